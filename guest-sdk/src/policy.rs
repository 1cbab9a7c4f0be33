//! The `Policy` trait a policy implements, and the `Host` it decides with.

use crate::answer::{AnswerLookupError, Answers};
use crate::question::QuestionSet;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Why a read failed (mirrors the WIT `read-error`; `hunch_core::ReadErrorKind` on the server.
/// A guest does not link `hunch-core`, whose `serde_json` features would make every policy
/// import more WASI than the host grants: docs/architecture.md, "Duplication").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadErrorKind {
    InvalidQuestion,
    TooLarge,
    Unavailable,
    Timeout,
    Rejected,
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub kind: ReadErrorKind,
    pub message: String,
    /// Index of the offending question in its set.
    pub question: Option<u32>,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "read failed ({:?}): {}", self.kind, self.message)
    }
}

impl std::error::Error for ReadError {}

/// Why a policy declined to decide.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyError {
    InvalidInput(String),
    ReadFailed(ReadError),
    Failed(String),
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyError::InvalidInput(m) => write!(f, "invalid input: {m}"),
            PolicyError::ReadFailed(e) => write!(f, "{e}"),
            PolicyError::Failed(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for PolicyError {}

impl From<ReadError> for PolicyError {
    fn from(e: ReadError) -> Self {
        PolicyError::ReadFailed(e)
    }
}

impl From<AnswerLookupError> for PolicyError {
    fn from(e: AnswerLookupError) -> Self {
        PolicyError::Failed(e.to_string())
    }
}

/// Log levels of the host log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What a policy can do with the outside world: read and log. Nothing else exists.
pub trait Host {
    /// Reads one question set.
    fn read(&mut self, set: &QuestionSet) -> Result<Answers, ReadError>;

    /// Reads independent sets concurrently; one result per set, same order.
    fn read_batch(&mut self, sets: &[QuestionSet]) -> Vec<Result<Answers, ReadError>>;

    fn log(&mut self, level: Level, message: &str);
}

/// What a policy says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Describe {
    pub name: String,
    pub version: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
}

impl Describe {
    /// `version` is usually `env!("CARGO_PKG_VERSION")`. Schemas default to "anything".
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        Describe {
            name: name.into(),
            version: version.into(),
            description: description.into(),
            input_schema: Value::Bool(true),
            output_schema: Value::Bool(true),
        }
    }

    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = schema;
        self
    }
}

/// A decision policy. Implement it, then `hunch_guest_sdk::export_policy!(MyPolicy);`.
pub trait Policy {
    /// The input, deserialised from JSON (the host has already checked it against the schema).
    type Input: DeserializeOwned;
    /// The decision, serialised to JSON.
    type Output: Serialize;

    fn describe() -> Describe;

    fn decide(input: Self::Input, host: &mut dyn Host) -> Result<Self::Output, PolicyError>;
}

/// `decide` on JSON text: what the component export does, and what native tests call.
pub fn decide_json<P: Policy>(input: &str, host: &mut dyn Host) -> Result<String, PolicyError> {
    let input: P::Input =
        serde_json::from_str(input).map_err(|e| PolicyError::InvalidInput(e.to_string()))?;
    let output = P::decide(input, host)?;
    serde_json::to_string(&output)
        .map_err(|e| PolicyError::Failed(format!("the decision is not JSON: {e}")))
}

/// A structured state as prompt text: compact JSON. (Plain strings pass through as they are.)
pub fn state_json<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}
