//! The DiffusionGemma tokenizer: a checkpoint's `tokenizer.json`, the special tokens the read
//! needs (found by their text, so a checkpoint with other ids still works), and the chat format.
//!
//! [`tiny`] builds a small Gemma-style tokenizer for random test checkpoints.

pub mod chat;
pub mod tiny;

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("loading tokenizer {path}: {why}")]
    Load { path: PathBuf, why: String },
    #[error(
        "tokenizer {path} has no single token {token:?}; DiffusionGemma's chat format needs it"
    )]
    MissingSpecial { path: PathBuf, token: &'static str },
    #[error("tokenizer {path}: {token:?} written in text encodes as {ids:?}, not as its single id {id}; it must be an added (special) token")]
    NotAtomic {
        path: PathBuf,
        token: &'static str,
        id: u32,
        ids: Vec<u32>,
    },
    #[error("tokenising: {0}")]
    Encode(String),
    #[error("detokenising: {0}")]
    Decode(String),
}

/// Ids of the control tokens of DiffusionGemma's chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialTokens {
    pub pad: u32,
    pub eos: u32,
    pub bos: u32,
    /// `<|turn>`
    pub turn_open: u32,
    /// `<turn|>`
    pub turn_close: u32,
    /// `<|channel>`
    pub channel_open: u32,
    /// `<channel|>`
    pub channel_close: u32,
}

/// Texts of the special tokens, in the order of [`SpecialTokens`]' fields.
pub const SPECIAL_TEXTS: [&str; 7] = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
];

/// A loaded tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
}

impl Tokenizer {
    /// Load `tokenizer.json` from a checkpoint folder.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        Self::from_inner(inner, path)
    }

    /// Parse a `tokenizer.json` held in memory; `origin` names it in errors.
    pub fn from_json(json: &str, origin: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let origin = origin.as_ref();
        let inner: tokenizers::Tokenizer =
            json.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: origin.to_path_buf(),
                    why: e.to_string(),
                })?;
        Self::from_inner(inner, origin)
    }

    fn from_inner(inner: tokenizers::Tokenizer, path: &Path) -> Result<Self, TokenizerError> {
        let id = |token: &'static str| {
            inner
                .token_to_id(token)
                .ok_or(TokenizerError::MissingSpecial {
                    path: path.to_path_buf(),
                    token,
                })
        };
        let special = SpecialTokens {
            pad: id(SPECIAL_TEXTS[0])?,
            eos: id(SPECIAL_TEXTS[1])?,
            bos: id(SPECIAL_TEXTS[2])?,
            turn_open: id(SPECIAL_TEXTS[3])?,
            turn_close: id(SPECIAL_TEXTS[4])?,
            channel_open: id(SPECIAL_TEXTS[5])?,
            channel_close: id(SPECIAL_TEXTS[6])?,
        };
        // The read writes these markers as text (`<|channel>thought…`), so each must come back as
        // its one id, which holds only for added tokens matched before the model runs.
        let ids = [
            special.pad,
            special.eos,
            special.bos,
            special.turn_open,
            special.turn_close,
            special.channel_open,
            special.channel_close,
        ];
        for (token, id) in SPECIAL_TEXTS.into_iter().zip(ids) {
            let enc = inner
                .encode(token, false)
                .map_err(|e| TokenizerError::Encode(e.to_string()))?;
            if enc.get_ids() != [id] {
                return Err(TokenizerError::NotAtomic {
                    path: path.to_path_buf(),
                    token,
                    id,
                    ids: enc.get_ids().to_vec(),
                });
            }
        }
        Ok(Self { inner, special })
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Token ids of `text` without adding `<bos>` or any other template token. Special tokens
    /// written in the text (`<|channel>`, `<turn|>` …) map to their single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (the read shows canvases verbatim).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Id of a token given its vocabulary text (e.g. `"▁yes"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary text of an id.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` object, for callers that need offsets or batching.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Jinja's `| trim` is Python's `str.strip()`: it also strips the ASCII separators U+001C–U+001F,
