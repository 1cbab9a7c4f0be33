//! `POST /v1/systemone`: decode, validate into typed questions, read the ones that need a read,
//! build every answer with hunch-core's one piece of answer math, reply in request order.

use super::body::read_body;
use super::error::{from_read_error, ApiError, LocPart};
use super::middleware::ReadSummary;
use super::validate::SystemOneRequest;
use super::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::{Extension, Json};
use hunch_core::{Answer, ReadRequest, ReadStats, Reader, Usage};
use serde_json::{json, Map, Value};
use std::time::Instant;

pub async fn handle(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<(Extension<ReadSummary>, Json<Value>), ApiError> {
    refuse_multipart(&headers)?;
    let bytes = read_body(&headers, body, state.limits.max_body_bytes).await?;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity");
    state
        .metrics
        .record_body_encoding(&encoding.trim().to_ascii_lowercase());
    let request = state.validator.parse(&bytes)?;
    // An unknown model is a 404 (TypeSafe's contract), listing what is served.
    let reader = state.reader(&request.model)?;
    let started = Instant::now();
    let answered = answer(&reader, &request).await?;
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
    };
    // The summary rides in the response's extensions to the request log line.
    Ok((Extension(summary), Json(answered.body)))
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

    /// Answers with fixed distributions, or fails, and remembers what it was asked.
    struct Stub {
        result: Result<Vec<Vec<f64>>, ReadError>,
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
                stats: ReadStats::default(),
            })
        }
    }

    fn stub(result: Result<Vec<Vec<f64>>, ReadError>) -> Stub {
        Stub {
            result,
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
}
