//! Requests are parsed once, here, into typed questions: first against the JSON Schema the host
//! ships (`host/schema/systemone-request.json`), then the rules a schema cannot say. Every failure
//! is a 422 whose `loc` names the exact field, in FastAPI's shape.

use super::error::{ApiError, FieldError, LocPart};
use hunch_core::text::render_value;
use hunch_core::{
    ChoiceOption, OrderMode, PriorMode, Question, QuestionId, QuestionKind, QuestionLimits,
    QuestionMode, ReadOptions,
};
use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value};
use std::time::Duration;

/// The request schema, served in `/openapi.json` and used to validate every request.
pub const REQUEST_SCHEMA: &str = include_str!("../../schema/systemone-request.json");

/// The top-level fields Hunch reads; any other is ignored and named in the response.
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "state",
    "questions",
    "assets",
    "x_seed",
    "x_draws",
    "x_questions",
    "x_prior",
    "x_order",
    "x_calibration",
    "x_keep_alive",
];

/// The longest `x_keep_alive` (30 days): what the schema admits as a number, and a duration
/// string is held to the same.
const MAX_KEEP_ALIVE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A validated System One request.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemOneRequest {
    /// The `model` field as sent (a name or an alias).
    pub model: String,
    /// The state rendered to prompt text.
    pub state: String,
    /// In request order.
    pub questions: Vec<AskedQuestion>,
    /// Seed and draws from `x_seed`/`x_draws`; the question mode is the server's unless
    /// [`SystemOneRequest::x_questions`] says otherwise.
    pub options: ReadOptions,
    /// `x_questions`, when sent.
    pub x_questions: Option<QuestionMode>,
    /// `x_prior`, when sent (else the model's setting, else none).
    pub x_prior: Option<PriorMode>,
    /// `x_order`, when sent (else the model's setting, else as given).
    pub x_order: Option<OrderMode>,
    /// `"x_calibration": "off"`: answer from the raw distributions even when the server has a
    /// calibration.
    pub calibration_off: bool,
    /// `x_keep_alive`: how long the model stays loaded after this request (zero: unload it
    /// once answered), when sent.
    pub keep_alive: Option<Duration>,
    /// Top-level fields this server does not know, in request order: ignored, and named in the
    /// `x-hunch-ignored-fields` response header.
    pub ignored_fields: Vec<String>,
}

/// A caller's question: its id beside the id-free typed question the readers see.
#[derive(Debug, Clone, PartialEq)]
pub struct AskedQuestion {
    pub id: QuestionId,
    pub question: Question,
    /// The score levels exactly as sent, when any is not a string: the legend echoes them as
    /// sent, while readers see their rendered text.
    pub legend_values: Option<Vec<Value>>,
}

/// Validates request bodies. Built once (the schema compiles once) and shared.
pub struct RequestValidator {
    schema: jsonschema::Validator,
}

impl std::fmt::Debug for RequestValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestValidator")
    }
}

/// The shipped request schema is broken: a build bug, found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("the shipped request schema is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("the shipped request schema does not compile: {0}")]
    DoesNotCompile(String),
}

impl RequestValidator {
    /// Compiles the shipped schema. Fails only if the schema file itself is broken (a build bug).
    pub fn new() -> Result<Self, SchemaError> {
        let schema: Value = serde_json::from_str(REQUEST_SCHEMA)?;
        let schema = jsonschema::validator_for(&schema)
            .map_err(|e| SchemaError::DoesNotCompile(e.to_string()))?;
        Ok(RequestValidator { schema })
    }

    /// Parses and validates a (decompressed) JSON body.
    pub fn parse(&self, body: &[u8]) -> Result<SystemOneRequest, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::field(
                vec!["body".into()],
                "json_invalid",
                format!("JSON decode error: {e}"),
            )
        })?;
        self.validate(&value)
    }

    /// Validates a JSON value: schema first, then the rules the schema cannot say.
    pub fn validate(&self, value: &Value) -> Result<SystemOneRequest, ApiError> {
        let errors: Vec<FieldError> = self
            .schema
            .iter_errors(value)
            .map(|e| schema_error(value, &e))
            .collect();
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        typed(value)
    }
}

