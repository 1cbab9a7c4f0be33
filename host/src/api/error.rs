//! `ApiError`: the one place that maps failures to HTTP statuses and TypeSafe's error bodies.
//!
//! Validation failures are FastAPI-shaped (`{"detail": [{"loc", "msg", "type"}]}`); everything
//! else is `{"detail": {"error_type", "message"}}` (plus the fields an [`ApiError::Other`]
//! carries). The policy endpoints use this same type (`api/policies.rs`). Only failures that can succeed on a retry are
//! 5xx: the SDK retries every 5xx, so a request that can never succeed must be a 4xx.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hunch_core::ReadError;
use serde::Serialize;
use serde_json::{json, Value};

/// One element of a validation error's `loc`: an object key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum LocPart {
    Key(String),
    Index(usize),
}

impl From<&str> for LocPart {
    fn from(s: &str) -> Self {
        LocPart::Key(s.to_string())
    }
}

impl From<String> for LocPart {
    fn from(s: String) -> Self {
        LocPart::Key(s)
    }
}

impl From<usize> for LocPart {
    fn from(i: usize) -> Self {
        LocPart::Index(i)
    }
}

/// One entry of a 422's `detail`: where, what, and a machine-readable kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldError {
    pub loc: Vec<LocPart>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl FieldError {
    pub fn new(loc: Vec<LocPart>, kind: impl Into<String>, msg: impl Into<String>) -> Self {
        FieldError {
            loc,
            msg: msg.into(),
            kind: kind.into(),
        }
    }

    /// `loc` as the strings a test or a log line compares against (`body.questions.q.type`).
    pub fn loc_path(&self) -> String {
        self.loc
            .iter()
            .map(|p| match p {
                LocPart::Key(k) => k.clone(),
                LocPart::Index(i) => i.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// Every way a request can fail, each with exactly one status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 422: the request does not follow the contract (or asks what a text-only model cannot do).
    #[error("invalid request: {0:?}")]
    Validation(Vec<FieldError>),
    /// 400: well-formed but beyond a limit of the model, or an unreadable body.
    #[error("{message}")]
    BadRequest { error_type: String, message: String },
    /// 401: missing or wrong bearer key.
    #[error("missing or invalid API key")]
    Unauthorized,
    /// 404: unknown model or route.
    #[error("{message}")]
    NotFound { error_type: String, message: String },
    /// 413: the body (compressed or decompressed) is over the configured limit.
    #[error("{message}")]
    PayloadTooLarge { message: String },
    /// 415: a `Content-Encoding` the server does not decode.
    #[error("{message}")]
    UnsupportedMediaType { message: String },
    /// A 4xx an upstream System One server gave, passed through.
    #[error("{message}")]
    Upstream { status: u16, message: String },
    /// 503 with `Retry-After`: loading, restarting or overloaded.
    #[error("{message}")]
    Unavailable {
        message: String,
        retry_after_seconds: u64,
    },
    /// 504: the request did not finish within the per-request timeout.
    #[error("the request timed out")]
    Timeout,
    /// 500: a bug or a broken reader output. Logged.
    #[error("{message}")]
    Internal { message: String },
    /// Any other failure with its own `error_type` (the policy endpoints'), extra `detail`
    /// fields (`limit`, `policy_error`, …) and, when a retry may help, a `Retry-After`.
    #[error("{message}")]
    Other {
        status: u16,
        error_type: String,
        message: String,
        fields: serde_json::Map<String, Value>,
        retry_after_seconds: Option<u64>,
    },
}

impl ApiError {
    pub fn field(loc: Vec<LocPart>, kind: &str, msg: impl Into<String>) -> Self {
        ApiError::Validation(vec![FieldError::new(loc, kind, msg)])
    }

    pub fn bad_request(error_type: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            error_type: error_type.into(),
            message: message.into(),
        }
    }

    /// A failure with its own status and `error_type`.
    pub fn new(status: StatusCode, error_type: &str, message: impl Into<String>) -> Self {
        ApiError::Other {
            status: status.as_u16(),
            error_type: error_type.into(),
            message: message.into(),
            fields: serde_json::Map::new(),
            retry_after_seconds: None,
        }
    }

    /// Adds a field to the `detail` object of an error made by [`ApiError::new`].
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let ApiError::Other { fields, .. } = &mut self {
            fields.insert(key.to_string(), value);
        }
        self
    }

    /// The id of the decision that failed, in `detail` (errors of a decision carry it).
    pub fn with_decision(self, id: &str) -> Self {
        self.with("decision_id", json!(id))
    }

    /// Sends `Retry-After` with an error made by [`ApiError::new`].
    pub fn retry_after(mut self, seconds: u64) -> Self {
        if let ApiError::Other {
            retry_after_seconds,
            ..
        } = &mut self
        {
            *retry_after_seconds = Some(seconds);
        }
        self
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::Internal {
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            // An upstream that answered outside 4xx is never passed through as such: only its
            // 4xx (the caller's fault) reach here, anything else was mapped to 503/504 already.
            ApiError::Upstream { status, .. } => StatusCode::from_u16(*status)
                .ok()
                .filter(|s| s.is_client_error())
                .unwrap_or(StatusCode::BAD_REQUEST),
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Other { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// The `error_type` clients see.
    pub fn error_type(&self) -> &str {
        match self {
            ApiError::Validation(_) => "validation_error",
            ApiError::BadRequest { error_type, .. } | ApiError::NotFound { error_type, .. } => {
                error_type
            }
            ApiError::Unauthorized => "authentication_error",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::UnsupportedMediaType { .. } => "unsupported_content_encoding",
            ApiError::Upstream { .. } => "upstream_rejected",
            ApiError::Unavailable { .. } => "unavailable",
            ApiError::Timeout => "timeout",
            ApiError::Internal { .. } => "internal_error",
            ApiError::Other { error_type, .. } => error_type,
        }
    }

    /// The JSON body TypeSafe's clients parse.
    pub fn body(&self) -> Value {
        match self {
            ApiError::Validation(errors) => json!({ "detail": errors }),
            ApiError::Other {
                error_type,
                message,
                fields,
                ..
            } => {
                let mut detail = serde_json::Map::new();
                detail.insert("error_type".into(), json!(error_type));
                detail.insert("message".into(), json!(message));
                detail.extend(fields.clone());
                json!({ "detail": detail })
            }
            other => json!({
                "detail": { "error_type": other.error_type(), "message": other.to_string() }
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal { message } = &self {
            tracing::error!(%message, "internal error");
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        let headers = response.headers_mut();
        let retry_after = match &self {
            ApiError::Unavailable {
                retry_after_seconds,
                ..
            } => Some(*retry_after_seconds),
            ApiError::Other {
                retry_after_seconds,
                ..
            } => *retry_after_seconds,
            _ => None,
        };
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(seconds.saturating_mul(1000)),
            );
        }
        match &self {
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

/// How a reader's failure reaches the client. `question_ids` maps the read request's question
/// index back to the caller's id so a 422 names the exact field.
pub fn from_read_error(error: ReadError, question_ids: &[String]) -> ApiError {
    match error {
        ReadError::InvalidQuestion { question, message } => {
            let mut loc: Vec<LocPart> = vec!["body".into(), "questions".into()];
            if let Some(id) = question_ids.get(question) {
                loc.push(id.clone().into());
            }
            ApiError::field(loc, "value_error", message)
        }
        ReadError::TooLarge { message } => ApiError::bad_request("request_too_large", message),
        ReadError::Unavailable {
            message,
            retry_after_seconds,
        } => ApiError::Unavailable {
            message,
            retry_after_seconds: retry_after_seconds.max(1),
        },
        ReadError::Timeout => ApiError::Timeout,
        ReadError::Rejected { status, message } => ApiError::Upstream { status, message },
        ReadError::Internal { message } => ApiError::Internal { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_errors_are_fastapi_shaped() {
        let e = ApiError::field(
            vec!["body".into(), "questions".into(), "q".into(), 2usize.into()],
            "missing",
            "Field required",
        );
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            e.body(),
            json!({"detail": [{"loc": ["body", "questions", "q", 2], "msg": "Field required", "type": "missing"}]})
        );
    }

    #[test]
    fn only_retryable_read_errors_are_5xx() {
        let ids = vec!["a".to_string()];
        let invalid = from_read_error(
            ReadError::InvalidQuestion {
                question: 0,
                message: "x".into(),
            },
            &ids,
        );
        assert_eq!(invalid.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let too_large = from_read_error(
            ReadError::TooLarge {
                message: "long".into(),
            },
            &ids,
        );
        assert_eq!(too_large.status(), StatusCode::BAD_REQUEST);
        let rejected = from_read_error(
            ReadError::Rejected {
                status: 502,
                message: "odd".into(),
            },
            &ids,
        );
        assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            from_read_error(ReadError::Timeout, &ids).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
    }

    #[test]
    fn other_errors_carry_their_type_fields_and_retry_hint() {
        let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "try later")
            .with("limit", json!("fuel"))
            .retry_after(2);
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            e.body(),
            json!({"detail": {"error_type": "busy", "message": "try later", "limit": "fuel"}})
        );
        let response = e.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(response.headers()["retry-after-ms"], "2000");
    }
}
