//! A chat tokenizer from a Hugging Face folder: `tokenizer.json`, and what transformers reads
//! beside it (`tokenizer_config.json`, `special_tokens_map.json`, `chat_template.jinja`,
//! `chat_template.json`).

use super::error::ChatTokenizerError;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use tokenizers::{OffsetReferential, OffsetType, Tokenizer};

/// What the folder says besides the vocabulary.
#[derive(Debug, Default)]
pub(super) struct HfConfig {
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    /// `tokenizer_config.json`'s `add_bos_token`, when it says.
    pub add_bos_token: Option<bool>,
}

pub(super) struct HfTokenizer {
    path: PathBuf,
    inner: Tokenizer,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ChatTokenizerError + '_ {
    move |source| ChatTokenizerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn config_error(path: &Path, why: impl Into<String>) -> ChatTokenizerError {
    ChatTokenizerError::Config {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// The JSON object in `path`, or `None` when the file does not exist.
fn read_json(path: &Path) -> Result<Option<serde_json::Map<String, Json>>, ChatTokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    match serde_json::from_str(&text) {
        Ok(Json::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(config_error(path, "not a JSON object")),
        Err(e) => Err(config_error(path, format!("not valid JSON: {e}"))),
    }
}

/// A special token written as a string, as `{"content": …}` (an `AddedToken`), or null.
fn token_text(
    path: &Path,
    map: &serde_json::Map<String, Json>,
    key: &str,
) -> Result<Option<String>, ChatTokenizerError> {
    match map.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Object(o)) => match o.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(config_error(
                path,
                format!("{key} is an object without a string \"content\""),
            )),
        },
        Some(other) => Err(config_error(
            path,
            format!("{key} is {other}, not a token (a string or {{\"content\": …}})"),
        )),
    }
}

/// `chat_template` as a string, or a list of `{name, template}` of which "default" is used.
fn template_value(path: &Path, key: &str, v: &Json) -> Result<String, ChatTokenizerError> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Array(items) => {
            let mut names = Vec::new();
            for item in items {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(t.to_string()),
                    (Some(name), Some(_)) => names.push(name.to_string()),
                    _ => {
                        return Err(config_error(
                            path,
                            format!("{key}: an entry is not {{\"name\": …, \"template\": …}}"),
                        ))
                    }
                }
            }
            Err(config_error(
                path,
                format!(
                    "{key} lists templates named {names:?} but none named \"default\", the one \
                     a plain chat uses"
                ),
            ))
        }
        other => Err(config_error(
            path,
            format!(
                "{key} is {}, not a string or a list of named templates",
                kind(other)
            ),
        )),
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// The folder's configuration, read as transformers reads it: `chat_template.jinja`, then
/// `chat_template.json`, then `tokenizer_config.json`'s `chat_template`; special tokens from
/// `tokenizer_config.json`, overridden by `special_tokens_map.json` where that names them.
pub(super) fn read_config(dir: &Path) -> Result<HfConfig, ChatTokenizerError> {
    let mut config = HfConfig::default();
    let config_path = dir.join("tokenizer_config.json");
    if let Some(map) = read_json(&config_path)? {
        if let Some(v) = map.get("chat_template").filter(|v| !v.is_null()) {
            config.chat_template = Some(template_value(&config_path, "chat_template", v)?);
        }
        config.bos_token = token_text(&config_path, &map, "bos_token")?;
        config.eos_token = token_text(&config_path, &map, "eos_token")?;
        config.unk_token = token_text(&config_path, &map, "unk_token")?;
        config.pad_token = token_text(&config_path, &map, "pad_token")?;
        config.add_bos_token = match map.get("add_bos_token") {
            None | Some(Json::Null) => None,
            Some(Json::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(config_error(
                    &config_path,
                    format!("add_bos_token is {}, not true or false", kind(other)),
                ))
            }
        };
    }
    let map_path = dir.join("special_tokens_map.json");
    if let Some(map) = read_json(&map_path)? {
        let slots = [
            ("bos_token", &mut config.bos_token),
            ("eos_token", &mut config.eos_token),
            ("unk_token", &mut config.unk_token),
            ("pad_token", &mut config.pad_token),
        ];
        for (key, slot) in slots {
            if let Some(text) = token_text(&map_path, &map, key)? {
                *slot = Some(text);
            }
        }
    }
    let json_path = dir.join("chat_template.json");
    if let Some(map) = read_json(&json_path)? {
        match map.get("chat_template") {
            Some(v) => config.chat_template = Some(template_value(&json_path, "chat_template", v)?),
            None => return Err(config_error(&json_path, "no \"chat_template\" key")),
        }
    }
    let jinja_path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja_path) {
        Ok(text) => config.chat_template = Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&jinja_path)(e)),
    }
    Ok(config)
}

impl HfTokenizer {
    pub fn from_dir(dir: &Path) -> Result<HfTokenizer, ChatTokenizerError> {
        if !dir.is_dir() {
            return Err(ChatTokenizerError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a directory (a Hugging Face model folder is expected)",
                ),
            });
        }
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ChatTokenizerError::NoTokenizerJson {
                dir: dir.to_path_buf(),
            });
        }
        let inner = Tokenizer::from_file(&path).map_err(|e| ChatTokenizerError::Load {
            path: path.clone(),
            why: e.to_string(),
        })?;
        Ok(HfTokenizer { path, inner })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The first id the post-processor puts in front of a text when special tokens are added
    /// (a BOS from a `TemplateProcessing`), if any.
    pub fn post_processor_prefix(&self) -> Option<u32> {
        let with = self.inner.encode("a", true).ok()?;
        let without = self.inner.encode("a", false).ok()?;
        let (with, without) = (with.get_ids(), without.get_ids());
        (with.len() > without.len() && with[1..].starts_with(without)).then(|| with[0])
    }

    /// Byte offset just past the last added token `encode` extracts from `text`: the same
    /// extraction `tokenizers` runs before normalising and pre-tokenising each stretch between
    /// added tokens on its own (an `rstrip` token's stripped spaces count as its own).
    pub fn last_special_end(&self, text: &str) -> Option<usize> {
        let pre = self
            .inner
            .get_added_vocabulary()
            .extract_and_normalize(self.inner.get_normalizer(), text);
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .rev()
            .find(|(_, _, tokens)| tokens.is_some())
            .map(|(_, (_, end), _)| end)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let size = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(format!("id {bad} is past the vocabulary's {size} tokens"));
        }
        self.inner.decode(ids, false).map_err(|e| e.to_string())
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
