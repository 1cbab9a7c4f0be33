//! Hunch's domain: typed System One questions, label distributions, answers and the `Reader`
//! trait. Everything that reads (the raw API, decision policies) speaks these types.

pub mod answer;
pub mod question;
pub mod reader;
pub mod text;

pub use answer::{Answer, AnswerError};
pub use question::{ChoiceOption, Question, QuestionId, QuestionKind};
pub use reader::{
    LabelDistribution, ReadError, ReadOptions, ReadOutcome, ReadRequest, ReadStats, Reader, Usage,
};
