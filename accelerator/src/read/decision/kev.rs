//! llama.cpp's `kev` decision type: a pointer read over hidden states, not label logits
//! (docs/models.md, "Decision models").
//!
//! Its template takes text only: the state, the instructions and each option's key and
//! description are flattened into **kev text** ([`kev_text`]: llama-server's
//! `decision_kev_render`, then every `<|NAME|>` escaped to `<¦NAME¦>` so that no text of a
//! request is read as a special token). The template ends each option with the marker
//! `<|box_end|>`, one special token ([`MARKER`]); the model's final-norm hidden state at each
//! marker and at the prompt's last position (the pointer) go through the head `cls.output`
//! (`[2p, n_embd]` and a bias: `[query | key]`), and option `i` scores
//! `query(pointer) · key(marker_i) / √p` (`pointer.rs`). The scores are then read as
//! the other types' label logits are (a softmax at the fitted temperature, `readout`).

use serde_json::{Number, Value};

use super::pointer::PointerHeadError;
use crate::read::logits::PromptTokenizer;

/// The token that ends each option in a kev prompt.
pub const MARKER: &str = "<|box_end|>";

/// `value` as kev text with the special-token syntax escaped: what llama-server gives a kev
/// template for the state, the instructions and an option's key and (non-null) description.
pub fn kev_text(value: &Value) -> String {
    escape_special_tokens(&render(value, 0))
}

/// llama-server's `decision_kev_render`: null as nothing, a string as it is, a bool as
/// Python's `True`/`False`, a number as its JSON, an array as `- ` items and an object as
/// `key: value` lines (`key:` and the nested value on the lines below, two spaces deeper, for
/// a nested array or object). An array item's own leading whitespace is dropped after its
/// `- `.
fn render(value: &Value, indent: usize) -> String {
    let pad = " ".repeat(2 * indent);
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => String::from(if *b { "True" } else { "False" }),
        Value::Number(n) => json_number(n),
        Value::Array(items) => {
            let mut out = String::new();
            for item in items {
                let text = render(item, indent + 1);
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(text.trim_start_matches([' ', '\t', '\n', '\r']));
            }
            out
        }
        Value::Object(map) => {
            let mut out = String::new();
            for (key, item) in map {
                let nested = item.is_object() || item.is_array();
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&pad);
                out.push_str(key);
                out.push_str(if nested { ":\n" } else { ": " });
                out.push_str(&render(item, if nested { indent + 1 } else { 0 }));
            }
            out
        }
    }
}

