//! Per-request layers: request ids, metrics and the one log line (`observe`), bearer keys
//! (`auth`) and the per-request timeout (`timeout`).

use super::error::ApiError;
use super::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Instant;

/// The header every response carries.
pub const REQUEST_ID_HEADER: &str = "x-typesafe-request-id";
/// A client's own id, echoed when it is plain.
pub const CLIENT_REQUEST_ID_HEADER: &str = "x-request-id";

/// This request's id, in the request's extensions for handlers that log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// What a handler read, left in the response's extensions for the log line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadSummary {
    pub model: String,
    pub questions: usize,
    pub reads: u32,
    pub draws: u32,
    /// Wall time of the read, queue wait included.
    pub read_ms: f64,
    pub prompt_tokens: u64,
    pub reused_tokens: u64,
    pub tokenize_ms: f64,
    pub prefill_ms: f64,
    pub denoise_ms: f64,
    /// Reads whose prompt started from a cached prefix.
    pub cache_hits: u32,
    /// The most requests that shared a forward pass with this one (0: not reported).
    pub batch_requests: u32,
    /// The engine's measured deviation between a read alone and batched, when this request
    /// shared a forward pass.
    pub batch_deviation: Option<f64>,
}

/// A client id is echoed only when it is short and made of safe characters, so it can never
/// smuggle anything into logs or headers.
fn plain(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

pub async fn observe(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request
        .headers()
        .get(CLIENT_REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| plain(v))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = request.method().clone();
    request.extensions_mut().insert(RequestId(id.clone()));

    state.metrics.http_in_flight(1);
    let mut response = next.run(request).await;
    state.metrics.http_in_flight(-1);

    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    state.metrics.record_request(&route, status, elapsed);
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    let summary = response
        .extensions()
        .get::<ReadSummary>()
        .cloned()
        .unwrap_or_default();
    // One line per request: what was asked, what it cost.
    tracing::info!(
        target: "hunch::request",
        request_id = %id,
        %method,
        route = %route,
        status,
        ms = round2(elapsed.as_secs_f64() * 1000.0),
        model = %summary.model,
        questions = summary.questions,
        reads = summary.reads,
        draws = summary.draws,
        read_ms = round2(summary.read_ms),
        prompt_tokens = summary.prompt_tokens,
        reused_tokens = summary.reused_tokens,
        tokenize_ms = round2(summary.tokenize_ms),
        prefill_ms = round2(summary.prefill_ms),
        denoise_ms = round2(summary.denoise_ms),
        cache_hits = summary.cache_hits,
        batch_requests = summary.batch_requests,
        batch_deviation = summary.batch_deviation,
    );
    response
}

/// Milliseconds to two decimals: enough for a log line.
fn round2(ms: f64) -> f64 {
    (ms * 100.0).round() / 100.0
}

pub async fn auth(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !state.keys.allows(presented) {
        return ApiError::Unauthorized {
            message: "missing or invalid API key (Authorization: Bearer KEY)".into(),
        }
        .into_response();
    }
    next.run(request).await
}

/// Bounds a `/v1` request. Dropping the handler's future cancels its read and frees its queue
/// slot, so a timed-out request costs nothing after its 504.
pub async fn timeout(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(state.limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn only_plain_client_ids_are_echoed() {
        assert!(plain("req-123_abc.4:5"));
        assert!(!plain(""));
        assert!(!plain("a b"));
        assert!(!plain("x\r\ny"));
        assert!(!plain(&"a".repeat(129)));
    }
}
