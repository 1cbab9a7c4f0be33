//! `ApiError`: the one place that maps failures to HTTP statuses and TypeSafe's error bodies.
//!
//! Validation failures are FastAPI-shaped (`{"detail": [{"loc", "msg", "type"}]}`); everything
//! else is `{"detail": {"error_type", "message", …}}`. The policy endpoints use this same type:
//! the policy runtime's [`InvokeError`] and [`RegistryError`] are variants here, and their
//! statuses are decided here and nowhere else. Only failures that can succeed on a retry are 5xx
//! (the SDK retries every 5xx), and every 503 has one shape: `error_type: "unavailable"` with
//! `Retry-After`. Every error names its kind through [`ApiError::kind`], the decision records'
//! vocabulary, so nothing downstream reads a kind back out of a body.

use crate::decision::event::{FailureKind, Limit, LimitHit};
use crate::policy::invoke::PolicyFailure;
use crate::policy::{InvokeError, RegistryError};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hunch_core::{ReadError, ReadErrorKind};
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
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// 422: the request does not follow the contract (or asks what a text-only model cannot do).
    #[error("invalid request: {0:?}")]
    Validation(Vec<FieldError>),
    /// 400: well-formed but beyond a limit of the model.
    #[error("{message}")]
    TooLarge { message: String },
    /// 400: a body that could not be read or decoded, or a policy input that is not JSON.
    #[error("{message}")]
    BadBody { kind: BadBody, message: String },
    /// 400: a query string the route cannot read (a repeated or unknown parameter, a wrong type).
    #[error("{message}")]
    BadQuery { message: String },
    /// 400: a deployment's parameters (`?stage=`, limits) are wrong.
    #[error("{message}")]
    BadDeployment {
        kind: BadDeployment,
        message: String,
    },
    /// 401, one shape for the API keys and the admin key: missing or wrong key.
    #[error("{message}")]
    Unauthorized { message: String },
    /// 403: deployments over HTTP are disabled.
    #[error("{message}")]
    Forbidden { message: String },
    /// 404: an unknown model, route or policy.
    #[error("{message}")]
    NotFound { what: Missing, message: String },
    /// 413: the body (compressed or decompressed) is over the configured limit.
    #[error("{message}")]
    PayloadTooLarge { message: String },
    /// 415: a `Content-Encoding` the server does not decode.
    #[error("{message}")]
    UnsupportedMediaType { message: String },
    /// A 4xx an upstream System One server gave, passed through.
    #[error("{message}")]
    Upstream { status: u16, message: String },
    /// 503 with `Retry-After`: loading, restarting, overloaded, or the required decision log
    /// could not take the event. Retrying can help, by definition of this variant.
    #[error("{message}")]
    Unavailable {
        message: String,
        retry_after_seconds: u64,
    },
    /// 507: the model can never fit the memory budget (less what pinned models hold); no
    /// retry helps, only a larger `--memory-budget` or fewer pinned models.
    #[error(
        "model {model} needs {needed_bytes} bytes but the memory budget is {budget_bytes} bytes \
         ({pinned_bytes} of them held by pinned models): it can never be loaded here"
    )]
    InsufficientStorage {
        model: String,
        needed_bytes: u64,
        budget_bytes: u64,
        pinned_bytes: u64,
    },
    /// 409: a model change its state does not allow now (unloading a pinned or loading model).
    #[error("{message}")]
    ModelConflict { message: String },
    /// 504: the request did not finish within the per-request timeout.
    #[error("the request timed out")]
    Timeout,
    /// 500: a bug or a broken reader output. Logged.
    #[error("{message}")]
    Internal { message: String },
    /// A policy invocation that did not produce a decision.
    #[error(transparent)]
    Invoke(InvokeError),
    /// A deployment, removal, promotion or rollback the registry refused.
    #[error("{message}")]
    Registry {
        kind: RegistryRefusal,
        message: String,
    },
}

/// Why a body was refused before it was parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadBody {
    /// Unreadable or undecodable bytes.
    Unreadable,
    /// Not JSON (policy inputs; the System One body is validated field by field instead).
    NotJson,
}

/// What is wrong with a deployment's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadDeployment {
    Stage,
    Config,
}

