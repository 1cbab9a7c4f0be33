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
mod tests {
    use super::*;
    use crate::api::validate::RequestValidator;
    use hunch_core::{AnswerSettings, QuestionMode};
    use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest};
    use std::sync::Mutex;

    /// Answers with fixed distributions (and stats), or fails, and remembers what it was asked.
    struct Stub {
        result: Result<Vec<Vec<f64>>, ReadError>,
        stats: ReadStats,
        asked: Mutex<Vec<ReadRequest>>,
        limits: hunch_core::ReaderLimits,
    }

    #[async_trait::async_trait]
    impl Reader for Stub {
        fn model_name(&self) -> &str {
            "real-name"
        }
        async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
            self.asked.lock().unwrap().push(request);
            self.result.clone().map(|d| ReadOutcome {
                distributions: d.into_iter().map(LabelDistribution).collect(),
                usage: Usage {
                    input_tokens: 7,
                    output_tokens: 2,
                },
                stats: self.stats.clone(),
            })
        }
        fn info(&self) -> hunch_core::ReaderInfo {
            hunch_core::ReaderInfo {
                limits: self.limits,
                fingerprint: Some("stub".into()),
                kind: None,
            }
        }
    }

    fn stub(result: Result<Vec<Vec<f64>>, ReadError>) -> Stub {
        Stub {
            result,
            stats: ReadStats::default(),
            asked: Mutex::new(Vec::new()),
            limits: Default::default(),
        }
    }

    fn request() -> SystemOneRequest {
        RequestValidator::new()
            .unwrap()
            .validate(&json!({"model": "jev-latest", "state": "s", "questions": {
                "single": {"type": "choice", "criteria": {"only": null}},
                "yn": {"type": "noul", "instructions": "?"},
                "lvl": {"type": "score", "criteria": ["a", {"b": 1}, "c"]},
                "pick": {"type": "choice", "criteria": {"x": null, "y": "why"}}
            }}))
            .unwrap()
    }

    #[tokio::test]
    async fn only_questions_that_need_a_read_are_read_and_answers_keep_request_order() {
        let reader = stub(Ok(vec![
            vec![0.8, 0.2],
            vec![0.2, 0.3, 0.5],
            vec![0.25, 0.75],
        ]));
        let answered = answer(&reader, &request(), QuestionMode::Isolated)
            .await
            .unwrap();
        let asked = reader.asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        assert_eq!(
            asked[0].questions.len(),
            3,
            "the 1-option choice is not read"
        );
        let body = &answered.body;
        assert_eq!(body["model"], "real-name");
        let ids: Vec<&String> = body["answers"].as_object().unwrap().keys().collect();
        assert_eq!(ids, vec!["single", "yn", "lvl", "pick"]);
        assert_eq!(body["answers"]["single"]["confidence"], 1.0);
        assert_eq!(body["answers"]["yn"]["noul"], 0.8);
        assert_eq!(
            body["answers"]["lvl"]["legend"],
            json!({"0": "a", "1": {"b": 1}, "2": "c"})
        );
        assert_eq!(body["answers"]["pick"]["choice"], "y");
        assert_eq!(
            body["usage"],
            json!({"input_tokens": 7, "output_tokens": 2})
        );
    }

    #[tokio::test]
    async fn a_reader_error_names_the_callers_question() {
        // Index 1 of the *read* questions is "lvl" (the 1-option "single" is not read).
        let reader = stub(Err(ReadError::InvalidQuestion {
            question: 1,
            message: "no".into(),
        }));
        match answer(&reader, &request(), QuestionMode::Isolated).await {
            Err(ApiError::Validation(e)) => assert_eq!(e[0].loc_path(), "body.questions.lvl"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn broken_reader_output_is_a_500_never_nan() {
        let short = stub(Ok(vec![vec![0.5, 0.5]]));
        assert!(matches!(
            answer(&short, &request(), QuestionMode::Isolated).await,
            Err(ApiError::Internal { .. })
        ));
        let nan = stub(Ok(vec![
            vec![f64::NAN, 0.5],
            vec![0.2, 0.3, 0.5],
            vec![0.25, 0.75],
        ]));
        assert!(matches!(
            answer(&nan, &request(), QuestionMode::Isolated).await,
            Err(ApiError::Internal { .. })
        ));
    }

    #[test]
    fn batch_headers_follow_the_read_stats() {
        assert!(batch_headers(&ReadStats::default()).is_empty());
        let alone = batch_headers(&ReadStats {
            max_batch_requests: 1,
            ..Default::default()
        });
        assert_eq!(alone.get(BATCH_REQUESTS_HEADER).unwrap(), "1");
        assert!(alone.get(BATCH_DEVIATION_HEADER).is_none());
        let shared = batch_headers(&ReadStats {
            max_batch_requests: 5,
            batch_deviation: Some(0.00019),
            ..Default::default()
        });
        assert_eq!(shared.get(BATCH_REQUESTS_HEADER).unwrap(), "5");
        assert_eq!(shared.get(BATCH_DEVIATION_HEADER).unwrap(), "0.00019");
    }

    /// Serves the whole app on a local port with one model read by `reader`; returns its URL.
    async fn serve(reader: Stub) -> String {
        serve_with(std::sync::Arc::new(reader), AnswerSettings::default()).await
    }

    async fn serve_with(reader: std::sync::Arc<Stub>, answering: AnswerSettings) -> String {
        let mut registry = crate::reader::Registry::new();
        registry
            .add(crate::reader::ModelEntry {
                name: "real-name".into(),
                description: String::new(),
                release_date: String::new(),
                reader,
            })
            .unwrap();
        let state = AppState::new(
            registry,
            crate::api::Limits::default(),
            crate::api::ApiKeys::default(),
        )
        .unwrap()
        .with_answering(answering);
        let app = crate::api::router(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        url
    }

    fn stub_with(stats: ReadStats) -> Stub {
        Stub {
            stats,
            ..stub(Ok(vec![vec![0.8, 0.2]]))
        }
    }

    async fn post(url: &str) -> reqwest::Response {
        let body = json!({"model": "jev-latest", "state": "s",
                          "questions": {"yn": {"type": "noul", "instructions": "?"}}});
        let response = post_body(url, &body).await;
        assert_eq!(response.status(), 200);
        response
    }

    async fn metrics(url: &str) -> String {
        let response = reqwest::get(format!("{url}/metrics")).await.unwrap();
        response.text().await.unwrap()
    }

    #[tokio::test]
    async fn a_batched_answer_says_so_in_its_headers_and_metrics() {
        let url = serve(stub_with(ReadStats {
            reads: 1,
            cache_hits: 1,
            forwards: 2,
            max_batch_requests: 3,
            max_batch_rows: 40,
            batch_deviation: Some(0.0),
            ..Default::default()
        }))
        .await;
        let response = post(&url).await;
        let headers = response.headers();
        assert_eq!(headers.get(BATCH_REQUESTS_HEADER).unwrap(), "3");
        assert_eq!(headers.get(BATCH_DEVIATION_HEADER).unwrap(), "0");
        let metrics = metrics(&url).await;
        assert!(metrics.contains("hunch_model_prefix_cache_hits_total{model=\"real-name\"} 1\n"));
        assert!(metrics.contains("hunch_model_forwards_total{model=\"real-name\"} 2\n"));
        assert!(
            metrics.contains("hunch_model_batch_requests_bucket{model=\"real-name\",le=\"4\"} 1\n")
        );
        assert!(metrics.contains("hunch_model_batch_rows_sum{model=\"real-name\"} 40\n"));
        assert!(metrics.contains("hunch_model_batch_deviation{model=\"real-name\"} 0\n"));
    }

    #[tokio::test]
    async fn an_answer_read_alone_or_by_an_old_sidecar_sends_no_deviation() {
        let alone = serve(stub_with(ReadStats {
            max_batch_requests: 1,
            batch_deviation: None,
            ..Default::default()
        }))
        .await;
        let response = post(&alone).await;
        assert_eq!(response.headers().get(BATCH_REQUESTS_HEADER).unwrap(), "1");
        assert!(response.headers().get(BATCH_DEVIATION_HEADER).is_none());

        let old = serve(stub_with(ReadStats::default())).await;
        let response = post(&old).await;
        assert!(response.headers().get(BATCH_REQUESTS_HEADER).is_none());
        assert!(response.headers().get(BATCH_DEVIATION_HEADER).is_none());
    }

    async fn post_body(url: &str, body: &Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{url}/v1/systemone"))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_read_beyond_the_readers_size_limit_is_a_400_and_never_sent() {
        let reader = std::sync::Arc::new(Stub {
            limits: hunch_core::ReaderLimits {
                max_request_bytes: Some(1 << 20),
                ..Default::default()
            },
            ..stub_with(ReadStats::default())
        });
        let url = serve_with(reader.clone(), AnswerSettings::default()).await;
        let response = post_body(
            &url,
            &json!({"model": "jev-latest", "state": "s",
                    "questions": {"big": {"type": "noul", "instructions": "x".repeat(3 << 20)}}}),
        )
        .await;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["detail"]["error_type"], "request_too_large", "{body}");
        assert!(reader.asked.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_remedies_asked_are_read_reported_and_answers_keep_the_option_names() {
        // The stub answers [0.8, 0.2] to every read: a pure position bias.
        let reader = std::sync::Arc::new(stub(Ok(vec![vec![0.8, 0.2], vec![0.8, 0.2]])));
        let url = serve_with(reader.clone(), AnswerSettings::default()).await;
        let body = json!({"model": "jev-latest", "state": "s", "x_prior": "divide",
                          "x_order": "reversed_average",
                          "questions": {"pick": {"type": "choice", "criteria": {"x": null, "y": null}}}});
        let response = post_body(&url, &body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[PRIOR_HEADER], "divide");
        assert_eq!(response.headers()[ORDER_HEADER], "reversed_average");
        let b: Value = response.json().await.unwrap();
        assert_eq!(
            b["answers"]["pick"]["probabilities"],
            json!({"x": 0.5, "y": 0.5})
        );
        assert_eq!(b["answers"]["pick"]["choice"], "x");
        let asked = reader.asked.lock().unwrap().clone();
        // One read about the state, one about "N/A", each with both orders; the model's reader
        // never sees the remedies.
        assert_eq!(asked.len(), 2);
        assert_eq!(asked[1].state, hunch_core::debias::PRIOR_STATE);
        let hunch_core::QuestionKind::Choice { options } = &asked[0].questions[1].kind else {
            panic!("not a choice");
        };
        assert_eq!(options[0].name, "y");
        assert!(asked
            .iter()
            .all(|r| r.options.prior.is_none() && r.options.order.is_as_given()));
        // Without them: the server's default (none), said so.
        let url = serve_with(
            std::sync::Arc::new(stub_with(ReadStats::default())),
            AnswerSettings::default(),
        )
        .await;
        let plain = post(&url).await;
        assert_eq!(plain.headers()[PRIOR_HEADER], "none");
        assert_eq!(plain.headers()[ORDER_HEADER], "as_given");
        // A name that is not a remedy is a 422 naming the field.
        let bad = post_body(
            &url,
            &json!({"model": "jev-latest", "state": "s", "x_order": "reverse",
            "questions": {"q": {"type": "noul", "instructions": "?"}}}),
        )
        .await;
        assert_eq!(bad.status(), 422);
        let detail: Value = bad.json().await.unwrap();
        assert_eq!(
            detail["detail"][0]["loc"],
            json!(["body", "x_order"]),
            "{detail}"
        );
    }

    #[tokio::test]
    async fn unknown_fields_are_named_and_the_mode_and_cache_hits_are_reported() {
        let reader = std::sync::Arc::new(stub_with(ReadStats::default()));
        let cache = std::sync::Arc::new(hunch_core::AnswerCache::new(1 << 20));
        let url = serve_with(
            reader.clone(),
            AnswerSettings {
                questions: hunch_core::QuestionMode::Isolated,
                cache: Some(cache),
                ..AnswerSettings::default()
            },
        )
        .await;
        let body = json!({"model": "jev-latest", "state": "s", "x_sed": 1, "trace": "é,%",
                          "questions": {"yn": {"type": "noul", "instructions": "?"}}});
        let first = post_body(&url, &body).await;
        assert_eq!(first.status(), 200);
        let headers = first.headers().clone();
        assert_eq!(headers[IGNORED_FIELDS_HEADER], "x_sed, trace");
        assert_eq!(headers[QUESTIONS_HEADER], "isolated");
        assert_eq!(headers[ANSWER_CACHE_HITS_HEADER], "0");
        let a: Value = first.json().await.unwrap();
        let second = post_body(&url, &body).await;
        assert_eq!(second.headers()[ANSWER_CACHE_HITS_HEADER], "1");
        let b: Value = second.json().await.unwrap();
        assert_eq!(a["answers"], b["answers"]);
        assert_eq!(b["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
        assert_eq!(reader.asked.lock().unwrap().len(), 1);
        let metrics = metrics(&url).await;
        assert!(
            metrics.contains("hunch_answer_cache_hits_total 1\n"),
            "{metrics}"
        );
        // A joint request is read (never cached) and says so.
        let mut joint = body.clone();
        joint["x_questions"] = json!("joint");
        let third = post_body(&url, &joint).await;
        assert_eq!(third.headers()[QUESTIONS_HEADER], "joint");
        assert!(third.headers().get(ANSWER_CACHE_HITS_HEADER).is_none());
        assert_eq!(reader.asked.lock().unwrap().len(), 2);
        assert_eq!(
            reader.asked.lock().unwrap()[1].options.questions,
            hunch_core::QuestionMode::Joint
        );
    }

    #[test]
    fn header_lists_escape_what_a_header_cannot_carry() {
        assert_eq!(
            header_list(&["a".into(), "é,%".into(), "b c".into()]),
            "a, %C3%A9%2C%25, b%20c"
        );
    }
}
