//! llama.cpp's decision models: a GGUF whose metadata carries `{arch}.decision.type` was trained
//! to answer System One questions from a prompt of its own (the named chat template
//! `tokenizer.chat_template.systemone`), read at fitted temperatures
//! (`{arch}.decision.temperature.<type>[.<bucket>]`). This module reads those keys as
//! llama-server reads them, and refuses a type Hunch does not serve by name (docs/models.md,
//! "Decision models"). The prompt and the answer are the read's (`read::decision`).

use std::collections::BTreeMap;

use super::{GgufFile, MetaValue};

/// The decision types Hunch serves: the label-logit ones, whose answer is the next-token
/// logits of one single-token label per option at the prompt's last token; kev, read through
/// its pointer head at each option's marker; laya, a ModernBERT encoder's head read at each
/// option's mask marker.
pub const SERVED_DECISION_TYPES: &[&str] =
    &["openjev", "lev", "pplx-decider", "nimble", "kev", "laya"];

/// The types llama-server knows that Hunch does not serve, with why.
const UNSERVED_DECISION_TYPES: &[(&str, &str)] = &[
    ("clef", "it reads a joint decision head of its own"),
    (
        "lfm2-d1",
        "it reads label groups of the LFM2 family, which Hunch does not load",
    ),
    (
        "lfm2-d1-omni",
        "it reads a head of its own over the LFM2 family, which Hunch does not load",
    ),
];

/// A served decision type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecisionKind {
    /// One letter per option (`A`–`Z`, then `a`–`z`), `true` listed before `false`.
    Openjev,
    /// Codes `A`…`Z`, `AA`…`ZZ` (the single-token ones), a choice asked twice (the options
    /// reversed the second time) and averaged, a noul read on a 9-point scale, keys sorted.
    Lev,
    /// Codes as lev's, one reading per question.
    PplxDecider,
    /// Codes as lev's, one reading per question, whose prompt names the question by the
    /// caller's id and lists every question of the request.
    Nimble,
    /// A pointer head over hidden states: each option read at its `<|box_end|>` marker against
    /// the prompt's last position, the template given text (`read::decision`'s `kev`).
    Kev,
    /// A ModernBERT encoder with a decision head, each option read at the mask token that opens
    /// it, the question and options cut to the head's token budget (`read::decision`'s
    /// `laya`).
    Laya,
}

impl DecisionKind {
    /// The type's name as the metadata spells it.
    pub fn name(self) -> &'static str {
        match self {
            DecisionKind::Openjev => "openjev",
            DecisionKind::Lev => "lev",
            DecisionKind::PplxDecider => "pplx-decider",
            DecisionKind::Nimble => "nimble",
            DecisionKind::Kev => "kev",
            DecisionKind::Laya => "laya",
        }
    }

    /// The served type named `name`, or why it is not served.
    pub fn parse(name: &str) -> Result<DecisionKind, DecisionMetadataError> {
        match name {
            "openjev" => Ok(DecisionKind::Openjev),
            "lev" => Ok(DecisionKind::Lev),
            "pplx-decider" => Ok(DecisionKind::PplxDecider),
            "nimble" => Ok(DecisionKind::Nimble),
            "kev" => Ok(DecisionKind::Kev),
            "laya" => Ok(DecisionKind::Laya),
            _ => Err(
                match UNSERVED_DECISION_TYPES.iter().find(|(n, _)| *n == name) {
                    Some((_, why)) => DecisionMetadataError::NotServed {
                        name: name.to_string(),
                        why,
                    },
                    None => DecisionMetadataError::UnknownType {
                        name: name.to_string(),
                    },
                },
            ),
        }
    }
}

/// What a decision GGUF says about its read.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionMetadata {
    pub kind: DecisionKind,
    /// The `systemone` template's Jinja source.
    pub template: String,
    /// Fitted temperatures by name (`choice`, `choice.3_5`, `noul.small`, …), each > 0.
    pub temperatures: BTreeMap<String, f32>,
    /// laya: what its prompt is laid out with; `None` for the other types.
    pub laya: Option<LayaMetadata>,
}

/// What a laya model's prompt is laid out with: `[CLS] question [SEP] ([MASK] option)* [SEP]
/// state [SEP]` in the file's own tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct LayaMetadata {
    /// The head's token budget for the question and its options
    /// (`{arch}.decision.max_head_tokens`, > 0).
    pub max_head_tokens: usize,
    /// The marker that opens each option (`tokenizer.ggml.mask_token_id`).
    pub mask: u32,
    /// The separator (`tokenizer.ggml.seperator_token_id`, llama.cpp's spelling).
    pub sep: u32,
    /// The mask token's text, which llama-server replaces by a space wherever the request's
    /// strings contain it.
    pub mask_text: String,
}

/// Why a decision GGUF cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecisionMetadataError {
    #[error(
        "decision type {name:?} is not served by Hunch: {why} (Hunch serves {})",
        SERVED_DECISION_TYPES.join(", ")
    )]
    NotServed { name: String, why: &'static str },
    #[error(
        "unknown decision type {name:?} (Hunch serves {}; llama-server also knows laya, clef, \
         lfm2-d1 and lfm2-d1-omni)",
        SERVED_DECISION_TYPES.join(", ")
    )]
    UnknownType { name: String },
    #[error("{key} must be a string naming the decision type, not {got}")]
    TypeNotString { key: String, got: &'static str },
    #[error("decision model has no \"systemone\" template (tokenizer.chat_template.systemone)")]
    NoTemplate,
    #[error("invalid decision temperature: {key} = {value} (a temperature must be a number > 0)")]
    Temperature { key: String, value: String },
    #[error("decision model has no valid max_head_tokens ({key}: {got})")]
    MaxHeadTokens { key: String, got: String },
    #[error(
        "decision model has no mask or sep token (tokenizer.ggml.mask_token_id and \
         tokenizer.ggml.seperator_token_id must name tokens of the vocabulary): {0}"
    )]
    NoMaskOrSep(String),
}