/// A number as llama.cpp's JSON library (nlohmann) dumps it: integers in decimal; a float in
/// its shortest round-trip digits, as a plain decimal with at least one digit after the point
/// when its decimal exponent is within -4 and 15 (`129.5`, `1.0`, `0.001`), else in exponent
/// form with a sign and at least two digits (`1e+20`, `1.5e-05`).
fn json_number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let Some(x) = n.as_f64() else {
        return n.to_string();
    };
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    // Rust's `{:e}` writes the shortest digits that round-trip: `d[.ddd]e<exp>`.
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let k = digits.len() as i32;
    // The value is 0.DIGITS × 10^n.
    let n = exponent + 1;
    let body = if k <= n && n <= 15 {
        format!("{digits}{}.0", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 15 {
        let (int, frac) = digits.split_at(n as usize);
        format!("{int}.{frac}")
    } else if -4 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let (first, rest) = digits.split_at(1);
        let e = n - 1;
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        format!(
            "{mantissa}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        )
    };
    format!("{sign}{body}")
}

/// llama-server's `server_decision_escape_special_tokens`: every `<|NAME|>` (NAME one or more
/// of `A-Z a-z 0-9 _`) becomes `<¦NAME¦>`, scanning left to right as a global regex
/// replacement of `<\|([A-Za-z0-9_]+)\|>` does.
pub fn escape_special_tokens(text: &str) -> String {
    let bytes = text.as_bytes();
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    let mut i = 0;
    while let Some(found) = text[i..].find("<|") {
        let start = i + found;
        let mut j = start + 2;
        while j < bytes.len() && is_name(bytes[j]) {
            j += 1;
        }
        if j > start + 2 && bytes[j..].starts_with(b"|>") {
            out.push_str(&text[done..start]);
            out.push_str("<\u{a6}");
            out.push_str(&text[start + 2..j]);
            out.push_str("\u{a6}>");
            done = j + 2;
            i = done;
        } else {
            i = start + 1;
        }
    }
    out.push_str(&text[done..]);
    out
}

/// The template's input made text as llama-server gives it to a kev template: the state, the
/// instructions and each option's key and description as [`kev_text`] (a null description
/// stays null).
pub fn as_text(input: &mut Value) {
    for field in ["state", "instructions"] {
        if let Some(value) = input.get_mut(field) {
            *value = Value::String(kev_text(value));
        }
    }
    let Some(options) = input.get_mut("options").and_then(Value::as_array_mut) else {
        return;
    };
    for option in options {
        for field in ["key", "description"] {
            if let Some(value) = option.get_mut(field).filter(|v| !v.is_null()) {
                *value = Value::String(kev_text(value));
            }
        }
    }
}

/// Why a kev model cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KevSetupError {
    #[error(
        "decision model has no {MARKER} token (a kev model's option marker must be one token)"
    )]
    NoMarker,
    #[error(
        "unexpected layout of the decision prompt: the systemone template wrote {markers} \
         {MARKER} markers for a question of {options} options (a kev template ends each option \
         with one)"
    )]
    Layout { markers: usize, options: usize },
    #[error(
        "the model has no tensor {0}: a kev model reads its options through its pointer head \
         (cls.output.weight and cls.output.bias)"
    )]
    NoHead(String),
    #[error(transparent)]
    Head(#[from] PointerHeadError),
}

/// The marker's token id under `tokenizer`: [`MARKER`] must be one token.
pub fn marker_token<T: PromptTokenizer>(tokenizer: &T) -> Result<u32, KevSetupError> {
    match tokenizer.encode(MARKER).ok().as_deref() {
        Some(&[id]) => Ok(id),
        _ => Err(KevSetupError::NoMarker),
    }
}

/// The positions of `marker` in `tokens`, in order.
pub fn marker_positions(tokens: &[u32], marker: u32) -> Vec<usize> {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == marker)
        .map(|(i, _)| i)
        .collect()
}

