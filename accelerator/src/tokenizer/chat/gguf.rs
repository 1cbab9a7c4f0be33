//! A chat tokenizer from a GGUF file's own vocabulary, tokenising as llama.cpp does.
//!
//! - `tokenizer.ggml.model` = `gpt2`: byte-level BPE. The text between special tokens is split
//!   by the pre-tokenizer regexes `tokenizer.ggml.pre` names (llama.cpp's table in
//!   `llama-vocab.cpp`; an unknown name is refused), mapped to GPT-2's byte alphabet and merged
//!   by `tokenizer.ggml.merges` rank. That part is a `tokenizers` BPE built here.
//! - `tokenizer.ggml.model` = `llama`: SentencePiece, merged by `tokenizer.ggml.scores`
//!   ([`super::spm`]), spaces written `▁`, characters outside the vocabulary as `<0xNN>` byte
//!   tokens, and a space put in front of the text and of every fragment after a special token
//!   unless `tokenizer.ggml.add_space_prefix` is false (Gemma's GGUFs set it false).
//!
//! Both split the text at special tokens first ([`super::special`]): tokens of type control (3),
//! user-defined (4) or unknown (2), and the end-of-turn texts llama.cpp makes control.

use super::error::ChatTokenizerError;
use super::special::{Fragment, Specials, TokenKind, FORCED_CONTROL};
use super::spm::SpmModel;
use crate::checkpoint::gguf::GgufFile;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

/// GPT-2's pre-tokenizer regex (`ByteLevel`'s `use_regex`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's (digits in runs of up to three).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's and Qwen3's (single digits).
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's (combining marks kept with letters).
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's (also Llama 4's and Phi-4's).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` splits text before BPE.
struct PreTokenizer {
    names: &'static [&'static str],
    /// Applied in order, each splitting the pieces the previous one left (matches isolated).
    regexes: &'static [&'static str],
    /// Take a whole pre-token that is in the vocabulary as it is, without merging.
    ignore_merges: bool,
    /// Whether llama.cpp adds BOS when `tokenizer.ggml.add_bos_token` is absent.
    add_bos: bool,
}

const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        names: &["default"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        regexes: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        regexes: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizer {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "stablelm2",
            "megrez",
            "hunyuan",
            "solar-open",
        ],
        regexes: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["qwen35"],
        regexes: &[QWEN35],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["gpt-4o", "llama4", "kanana2", "talkie"],
        regexes: &[GPT4O],
        ignore_merges: false,
        add_bos: false,
    },
];

/// Every `tokenizer.ggml.pre` name this reader knows, for the refusal of another.
pub(super) fn known_pre_names() -> String {
    let names: Vec<&str> = PRE_TOKENIZERS
        .iter()
        .flat_map(|p| p.names.iter().copied())
        .collect();
    names.join(", ")
}

enum Model {
    Bpe(Box<Tokenizer>),
    Spm {
        model: SpmModel,
        add_space_prefix: bool,
    },
}

/// A GGUF vocabulary and its tokeniser.
pub(super) struct GgufTokenizer {
    path: PathBuf,
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    by_text: HashMap<String, u32>,
    specials: Specials,
    model: Model,
}

/// What [`GgufTokenizer::from_file`] read besides the vocabulary.
pub(super) struct GgufExtras {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

/// The keys read, for tests that build a vocabulary without a file.
pub(super) struct GgufVocab<'a> {
    pub model: &'a str,
    pub pre: Option<&'a str>,
    pub tokens: Vec<&'a str>,
    pub types: Option<Vec<i32>>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<&'a str>>,
    pub add_space_prefix: Option<bool>,
    pub unk: Option<u32>,
}

fn key_error(path: &Path, key: &str, why: impl Into<String>) -> ChatTokenizerError {
    ChatTokenizerError::Gguf {
        path: path.to_path_buf(),
        key: key.to_string(),
        why: why.into(),
    }
}

