//! A request as a decision, for every route that makes one (`POST /v1/systemone`,
//! `POST /v1/policies/NAME`): begin it (id, request ids), and [`finish`] it — one function for
//! both routes — which writes its event, puts its id on the response, and answers 503 when a
//! required decision log cannot take the event.

use crate::api::error::ApiError;
use crate::api::middleware::{RequestId, CLIENT_REQUEST_ID_HEADER};
use crate::decision::event::{DecisionEvent, ErrorRecord};
use crate::decision::mask::PolicyLogConfig;
use crate::decision::sink::file::FileSinkError;
use crate::decision::{Decision, DecisionLog, DECISION_ID_HEADER};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use axum::Extension;
use std::time::Duration;

/// How long the collector gets to send what it holds at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
fn with_id(mut response: Response, decision: &Decision) -> Response {
    if let Ok(v) = HeaderValue::from_str(&decision.id) {
        response.headers_mut().insert(DECISION_ID_HEADER, v);
    }
    response
}

/// The answer when a required decision log could not take the event: retrying can help (the
/// disk may recover, the queue drain), so a 503 with the `Retry-After` the sink suggests.
fn unrecorded(why: &FileSinkError) -> ApiError {
    ApiError::Unavailable {
        message: format!("the decision could not be recorded in the required decision log: {why}"),
        retry_after_seconds: why.retry_after_seconds(),
    }
}

/// What a route answered, before its event is written: the response, or the failure.
pub type Answer = Result<Response, ApiError>;

/// Finishes a decision: when its reads are recorded, builds its event (`fill` adds what the
/// route knows: the input, the model, the policy, the result), records the failure by its kind
/// and the limit it hit, writes the event (masked by `policy`'s `[decision_log]`), and answers.
/// A required log that cannot take the event turns the answer into a 503. Every answer carries
/// the decision id in `x-hunch-decision-id`, and a failure in its `detail` too.
pub async fn finish(
    log: &DecisionLog,
    decision: &Decision,
    policy: Option<&PolicyLogConfig>,
    fill: impl FnOnce(&mut DecisionEvent),
    answer: Answer,
) -> Response {
    let mut answer = answer;
    if decision.recording() {
        let status = match &answer {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status().as_u16(),
        };
        let mut event: DecisionEvent = decision.event(status);
        fill(&mut event);
        if let Err(e) = &answer {
            event.limits_hit.extend(e.limit_hit());
            event.error = Some(ErrorRecord {
                kind: e.kind(),
                message: e.to_string(),
            });
        }
        if let Err(why) = log.write(event, policy).await {
            answer = Err(unrecorded(&why));
        }
    }
    let response = match answer {
        Ok(response) => response,
        Err(e) => e.into_response_for(&decision.id),
    };
    with_id(response, decision)
}