/// Converts a schema error into a `loc`/`msg`/`type` entry whose `loc` ends at the exact field
/// (for a missing or unexpected field, the field's own name, as FastAPI does).
fn schema_error(instance: &Value, error: &jsonschema::ValidationError<'_>) -> FieldError {
    let mut loc = vec![LocPart::from("body")];
    loc.extend(pointer_to_loc(instance, error.instance_path().as_str()));
    let (kind, msg) = match error.kind() {
        ValidationErrorKind::Required { property } => {
            loc.push(property.as_str().unwrap_or_default().into());
            ("missing", "Field required".to_string())
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            if let Some(first) = unexpected.first() {
                loc.push(first.clone().into());
            }
            (
                "extra_forbidden",
                "Extra inputs are not permitted".to_string(),
            )
        }
        ValidationErrorKind::Type { .. } => ("type_error", short(&error.to_string())),
        ValidationErrorKind::Enum { .. } | ValidationErrorKind::Constant { .. } => {
            ("literal_error", short(&error.to_string()))
        }
        ValidationErrorKind::MinProperties { limit } => (
            "too_short",
            format!("Object should have at least {limit} item(s)"),
        ),
        ValidationErrorKind::MaxProperties { limit } => (
            "too_long",
            format!("Object should have at most {limit} items (choice options)"),
        ),
        ValidationErrorKind::MinItems { limit } => (
            "too_short",
            format!("List should have at least {limit} item(s)"),
        ),
        ValidationErrorKind::MaxItems { limit } => (
            "too_long",
            format!("List should have at most {limit} items (score levels)"),
        ),
        ValidationErrorKind::Minimum { limit } => (
            "greater_than_equal",
            format!("Input should be greater than or equal to {limit}"),
        ),
        // The only `anyOf` of the schema: a noul's "instructions or a criterion".
        ValidationErrorKind::AnyOf { .. } if is_noul(error.instance()) => {
            ("value_error", NOUL_NEEDS_TEXT.to_string())
        }
        ValidationErrorKind::Maximum { limit } => (
            "less_than_equal",
            format!("Input should be less than or equal to {limit}"),
        ),
        other => (
            "value_error",
            short(&format!("{} ({})", error, other.keyword())),
        ),
    };
    FieldError::new(loc, kind, msg)
}

const NOUL_NEEDS_TEXT: &str =
    "a noul question needs instructions or at least one criterion (true or false)";

fn is_noul(instance: &Value) -> bool {
    instance.get("type").and_then(Value::as_str) == Some("noul")
}

/// Error messages quote the offending value; a huge value must not make a huge response.
fn short(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A JSON pointer (`/questions/a~1b/criteria/3`) as `loc` parts. Whether a segment is an index or
/// a key is decided by walking the instance, so a question id `"3"` stays a string.
fn pointer_to_loc(instance: &Value, pointer: &str) -> Vec<LocPart> {
    let mut loc = Vec::new();
    let mut current = Some(instance);
    if pointer.is_empty() {
        return loc;
    }
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        match current {
            Some(Value::Array(items)) => match segment.parse::<usize>() {
                Ok(i) => {
                    current = items.get(i);
                    loc.push(LocPart::Index(i));
                }
                Err(_) => {
                    current = None;
                    loc.push(LocPart::Key(segment));
                }
            },
            Some(Value::Object(map)) => {
                current = map.get(&segment);
                loc.push(LocPart::Key(segment));
            }
            _ => {
                current = None;
                loc.push(LocPart::Key(segment));
            }
        }
    }
    loc
}

fn at(parts: &[&str]) -> Vec<LocPart> {
    let mut loc = vec![LocPart::from("body")];
    loc.extend(parts.iter().map(|p| LocPart::from(*p)));
    loc
}

fn question_loc(id: &str, rest: &[&str]) -> Vec<LocPart> {
    let mut loc = at(&["questions"]);
    loc.push(id.into());
    loc.extend(rest.iter().map(|p| LocPart::from(*p)));
    loc
}

