//! A tiny Gemma-style `tokenizer.json` for random checkpoints of any vocabulary size ≥ 512.
//!
//! Structure of the real Gemma 3/4 tokenizer (transformers' `GemmaConverter`): a
//! SentencePiece-converted BPE whose only pre-tokenizer is a no-op split on " " (BPE runs over
//! the whole text), a normalizer that replaces `" "` with `"▁"`,
//! byte fallback through `<0x00>`…`<0xFF>`, a decoder that undoes both, and control tokens as
//! special added tokens. The control tokens sit at the real ids (pad 0, eos 1, bos 2,
//! `<|tool_response>` 50, `<|channel>`/`<channel|>` 100/101, `<|turn>`/`<turn|>` 105/106,
//! `"\n"` 107); other low ids are `<unusedN>`.
//!
//! The vocabulary is chosen so that every label the read uses is one token *in context*: after
//! `": "` (`▁yes`, `▁A`, `▁7`, `▁AB`) and glued after an id (`yes`, `A`, `AB`). Merge ranks put
//! every `▁`-merge before the plain ones, so `"q1: yes"` ends in `▁yes` rather than `▁` + `yes`.
//! Two-letter labels get as many tokens as the vocabulary leaves room for (`▁XY` first, then
//! `XY`; all 676 of each from 2048 up); the read skips labels that are not single tokens.

use std::path::Path;

use serde_json::{json, Value};

use super::{Tokenizer, TokenizerError};

/// Smallest vocabulary that holds the fixed part (control ids, pieces, bytes, image tokens).
pub const MIN_VOCAB: usize = 511;

/// Control tokens at the ids the real checkpoint uses.
const FIXED: [(u32, &str); 9] = [
    (0, "<pad>"),
    (1, "<eos>"),
    (2, "<bos>"),
    (3, "<unk>"),
    (50, "<|tool_response>"),
    (100, "<|channel>"),
    (101, "<channel|>"),
    (105, "<|turn>"),
    (106, "<turn|>"),
];
const NEWLINE_ID: u32 = 107;
const PUNCTUATION: [&str; 13] = [
    ":", ".", ",", "(", ")", "\"", "-", "?", "!", "/", "'", "[", "]",
];
/// Image tokens take the top three ids, like the config writer's boi/eoi/image ids.
const IMAGE_TOKENS: [&str; 3] = ["<|image>", "<image|>", "<|image|>"];