/// which Rust's `char::is_whitespace` does not count as white space.
pub fn jinja_trim(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// The prompt text DiffusionGemma's chat template renders for one system and one user message
/// with `add_generation_prompt=True, enable_thinking=False` (docs/model.md, "Chat format"):
/// contents trimmed, and the empty thought block that thinking-off appends.
pub fn render_chat(system: &str, user: &str) -> String {
    format!(
        "<bos><|turn>system\n{}<turn|>\n<|turn>user\n{}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
        jinja_trim(system),
        jinja_trim(user)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        tiny::tiny_tokenizer(512).expect("tiny tokenizer")
    }

    #[test]
    fn chat_text_is_exact() {
        let text = render_chat("  Answer.\n", "\tWhy is the sky blue?\u{1f} \n");
        assert_eq!(
            text,
            "<bos><|turn>system\nAnswer.<turn|>\n<|turn>user\nWhy is the sky blue?<turn|>\n\
             <|turn>model\n<|channel>thought\n<channel|>"
        );
        // U+00A0 is white space to both Python and Rust; U+200B is to neither.
        assert_eq!(jinja_trim("\u{a0}x\u{200b}"), "x\u{200b}");
    }

    #[test]
    fn chat_tokens_have_the_real_special_ids() {
        let t = tiny();
        let s = *t.special();
        assert_eq!(
            (
                s.pad,
                s.eos,
                s.bos,
                s.channel_open,
                s.channel_close,
                s.turn_open,
                s.turn_close
            ),
            (0, 1, 2, 100, 101, 105, 106)
        );
        let ids = t
            .encode(&render_chat("", "Why is the sky blue?"))
            .expect("encode");
        // The reference's tokenised prompt (docs/model.md, "Chat format") starts with
        // <bos><|turn> and ends with `105 <model> 107 100 <thought> 107 101`; "model" and
        // "thought" are several pieces here.
        assert_eq!(&ids[..2], &[2, 105]);
        let model = t.encode("model").expect("encode");
        let thought = t.encode("thought").expect("encode");
        let mut tail = vec![105];
        tail.extend(&model);
        tail.push(107);
        tail.push(100);
        tail.extend(&thought);
        tail.extend([107, 101]);
        assert_eq!(&ids[ids.len() - tail.len()..], &tail[..]);
        assert_eq!(
            ids.iter().filter(|&&i| i == 106).count(),
            2,
            "two turn closes"
        );
        assert_eq!(
            t.decode(&ids).expect("decode"),
            render_chat("", "Why is the sky blue?")
        );
    }

    #[test]
    fn special_tokens_in_text_map_to_single_ids() {
        let t = tiny();
        assert_eq!(
            t.encode("<|channel>thought\n<channel|>").expect("encode")[0],
            100
        );
        assert_eq!(
            t.encode("<|channel>thought\n<channel|>")
                .expect("encode")
                .last(),
            Some(&101)
        );
    }

    #[test]
    fn special_tokens_must_be_added_tokens() {
        let mut json = tiny::tiny_tokenizer_json(512).expect("json");
        let added = json["added_tokens"].as_array_mut().expect("added tokens");
        added.retain(|t| t["content"] != "<turn|>");
        let e = Tokenizer::from_json(&json.to_string(), "x/tokenizer.json").expect_err("must fail");
        assert!(
            matches!(
                e,
                TokenizerError::NotAtomic {
                    token: "<turn|>",
                    id: 106,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_special_token_is_named() {
        let mut json = tiny::tiny_tokenizer_json(512).expect("json");
        let text = json.to_string().replace("<|channel>", "<|chanel>");
        json = serde_json::from_str(&text).expect("json");
        let e = Tokenizer::from_json(&json.to_string(), "x/tokenizer.json").expect_err("must fail");
        assert!(e.to_string().contains("\"<|channel>\""), "{e}");
    }
}