/// The marker positions of a kev prompt's `tokens`, which must be one per option (as
/// llama-server checks every prompt).
pub fn layout(tokens: &[u32], marker: u32, options: usize) -> Result<Vec<usize>, KevSetupError> {
    let at = marker_positions(tokens, marker);
    if at.len() != options {
        return Err(KevSetupError::Layout {
            markers: at.len(),
            options,
        });
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kev_text_flattens_values_as_llama_server_does() {
        assert_eq!(kev_text(&json!(null)), "");
        assert_eq!(kev_text(&json!("as is\n  kept")), "as is\n  kept");
        assert_eq!(kev_text(&json!(true)), "True");
        assert_eq!(kev_text(&json!(false)), "False");
        assert_eq!(kev_text(&json!(7)), "7");
        assert_eq!(kev_text(&json!(-3)), "-3");
        assert_eq!(kev_text(&json!(["a", 1, null])), "- a\n- 1\n- ");
        let state = json!({
            "message": "Hi, I was charged twice.",
            "plan": "pro",
            "order": {"id": 4471, "items": ["phone case", "charger"]},
            "paid": true,
            "note": null,
        });
        assert_eq!(
            kev_text(&state),
            "message: Hi, I was charged twice.\nplan: pro\norder:\n  id: 4471\n  items:\n    \
             - phone case\n    - charger\npaid: True\nnote: "
        );
        // An array item's first line loses its indentation after the dash; its other lines
        // keep theirs.
        assert_eq!(
            kev_text(&json!([{"a": 1, "b": [2, 3]}, [4, [5]]])),
            "- a: 1\n  b:\n    - 2\n    - 3\n- - 4\n  - - 5"
        );
        assert_eq!(
            kev_text(&json!({"empty": [], "none": {}})),
            "empty:\n\nnone:\n"
        );
    }

    #[test]
    fn numbers_are_written_as_llama_cpps_json_dumps_them() {
        let cases = [
            (json!(129.5), "129.5"),
            (json!(1.0), "1.0"),
            (json!(-0.0), "-0.0"),
            (json!(0.001), "0.001"),
            (json!(0.0001), "0.0001"),
            (json!(0.00001), "1e-05"),
            (json!(1.5e-7), "1.5e-07"),
            (json!(1e14), "100000000000000.0"),
            (json!(1e15), "1e+15"),
            (json!(1.25e20), "1.25e+20"),
            (json!(123456.789), "123456.789"),
            (json!(u64::MAX), "18446744073709551615"),
        ];
        for (value, text) in cases {
            assert_eq!(kev_text(&value), text, "{value}");
        }
    }

    #[test]
    fn special_token_syntax_is_escaped_everywhere_in_the_text() {
        assert_eq!(
            escape_special_tokens("a <|box_end|> b <|im_start|>"),
            "a <\u{a6}box_end\u{a6}> b <\u{a6}im_start\u{a6}>"
        );
        // Only a name of letters, digits and underscores between the bars counts.
        assert_eq!(
            escape_special_tokens("<||> <|a b|> <|x-y|>"),
            "<||> <|a b|> <|x-y|>"
        );
        assert_eq!(
            escape_special_tokens("<|<|a_1|>|>"),
            "<|<\u{a6}a_1\u{a6}>|>"
        );
        assert_eq!(escape_special_tokens("plain, é <|"), "plain, é <|");
        // Keys are kev text too.
        assert_eq!(
            kev_text(&json!({"<|fim_prefix|>": "<|box_end|>"})),
            "<\u{a6}fim_prefix\u{a6}>: <\u{a6}box_end\u{a6}>"
        );
    }

    #[test]
    fn markers_are_found_in_order_and_must_be_one_per_option() {
        assert_eq!(marker_positions(&[5, 9, 1, 9, 9], 9), vec![1, 3, 4]);
        assert!(marker_positions(&[1, 2], 9).is_empty());
        assert_eq!(layout(&[9, 1, 9], 9, 2), Ok(vec![0, 2]));
        let err = layout(&[9, 1, 9, 9], 9, 2).expect_err("three markers");
        assert_eq!(
            err,
            KevSetupError::Layout {
                markers: 3,
                options: 2
            }
        );
        assert!(err
            .to_string()
            .starts_with("unexpected layout of the decision prompt"));
    }

    #[test]
    fn the_template_is_given_text_and_a_null_description_stays_null() {
        let mut input = json!({
            "type": "choice",
            "instructions": {"rule": "pick <|box_end|>"},
            "state": ["a", true],
            "options": [
                {"key": "<|box_end|>", "description": {"x": 1.5}},
                {"key": "b", "description": null},
            ],
            "images": [],
        });
        as_text(&mut input);
        assert_eq!(
            input,
            json!({
                "type": "choice",
                "instructions": "rule: pick <\u{a6}box_end\u{a6}>",
                "state": "- a\n- True",
                "options": [
                    {"key": "<\u{a6}box_end\u{a6}>", "description": "x: 1.5"},
                    {"key": "b", "description": null},
                ],
                "images": [],
            })
        );
    }

    /// One id per character, and `<|box_end|>` one token (id 1000): enough of a tokenizer to
    /// plan kev prompts.
    struct MarkerTokenizer;

    impl PromptTokenizer for MarkerTokenizer {
        fn render_chat(&self, _: &str, _: &str) -> Result<String, String> {
            Err("no chat template".into())
        }

        fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
            let mut out = Vec::new();
            for (i, piece) in text.split(MARKER).enumerate() {
                if i > 0 {
                    out.push(1000);
                }
                out.extend(piece.chars().map(u32::from));
            }
            Ok(out)
        }

        fn bos_for(&self, _: &str) -> Option<u32> {
            None
        }
    }

    const TEMPLATE: &str = "<|fim_prefix|>{{ state }}<|fim_middle|>{{ instructions }}\n{% for o in options %}<|box_start|>{{ o.key }}{% if o.description is not none %}: {{ o.description }}{% endif %}<|box_end|>\n{% endfor %}";

    fn planner(
        template: &str,
    ) -> Result<
        crate::read::decision::DecisionPlanner<MarkerTokenizer>,
        crate::read::decision::DecisionSetupError,
    > {
        let metadata = crate::checkpoint::gguf::DecisionMetadata {
            kind: crate::checkpoint::gguf::DecisionKind::Kev,
            template: template.into(),
            temperatures: Default::default(),
            laya: None,
        };
        crate::read::decision::DecisionPlanner::new(MarkerTokenizer, metadata, "test", 10_000)
    }

    #[test]
    fn a_kev_prompt_is_kev_text_read_at_one_marker_per_option() {
        let p = planner(TEMPLATE).expect("planner");
        assert_eq!(p.question_limits().max_choice_options, 255);
        assert_eq!(p.question_limits().max_score_levels, 10);
        assert!(p.labels().ids.is_empty());
        let request: hunch_core::ReadRequest = serde_json::from_value(json!({
            "state": "{\"order\": {\"id\": 7, \"paid\": true}, \"note\": \"<|box_end|>\"}",
            "questions": [
                {"instructions": "Which?", "type": "choice",
                 "options": [{"name": "a", "description": "first"}, {"name": "<|box_end|>"}]},
                {"instructions": "Is it?", "type": "noul", "yes": "it is", "no": null},
            ],
        }))
        .expect("request");
        let text = p.render(&request, 0, 0).expect("render");
        assert_eq!(
            text,
            "<|fim_prefix|>order:\n  id: 7\n  paid: True\nnote: <\u{a6}box_end\u{a6}><|fim_middle|>\
             Which?\n<|box_start|>a: first<|box_end|>\n<|box_start|><\u{a6}box_end\u{a6}><|box_end|>\n"
        );
        // A noul lists false first.
        let noul = p.render(&request, 1, 0).expect("render");
        assert!(
            noul.ends_with("<|box_start|>false<|box_end|>\n<|box_start|>true: it is<|box_end|>\n"),
            "{noul}"
        );
        let plan = p.plan(&request).expect("plan");
        let markers = plan.markers.expect("kev plans markers");
        for (sequence, at) in plan.sequences.iter().zip(&markers) {
            assert_eq!(at.len(), 2);
            assert!(at.iter().all(|&i| sequence.tokens[i] == 1000));
            assert!(sequence.labels.is_empty());
        }
    }

    #[test]
    fn a_kev_template_without_one_marker_per_option_or_a_tokenizer_without_it_is_refused() {
        let one = "{{ state }}{% for o in options %}{{ o.key }}{% endfor %}<|box_end|>";
        let err = planner(one).err().expect("one marker for two options");
        assert!(
            err.to_string().contains(
                "unexpected layout of the decision prompt: the systemone template wrote 1"
            ),
            "{err}"
        );

        struct NoMarker;
        impl PromptTokenizer for NoMarker {
            fn render_chat(&self, _: &str, _: &str) -> Result<String, String> {
                Err("none".into())
            }
            fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
                Ok(text.chars().map(u32::from).collect())
            }
            fn bos_for(&self, _: &str) -> Option<u32> {
                None
            }
        }
        let metadata = crate::checkpoint::gguf::DecisionMetadata {
            kind: crate::checkpoint::gguf::DecisionKind::Kev,
            template: TEMPLATE.into(),
            temperatures: Default::default(),
            laya: None,
        };
        let err = crate::read::decision::DecisionPlanner::new(NoMarker, metadata, "test", 10_000)
            .err()
            .expect("no marker token");
        assert!(err.to_string().contains("no <|box_end|> token"), "{err}");
    }
}
