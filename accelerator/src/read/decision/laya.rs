//! llama.cpp's `laya` decision type: a ModernBERT encoder whose head scores each option at the
//! mask token that opens it (docs/models.md, "Decision models").
//!
//! The template lays a question out as `[CLS] question [SEP] ([MASK] option)* [SEP] state
//! [SEP]` in the file's own tokens; every string of the template's input has the mask token's
//! text replaced by a space first ([`without_marker_text`]), so that only the template's masks
//! are markers. The prompt is then cut to the head's token budget (`max_head_tokens`) the way
//! the model was trained, as llama-server's `fill_task_laya` cuts it ([`fit`]): each option to
//! its marker and at most [`MAX_OPTION_TOKENS`] tokens; where the options then leave the
//! question fewer than 16 tokens of the budget, every option to an even share of it (at least
//! 4); the question to what remains (at least 8). The state is never cut. The head reads the
//! question's type (`model::encoder::QuestionType`) and scores each marker; the scores are read
//! as the other types' label logits are (a softmax at the fitted temperature, `readout`).

use serde_json::Value;

/// Most tokens of an option's text after its marker (the laya trainer's).
pub const MAX_OPTION_TOKENS: usize = 48;
/// Head tokens the options leave the question before they are shrunk.
const MIN_QUESTION_TOKENS: usize = 16;
/// The fewest tokens an option is shrunk to (its marker included).
const MIN_OPTION_TOKENS: usize = 4;
/// The fewest tokens the question keeps.
const MIN_QUESTION_KEPT: usize = 8;

/// A prompt that is not laid out as a laya head reads it (the template's fault, or an option
/// whose text the tokenizer merged with a marker).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unexpected layout of the decision prompt: {0} (a laya template writes [CLS] question [SEP], \
     then one mask token before each option, then [SEP] state [SEP])"
)]
pub struct LayaLayoutError(pub String);

/// A prompt cut to the head's budget: its tokens and each option's marker position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FittedPrompt {
    pub tokens: Vec<u32>,
    pub markers: Vec<usize>,
}

/// `tokens` (a rendered laya prompt of `options` options) cut to `max_head_tokens` as
/// llama-server cuts it.
pub fn fit(
    tokens: &[u32],
    options: usize,
    mask: u32,
    sep: u32,
    max_head_tokens: usize,
) -> Result<FittedPrompt, LayaLayoutError> {
    let found: Vec<usize> = (0..tokens.len()).filter(|&i| tokens[i] == mask).collect();
    if found.len() != options {
        return Err(LayaLayoutError(format!(
            "{} markers for {options} options",
            found.len()
        )));
    }
    let (first, last) = match (found.first(), found.last()) {
        (Some(&first), Some(&last)) => (first, last),
        _ => return Err(LayaLayoutError("no options".into())),
    };
    if first < 2 || tokens[first - 1] != sep || tokens.last() != Some(&sep) {
        return Err(LayaLayoutError(
            "the options do not follow [CLS] question [SEP], or the prompt does not end with [SEP]"
                .into(),
        ));
    }
    let head_end = first - 1;
    let options_end = last
        + tokens[last..]
            .iter()
            .position(|&t| t == sep)
            .ok_or_else(|| LayaLayoutError("no [SEP] after the options".into()))?;
    if options_end + 1 >= tokens.len() {
        return Err(LayaLayoutError("no state after the options".into()));
    }
    let mut spans: Vec<&[u32]> = (0..options)
        .map(|i| {
            let end = found.get(i + 1).copied().unwrap_or(options_end);
            &tokens[found[i]..end]
        })
        .collect();
    let cap = |spans: &mut Vec<&[u32]>, most: usize| -> usize {
        for span in spans.iter_mut() {
            *span = &span[..span.len().min(most)];
        }
        spans.iter().map(|s| s.len()).sum()
    };
    let mut used = cap(&mut spans, MAX_OPTION_TOKENS + 1);
    if used + MIN_QUESTION_TOKENS > max_head_tokens {
        let share = (max_head_tokens - max_head_tokens.min(MIN_QUESTION_TOKENS)) / options;
        used = cap(&mut spans, share.max(MIN_OPTION_TOKENS));
    }
    let question_tokens = (max_head_tokens - max_head_tokens.min(used)).max(MIN_QUESTION_KEPT);
    let mut out = Vec::with_capacity(tokens.len());
    out.push(tokens[0]);
    out.extend_from_slice(&tokens[1..head_end.min(1 + question_tokens)]);
    out.push(sep);
    let mut markers = Vec::with_capacity(options);
    for span in &spans {
        markers.push(out.len());
        out.extend_from_slice(span);
    }
    out.extend_from_slice(&tokens[options_end..]);
    Ok(FittedPrompt {
        tokens: out,
        markers,
    })
}

