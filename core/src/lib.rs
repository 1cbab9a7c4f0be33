//! `hunch-core` is Hunch's vocabulary: typed System One questions, the label distributions a
//! [`Reader`] answers them with, and the one piece of code that turns distributions into
//! TypeSafe-shaped answers (argmax, expectation, confidence).
//!
//! Everything that crosses a crate boundary — the raw HTTP API, the policy runtime, the
//! accelerator sidecar — speaks these types, so validation happens once at the edge and the rest
//! of the system never sees untyped JSON.

pub mod answer;
pub mod question;
pub mod reader;
pub mod text;

pub use answer::{Answer, AnswerError};
pub use question::{ChoiceOption, Question, QuestionId, QuestionKind};
pub use reader::{
    EngineGauges, LabelDistribution, ReadError, ReadOptions, ReadOutcome, ReadRequest, ReadStats,
    Reader, Usage,
};