#[derive(Debug, thiserror::Error)]
pub enum TinyTokenizerError {
    #[error("a tiny tokenizer needs a vocabulary of at least {MIN_VOCAB} ids, got {0}")]
    TooSmall(usize),
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

struct Builder {
    vocab: Vec<String>,
    merges: Vec<(String, String)>,
}

impl Builder {
    fn push(&mut self, piece: impl Into<String>) {
        self.vocab.push(piece.into());
    }
}

fn letters() -> impl Iterator<Item = char> {
    ('A'..='Z').chain('a'..='z')
}

/// Build the tokenizer as `tokenizer.json` content for a vocabulary of exactly `vocab_size` ids.
pub fn tiny_tokenizer_json(vocab_size: usize) -> Result<Value, TinyTokenizerError> {
    if vocab_size < MIN_VOCAB {
        return Err(TinyTokenizerError::TooSmall(vocab_size));
    }
    let mut b = Builder {
        vocab: Vec::with_capacity(vocab_size),
        merges: Vec::new(),
    };
    for id in 0..=NEWLINE_ID {
        match FIXED.iter().find(|(i, _)| *i == id) {
            Some((_, t)) => b.push(*t),
            None if id == NEWLINE_ID => b.push("\n"),
            None => b.push(format!("<unused{id}>")),
        }
    }
    // Single pieces: the word boundary, punctuation, digits and letters.
    b.push("▁");
    let singles: Vec<String> = PUNCTUATION
        .iter()
        .map(|s| s.to_string())
        .chain(('0'..='9').map(String::from))
        .chain(letters().map(String::from))
        .collect();
    for s in &singles {
        b.push(s.clone());
    }
    // "▁" + digit / letter, merged first so a label after ": " is one token.
    let mut spaced = Vec::new();
    for c in ('0'..='9').chain(letters()) {
        b.push(format!("▁{c}"));
        b.merges.push(("▁".into(), c.to_string()));
        spaced.push(c);
    }
    for (a, c, r) in [("▁y", "e", "▁ye"), ("▁ye", "s", "▁yes"), ("▁n", "o", "▁no")] {
        b.push(r);
        b.merges.push((a.into(), c.into()));
    }
    let plain_words = [("y", "e", "ye"), ("ye", "s", "yes"), ("n", "o", "no")];
    for (_, _, r) in plain_words {
        b.push(r);
    }
    // Byte fallback for everything else.
    for byte in 0..=255u8 {
        b.push(format!("<0x{byte:02X}>"));
    }
    // Two-letter labels, as many as fit: "▁XY" (after ": ") and "XY" (glued after an id).
    let room = vocab_size - b.vocab.len() - IMAGE_TOKENS.len();
    let pairs: Vec<(char, char)> = ('A'..='Z')
        .flat_map(|x| ('A'..='Z').map(move |y| (x, y)))
        .collect();
    // "▁XY" first: LINES answers (up to ten questions, the common case) put labels after ": ".
    let n_spaced = pairs.len().min(room);
    let n_plain = pairs.len().min(room - n_spaced);
    let mut spaced_pair_merges = Vec::new();
    let mut plain_pair_merges = Vec::new();
    for &(x, y) in &pairs[..n_spaced] {
        b.push(format!("▁{x}{y}"));
        spaced_pair_merges.push((format!("▁{x}"), y.to_string()));
    }
    for &(x, y) in &pairs[..n_plain] {
        b.push(format!("{x}{y}"));
        plain_pair_merges.push((x.to_string(), y.to_string()));
    }
    // Ranks: every ▁-merge before any plain merge.
    b.merges.extend(spaced_pair_merges);
    for (a, c, _) in plain_words {
        b.merges.push((a.into(), c.into()));
    }
    b.merges.extend(plain_pair_merges);
    while b.vocab.len() < vocab_size - IMAGE_TOKENS.len() {
        let id = b.vocab.len();
        b.push(format!("<unused{id}>"));
    }
    for t in IMAGE_TOKENS {
        b.push(t);
    }
    debug_assert_eq!(b.vocab.len(), vocab_size);

    let vocab: serde_json::Map<String, Value> = b
        .vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    // Control tokens are special added tokens: matched in raw text before normalisation, never
    // split. <unusedN> above the fixed range stays plain vocabulary (no merge produces it).
    let mut added: Vec<Value> = Vec::new();
    for (id, tok) in b.vocab.iter().enumerate() {
        let control = tok.starts_with('<') && tok.ends_with('>') && !tok.starts_with("<0x");
        if control && (id as u32 <= NEWLINE_ID || id >= vocab_size - IMAGE_TOKENS.len()) {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            }));
        }
    }
    let merges: Vec<Value> = b.merges.iter().map(|(a, c)| json!([a, c])).collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        // transformers' GemmaConverter: a split on " " that never fires after the normaliser
        // has replaced every space (BPE effectively runs over the whole text).
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    }))
}

/// The tiny tokenizer, loaded.
pub fn tiny_tokenizer(vocab_size: usize) -> Result<Tokenizer, TinyTokenizerError> {
    let json = tiny_tokenizer_json(vocab_size)?;
    Ok(Tokenizer::from_json(&json.to_string(), "<tiny tokenizer>")?)
}

