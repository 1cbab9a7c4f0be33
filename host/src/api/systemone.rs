//! `POST /v1/systemone`: decode, validate into typed questions, answer them with hunch-core's one
//! orchestration ([`hunch_core::answer_set`], shared with the policies' reads), reply in request
//! order.

use super::body::read_body;
use super::error::{from_read_error, ApiError, LocPart};
use super::middleware::{ReadSummary, RequestId};
use super::validate::SystemOneRequest;
use super::AppState;
use crate::api::decision as decision_api;
use crate::calibration::file::Calibrations;
use crate::calibration::serve::CalibratingReader;
use crate::decision::recorder::asking;
use crate::decision::Decision;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hunch_core::{answer_set, AskedQuestion, ReadStats, Reader, Usage};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// Top-level fields of the request this server ignored (comma-separated; a name with characters a
/// header cannot carry is percent-encoded), so a misspelt extension stays visible.
pub const IGNORED_FIELDS_HEADER: &str = "x-hunch-ignored-fields";
/// How many answers came from the answer cache (sent when the cache is on and the read isolated).
pub const ANSWER_CACHE_HITS_HEADER: &str = "x-hunch-answer-cache-hits";
/// The question mode the answers were read in: `isolated` or `joint`.
pub const QUESTIONS_HEADER: &str = "x-hunch-questions";
/// The prior remedy the answers were computed with (`none` or `divide`; docs/read.md).
pub const PRIOR_HEADER: &str = "x-hunch-prior";
/// The order remedy likewise (`as_given`, `reversed_average`, `cyclic_average`).
pub const ORDER_HEADER: &str = "x-hunch-order";
/// The id of the calibration the answers were computed with; absent when they are raw
/// (docs/calibration.md). `hunch batch` keeps it in its output, so a fit can tell raw from
/// calibrated answers.
pub const CALIBRATION_HEADER: &str = "x-hunch-calibration";

/// The most requests whose rows shared one forward pass with this one (1: read alone); sent when
/// the reader reports it.
pub const BATCH_REQUESTS_HEADER: &str = "x-hunch-batch-requests";
/// Sent when this request shared a forward pass with another request: the largest |Δ probability|
/// the engine measured between a read alone and batched on this model and backend (`0`:
/// bit-exact).
pub const BATCH_DEVIATION_HEADER: &str = "x-hunch-batch-deviation";

/// Every request is a decision: it gets an id and, with a decision log, an event
/// (`crate::decision`).
pub async fn handle(
    State(state): State<AppState>,
    request_id: Option<Extension<RequestId>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let decision = decision_api::begin(&state.decisions, "/v1/systemone", request_id, &headers);
    let mut seen = Seen::default();
    let result = decide(&state, &decision, &headers, body, &mut seen).await;
    let recorded_body = match &result {
        Ok((_, _, Json(body))) if decision.recording() => Some(body.clone()),
        _ => None,
    };
    let log = &state.decisions;
    decision_api::finish(
        log,
        &decision,
        None,
        |event| {
            event.input = seen.input.unwrap_or(Value::Null);
            event.model = seen.model.as_deref().map(|m| log.model_ref(m));
            event.result = recorded_body;
            if let Some(c) = &seen.calibration {
                crate::calibration::serve::record(event, c);
            }
        },
        result.map(IntoResponse::into_response),
    )
    .await
}

/// What a decision's event needs from the handler when it fails halfway.
#[derive(Default)]
struct Seen {
    model: Option<String>,
    input: Option<Value>,
    /// The calibration the answers were computed with.
    calibration: Option<Arc<Calibrations>>,
}