/// `value` with `marker` replaced by a space in every string (object keys kept as they are),
/// as llama-server cleans a laya template's input.
pub fn without_marker_text(value: &mut Value, marker: &str) {
    if marker.is_empty() {
        return;
    }
    match value {
        Value::String(s) if s.contains(marker) => *s = s.replace(marker, " "),
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| without_marker_text(v, marker)),
        Value::Object(map) => map
            .values_mut()
            .for_each(|v| without_marker_text(v, marker)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLS: u32 = 2;
    const SEP: u32 = 1;
    const MASK: u32 = 4;

    /// `[CLS] q… [SEP] ([MASK] o…)* [SEP] s… [SEP]` with question, option and state lengths.
    fn prompt(question: usize, options: &[usize], state: usize) -> Vec<u32> {
        let mut t = vec![CLS];
        t.extend((0..question).map(|i| 100 + i as u32));
        t.push(SEP);
        for (o, &len) in options.iter().enumerate() {
            t.push(MASK);
            t.extend((0..len).map(|i| 1000 * (o as u32 + 1) + i as u32));
        }
        t.push(SEP);
        t.extend((0..state).map(|i| 500 + i as u32));
        t.push(SEP);
        t
    }

    #[test]
    fn a_prompt_within_the_budget_is_kept_whole() {
        let tokens = prompt(5, &[2, 3], 7);
        let fitted = fit(&tokens, 2, MASK, SEP, 256).expect("fits");
        assert_eq!(fitted.tokens, tokens);
        assert_eq!(fitted.markers, vec![7, 10]);
    }

    #[test]
    fn long_options_are_cut_to_48_tokens_then_evenly_and_the_question_to_the_rest() {
        // Two options of 60 text tokens: each cut to its marker and 48, 98 in all; a budget
        // of 256 leaves the question 158.
        let tokens = prompt(200, &[60, 60], 3);
        let fitted = fit(&tokens, 2, MASK, SEP, 256).expect("fits");
        assert_eq!(fitted.markers, vec![1 + 158 + 1, 1 + 158 + 1 + 49]);
        assert_eq!(fitted.tokens.len(), 1 + 158 + 1 + 98 + 1 + 3 + 1);
        // A budget of 32: 98 + 16 > 32, so each option gets max(4, 16 / 2) = 8 tokens and the
        // question max(8, 32 − 16) = 16.
        let fitted = fit(&tokens, 2, MASK, SEP, 32).expect("fits");
        assert_eq!(fitted.markers, vec![18, 26]);
        assert_eq!(
            &fitted.tokens[18..34],
            &tokens[202..210]
                .iter()
                .chain(&tokens[263..271])
                .copied()
                .collect::<Vec<_>>()[..]
        );
        assert_eq!(&fitted.tokens[34..], &tokens[tokens.len() - 5..]);
        // Many options: each keeps at least its marker and 3 tokens, the question 8.
        let tokens = prompt(20, &[10; 12], 2);
        let fitted = fit(&tokens, 12, MASK, SEP, 32).expect("fits");
        assert_eq!(fitted.markers[0], 1 + 8 + 1);
        assert_eq!(fitted.markers[1] - fitted.markers[0], 4);
    }

    #[test]
    fn a_prompt_not_laid_out_for_the_head_is_refused() {
        let tokens = prompt(3, &[2, 2], 2);
        assert!(fit(&tokens, 3, MASK, SEP, 64).is_err(), "marker count");
        let mut no_sep = tokens.clone();
        no_sep.pop();
        assert!(fit(&no_sep, 2, MASK, SEP, 64).is_err(), "last token");
        let mut joined = tokens.clone();
        joined.remove(4); // the [SEP] before the first marker
        assert!(
            fit(&joined, 2, MASK, SEP, 64).is_err(),
            "sep before markers"
        );
    }

    #[test]
    fn the_marker_text_is_replaced_in_values_not_keys() {
        let mut v = serde_json::json!({"a<mask>": ["x<mask>y", {"k": "<mask>"}], "n": 1});
        without_marker_text(&mut v, "<mask>");
        assert_eq!(
            v,
            serde_json::json!({"a<mask>": ["x y", {"k": " "}], "n": 1})
        );
    }
}
