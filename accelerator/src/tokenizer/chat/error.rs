//! What can go wrong loading a chat tokenizer or using it; every load error names the file (and
//! the key) that is wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ChatTokenizerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{dir} has no tokenizer.json; a chat model's Hugging Face folder needs one (a GGUF file \
         carries its own vocabulary instead)"
    )]
    NoTokenizerJson { dir: PathBuf },
    /// `tokenizer.json` (or a vocabulary built from a GGUF) that `tokenizers` refuses.
    #[error("loading tokenizer {path}: {why}")]
    Load { path: PathBuf, why: String },
    /// A JSON file that does not parse, or a key in it of the wrong shape.
    #[error("{path}: {why}")]
    Config { path: PathBuf, why: String },
    /// A GGUF tokenizer key that is missing or does not hold what it must.
    #[error("{path}: metadata {key}: {why}")]
    Gguf {
        path: PathBuf,
        key: String,
        why: String,
    },
    #[error(
        "{path}: tokenizer.ggml.model is {model:?}; this reader knows \"gpt2\" (byte-level BPE) \
         and \"llama\" (SentencePiece)"
    )]
    UnknownModel { path: PathBuf, model: String },
    #[error(
        "{path}: tokenizer.ggml.pre is {pre:?}, a pre-tokenizer this reader does not know (it \
         knows {known}); without its split the ids would differ from the model's"
    )]
    UnknownPre {
        path: PathBuf,
        pre: String,
        known: String,
    },
    /// The chat template does not compile.
    #[error("chat template of {origin}: {why}")]
    Template { origin: String, why: String },
    #[error("{origin} has no chat template (tokenizer_config.json's chat_template, chat_template.jinja, chat_template.json or the GGUF's tokenizer.chat_template); give one: `hunch serve --chat-template NAME=TEMPLATE` beside its --model, or the model's `chat_template` in hunch-models.toml, TEMPLATE a built-in name (chatml, llama3, gemma) or a Jinja file's path")]
    NoTemplate { origin: String },
    /// The template failed on these messages (a `raise_exception` included).
    #[error("rendering the chat template of {origin}: {why}")]
    Render { origin: String, why: String },
    #[error("tokenising: {0}")]
    Encode(String),
    #[error("detokenising: {0}")]
    Decode(String),
}