/// The key that makes a GGUF of architecture `arch` a decision model.
pub fn decision_type_key(arch: &str) -> String {
    format!("{arch}.decision.type")
}

/// The decision metadata of `file`, or `None` for a file that is not a decision model.
pub fn decision_metadata(
    file: &GgufFile,
) -> Result<Option<DecisionMetadata>, DecisionMetadataError> {
    let Some(arch) = file.architecture() else {
        return Ok(None);
    };
    let type_key = decision_type_key(arch);
    let Some(value) = file.get(&type_key) else {
        return Ok(None);
    };
    let MetaValue::String(name) = value else {
        return Err(DecisionMetadataError::TypeNotString {
            key: type_key,
            got: value.type_name(),
        });
    };
    let kind = DecisionKind::parse(name)?;
    let template = file
        .string("tokenizer.chat_template.systemone")
        .ok_or(DecisionMetadataError::NoTemplate)?
        .to_string();
    let prefix = format!("{arch}.decision.temperature.");
    let mut temperatures = BTreeMap::new();
    for (key, value) in file.metadata() {
        let Some(name) = key.strip_prefix(&prefix) else {
            continue;
        };
        let text = as_llama_string(value);
        let temperature = text
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| DecisionMetadataError::Temperature {
                key: key.clone(),
                value: text.clone(),
            })?;
        temperatures.insert(name.to_string(), temperature);
    }
    let laya = match kind {
        DecisionKind::Laya => Some(laya_metadata(file, arch)?),
        _ => None,
    };
    Ok(Some(DecisionMetadata {
        kind,
        template,
        temperatures,
        laya,
    }))
}

/// A laya model's budget and special tokens, each refused as llama-server refuses it.
fn laya_metadata(file: &GgufFile, arch: &str) -> Result<LayaMetadata, DecisionMetadataError> {
    let max_head_tokens = max_head_tokens(file, arch)?;
    let tokens = file
        .strings("tokenizer.ggml.tokens")
        .map_err(|e| DecisionMetadataError::NoMaskOrSep(e.to_string()))?;
    let special = |key: &str| -> Result<u32, DecisionMetadataError> {
        let id = file
            .uint(key)
            .ok_or_else(|| DecisionMetadataError::NoMaskOrSep(format!("{key} is missing")))?;
        if id as usize >= tokens.len() {
            return Err(DecisionMetadataError::NoMaskOrSep(format!(
                "{key} = {id}, past the {} tokens",
                tokens.len()
            )));
        }
        Ok(id as u32)
    };
    let mask = special("tokenizer.ggml.mask_token_id")?;
    let sep = special("tokenizer.ggml.seperator_token_id")?;
    Ok(LayaMetadata {
        max_head_tokens,
        mask,
        sep,
        mask_text: tokens[mask as usize].to_string(),
    })
}

/// A laya model's `max_head_tokens`: llama-server parses the key's text as a count and refuses
/// the model where that is missing or 0.
fn max_head_tokens(file: &GgufFile, arch: &str) -> Result<usize, DecisionMetadataError> {
    let key = format!("{arch}.decision.max_head_tokens");
    let text = file.get(&key).map(as_llama_string);
    text.as_deref()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| DecisionMetadataError::MaxHeadTokens {
            key,
            got: text.unwrap_or_else(|| "missing".into()),
        })
}

/// A scalar as llama.cpp's `llama_model_meta_val_str` writes it, which is what llama-server
/// parses a temperature from: integers in decimal, floats as C's `%f` (six decimals, so a
/// float32 temperature is rounded to a millionth), strings as they are.
fn as_llama_string(value: &MetaValue) -> String {
    match value {
        MetaValue::F32(x) => format!("{:.6}", f64::from(*x)),
        MetaValue::F64(x) => format!("{x:.6}"),
        MetaValue::String(s) => s.clone(),
        MetaValue::Bool(b) => b.to_string(),
        other => other
            .as_i64()
            .map(|i| i.to_string())
            .or_else(|| other.as_u64().map(|u| u.to_string()))
            .unwrap_or_else(|| other.type_name().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_llama_server_knows_is_served_or_refused_by_name() {
        for name in SERVED_DECISION_TYPES {
            assert_eq!(DecisionKind::parse(name).map(DecisionKind::name), Ok(*name));
        }
        for (name, _) in UNSERVED_DECISION_TYPES {
            let err = DecisionKind::parse(name).expect_err(name).to_string();
            assert!(
                err.contains(name) && err.contains("openjev, lev, pplx-decider"),
                "{err}"
            );
        }
        let err = DecisionKind::parse("future-decision")
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("unknown decision type \"future-decision\""),
            "{err}"
        );
    }

    #[test]
    fn temperatures_read_as_llama_server_reads_them() {
        assert_eq!(as_llama_string(&MetaValue::F32(1.25)), "1.250000");
        // %f rounds a float32 to six decimals; llama-server parses that back.
        assert_eq!(as_llama_string(&MetaValue::F32(0.123_456_79)), "0.123457");
        assert_eq!(as_llama_string(&MetaValue::String("1.75".into())), "1.75");
        assert_eq!(as_llama_string(&MetaValue::U32(2)), "2");
    }
}
