//! Chat models' tokenizers (from `tokenizer.json` or a GGUF's own vocabulary) and their chat
//! templates.
//!
//! [`ChatTokenizer`] loads either source and gives what the label-logit read needs: the chat
//! template rendered as transformers' `apply_chat_template(..., add_generation_prompt=True,
//! enable_thinking=False)` renders it ([`template`]), text to ids with the special tokens written
//! in it recognised, the BOS the model expects, and where its tokenizer splits the text.
//!
//! - [`hf`]: a Hugging Face folder, tokenised by `tokenizers` from its `tokenizer.json`.
//! - [`gguf`]: a GGUF file's vocabulary, tokenised as llama.cpp does: byte-level BPE
//!   (`tokenizers` with llama.cpp's pre-tokenizer regexes) or SentencePiece ([`spm`]), after
//!   the split at special tokens ([`special`]).

pub mod builtin;
mod error;
mod gguf;
mod hf;
mod special;
mod spm;
mod template;

pub use error::ChatTokenizerError;

use crate::checkpoint::gguf::GgufFile;
use std::path::Path;
use template::{ChatTemplate, RenderFailure, TemplateTokens};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

enum Backend {
    Hf(Box<hf::HfTokenizer>),
    Gguf(Box<gguf::GgufTokenizer>),
}

/// A chat model's tokenizer and chat template.
pub struct ChatTokenizer {
    backend: Backend,
    /// Names the source in template errors.
    origin: String,
    template: Option<ChatTemplate>,
    template_tokens: TemplateTokens,
    /// The BOS id and its text, when the model puts one in front of a prompt.
    bos: Option<(u32, String)>,
    eos: Option<u32>,
}

fn compile(source: Option<&str>, origin: &str) -> Result<Option<ChatTemplate>, ChatTokenizerError> {
    source
        .map(|s| {
            ChatTemplate::new(s).map_err(|why| ChatTokenizerError::Template {
                origin: origin.to_string(),
                why,
            })
        })
        .transpose()
}

/// A Jinja template rendered over a JSON context, with the same environment as chat templates
/// (transformers' `tojson`, Python's string methods, trimmed blocks): a decision model's
/// `systemone` template.
pub struct JinjaTemplate {
    template: ChatTemplate,
    origin: String,
}

impl JinjaTemplate {
    /// Compiles `source`; `origin` names it in errors.
    pub fn compile(source: &str, origin: &str) -> Result<JinjaTemplate, ChatTokenizerError> {
        let template = ChatTemplate::new(source).map_err(|why| ChatTokenizerError::Template {
            origin: origin.to_string(),
            why,
        })?;
        Ok(JinjaTemplate {
            template,
            origin: origin.to_string(),
        })
    }

    /// The text for `context` (a JSON object: its keys are the variables).
    pub fn render(&self, context: &serde_json::Value) -> Result<String, ChatTokenizerError> {
        self.template
            .render_json(context)
            .map_err(|f| ChatTokenizerError::Render {
                origin: self.origin.clone(),
                why: f.message().to_string(),
            })
    }

    /// Whether the template reads the variable `name` (without setting it itself).
    pub fn reads(&self, name: &str) -> bool {
        self.template.variables().iter().any(|v| v == name)
    }
}