/// The rules a schema cannot say, and the conversion into typed questions. Runs only on values
/// the schema accepted; a shape it did not expect is still a 422, never a panic.
fn typed(value: &Value) -> Result<SystemOneRequest, ApiError> {
    let mut errors = Vec::new();
    let body = value
        .as_object()
        .ok_or_else(|| ApiError::field(at(&[]), "type_error", "Input should be an object"))?;

    if let Some(assets) = body.get("assets") {
        if !assets.is_null() {
            errors.push(FieldError::new(
                at(&["assets"]),
                "unsupported",
                "this model is text-only: image assets are not supported",
            ));
        }
    }
    let ignored_fields: Vec<String> = body
        .keys()
        .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();

    let model = match body.get("model").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => {
            errors.push(FieldError::new(at(&["model"]), "missing", "Field required"));
            String::new()
        }
    };
    let state = body.get("state").map(render_value).unwrap_or_default();
    let options = ReadOptions {
        seed: body.get("x_seed").and_then(whole_number),
        draws: body
            .get("x_draws")
            .and_then(whole_number)
            .and_then(|d| u32::try_from(d).ok()),
        ..ReadOptions::default()
    };
    // The schema admits only the two names.
    let x_questions = body
        .get("x_questions")
        .and_then(Value::as_str)
        .and_then(|m| m.parse().ok());
    // Likewise: the schema admits only their names.
    let x_prior = body
        .get("x_prior")
        .and_then(Value::as_str)
        .and_then(|m| m.parse().ok());
    let x_order = body
        .get("x_order")
        .and_then(Value::as_str)
        .and_then(|m| m.parse().ok());

    // The schema admits only "on" and "off".
    let calibration_off = body.get("x_calibration").and_then(Value::as_str) == Some("off");
    let keep_alive = match body.get("x_keep_alive") {
        None => None,
        Some(v) => match keep_alive_of(v) {
            Some(d) => Some(d),
            None => {
                errors.push(FieldError::new(
                    at(&["x_keep_alive"]),
                    "value_error",
                    "x_keep_alive must be seconds (0 to 2592000) or a duration such as 30s, 5m, \
                     1h, at most 30 days",
                ));
                None
            }
        },
    };

    let mut questions = Vec::new();
    match body.get("questions").and_then(Value::as_object) {
        Some(map) => {
            for (id, q) in map {
                match typed_question(id, q) {
                    Ok(asked) => questions.push(asked),
                    Err(mut e) => errors.append(&mut e),
                }
            }
        }
        None => errors.push(FieldError::new(
            at(&["questions"]),
            "missing",
            "Field required",
        )),
    }

    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    Ok(SystemOneRequest {
        model,
        state,
        questions,
        options,
        x_questions,
        x_prior,
        x_order,
        calibration_off,
        keep_alive,
        ignored_fields,
    })
}

/// `x_keep_alive` as a duration: seconds as a number, or `500ms`, `30s`, `5m`, `1h` (a bare
/// number in a string is seconds). `None` for anything else or beyond [`MAX_KEEP_ALIVE`].
fn keep_alive_of(value: &Value) -> Option<Duration> {
    let seconds = match value {
        Value::Number(n) => n.as_f64()?,
        Value::String(text) => hunch_core::duration::parse(text)?.as_secs_f64(),
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| *d <= MAX_KEEP_ALIVE)
}

/// JSON Schema's `integer` admits `3.0`; read it as 3 rather than dropping it.
fn whole_number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}

fn typed_question(id: &str, q: &Value) -> Result<AskedQuestion, Vec<FieldError>> {
    let Some(obj) = q.as_object() else {
        return Err(vec![FieldError::new(
            question_loc(id, &[]),
            "type_error",
            "Input should be an object",
        )]);
    };
    let instructions_value = obj.get("instructions").unwrap_or(&Value::Null);
    let instructions = render_value(instructions_value);
    let criteria = obj.get("criteria").unwrap_or(&Value::Null);
    let mut legend_values = None;
    let limits = QuestionLimits::default();
    let kind = match obj.get("type").and_then(Value::as_str) {
        Some("noul") => {
            let side = |name: &str| -> Option<String> {
                criteria
                    .as_object()
                    .and_then(|c| c.get(name))
                    .filter(|v| !v.is_null())
                    .map(render_value)
            };
            let (yes, no) = (side("true"), side("false"));
            if instructions_value.is_null() && yes.is_none() && no.is_none() {
                return Err(vec![FieldError::new(
                    question_loc(id, &[]),
                    "value_error",
                    NOUL_NEEDS_TEXT,
                )]);
            }
            QuestionKind::Noul { yes, no }
        }
        Some("choice") => {
            let map = criteria.as_object().cloned().unwrap_or_else(Map::new);
            QuestionKind::Choice {
                options: map
                    .iter()
                    .map(|(name, description)| ChoiceOption {
                        name: name.clone(),
                        description: if description.is_null() {
                            None
                        } else {
                            Some(render_value(description))
                        },
                    })
                    .collect(),
            }
        }
        Some("score") => {
            let levels = criteria.as_array().cloned().unwrap_or_default();
            if levels.iter().any(|l| !l.is_string()) {
                legend_values = Some(levels.clone());
            }
            QuestionKind::Score {
                levels: levels.iter().map(render_value).collect(),
            }
        }
        Some("box") => {
            return Err(vec![FieldError::new(
                question_loc(id, &["type"]),
                "unsupported",
                "box questions need a vision model; this model is text-only",
            )])
        }
        _ => {
            return Err(vec![FieldError::new(
                question_loc(id, &["type"]),
                "literal_error",
                "Input should be 'noul', 'choice', 'score' or 'box'",
            )])
        }
    };
    let question = Question { instructions, kind };
    // The contract's limits (the schema says them too); a model's own are checked when it reads.
    question.validate(&limits).map_err(|e| {
        vec![FieldError::new(
            question_loc(id, &["criteria"]),
            e.kind(),
            e.to_string(),
        )]
    })?;
    Ok(AskedQuestion {
        id: QuestionId(id.to_string()),
        question,
        legend_values,
    })
}

#[cfg(test)]
mod tests;
