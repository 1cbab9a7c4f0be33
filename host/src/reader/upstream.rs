//! The `upstream` reader: any other System One server, by URL and key. It forwards a request built
//! from the typed questions (internal ids `q1…`, so caller ids never leave this host), takes only
//! the probabilities from the answers and lets hunch-core recompute everything else. Its errors
//! map to ours: a 422 naming a question → our 422 naming the caller's question, other 4xx passed
//! through, 5xx and connection failures → 503/504.

use hunch_core::{
    LabelDistribution, Question, QuestionKind, ReadError, ReadOptions, ReadOutcome, ReadRequest,
    ReadStats, Reader, ReaderInfo, Usage,
};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The name this host serves the model under.
    pub name: String,
    /// The upstream's base URL (`http://host:port`); requests go to `{url}/v1/systemone`.
    pub url: String,
    /// The `model` sent upstream.
    pub remote_model: String,
    pub key: Option<String>,
    pub timeout: Duration,
    /// PEM certificates trusted for `https://` upstreams besides the system's roots (a private
    /// CA, a self-signed server).
    pub ca_file: Option<PathBuf>,
}

/// Why an upstream reader cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot read the upstream CA file {path}: {source}")]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the upstream CA file {path} holds no PEM certificate{}", .reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    BadCa {
        path: PathBuf,
        reason: Option<reqwest::Error>,
    },
    #[error("cannot build an HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

pub struct UpstreamReader {
    config: UpstreamConfig,
    endpoint: String,
    http: reqwest::Client,
}

fn internal_id(index: usize) -> String {
    format!("q{}", index + 1)
}

/// The wire form of a typed question.
fn wire_question(q: &Question) -> Value {
    let mut out = Map::new();
    match &q.kind {
        QuestionKind::Noul { yes, no } => {
            out.insert("type".into(), json!("noul"));
            out.insert("instructions".into(), json!(q.instructions));
            let mut criteria = Map::new();
            if let Some(yes) = yes {
                criteria.insert("true".into(), json!(yes));
            }
            if let Some(no) = no {
                criteria.insert("false".into(), json!(no));
            }
            if !criteria.is_empty() {
                out.insert("criteria".into(), Value::Object(criteria));
            }
        }
        QuestionKind::Choice { options } => {
            out.insert("type".into(), json!("choice"));
            out.insert("instructions".into(), json!(q.instructions));
            let criteria: Map<String, Value> = options
                .iter()
                .map(|o| (o.name.clone(), json!(o.description)))
                .collect();
            out.insert("criteria".into(), Value::Object(criteria));
        }
        QuestionKind::Score { levels } => {
            out.insert("type".into(), json!("score"));
            out.insert("instructions".into(), json!(q.instructions));
            out.insert("criteria".into(), json!(levels));
        }
    }
    Value::Object(out)
}

/// The System One body for a read request, with every read option as the extension that asks
/// for it (docs/api.md): the question mode always (the upstream's own default may differ, and a
/// re-read or a policy run must read as asked), the seed and the draws when set. A server that
/// does not know an extension ignores it (and names it in `x-hunch-ignored-fields`).
pub fn wire_request(model: &str, request: &ReadRequest) -> Value {
    let questions: Map<String, Value> = request
        .questions
        .iter()
        .enumerate()
        .map(|(i, q)| (internal_id(i), wire_question(q)))
        .collect();
    let ReadOptions {
        seed,
        draws,
        questions: mode,
        prior,
        order,
    } = &request.options;
    let mut body = json!({"model": model, "state": request.state, "questions": questions,
                          "x_questions": mode.as_str()});
    // Remedies reach an upstream only where no debiasing reader took them out first (below
    // one, its reads are plain): the upstream then applies them itself.
    if !prior.is_none() {
        body["x_prior"] = json!(prior.as_str());
    }
    if !order.is_as_given() {
        body["x_order"] = json!(order.as_str());
    }
    if let Some(seed) = seed {
        body["x_seed"] = json!(seed);
    }
    if let Some(draws) = draws {
        body["x_draws"] = json!(draws);
    }
    body
}

/// An upstream answer without the probability a label needs.
#[derive(Debug, thiserror::Error)]
#[error("the upstream answer has no number for {0}")]
struct MissingProbability(String);