impl ChatTokenizer {
    /// A Hugging Face folder: `tokenizer.json`, with `tokenizer_config.json` (its
    /// `chat_template`, a string or a list of named templates of which "default" is taken;
    /// `bos_token`/`eos_token`; `add_bos_token`), `special_tokens_map.json` (whose tokens win, as
    /// in transformers), and `chat_template.jinja` or `chat_template.json`, which win over
    /// `tokenizer_config.json`'s template. All but `tokenizer.json` are optional; a folder
    /// without any template loads, and [`render`](Self::render) then says so.
    ///
    /// The model adds a BOS when `add_bos_token` is true, or, where the config does not say,
    /// when `tokenizer.json`'s post-processor puts a token in front of the text.
    pub fn from_dir(dir: &Path) -> Result<ChatTokenizer, ChatTokenizerError> {
        let tokenizer = hf::HfTokenizer::from_dir(dir)?;
        let config = hf::read_config(dir)?;
        let origin = dir.display().to_string();
        let template = compile(config.chat_template.as_deref(), &origin)?;
        let config_path = dir.join("tokenizer_config.json");
        let bos = match config.add_bos_token {
            Some(true) => {
                let text = config
                    .bos_token
                    .clone()
                    .ok_or_else(|| ChatTokenizerError::Config {
                        path: config_path.clone(),
                        why: "add_bos_token is true but no bos_token is named".into(),
                    })?;
                let id =
                    tokenizer
                        .token_to_id(&text)
                        .ok_or_else(|| ChatTokenizerError::Config {
                            path: config_path.clone(),
                            why: format!("bos_token {text:?} is not a token of tokenizer.json"),
                        })?;
                Some((id, text))
            }
            Some(false) => None,
            None => tokenizer
                .post_processor_prefix()
                .and_then(|id| Some((id, tokenizer.id_to_token(id)?))),
        };
        let eos = config
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        Ok(ChatTokenizer {
            backend: Backend::Hf(Box::new(tokenizer)),
            origin,
            template,
            template_tokens: TemplateTokens {
                bos: config.bos_token,
                eos: config.eos_token,
                unk: config.unk_token,
                pad: config.pad_token,
            },
            bos,
            eos,
        })
    }

