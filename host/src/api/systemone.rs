//! `POST /v1/systemone`: decode, validate into typed questions, read the ones that need a read,
//! build every answer with hunch-core's one piece of answer math, reply in request order.

use super::body::read_body;
use super::error::{from_read_error, ApiError, LocPart};
use super::middleware::{ReadSummary, RequestId};
use super::validate::SystemOneRequest;
use super::AppState;
use crate::decision::{api as decision_api, Decision};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use axum::{Extension, Json};
use hunch_core::{Answer, ReadRequest, ReadStats, Reader, Usage};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

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
    decision_api::finish_systemone(
        &state.decisions,
        &decision,
        seen.model.as_deref(),
        seen.input,
        result,
    )
    .await
}

/// What a decision's event needs from the handler when it fails halfway.
#[derive(Default)]
struct Seen {
    model: Option<String>,
    input: Option<Value>,
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
    let request = state.validator.parse(&bytes)?;
    // An unknown model is a 404 (TypeSafe's contract), listing what is served.
    let reader = decision.reader(Arc::new(state.reader(&request.model)?));
    seen.model = Some(reader.model_name().to_string());
    let started = Instant::now();
    let answered = answer(reader.as_ref(), &request).await?;
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
    // The summary rides in the response's extensions to the request log line.
    Ok((
        Extension(summary),
        batch_headers(&answered.stats),
        Json(answered.body),
    ))
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
}

/// Reads the questions that need a read (one reader call for all of them) and builds every answer
/// with hunch-core. 1-option and 1-level questions are answered without a read.
pub async fn answer(reader: &dyn Reader, request: &SystemOneRequest) -> Result<Answered, ApiError> {
    let needs_read: Vec<usize> = request
        .questions
        .iter()
        .enumerate()
        .filter(|(_, q)| q.question.needs_read())
        .map(|(i, _)| i)
        .collect();
    let (distributions, usage, stats) = if needs_read.is_empty() {
        (Vec::new(), Usage::default(), ReadStats::default())
    } else {
        let read = ReadRequest {
            state: request.state.clone(),
            questions: needs_read
                .iter()
                .map(|&i| request.questions[i].question.clone())
                .collect(),
            options: request.options.clone(),
        };
        let ids: Vec<String> = needs_read
            .iter()
            .map(|&i| request.questions[i].id.0.clone())
            .collect();
        let outcome = reader
            .read(read)
            .await
            .map_err(|e| from_read_error(e, &ids))?;
        if outcome.distributions.len() != needs_read.len() {
            return Err(ApiError::internal(format!(
                "the reader returned {} distributions for {} questions",
                outcome.distributions.len(),
                needs_read.len()
            )));
        }
        (outcome.distributions, outcome.usage, outcome.stats)
    };

    let mut answers = Map::new();
    let mut next_read = distributions.iter();
    for asked in &request.questions {
        let answer = if asked.question.needs_read() {
            let dist = next_read
                .next()
                .ok_or_else(|| ApiError::internal("fewer distributions than questions"))?;
            Answer::from_distribution(&asked.question, dist)
                .map_err(|e| ApiError::internal(format!("question {:?}: {e}", asked.id.as_str())))?
        } else {
            Answer::without_read(&asked.question).ok_or_else(|| {
                ApiError::internal(format!(
                    "question {:?} cannot be answered",
                    asked.id.as_str()
                ))
            })?
        };
        let mut value = serde_json::to_value(&answer)
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
    let body = json!({
        "model": reader.model_name(),
        "answers": answers,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    });
    Ok(Answered { body, usage, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::RequestValidator;
    use hunch_core::{LabelDistribution, ReadError, ReadOutcome};
    use std::sync::Mutex;

    /// Answers with fixed distributions (and stats), or fails, and remembers what it was asked.
    struct Stub {
        result: Result<Vec<Vec<f64>>, ReadError>,
        stats: ReadStats,
        asked: Mutex<Vec<ReadRequest>>,
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
    }

    fn stub(result: Result<Vec<Vec<f64>>, ReadError>) -> Stub {
        Stub {
            result,
            stats: ReadStats::default(),
            asked: Mutex::new(Vec::new()),
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
        let answered = answer(&reader, &request()).await.unwrap();
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
        match answer(&reader, &request()).await {
            Err(ApiError::Validation(e)) => assert_eq!(e[0].loc_path(), "body.questions.lvl"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn broken_reader_output_is_a_500_never_nan() {
        let short = stub(Ok(vec![vec![0.5, 0.5]]));
        assert!(matches!(
            answer(&short, &request()).await,
            Err(ApiError::Internal { .. })
        ));
        let nan = stub(Ok(vec![
            vec![f64::NAN, 0.5],
            vec![0.2, 0.3, 0.5],
            vec![0.25, 0.75],
        ]));
        assert!(matches!(
            answer(&nan, &request()).await,
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
        let mut registry = crate::reader::Registry::new();
        registry
            .add(crate::reader::ModelEntry {
                name: "real-name".into(),
                description: String::new(),
                release_date: String::new(),
                reader: std::sync::Arc::new(reader),
            })
            .unwrap();
        let state = AppState::new(
            registry,
            crate::api::Limits::default(),
            crate::api::ApiKeys::default(),
        )
        .unwrap();
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
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/systemone"))
            .json(&json!({"model": "jev-latest", "state": "s",
                          "questions": {"yn": {"type": "noul", "instructions": "?"}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response
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
        let metrics = reqwest::get(format!("{url}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
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
}