/// The label distribution inside one upstream answer; only probabilities are taken.
fn distribution(q: &Question, answer: &Value) -> Result<LabelDistribution, MissingProbability> {
    let number = |v: Option<&Value>, what: &str| -> Result<f64, MissingProbability> {
        v.and_then(Value::as_f64)
            .ok_or_else(|| MissingProbability(what.to_string()))
    };
    Ok(LabelDistribution(match &q.kind {
        QuestionKind::Noul { .. } => {
            let p = number(answer.get("noul"), "noul")?;
            vec![p, 1.0 - p]
        }
        QuestionKind::Choice { options } => {
            let probs = answer.get("probabilities");
            options
                .iter()
                .map(|o| number(probs.and_then(|p| p.get(&o.name)), &o.name))
                .collect::<Result<_, _>>()?
        }
        QuestionKind::Score { levels } => {
            let probs = answer.get("probabilities");
            (0..levels.len())
                .map(|i| {
                    number(
                        probs.and_then(|p| p.get(i.to_string())),
                        &format!("level {i}"),
                    )
                })
                .collect::<Result<_, _>>()?
        }
    }))
}

/// The message in a TypeSafe-shaped error body, or the body itself (shortened).
fn error_message(body: &Value, raw: &str) -> String {
    match body.get("detail") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(d)) => d
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.get("msg").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("; "),
        _ => raw.chars().take(300).collect(),
    }
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1))
}

/// Maps an upstream failure status to ours.
fn map_error(status: u16, headers: &reqwest::header::HeaderMap, raw: &[u8]) -> ReadError {
    let text = String::from_utf8_lossy(raw);
    let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let message = error_message(&body, &text);
    match status {
        422 => {
            // A field inside one of our `qN` questions: name that question.
            let question = body
                .get("detail")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find_map(|d| {
                    let loc = d.get("loc")?.as_array()?;
                    let pos = loc.iter().position(|p| p == "questions")?;
                    let id = loc.get(pos + 1)?.as_str()?;
                    let n: usize = id.strip_prefix('q')?.parse().ok()?;
                    n.checked_sub(1)
                });
            match question {
                Some(question) => ReadError::InvalidQuestion { question, message },
                None => ReadError::Rejected { status, message },
            }
        }
        408 | 504 => ReadError::Timeout,
        429 => ReadError::unavailable(
            format!("the upstream is rate limiting: {message}"),
            retry_after(headers),
        ),
        400..=499 => ReadError::Rejected { status, message },
        _ => ReadError::unavailable(
            format!("the upstream answered {status}: {message}"),
            retry_after(headers),
        ),
    }
}

impl UpstreamReader {
    /// A reader of `config.url`. `https://` URLs are verified against the system's root
    /// certificates and those of `config.ca_file`.
    pub fn new(config: UpstreamConfig) -> Result<Self, UpstreamError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .use_rustls_tls()
            .tls_built_in_native_certs(true);
        if let Some(path) = &config.ca_file {
            for certificate in read_ca_file(path)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder.build().map_err(UpstreamError::Client)?;
        let endpoint = format!("{}/v1/systemone", config.url.trim_end_matches('/'));
        Ok(UpstreamReader {
            config,
            endpoint,
            http,
        })
    }
}

/// The PEM certificates of a CA file; at least one.
fn read_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, UpstreamError> {
    let pem = std::fs::read(path).map_err(|source| UpstreamError::ReadCa {
        path: path.to_path_buf(),
        source,
    })?;
    let certificates =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| UpstreamError::BadCa {
            path: path.to_path_buf(),
            reason: Some(e),
        })?;
    if certificates.is_empty() {
        return Err(UpstreamError::BadCa {
            path: path.to_path_buf(),
            reason: None,
        });
    }
    Ok(certificates)
}

#[async_trait::async_trait]
impl Reader for UpstreamReader {
    fn model_name(&self) -> &str {
        &self.config.name
    }