async fn decide(
    state: &AppState,
    decision: &Decision,
    headers: &HeaderMap,
    body: Body,
    seen: &mut Seen,
) -> Result<(Extension<ReadSummary>, HeaderMap, Json<Value>), ApiError> {
    refuse_multipart(headers)?;
    let bytes = read_body(headers, body, state.limits.max_body_bytes).await?;
    if decision.recording() {
        seen.input = serde_json::from_slice(&bytes).ok();
    }
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity");
    state
        .metrics
        .record_body_encoding(&encoding.trim().to_ascii_lowercase());
    let mut request = state.validator.parse(&bytes)?;
    // An unknown model is a 404 (TypeSafe's contract), listing what is served.
    let gated = state.reader(&request.model)?;
    // A model that can never fit the memory budget is a 507 now, not after a wait.
    state.check_fits(gated.model_name())?;
    let model_name = gated.model_name().to_string();
    // A model's own read settings (its models directory's settings file) stand in for what the
    // request does not say; the server's question mode for what neither says.
    let (model_questions, model_draws) = state
        .models
        .as_ref()
        .filter(|m| m.manages(&model_name))
        .map_or((None, None), |m| m.read_settings(&model_name));
    if request.options.draws.is_none() {
        request.options.draws = model_draws;
    }
    // The prior and order remedies likewise (docs/read.md): the request's, the model's, else
    // the server's. They ride in the read options, so the decision's record names them and a replay
    // reproduces them.
    let (model_prior, model_order) = state
        .models
        .as_ref()
        .filter(|m| m.manages(&model_name))
        .map_or((None, None), |m| m.debias_settings(&model_name));
    request.options.prior = request
        .x_prior
        .or(model_prior)
        .unwrap_or(state.answering.prior);
    request.options.order = request
        .x_order
        .or(model_order)
        .unwrap_or(state.answering.order);
    let questions = model_questions.unwrap_or(state.answering.questions);
    let model: Arc<dyn Reader> = Arc::new(gated);
    // The answer cache sits below the decision's recorder, so a recorded read holds every
    // answer, cached or read (and replays without a model). It holds raw distributions: the
    // calibration is applied above the recorder, at every read, so a reloaded calibration
    // applies to cached answers at once.
    let calibration = state.calibration.current();
    let model = state.answering.reader(model);
    let reader = decision.reader(model);
    seen.model = Some(reader.model_name().to_string());
    // The calibration wraps the recording reader: the record keeps the raw distributions.
    let reader: Arc<dyn Reader> = match calibration {
        Some(c) => {
            if request.calibration_off {
                reader
            } else {
                seen.calibration = Some(c.clone());
                Arc::new(CalibratingReader {
                    inner: reader,
                    calibrations: c,
                })
            }
        }
        None => reader,
    };
    let started = Instant::now();
    let answered = answer(reader.as_ref(), &request, questions).await;
    // `x_keep_alive` applies once this request's reads are done, answered or not.
    if let (Some(keep), Some(manager)) = (request.keep_alive, &state.models) {
        if manager.manages(&model_name) {
            manager.keep_alive(&model_name, keep);
        }
    }
    let answered = answered?;
    let summary = ReadSummary {
        model: reader.model_name().to_string(),
        questions: request.questions.len(),
        reads: answered.stats.reads,
        draws: answered.stats.draws,
        read_ms: started.elapsed().as_secs_f64() * 1000.0,
        prompt_tokens: answered.stats.prompt_tokens,
        reused_tokens: answered.stats.reused_tokens,
        tokenize_ms: answered.stats.tokenize_seconds * 1000.0,
        prefill_ms: answered.stats.prefill_seconds * 1000.0,
        denoise_ms: answered.stats.denoise_seconds * 1000.0,
        cache_hits: answered.stats.cache_hits,
        batch_requests: answered.stats.max_batch_requests,
        batch_deviation: answered.stats.batch_deviation,
    };
    let mut headers = batch_headers(&answered.stats);
    headers.insert(
        QUESTIONS_HEADER,
        HeaderValue::from_static(answered.mode.as_str()),
    );
    headers.insert(
        PRIOR_HEADER,
        HeaderValue::from_static(request.options.prior.as_str()),
    );
    headers.insert(
        ORDER_HEADER,
        HeaderValue::from_static(request.options.order.as_str()),
    );
    if let Some(c) = &seen.calibration {
        if let Ok(v) = HeaderValue::from_str(&c.id) {
            headers.insert(CALIBRATION_HEADER, v);
        }
    }
    if !request.ignored_fields.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&header_list(&request.ignored_fields)) {
            headers.insert(IGNORED_FIELDS_HEADER, v);
        }
    }
    if state.answering.cache.is_some() && answered.mode == hunch_core::QuestionMode::Isolated {
        headers.insert(
            ANSWER_CACHE_HITS_HEADER,
            HeaderValue::from(answered.cache_hits),
        );
    }
    // The summary rides in the response's extensions to the request log line.
    Ok((Extension(summary), headers, Json(answered.body)))
}

