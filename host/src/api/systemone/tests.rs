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
    assert!(metrics.contains("hunch_model_batch_requests_bucket{model=\"real-name\",le=\"4\"} 1\n"));
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