impl GgufTokenizer {
    pub fn from_file(file: &GgufFile) -> Result<(GgufTokenizer, GgufExtras), ChatTokenizerError> {
        let path = file.path();
        let meta = |e: crate::checkpoint::gguf::GgufError| match e {
            crate::checkpoint::gguf::GgufError::Metadata { key, why, .. } => {
                key_error(path, &key, why)
            }
            other => ChatTokenizerError::Load {
                path: path.to_path_buf(),
                why: other.to_string(),
            },
        };
        let model = file.string("tokenizer.ggml.model").ok_or_else(|| {
            key_error(
                path,
                "tokenizer.ggml.model",
                match file.get("tokenizer.ggml.model") {
                    Some(v) => format!("a {}, not a string", v.type_name()),
                    None => "not in the file: this GGUF carries no tokenizer".to_string(),
                },
            )
        })?;
        let optional = |key: &str| file.get(key).is_some();
        let vocab = GgufVocab {
            model,
            pre: file.string("tokenizer.ggml.pre"),
            tokens: file.strings("tokenizer.ggml.tokens").map_err(meta)?,
            types: optional("tokenizer.ggml.token_type")
                .then(|| file.i32s("tokenizer.ggml.token_type"))
                .transpose()
                .map_err(meta)?,
            scores: optional("tokenizer.ggml.scores")
                .then(|| file.f32s("tokenizer.ggml.scores"))
                .transpose()
                .map_err(meta)?,
            merges: optional("tokenizer.ggml.merges")
                .then(|| file.strings("tokenizer.ggml.merges"))
                .transpose()
                .map_err(meta)?,
            add_space_prefix: file.boolean("tokenizer.ggml.add_space_prefix"),
            unk: file
                .uint("tokenizer.ggml.unknown_token_id")
                .and_then(|u| u32::try_from(u).ok()),
        };
        let tokenizer = GgufTokenizer::new(path, &vocab)?;
        let n = tokenizer.tokens.len();
        let id = |key: &str| -> Result<Option<u32>, ChatTokenizerError> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                    Some(id) => Err(key_error(
                        path,
                        key,
                        format!("id {id} is past the vocabulary's {n} tokens"),
                    )),
                    None => Err(key_error(
                        path,
                        key,
                        format!("a {}, not a token id", v.type_name()),
                    )),
                },
            }
        };
        let is_spm = matches!(tokenizer.model, Model::Spm { .. });
        let default_add_bos = if is_spm {
            true
        } else {
            pre_tokenizer(path, vocab.pre)?.add_bos
        };
        let add_bos = file
            .boolean("tokenizer.ggml.add_bos_token")
            .unwrap_or(default_add_bos);
        // llama.cpp's defaults when the file names no BOS: 1 for SentencePiece, 11 for BPE.
        let bos = match id("tokenizer.ggml.bos_token_id")? {
            Some(bos) => Some(bos),
            None => {
                let default = if is_spm { 1 } else { 11 };
                (default < n).then_some(default as u32)
            }
        };
        if add_bos && bos.is_none() {
            return Err(key_error(
                path,
                "tokenizer.ggml.bos_token_id",
                "not set, but tokenizer.ggml.add_bos_token asks for a BOS",
            ));
        }
        let chat_template = match file.get("tokenizer.chat_template") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| {
                        key_error(
                            path,
                            "tokenizer.chat_template",
                            format!("a {}, not a string", v.type_name()),
                        )
                    })?
                    .to_string(),
            ),
        };
        let extras = GgufExtras {
            bos,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos,
            chat_template,
        };
        Ok((tokenizer, extras))
    }

    pub fn new(path: &Path, vocab: &GgufVocab<'_>) -> Result<GgufTokenizer, ChatTokenizerError> {
        let n = vocab.tokens.len();
        let short = |key: &str, len: usize| {
            key_error(
                path,
                key,
                format!("{len} entries for {n} tokens in tokenizer.ggml.tokens"),
            )
        };
        let mut kinds: Vec<TokenKind> = match &vocab.types {
            Some(t) if t.len() < n => return Err(short("tokenizer.ggml.token_type", t.len())),
            Some(t) => t[..n].iter().map(|&t| TokenKind::from_gguf(t)).collect(),
            None => vec![TokenKind::Normal; n],
        };
        let mut tokens: Vec<String> = Vec::with_capacity(n);
        let mut by_text = HashMap::with_capacity(n);
        for (i, &t) in vocab.tokens.iter().enumerate() {
            // llama.cpp's name for an empty token, so that it can never match.
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.to_string()
            };
            if let Some(first) = by_text.insert(text.clone(), i as u32) {
                return Err(key_error(
                    path,
                    "tokenizer.ggml.tokens",
                    format!("{text:?} appears twice, as ids {first} and {i}"),
                ));
            }
            tokens.push(text);
        }
        for text in FORCED_CONTROL {
            if let Some(&id) = by_text.get(*text) {
                if !kinds[id as usize].is_special() {
                    kinds[id as usize] = TokenKind::Control;
                }
            }
        }
        let specials = Specials::new(
            kinds
                .iter()
                .enumerate()
                .filter(|(_, k)| k.is_special())
                .map(|(i, _)| (i as u32, tokens[i].as_str())),
        );
        let model = match vocab.model {
            "gpt2" => {
                let pre = pre_tokenizer(path, vocab.pre)?;
                let merges = vocab.merges.as_ref().ok_or_else(|| {
                    key_error(
                        path,
                        "tokenizer.ggml.merges",
                        "not in the file; byte-level BPE needs its merges",
                    )
                })?;
                Model::Bpe(Box::new(bpe(path, &by_text, merges, pre)?))
            }
            "llama" => {
                let scores = match &vocab.scores {
                    Some(s) if s.len() < n => return Err(short("tokenizer.ggml.scores", s.len())),
                    Some(s) => s[..n].to_vec(),
                    None => vec![0.0; n],
                };
                let unk = vocab.unk.filter(|&u| (u as usize) < n);
                Model::Spm {
                    model: SpmModel::new(by_text.clone(), scores, unk),
                    add_space_prefix: vocab.add_space_prefix.unwrap_or(true),
                }
            }
            other => {
                return Err(ChatTokenizerError::UnknownModel {
                    path: path.to_path_buf(),
                    model: other.to_string(),
                })
            }
        };
        Ok(GgufTokenizer {
            path: path.to_path_buf(),
            tokens,
            kinds,
            by_text,
            specials,
            model,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.by_text.get(token).copied()
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Ids of `text` (llama.cpp's `tokenize(text, add_special=false, parse_special=true)`) and
    /// the byte offset just past the last special token.
    pub fn encode(&self, text: &str) -> Result<(Vec<u32>, Option<usize>), String> {
        let mut out = Vec::new();
        let mut last_special = None;
        let mut prev_special = true;
        for fragment in self.specials.partition(text) {
            match fragment {
                Fragment::Special(id, range) => {
                    out.push(id);
                    last_special = Some(range.end);
                    prev_special = true;
                }
                Fragment::Text(range) => {
                    let piece = &text[range];
                    match &self.model {
                        Model::Bpe(tokenizer) => {
                            let enc = tokenizer.encode(piece, false).map_err(|e| e.to_string())?;
                            out.extend_from_slice(enc.get_ids());
                        }
                        Model::Spm {
                            model,
                            add_space_prefix,
                        } => {
                            let prefix = if *add_space_prefix && prev_special {
                                "▁"
                            } else {
                                ""
                            };
                            let escaped = format!("{prefix}{}", piece.replace(' ', "▁"));
                            model.encode(&escaped, &mut out)?;
                        }
                    }
                    prev_special = false;
                }
            }
        }
        Ok((out, last_special))
    }

    pub fn last_special_end(&self, text: &str) -> Option<usize> {
        self.specials
            .partition(text)
            .iter()
            .rev()
            .find_map(|f| match f {
                Fragment::Special(_, range) => Some(range.end),
                Fragment::Text(_) => None,
            })
    }

    /// Text of `ids` as llama.cpp's `detokenize(remove_special=false, unparse_special=true)`
    /// writes it, without its clean-up of spaces before punctuation: special tokens as their
    /// text, byte tokens as bytes, unused tokens as nothing; SentencePiece's space prefix
    /// removed from the first token.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let (Some(text), Some(kind)) = (
                self.tokens.get(id as usize),
                self.kinds.get(id as usize).copied(),
            ) else {
                return Err(format!(
                    "id {id} is past the vocabulary's {} tokens",
                    self.tokens.len()
                ));
            };
            let start = bytes.len();
            match (kind, &self.model) {
                (k, _) if k.is_special() => bytes.extend_from_slice(text.as_bytes()),
                (TokenKind::Normal, Model::Bpe(_)) => {
                    for c in text.chars() {
                        match byte_of_char(c) {
                            Some(b) => bytes.push(b),
                            None => bytes.extend_from_slice(c.to_string().as_bytes()),
                        }
                    }
                }
                (TokenKind::Normal, Model::Spm { .. }) => {
                    bytes.extend_from_slice(text.replace('▁', " ").as_bytes())
                }
                (TokenKind::Byte, _) => match parse_byte_token(text) {
                    Some(b) => bytes.push(b),
                    None => bytes.extend_from_slice(text.as_bytes()),
                },
                _ => {}
            }
            if let Model::Spm {
                add_space_prefix: true,
                ..
            } = self.model
            {
                if i == 0 && bytes.get(start) == Some(&b' ') {
                    bytes.remove(start);
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// The byte GPT-2's byte-level alphabet writes as `c`: printable Latin-1 bytes as themselves,
/// the other 68 bytes as U+0100 onwards in byte order.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let code = c as u32;
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    let index = code - 0x100;
    (0u32..0x100)
        .filter(|&b| !printable(b))
        .nth(index as usize)
        .map(|b| b as u8)
}

fn pre_tokenizer(
    path: &Path,
    pre: Option<&str>,
) -> Result<&'static PreTokenizer, ChatTokenizerError> {
    // llama.cpp reads a missing pre-tokenizer as "default" (with a loud warning).
    let name = pre.unwrap_or("default");
    PRE_TOKENIZERS
        .iter()
        .find(|p| p.names.contains(&name))
        .ok_or_else(|| ChatTokenizerError::UnknownPre {
            path: path.to_path_buf(),
            pre: name.to_string(),
            known: known_pre_names(),
        })
}

fn bpe(
    path: &Path,
    vocab: &HashMap<String, u32>,
    merges: &[&str],
    pre: &PreTokenizer,
) -> Result<Tokenizer, ChatTokenizerError> {
    let load = |why: String| ChatTokenizerError::Load {
        path: path.to_path_buf(),
        why,
    };
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, merge) in merges.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte.
        let at = merge
            .bytes()
            .enumerate()
            .skip(1)
            .find(|&(_, b)| b == b' ')
            .map(|(at, _)| at)
            .ok_or_else(|| {
                key_error(
                    path,
                    "tokenizer.ggml.merges",
                    format!("merge {i} ({merge:?}) is not two tokens separated by a space"),
                )
            })?;
        pairs.push((merge[..at].to_string(), merge[at + 1..].to_string()));
    }
    let vocab: Vocab = vocab.iter().map(|(t, &id)| (t.clone(), id)).collect();
    let model = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| load(format!("building the BPE from tokenizer.ggml.merges: {e}")))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| load(format!("pre-tokenizer regex {regex:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tokenizer)
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
