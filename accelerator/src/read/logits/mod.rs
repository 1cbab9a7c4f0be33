//! The label-logit read (simple-jev prompt structure v1) for causal chat models.
//!
//! Each question gets one scoring sequence: the model's chat template over v1's system message
//! (a fixed base text and a briefing that lists the questions' instructions) and a user message
//! (the state, a reminder and the selected question asked twice), with the assistant's answer
//! opened by a prefill (`{"answer": "` before letter labels, `{"answer": ` before digits). One
//! forward pass gives the next-token logits; the logits of the question's permitted labels,
//! normalised among themselves, are its label distribution (docs/logit-read.md).
//!
//! - [`prompt`]: the v1 texts and [`v1_messages`] (the texts alone, for goldens).
//! - [`canonical`]: canonical JSON and the reconstruction of JSON values from rendered text.
//! - [`labels`]: label schemes, choice labels past v1's 50 letters, the boundary check.
//! - [`score`]: softmax over the labels, the noul formula.
//! - [`plan`]: [`LogitPlanner`], which turns a `ReadRequest` into token sequences.
//!
//! # Reconstructing values from rendered text
//!
//! The accelerator protocol carries the state, instructions and descriptions as text rendered by
//! the host's `render_value` (strings verbatim, other JSON as Python-style JSON), while v1 renders
//! JSON values. A text that parses as a JSON object or array is read as that structure and
//! written canonically (keys sorted); any other text is a string (quoted where v1 writes a JSON
//! value, verbatim where it writes instruction text). This is ambiguous in one direction: a
//! caller's *string* whose text is itself a JSON object or array (`"{\"a\": 1}"`) reads as the
//! object. Null instructions arrive as the empty string and are asked as such (v1 would write
//! `null`); a null score level likewise arrives as an empty string.
//!
//! # Draws and seeds
//!
//! The read is one deterministic forward pass: a request's `draws` and `seed` (`x_draws`,
//! `x_seed`) are accepted and have no effect on it.

pub mod canonical;
pub mod labels;
pub mod plan;
pub mod prompt;
pub mod score;

pub use labels::LabelError;
pub use labels::Prefill;
pub use plan::{LogitPlan, LogitPlanner, ScoringSequence};
pub use prompt::v1_messages;
pub use score::Scoring;

/// What the label-logit read needs from a chat model's tokenizer.
pub trait PromptTokenizer {
    /// The model's own chat template over a system and a user message with an open assistant
    /// turn (`add_generation_prompt`, thinking disabled).
    fn render_chat(&self, system: &str, user: &str) -> Result<String, String>;

    /// Rendered text to ids (special tokens in the text recognised, nothing added).
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;

    /// The BOS the model wants in front of `rendered`, if any (none when the template already
    /// wrote it).
    fn bos_for(&self, rendered: &str) -> Option<u32>;

    /// The byte offset in `text` just past the last special (or added) token that
    /// [`encode`](Self::encode) splits the text at before tokenising the stretches between them,
    /// or `None` when `text` has none or the tokenizer cannot say.
    ///
    /// It lets the planner check the answer labels once per tokenizer instead of once per
    /// request (see [`labels`]); `None` is always correct, only slower: every request then
    /// checks each label by encoding its whole prompt followed by the label.
    fn last_special_end(&self, text: &str) -> Option<usize> {
        let _ = text;
        None
    }
}

/// The chat models' tokenizer, implemented here where the trait is owned so that `tokenizer`
/// never imports `read` (imports run one way, docs/architecture.md).
impl PromptTokenizer for crate::tokenizer::chat::ChatTokenizer {
    fn render_chat(&self, system: &str, user: &str) -> Result<String, String> {
        self.render_system_user(system, user)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        crate::tokenizer::chat::ChatTokenizer::encode(self, text).map_err(|e| e.to_string())
    }

    fn bos_for(&self, rendered: &str) -> Option<u32> {
        crate::tokenizer::chat::ChatTokenizer::bos_for(self, rendered)
    }

    fn last_special_end(&self, text: &str) -> Option<usize> {
        crate::tokenizer::chat::ChatTokenizer::last_special_end(self, text)
    }
}

#[cfg(test)]
mod chat_tokenizer_tests {
    use crate::tokenizer::chat::ChatTokenizer;

    /// A real chat tokenizer (the tiny Llama checkpoint's folder) answers what the label
    /// tables ask of it. Kept here, beside the impl, so the tokenizer never imports the read.
    #[test]
    fn prompt_tokenizer_builds_label_tables() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal/tiny-llama");
        let t = ChatTokenizer::from_dir(&dir).expect("loads");
        crate::read::logits::plan::label_tables(&t).expect("tables");
    }
}
