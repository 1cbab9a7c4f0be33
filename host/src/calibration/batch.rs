//! Lines of a `hunch batch` output file as labellable records (labels name them by
//! `custom_id`): the questions asked, as the line carries them (`request.questions`, which
//! `hunch batch` writes for `/v1/systemone` lines), and the distribution each answer holds.
//!
//! What fitting needs and a line may lack is said per label, never skipped: a line that failed
//! or was refused, a policy decision, a line without the questions (written before `hunch batch`
//! kept them), answers computed with a calibration (fitting needs the raw probabilities), an
//! answer without its full distribution.

use super::dataset::{normalised, Recorded, RecordedAnswer};
use super::labels::LabelKey;
use hunch_core::{Question, QuestionId, QuestionKind};
use serde_json::{Map, Value};

/// One output line of `hunch batch`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchLine {
    pub custom_id: String,
    /// What the line answered, or why it cannot be used.
    pub answered: Result<BatchAnswer, String>,
}

/// A `/v1/systemone` line answered with a 2xx.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchAnswer {
    /// The request's `questions` as sent; `None` in files written before `hunch batch` kept them.
    pub questions: Option<Value>,
    /// The response's `answers`, by question id.
    pub answers: Map<String, Value>,
    /// The calibration the server computed the answers with (`response.calibration`, from the
    /// `x-hunch-calibration` header), if any.
    pub calibration: Option<String>,
}

/// Whether `value` has the shape of a batch output line (OpenAI's: a `custom_id` with a
/// `response` or an `error`), whoever wrote it.
pub fn is_batch_line(value: &Value) -> bool {
    value.get("custom_id").is_some()
        && (value.get("response").is_some() || value.get("error").is_some())
        && value.get("decision_id").is_none()
}

/// The line, or `None` when it has no usable `custom_id` (nothing could label it).
pub fn parse_line(value: &Value) -> Option<BatchLine> {
    let custom_id = value.get("custom_id")?.as_str()?.to_string();
    Some(BatchLine {
        custom_id,
        answered: answered(value),
    })
}