/// What a 404 did not find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    Model,
    Route,
    Policy,
    /// A model's quality report (none stored for its fingerprint, or its fingerprint unknown).
    QualityReport,
}

/// A registry refusal, without the registry's error (which holds I/O details and is not `Clone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryRefusal {
    InvalidName,
    NotFound,
    Refused,
    Conflict,
    /// A change of one policy on a server whose policies a bundle owns.
    BundleOwned,
}

impl From<InvokeError> for ApiError {
    fn from(e: InvokeError) -> Self {
        if let InvokeError::Internal(message) = &e {
            tracing::error!(error = %message, "policy invocation failed");
        }
        ApiError::Invoke(e)
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let kind = match &e {
            RegistryError::InvalidName(_) => RegistryRefusal::InvalidName,
            RegistryError::NotFound(_) => RegistryRefusal::NotFound,
            RegistryError::Load(_) => RegistryRefusal::Refused,
            RegistryError::Conflict(_) => RegistryRefusal::Conflict,
            RegistryError::BundleOwned(_) => RegistryRefusal::BundleOwned,
        };
        ApiError::Registry {
            kind,
            message: e.to_string(),
        }
    }
}

/// The status a policy's failure is answered with. A limit is a property of the policy and the
/// input, which a retry would break again (422), except a deadline (504); a failed read keeps
/// its own meaning (503/504 retryable, 422 for the caller's questions, 502 for a broken model).
fn invoke_status(e: &InvokeError) -> StatusCode {
    match e {
        InvokeError::NotFound(_) => StatusCode::NOT_FOUND,
        InvokeError::InvalidInput(_) => StatusCode::UNPROCESSABLE_ENTITY,
        InvokeError::Limit(l) if l.limit == Limit::Timeout => StatusCode::GATEWAY_TIMEOUT,
        InvokeError::Limit(_) => StatusCode::UNPROCESSABLE_ENTITY,
        InvokeError::Trap(_) | InvokeError::Forbidden(_) | InvokeError::InvalidOutput(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        InvokeError::Policy(PolicyFailure::ReadFailed { read_error, .. }) => match read_error {
            ReadErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ReadErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ReadErrorKind::InvalidQuestion | ReadErrorKind::TooLarge | ReadErrorKind::Rejected => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ReadErrorKind::Internal => StatusCode::BAD_GATEWAY,
        },
        InvokeError::Policy(_) => StatusCode::UNPROCESSABLE_ENTITY,
        InvokeError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        InvokeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The `detail` fields a policy failure adds to `error_type` and `message`.
fn invoke_fields(e: &InvokeError, detail: &mut serde_json::Map<String, Value>) {
    match e {
        InvokeError::InvalidInput(details) => {
            detail.insert("details".into(), json!(details));
        }
        InvokeError::Limit(l) => {
            detail.insert("limit".into(), json!(l.limit.as_str()));
            detail.insert("limit_value".into(), json!(l.limit_value));
        }
        InvokeError::Policy(failure) => {
            detail.insert("policy_error".into(), json!(failure));
        }
        _ => {}
    }
}

/// Seconds a client should wait before retrying a busy policy pool.
const BUSY_RETRY_AFTER_SECONDS: u64 = 1;

impl ApiError {
    pub fn field(loc: Vec<LocPart>, kind: &str, msg: impl Into<String>) -> Self {
        ApiError::Validation(vec![FieldError::new(loc, kind, msg)])
    }

    pub fn unreadable_body(message: impl Into<String>) -> Self {
        ApiError::BadBody {
            kind: BadBody::Unreadable,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::Internal {
            message: message.into(),
        }
    }

    pub fn not_found(what: Missing, message: impl Into<String>) -> Self {
        ApiError::NotFound {
            what,
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TooLarge { .. }
            | ApiError::BadBody { .. }
            | ApiError::BadQuery { .. }
            | ApiError::BadDeployment { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
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
            ApiError::InsufficientStorage { .. } => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::ModelConflict { .. } => StatusCode::CONFLICT,
            ApiError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Invoke(e) => invoke_status(e),
            ApiError::Registry { kind, .. } => match kind {
                RegistryRefusal::InvalidName => StatusCode::BAD_REQUEST,
                RegistryRefusal::NotFound => StatusCode::NOT_FOUND,
                RegistryRefusal::Refused => StatusCode::UNPROCESSABLE_ENTITY,
                RegistryRefusal::Conflict | RegistryRefusal::BundleOwned => StatusCode::CONFLICT,
            },
        }
    }

    /// The kind of failure: what clients see as `error_type` and decision events record.
    pub fn kind(&self) -> FailureKind {
        match self {
            ApiError::Validation(_) => FailureKind::ValidationError,
            ApiError::TooLarge { .. } | ApiError::PayloadTooLarge { .. } => {
                FailureKind::RequestTooLarge
            }
            ApiError::BadBody { kind, .. } => match kind {
                BadBody::Unreadable => FailureKind::InvalidBody,
                BadBody::NotJson => FailureKind::InvalidJson,
            },
            ApiError::BadQuery { .. } => FailureKind::InvalidQuery,
            ApiError::BadDeployment { kind, .. } => match kind {
                BadDeployment::Stage => FailureKind::InvalidStage,
                BadDeployment::Config => FailureKind::InvalidConfig,
            },
            ApiError::Unauthorized { .. } => FailureKind::AuthenticationError,
            ApiError::Forbidden { .. } => FailureKind::Forbidden,
            ApiError::NotFound { what, .. } => match what {
                Missing::Model => FailureKind::ModelNotFound,
                Missing::Route | Missing::Policy | Missing::QualityReport => FailureKind::NotFound,
            },
            ApiError::UnsupportedMediaType { .. } => FailureKind::UnsupportedContentEncoding,
            ApiError::Upstream { .. } => FailureKind::UpstreamRejected,
            ApiError::Unavailable { .. } => FailureKind::Unavailable,
            ApiError::InsufficientStorage { .. } => FailureKind::InsufficientMemory,
            ApiError::ModelConflict { .. } => FailureKind::Conflict,
            ApiError::Timeout => FailureKind::Timeout,
            ApiError::Internal { .. } => FailureKind::InternalError,
            ApiError::Invoke(e) => e.kind(),
            ApiError::Registry { kind, .. } => match kind {
                RegistryRefusal::InvalidName => FailureKind::InvalidName,
                RegistryRefusal::NotFound => FailureKind::NotFound,
                RegistryRefusal::Refused => FailureKind::PolicyRefused,
                RegistryRefusal::Conflict => FailureKind::Conflict,
                RegistryRefusal::BundleOwned => FailureKind::BundleOwned,
            },
        }
    }

    /// The `error_type` clients see.
    pub fn error_type(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The limit this failure ran into, as decision events record it.
    pub fn limit_hit(&self) -> Option<LimitHit> {
        match self {
            ApiError::PayloadTooLarge { .. } => Some(LimitHit {
                limit: Limit::MaxBodyBytes,
                value: None,
            }),
            ApiError::TooLarge { .. } => Some(LimitHit {
                limit: Limit::ModelSize,
                value: None,
            }),
            ApiError::Invoke(e) => e.limit_hit(),
            _ => None,
        }
    }

    /// Seconds to send in `Retry-After`: every 503 has one.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match self {
            ApiError::Unavailable {
                retry_after_seconds,
                ..
            } => Some((*retry_after_seconds).max(1)),
            ApiError::Invoke(e) if invoke_status(e) == StatusCode::SERVICE_UNAVAILABLE => {
                Some(BUSY_RETRY_AFTER_SECONDS)
            }
            _ => None,
        }
    }

    /// The JSON body TypeSafe's clients parse.
    pub fn body(&self) -> Value {
        if let ApiError::Validation(errors) = self {
            return json!({ "detail": errors });
        }
        let mut detail = serde_json::Map::new();
        detail.insert("error_type".into(), json!(self.error_type()));
        detail.insert("message".into(), json!(self.to_string()));
        if let ApiError::Invoke(e) = self {
            invoke_fields(e, &mut detail);
        }
        if let ApiError::InsufficientStorage {
            model,
            needed_bytes,
            budget_bytes,
            pinned_bytes,
        } = self
        {
            detail.insert("model".into(), json!(model));
            detail.insert("needed_bytes".into(), json!(needed_bytes));
            detail.insert("budget_bytes".into(), json!(budget_bytes));
            detail.insert("pinned_bytes".into(), json!(pinned_bytes));
        }
        json!({ "detail": detail })
    }

    /// The response, with the id of the decision that failed in `detail` (when `detail` is an
    /// object: a validation error's `detail` is TypeSafe's list and stays one).
    pub fn into_response_for(self, decision_id: &str) -> Response {
        let mut body = self.body();
        if let Some(detail) = body["detail"].as_object_mut() {
            detail.insert("decision_id".into(), json!(decision_id));
        }
        self.respond(body)
    }

    fn respond(self, body: Value) -> Response {
        if let ApiError::Internal { message } = &self {
            tracing::error!(%message, "internal error");
        }
        let mut response = (self.status(), Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after_seconds() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(seconds.saturating_mul(1000)),
            );
        }
        if let ApiError::Unauthorized { .. } = self {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        self.respond(body)
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
        ReadError::TooLarge { message } => ApiError::TooLarge { message },
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
        // A model whose checkpoint was refused at load: its 409 passes through, no Retry-After.
        let refused = from_read_error(
            crate::reader::sidecar::refused_read_error("zoom", "zoom.gguf: k = 1"),
            &ids,
        );
        assert_eq!(refused.status(), StatusCode::CONFLICT);
        assert!(refused.to_string().contains("model zoom"), "{refused}");
        assert_eq!(
            from_read_error(ReadError::Timeout, &ids).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
    }

    #[test]
    fn every_503_has_one_shape_with_a_retry_hint() {
        let busy = ApiError::from(InvokeError::Busy);
        let loading = ApiError::Unavailable {
            message: "loading".into(),
            retry_after_seconds: 3,
        };
        for (e, seconds) in [(busy, "1"), (loading, "3")] {
            assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(e.body()["detail"]["error_type"], "unavailable");
            let response = e.into_response();
            assert_eq!(response.headers()[header::RETRY_AFTER], seconds);
        }
    }

    #[test]
    fn policy_failures_carry_their_kind_fields_and_limit() {
        let e = ApiError::from(InvokeError::Limit(crate::policy::LimitExceeded::new(
            Limit::Reads,
            3,
            "too many reads",
        )));
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.kind(), FailureKind::LimitExceeded);
        assert_eq!(e.body()["detail"]["limit"], "reads");
        assert_eq!(e.body()["detail"]["limit_value"], 3);
        assert_eq!(e.limit_hit().map(|h| h.limit), Some(Limit::Reads));
        let declined = ApiError::from(InvokeError::Policy(PolicyFailure::ReadFailed {
            read_error: ReadErrorKind::Unavailable,
            message: "queue full".into(),
        }));
        assert_eq!(declined.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(declined.retry_after_seconds().is_some());
        // Shaped like every other 503, the policy's own error kept beside it.
        assert_eq!(declined.body()["detail"]["error_type"], "unavailable");
        assert_eq!(
            declined.body()["detail"]["policy_error"]["read_error"],
            "unavailable"
        );
        let timed_out = ApiError::from(InvokeError::Policy(PolicyFailure::ReadFailed {
            read_error: ReadErrorKind::Timeout,
            message: "slow".into(),
        }));
        assert_eq!(timed_out.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(timed_out.body()["detail"]["error_type"], "policy_declined");
        let response = ApiError::Validation(vec![]).into_response_for("d");
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn a_model_that_can_never_fit_is_a_507_naming_both_sizes() {
        let e = ApiError::InsufficientStorage {
            model: "big".into(),
            needed_bytes: 5000,
            budget_bytes: 4000,
            pinned_bytes: 1000,
        };
        assert_eq!(e.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert!(e.retry_after_seconds().is_none(), "no retry helps");
        let body = e.body();
        assert_eq!(body["detail"]["error_type"], "insufficient_memory");
        assert_eq!(body["detail"]["needed_bytes"], 5000);
        assert_eq!(body["detail"]["budget_bytes"], 4000);
        let message = body["detail"]["message"].as_str().unwrap();
        assert!(
            message.contains("5000") && message.contains("4000"),
            "{message}"
        );
    }

    #[test]
    fn one_401_shape() {
        let e = ApiError::Unauthorized {
            message: "missing key".into(),
        };
        assert_eq!(e.body()["detail"]["error_type"], "authentication_error");
        let response = e.into_response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