    /// Another server's model: its limits are its own to enforce (it answers a 4xx that is
    /// passed through), and what its answers depend on is not known here, so they are never
    /// cached.
    fn info(&self) -> ReaderInfo {
        ReaderInfo::unknown()
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let body = wire_request(&self.config.remote_model, &request);
        let mut call = self
            .http
            .post(&self.endpoint)
            .timeout(self.config.timeout)
            .json(&body);
        if let Some(key) = &self.config.key {
            call = call.bearer_auth(key);
        }
        let unreachable = |e: reqwest::Error| {
            if e.is_timeout() {
                ReadError::Timeout
            } else {
                ReadError::unavailable(
                    format!("the upstream {} cannot be reached: {e}", self.config.url),
                    Duration::from_secs(2),
                )
            }
        };
        let response = call.send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let raw = response.bytes().await.map_err(unreachable)?;
        if !(200..300).contains(&status) {
            return Err(map_error(status, &headers, &raw));
        }
        let answer: Value = serde_json::from_slice(&raw)
            .map_err(|e| ReadError::internal(format!("the upstream's answer is not JSON: {e}")))?;
        let answers = answer
            .get("answers")
            .ok_or_else(|| ReadError::internal("the upstream's answer has no answers"))?;
        let distributions = request
            .questions
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let a = answers.get(internal_id(i)).ok_or_else(|| {
                    ReadError::internal(format!("the upstream did not answer {}", internal_id(i)))
                })?;
                distribution(q, a).map_err(|e| ReadError::internal(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tokens = |field: &str| {
            answer
                .get("usage")
                .and_then(|u| u.get(field))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens: tokens("input_tokens"),
                output_tokens: tokens("output_tokens"),
            },
            stats: ReadStats {
                reads: 1,
                ..ReadStats::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_core::ChoiceOption;

    #[test]
    fn requests_use_internal_ids_and_answers_give_probabilities_only() {
        let choice = Question {
            instructions: "route".into(),
            kind: QuestionKind::Choice {
                options: vec![
                    ChoiceOption {
                        name: "a b".into(),
                        description: None,
                    },
                    ChoiceOption {
                        name: "c".into(),
                        description: Some("see".into()),
                    },
                ],
            },
        };
        let noul = Question {
            instructions: String::new(),
            kind: QuestionKind::Noul {
                yes: Some("yes".into()),
                no: None,
            },
        };
        let request = ReadRequest {
            state: "s".into(),
            questions: vec![choice.clone(), noul.clone()],
            options: Default::default(),
            asked: None,
        };
        let body = wire_request("m", &request);
        assert_eq!(
            body["questions"]["q1"]["criteria"],
            json!({"a b": null, "c": "see"})
        );
        assert_eq!(body["questions"]["q2"]["criteria"], json!({"true": "yes"}));
        assert!(body.get("x_seed").is_none());
        assert!(body.get("x_draws").is_none());
        // The mode is always said: the upstream's default may be the other one.
        assert_eq!(body["x_questions"], "joint");
        let isolated = ReadRequest {
            options: ReadOptions {
                seed: Some(7),
                draws: Some(3),
                questions: hunch_core::QuestionMode::Isolated,
                prior: hunch_core::PriorMode::Divide,
                order: hunch_core::OrderMode::ReversedAverage,
            },
            ..request.clone()
        };
        let body = wire_request("m", &isolated);
        assert_eq!(
            (&body["x_questions"], &body["x_seed"], &body["x_draws"]),
            (&json!("isolated"), &json!(7), &json!(3))
        );
        // A remedy still in the read (no debiasing reader took it out) goes to the upstream;
        // none is never sent.
        assert_eq!(
            (&body["x_prior"], &body["x_order"]),
            (&json!("divide"), &json!("reversed_average"))
        );
        assert!(wire_request("m", &request).get("x_prior").is_none());
        let d = distribution(&choice, &json!({"type": "choice", "choice": "c", "confidence": 9, "probabilities": {"c": 0.75, "a b": 0.25}})).unwrap();
        assert_eq!(d.0, vec![0.25, 0.75]);
        let d = distribution(&noul, &json!({"type": "noul", "noul": 0.25})).unwrap();
        assert_eq!(d.0, vec![0.25, 0.75]);
    }

    #[test]
    fn upstream_errors_map_to_ours() {
        let h = reqwest::header::HeaderMap::new();
        let e = map_error(
            422,
            &h,
            br#"{"detail":[{"loc":["body","questions","q2","criteria"],"msg":"bad","type":"x"}]}"#,
        );
        assert_eq!(
            e,
            ReadError::InvalidQuestion {
                question: 1,
                message: "bad".into()
            }
        );
        assert!(matches!(
            map_error(404, &h, b"{}"),
            ReadError::Rejected { status: 404, .. }
        ));
        assert!(matches!(
            map_error(500, &h, b""),
            ReadError::Unavailable { .. }
        ));
        assert!(matches!(
            map_error(429, &h, b""),
            ReadError::Unavailable { .. }
        ));
        assert_eq!(map_error(504, &h, b""), ReadError::Timeout);
    }
}