/// Names as one header value: visible ASCII stays, anything else (and `%` and `,`) is
/// percent-encoded byte by byte.
fn header_list(names: &[String]) -> String {
    names
        .iter()
        .map(|name| {
            let mut out = String::with_capacity(name.len());
            for b in name.bytes() {
                if b.is_ascii_graphic() && b != b'%' && b != b',' {
                    out.push(b as char);
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a client may want to know about batching: how many requests shared this one's forward
/// passes, and (when it shared one) how far batching can move a probability on this engine.
pub fn batch_headers(stats: &ReadStats) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if stats.max_batch_requests > 0 {
        headers.insert(
            BATCH_REQUESTS_HEADER,
            HeaderValue::from(stats.max_batch_requests),
        );
    }
    if let Some(deviation) = stats.batch_deviation {
        if let Ok(v) = HeaderValue::from_str(&format!("{deviation}")) {
            headers.insert(BATCH_DEVIATION_HEADER, v);
        }
    }
    headers
}

/// The SDK sends image assets as `multipart/form-data`; a text-only model refuses them by name.
fn refuse_multipart(headers: &HeaderMap) -> Result<(), ApiError> {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/")
        });
    if multipart {
        return Err(ApiError::field(
            vec![LocPart::from("body"), LocPart::from("assets")],
            "unsupported",
            "this model is text-only: image assets (multipart requests) are not supported",
        ));
    }
    Ok(())
}

/// A System One response, ready to send, with what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub body: Value,
    pub usage: Usage,
    pub stats: ReadStats,
    /// Answers served from the answer cache.
    pub cache_hits: u32,
    pub mode: hunch_core::QuestionMode,
}

/// Answers every question of `request` through hunch-core's orchestration (the request's
/// `x_questions`, else the server's mode `questions`) and builds the response body. The answer
/// cache, when on, is part of `reader` ([`hunch_core::AnswerSettings::reader`]).
pub async fn answer(
    reader: &dyn Reader,
    request: &SystemOneRequest,
    questions: hunch_core::QuestionMode,
) -> Result<Answered, ApiError> {
    let mut options = request.options.clone();
    options.questions = request.x_questions.unwrap_or(questions);
    let asked: Vec<AskedQuestion> = request
        .questions
        .iter()
        .map(|q| AskedQuestion {
            id: q.id.clone(),
            question: q.question.clone(),
        })
        .collect();
    let ids: Vec<String> = request.questions.iter().map(|q| q.id.0.clone()).collect();
    // Within `asking`, so the decision's record names each read's questions by the request's ids.
    // The answer cache, when on, is part of the reader (below the decision's recorder).
    let set = asking(&asked, answer_set(reader, &request.state, &asked, &options))
        .await
        .map_err(|e| from_read_error(e.error, &ids))?;

    let mut answers = Map::new();
    for (asked, answer) in request.questions.iter().zip(&set.answers) {
        let mut value = serde_json::to_value(answer)
            .map_err(|e| ApiError::internal(format!("an answer did not serialise: {e}")))?;
        // The legend echoes the levels exactly as sent (objects stay objects).
        if let (Some(levels), Some(legend)) = (&asked.legend_values, value.get_mut("legend")) {
            *legend = Value::Object(
                levels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i.to_string(), l.clone()))
                    .collect(),
            );
        }
        answers.insert(asked.id.0.clone(), value);
    }
    let usage = set.usage;
    let body = json!({
        "model": reader.model_name(),
        "answers": answers,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    });
    Ok(Answered {
        body,
        usage,
        stats: set.stats,
        cache_hits: set.cache_hits,
        mode: options.questions,
    })
}

#[cfg(test)]
mod tests;