fn answered(value: &Value) -> Result<BatchAnswer, String> {
    let Some(response) = value.get("response").filter(|r| r.is_object()) else {
        let message = value
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no response");
        return Err(format!("the batch line was not answered: {message}"));
    };
    let status = response.get("status_code").and_then(Value::as_u64);
    if !status.is_some_and(|s| (200..300).contains(&s)) {
        return Err(format!(
            "the batch line was answered with status {}",
            status.map_or_else(|| "(none)".into(), |s| s.to_string())
        ));
    }
    let Some(answers) = response.pointer("/body/answers").and_then(Value::as_object) else {
        return Err(
            "the batch line holds no `/v1/systemone` answers (a policy decision's reads are labelled by decision_id against the decision log)"
                .into(),
        );
    };
    Ok(BatchAnswer {
        questions: value.pointer("/request/questions").cloned(),
        answers: answers.clone(),
        calibration: response
            .get("calibration")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// The line as a record; `type_questions` types the request's questions with the server's own
/// validation (the caller owns it), so their keys are exactly those the model was asked.
pub fn recorded(
    line: &BatchLine,
    type_questions: &dyn Fn(&Value) -> Result<Vec<(QuestionId, Question)>, String>,
) -> Recorded {
    Recorded {
        key: LabelKey::Custom(line.custom_id.clone()),
        no_question: "the line's request has no question with this id",
        answers: line
            .answered
            .clone()
            .and_then(|a| answers(&a, type_questions)),
    }
}

fn answers(
    answer: &BatchAnswer,
    type_questions: &dyn Fn(&Value) -> Result<Vec<(QuestionId, Question)>, String>,
) -> Result<Vec<RecordedAnswer>, String> {
    if let Some(id) = &answer.calibration {
        return Err(format!(
            "the answers were computed with calibration {id}, and fitting needs raw probabilities: send the batch with \"x_calibration\": \"off\" in each body, or fit from the server's decision log (it records the raw ones)"
        ));
    }
    let Some(questions) = &answer.questions else {
        return Err(NO_QUESTIONS.into());
    };
    let typed = type_questions(questions)
        .map_err(|e| format!("the questions the line carries do not validate: {e}"))?;
    Ok(typed
        .into_iter()
        .map(|(id, question)| {
            let distribution = match answer.answers.get(&id.0) {
                Some(a) => distribution(&question, a),
                None => Err("the response has no answer to this question".into()),
            };
            RecordedAnswer {
                id,
                question,
                distribution,
            }
        })
        .collect())
}

/// Why a line without `request.questions` cannot be used.
pub const NO_QUESTIONS: &str = "the batch line does not carry the questions asked (`request.questions`), which fitting needs to know which question each answer belongs to: it was written by a `hunch batch` without calibration support; run the batch again into a new output file";

/// The full distribution an answer holds, in the question's label order: a noul's `noul` is
/// `P(yes)`; a choice's and a score's `probabilities` name every option or level.
fn distribution(question: &Question, answer: &Value) -> Result<Vec<f64>, String> {
    let missing = || -> String {
        "the answer carries no full distribution (`probabilities` for every option or level)".into()
    };
    let p: Vec<f64> = match &question.kind {
        QuestionKind::Noul { .. } => {
            let yes = answer
                .get("noul")
                .and_then(Value::as_f64)
                .ok_or_else(|| "the answer carries no `noul` probability".to_string())?;
            vec![yes, 1.0 - yes]
        }
        QuestionKind::Choice { options } => {
            let probabilities = answer.get("probabilities").ok_or_else(missing)?;
            options
                .iter()
                .map(|o| probabilities.get(&o.name).and_then(Value::as_f64))
                .collect::<Option<_>>()
                .ok_or_else(missing)?
        }
        QuestionKind::Score { levels } => {
            let probabilities = answer.get("probabilities").ok_or_else(missing)?;
            (0..levels.len())
                .map(|i| probabilities.get(i.to_string()).and_then(Value::as_f64))
                .collect::<Option<_>>()
                .ok_or_else(missing)?
        }
    };
    normalised(question, &p)
        .ok_or_else(|| "the answer's probabilities are not a distribution".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::fixtures::{choice, noul};
    use serde_json::json;

    fn typed(questions: &Value) -> Result<Vec<(QuestionId, Question)>, String> {
        // The tests' questions: `u` a noul, `t` a choice of a/b, `s` a score of two levels.
        let mut out = Vec::new();
        for (id, _) in questions.as_object().ok_or("not an object")? {
            let question = match id.as_str() {
                "u" => noul(id),
                "t" => choice(id, &["a", "b"]),
                _ => Question {
                    instructions: id.clone(),
                    kind: QuestionKind::Score {
                        levels: vec!["low".into(), "high".into()],
                    },
                },
            };
            out.push((QuestionId(id.clone()), question));
        }
        Ok(out)
    }

    fn line(value: Value) -> Recorded {
        assert!(is_batch_line(&value));
        recorded(&parse_line(&value).unwrap(), &typed)
    }

    #[test]
    fn answers_give_their_full_distributions_in_label_order() {
        let r = line(json!({
            "id": "batch_req_1", "custom_id": "c1", "error": null,
            "request": {"questions": {"u": {}, "t": {}, "s": {}}},
            "response": {"status_code": 200, "request_id": "r", "body": {"answers": {
                "u": {"type": "noul", "noul": 0.75},
                "t": {"type": "choice", "choice": "b", "confidence": 0.2,
                      "probabilities": {"b": 0.6, "a": 0.4}},
                "s": {"type": "score", "score": 0.3, "probabilities": {"0": 0.7, "1": 0.3}}
            }}}
        }));
        assert_eq!(r.key, LabelKey::Custom("c1".into()));
        let answers = r.answers.unwrap();
        let d = |id: &str| {
            answers
                .iter()
                .find(|a| a.id.0 == id)
                .unwrap()
                .distribution
                .clone()
                .unwrap()
        };
        assert_eq!(d("u"), vec![0.75, 0.25]);
        assert_eq!(
            d("t"),
            vec![0.4, 0.6],
            "by option name, in the question's order"
        );
        assert_eq!(d("s"), vec![0.7, 0.3]);
    }

    #[test]
    fn a_line_lacking_what_fitting_needs_says_what_and_why() {
        let answered = |extra: Value| {
            let mut v = json!({"custom_id": "c", "error": null,
                "response": {"status_code": 200, "body": {"answers": {"u": {"noul": 0.5}, "t": {"choice": "a"}}}}});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            line(v).answers
        };
        let e = answered(json!({})).unwrap_err();
        assert!(
            e.contains("request.questions") && e.contains("new output file"),
            "{e}"
        );
        let mut calibrated = json!({"custom_id": "c", "error": null,
            "request": {"questions": {"u": {}}},
            "response": {"status_code": 200, "calibration": "abc", "body": {"answers": {}}}});
        let e = line(calibrated.take()).answers.unwrap_err();
        assert!(e.contains("calibration abc") && e.contains("raw"), "{e}");
        let a = answered(json!({"request": {"questions": {"u": {}, "t": {}, "s": {}}}})).unwrap();
        assert!(a[0].distribution.is_ok());
        let t = a[1].distribution.as_ref().unwrap_err();
        assert!(t.contains("full distribution"), "{t}");
        let s = a[2].distribution.as_ref().unwrap_err();
        assert!(s.contains("no answer"), "{s}");

        let e = line(json!({"custom_id": "c", "response": null,
            "error": {"code": "transport", "message": "down"}}))
        .answers
        .unwrap_err();
        assert!(e.contains("not answered: down"), "{e}");
        let e = line(json!({"custom_id": "c", "error": null,
            "response": {"status_code": 422, "body": {}}}))
        .answers
        .unwrap_err();
        assert!(e.contains("422"), "{e}");
        let e = line(json!({"custom_id": "c", "error": null,
            "response": {"status_code": 200, "body": {"output": {}, "reads": []}}}))
        .answers
        .unwrap_err();
        assert!(e.contains("policy"), "{e}");
    }

    #[test]
    fn the_shape_not_a_tag_makes_a_batch_line() {
        assert!(is_batch_line(
            &json!({"custom_id": "c", "response": null, "error": {}})
        ));
        assert!(!is_batch_line(&json!({"custom_id": "c", "labels": {}})));
        assert!(!is_batch_line(
            &json!({"decision_id": "d", "custom_id": "c", "response": {}})
        ));
        assert!(parse_line(&json!({"custom_id": null, "response": null})).is_none());
    }
}
