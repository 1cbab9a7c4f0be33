//! What the HTTP handlers call to make a request a decision: begin it (id, request ids), and
//! finish it (write its event, put its id on the response, or answer 503 when a required log
//! cannot take the event).

use crate::api::error::ApiError;
use crate::api::middleware::{ReadSummary, RequestId, CLIENT_REQUEST_ID_HEADER};
use crate::decision::event::{ErrorRecord, LimitHit};
use crate::decision::sink::file::FileSinkError;
use crate::decision::{Decision, DecisionLog, DECISION_ID_HEADER};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;
use std::time::Duration;

/// The client's own request id, when it sent one that is safe to record.
pub fn client_request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(CLIENT_REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
}

pub fn begin(
    log: &DecisionLog,
    route: &str,
    request_id: Option<Extension<RequestId>>,
    headers: &HeaderMap,
) -> Decision {
    log.begin(
        route,
        request_id.map(|Extension(RequestId(id))| id),
        client_request_id(headers),
    )
}

/// Puts the decision id on a response.
pub fn with_id(mut response: Response, decision: &Decision) -> Response {
    if let Ok(v) = HeaderValue::from_str(&decision.id) {
        response.headers_mut().insert(DECISION_ID_HEADER, v);
    }
    response
}

/// A failed decision as events record it.
pub fn api_error_record(e: &ApiError) -> ErrorRecord {
    let body = e.body();
    let kind = body["detail"]["error_type"]
        .as_str()
        .unwrap_or("validation_error")
        .to_string();
    ErrorRecord {
        kind,
        message: e.to_string(),
    }
}

/// The answer when a required decision log could not take the event.
pub fn unrecorded(e: &FileSinkError) -> ApiError {
    ApiError::Unavailable {
        message: format!("the decision could not be recorded in the required decision log: {e}"),
        retry_after_seconds: e.retry_after_seconds(),
    }
}

/// What `POST /v1/systemone` answered, before its event is written.
pub type SystemOneResult = Result<(Extension<ReadSummary>, HeaderMap, Json<Value>), ApiError>;

/// Writes the event of a System One decision and builds the response.
pub async fn finish_systemone(
    log: &DecisionLog,
    decision: &Decision,
    model: Option<&str>,
    input: Option<Value>,
    result: SystemOneResult,
) -> Response {
    if decision.recording() {
        let mut event = decision.event(match &result {
            Ok(_) => 200,
            Err(e) => e.status().as_u16(),
        });
        event.input = input.unwrap_or(Value::Null);
        event.model = model.map(|m| log.model_ref(m));
        match &result {
            Ok((_, _, Json(body))) => event.result = Some(body.clone()),
            Err(e) => {
                event.error = Some(api_error_record(e));
                let limit = match e {
                    ApiError::PayloadTooLarge { .. } => Some("max_body_bytes".to_string()),
                    // A request beyond a limit of the model (prompt length, labels, …).
                    ApiError::BadRequest { error_type, .. } if error_type.contains("too") => {
                        Some(error_type.clone())
                    }
                    _ => None,
                };
                event
                    .limits_hit
                    .extend(limit.map(|limit| LimitHit { limit, value: None }));
            }
        }
        if let Err(e) = log.write(event, None).await {
            return with_id(unrecorded(&e).into_response(), decision);
        }
    }
    let response = match result {
        Ok(parts) => parts.into_response(),
        Err(e) => e.into_response(),
    };
    with_id(response, decision)
}

/// How long the collector gets to send what it holds at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