    /// A GGUF file's own vocabulary (`tokenizer.ggml.*`) and `tokenizer.chat_template`,
    /// tokenised as llama.cpp tokenises it (see [`gguf`]).
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTokenizer, ChatTokenizerError> {
        let (tokenizer, extras) = gguf::GgufTokenizer::from_file(file)?;
        let origin = file.path().display().to_string();
        let template = compile(extras.chat_template.as_deref(), &origin)?;
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.id_to_token(id).map(String::from));
        let template_tokens = TemplateTokens {
            bos: text(extras.bos),
            eos: text(extras.eos),
            unk: text(extras.unk),
            pad: text(extras.pad),
        };
        let bos = if extras.add_bos {
            extras.bos.zip(text(extras.bos))
        } else {
            None
        };
        Ok(ChatTokenizer {
            backend: Backend::Gguf(Box::new(tokenizer)),
            origin,
            template,
            template_tokens,
            bos,
            eos: extras.eos,
        })
    }

    /// The same tokenizer with the chat template the user gave (`--chat-template`): a built-in
    /// name ([`builtin`]; the tokenizer must have its markers as tokens) or a Jinja file's path.
    /// It replaces the checkpoint's own, as llama.cpp's `--chat-template` does.
    pub fn with_template(mut self, given: &str) -> Result<ChatTokenizer, ChatTokenizerError> {
        let (source, origin) = match builtin::builtin(given) {
            Some(b) => {
                if let Some(missing) = b.markers.iter().find(|m| self.token_to_id(m).is_none()) {
                    return Err(ChatTokenizerError::Template {
                        origin: format!("built-in template {}", b.name),
                        why: format!(
                            "{} has no token {missing}, which the template writes; choose the \
                             family's template ({}) or give a Jinja file",
                            self.origin,
                            builtin::names()
                        ),
                    });
                }
                (
                    b.source.to_string(),
                    format!("built-in template {}", b.name),
                )
            }
            None => {
                let path = Path::new(given);
                let text =
                    std::fs::read_to_string(path).map_err(|e| ChatTokenizerError::Template {
                        origin: given.to_string(),
                        why: format!(
                            "neither a built-in template ({}) nor a readable Jinja file: {e}",
                            builtin::names()
                        ),
                    })?;
                (text, path.display().to_string())
            }
        };
        self.template = compile(Some(&source), &origin)?;
        Ok(self)
    }

    /// Ids of `text`: special tokens written in it are recognised, nothing is added (no BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatTokenizerError> {
        match &self.backend {
            Backend::Hf(t) => t.encode(text),
            Backend::Gguf(t) => t.encode(text).map(|(ids, _)| ids),
        }
        .map_err(ChatTokenizerError::Encode)
    }

    /// Text of `ids`, special tokens written out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatTokenizerError> {
        match &self.backend {
            Backend::Hf(t) => t.decode(ids),
            Backend::Gguf(t) => t.decode(ids),
        }
        .map_err(ChatTokenizerError::Decode)
    }

    /// Id of a token given its vocabulary text (`"<|im_end|>"`, `"Ġyes"`, `"▁yes"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::Hf(t) => t.token_to_id(token),
            Backend::Gguf(t) => t.token_to_id(token),
        }
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Hf(t) => t.vocab_size(),
            Backend::Gguf(t) => t.vocab_size(),
        }
    }

    /// Whether the model came with a chat template (without one it cannot be read: the v1
    /// prompt is the model's own template over a system and a user message).
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// A [`ChatTokenizerError::NoTemplate`] naming where the tokenizer came from.
    pub fn no_template_error(&self) -> ChatTokenizerError {
        ChatTokenizerError::NoTemplate {
            origin: self.origin.clone(),
        }
    }

    /// The chat template over `messages` with an open assistant turn
    /// (`add_generation_prompt=True`) and thinking off (`enable_thinking=False`); `bos_token`,
    /// `eos_token` (and `unk_token`, `pad_token` where known) are its variables.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ChatTokenizerError> {
        self.render_inner(messages)
            .map_err(|f| self.render_error(f.message()))
    }

    fn render_inner(&self, messages: &[ChatMessage]) -> Result<String, RenderFailure> {
        let Some(template) = &self.template else {
            return Err(RenderFailure::Failed(
                ChatTokenizerError::NoTemplate {
                    origin: self.origin.clone(),
                }
                .to_string(),
            ));
        };
        template.render(messages, &self.template_tokens)
    }

    fn render_error(&self, why: &str) -> ChatTokenizerError {
        if self.template.is_none() {
            return ChatTokenizerError::NoTemplate {
                origin: self.origin.clone(),
            };
        }
        ChatTokenizerError::Render {
            origin: self.origin.clone(),
            why: why.to_string(),
        }
    }

    /// The BOS id to put in front of `rendered`: `Some` when the model adds one and the text does
    /// not already start with the BOS token's text (templates such as Gemma's and Llama 3's
    /// write it themselves).
    pub fn bos_for(&self, rendered: &str) -> Option<u32> {
        self.bos
            .as_ref()
            .filter(|(_, text)| !rendered.starts_with(text.as_str()))
            .map(|(id, _)| *id)
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The byte offset just past the last special token [`encode`](Self::encode) splits `text`
    /// at, or `None` when it has none.
    pub fn last_special_end(&self, text: &str) -> Option<usize> {
        match &self.backend {
            Backend::Hf(t) => t.last_special_end(text),
            Backend::Gguf(t) => t.last_special_end(text),
        }
    }

    /// Where the vocabulary came from (`tokenizer.json` or the GGUF file).
    pub fn source(&self) -> &Path {
        match &self.backend {
            Backend::Hf(t) => t.path(),
            Backend::Gguf(t) => t.path(),
        }
    }
}

impl ChatTokenizer {
    /// The template over a system and a user message. A template that refuses a system role
    /// (Gemma 2's raises "System role not supported") gets one user message instead: the
    /// system text, a blank line, then the user text, which is what such models were trained
    /// to read as instructions.
    pub fn render_system_user(&self, system: &str, user: &str) -> Result<String, String> {
        let messages = [
            ChatMessage::new("system", system),
            ChatMessage::new("user", user),
        ];
        match self.render_inner(&messages) {
            Ok(text) => Ok(text),
            Err(RenderFailure::Raised(refusal)) => {
                let folded = [ChatMessage::new("user", format!("{system}\n\n{user}"))];
                self.render_inner(&folded).map_err(|f| {
                    format!(
                        "{} (the template refused a system message: {refusal}; with the \
                         system text folded into the user message it failed too)",
                        self.render_error(f.message())
                    )
                })
            }
            Err(f) => Err(self.render_error(f.message()).to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
