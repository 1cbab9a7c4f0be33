//! `hunch-core` is Hunch's vocabulary: typed System One questions, the label distributions a
//! [`Reader`] answers them with, and the one piece of code that turns distributions into
//! TypeSafe-shaped answers (argmax, expectation, confidence).
//!
//! Everything that crosses a crate boundary — the raw HTTP API, the policy runtime, the
//! accelerator sidecar — speaks these types, so validation happens once at the edge and the rest
//! of the system never sees untyped JSON.

pub mod answer;
pub mod answering;
pub mod cache;
pub mod caching;
pub mod calibration;
pub mod date;
pub mod debias;
pub mod duration;
pub mod protocol;
pub mod question;
pub mod reader;
pub mod remedy;
pub mod size;
pub mod text;

pub use answer::{Answer, AnswerError};
pub use answering::{answer_set, AnswerSettings, AnsweredSet, AskedQuestion, SetError};
pub use cache::{AnswerCache, CacheKey, CacheStats};
pub use caching::CachingReader;
pub use debias::DebiasingReader;
pub use question::{
    ChoiceOption, Question, QuestionError, QuestionId, QuestionKind, QuestionLimits,
    MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS,
};
pub use reader::{
    EngineGauges, LabelDistribution, QuestionMode, ReadError, ReadErrorKind, ReadOptions,
    ReadOutcome, ReadRequest, ReadStats, Reader, ReaderInfo, ReaderLimits, RequestQuestions, Usage,
    READ_ALGORITHM_VERSION,
};
pub use remedy::{OrderMode, PriorMode, UnknownMode};