/// Write the tiny tokenizer to `path` (normally `<checkpoint>/tokenizer.json`).
pub fn write_tiny_tokenizer(path: &Path, vocab_size: usize) -> Result<(), TinyTokenizerError> {
    let json = tiny_tokenizer_json(vocab_size)?;
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    std::fs::write(path, text).map_err(|source| TinyTokenizerError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token at the position where `text` and the same text with `label` differ (the read's
    /// slot rule): the label must change exactly one token.
    fn slot_token(t: &Tokenizer, prefix: &str, label: &str, suffix: &str) -> Option<String> {
        let other = if label == "yes" { "no" } else { "yes" };
        let a = t.encode(&format!("{prefix}{label}{suffix}")).ok()?;
        let b = t.encode(&format!("{prefix}{other}{suffix}")).ok()?;
        if a.len() != b.len() {
            return None;
        }
        let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        match diff[..] {
            [pos] => t.token_text(a[pos]),
            _ => None,
        }
    }

    #[test]
    fn fixed_ids_and_size() {
        for v in [512, 2048, 8192] {
            let t = tiny_tokenizer(v).expect("build");
            assert_eq!(t.vocab_size(), v);
            assert_eq!(t.token_id("<|tool_response>"), Some(50));
            assert_eq!(t.token_id("\n"), Some(107));
            assert_eq!(t.token_id("<|image|>"), Some(v as u32 - 1));
        }
        assert!(matches!(
            tiny_tokenizer_json(510),
            Err(TinyTokenizerError::TooSmall(510))
        ));
    }

    #[test]
    fn labels_are_single_tokens_in_context() {
        let t = tiny_tokenizer(2048).expect("build");
        let head = "<|channel>thought\n<channel|>q1: ";
        assert_eq!(
            slot_token(&t, head, "yes", "\nq2: A").as_deref(),
            Some("▁yes")
        );
        assert_eq!(
            slot_token(&t, head, "no", "\nq2: A").as_deref(),
            Some("▁no")
        );
        for l in letters()
            .map(String::from)
            .chain(('1'..='9').map(String::from))
        {
            assert_eq!(
                slot_token(&t, head, &l, "\n").as_deref(),
                Some(&*format!("▁{l}")),
                "{l}"
            );
        }
        for l in ["AA", "AZ", "ZZ"] {
            assert_eq!(
                slot_token(&t, head, l, "\n").as_deref(),
                Some(&*format!("▁{l}")),
                "{l}"
            );
            // INDEXED answers glue the label to the id: "q1AB q2A"
            assert_eq!(slot_token(&t, "q1", l, " q2A").as_deref(), Some(l), "{l}");
        }
        assert_eq!(slot_token(&t, "q1", "yes", " q2A").as_deref(), Some("yes"));
        let ids = t.encode("q1: yes").expect("encode");
        assert_eq!(
            t.token_text(*ids.last().expect("ids")).as_deref(),
            Some("▁yes")
        );
    }

    #[test]
    fn smallest_vocab_still_has_the_basic_labels() {
        let t = tiny_tokenizer(512).expect("build");
        let ids = t.encode("q1: yes\nq2: B\nq3: 7").expect("encode");
        let texts: Vec<String> = ids.iter().filter_map(|&i| t.token_text(i)).collect();
        assert_eq!(
            texts,
            ["q", "1", ":", "▁yes", "\n", "q", "2", ":", "▁B", "\n", "q", "3", ":", "▁7"]
        );
        assert!(t.token_id("▁AA").is_some());
        assert_eq!(t.token_id("▁AB"), None);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes_and_round_trip() {
        let t = tiny_tokenizer(512).expect("build");
        let text = "Zoë said «hi» {ok} — 🙂\ttab";
        let ids = t.encode(text).expect("encode");
        assert!(ids.contains(&t.token_id("<0xC3>").expect("byte token")));
        assert_eq!(t.decode(&ids).expect("decode"), text);
    }

    #[test]
    fn save_and_reload_gives_identical_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokenizer.json");
        write_tiny_tokenizer(&path, 2048).expect("write");
        let reloaded = Tokenizer::from_file(&path).expect("reload");
        let fresh = tiny_tokenizer(2048).expect("build");
        let text = crate::tokenizer::render_chat(
            "Answer a fixed set of questions.\n\nQuestion q1: Is it urgent?\n  yes\n  no\n",
            "{\"msg\": \"ASAP please!\"}",
        ) + "<|channel>thought\n<channel|>q1: yes<turn|><pad><pad>";
        assert_eq!(
            reloaded.encode(&text).expect("a"),
            fresh.encode(&text).expect("b")
        );
        // and saving through the tokenizers crate itself reproduces the same ids
        let resaved = dir.path().join("resaved.json");
        reloaded.inner().save(&resaved, false).expect("save");
        let again = Tokenizer::from_file(&resaved).expect("reload 2");
        assert_eq!(
            again.encode(&text).expect("c"),
            fresh.encode(&text).expect("d")
        );
    }
}
