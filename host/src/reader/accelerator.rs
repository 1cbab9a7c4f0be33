//! The accelerator sidecar's client: `POST /read` with a `ReadRequest`, `GET /health`.
//!
//! Every failure to reach the sidecar (refused, reset, died mid-request) is `Unavailable` with a
//! retry-after, and every call has a timeout: a request never hangs on a dead sidecar.

pub use hunch_core::protocol::{Health, HealthState};
use hunch_core::protocol::{ModelInfo, HEALTH_PATH, READ_PATH};
use hunch_core::{ReadError, ReadOutcome, ReadRequest, Reader, ReaderInfo};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How long a client waits before retrying when the sidecar cannot be reached.
const RETRY_AFTER: Duration = Duration::from_secs(2);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of one sidecar at a loopback URL.
#[derive(Debug, Clone)]
pub struct AcceleratorClient {
    name: String,
    base: String,
    http: reqwest::Client,
    read_timeout: Duration,
    /// What the sidecar said about its model in its last `/health` (shared by clones).
    info: Arc<RwLock<Option<ModelInfo>>>,
}

/// Why the sidecar could not be asked, or its answer not understood.
#[derive(Debug, thiserror::Error)]
pub enum AcceleratorError {
    #[error("cannot build an HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("health check failed: {0}")]
    Health(#[source] reqwest::Error),
    #[error("health answer is not understood: {0}")]
    HealthAnswer(#[source] reqwest::Error),
}

impl AcceleratorClient {
    /// `base` is `http://HOST:PORT` (a trailing slash is ignored). `read_timeout` bounds one read.
    pub fn new(name: &str, base: &str, read_timeout: Duration) -> Result<Self, AcceleratorError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(AcceleratorError::Client)?;
        Ok(AcceleratorClient {
            name: name.to_string(),
            base: base.trim_end_matches('/').to_string(),
            http,
            read_timeout,
            info: Arc::default(),
        })
    }

    /// The model's limits and fingerprint, as of the last health answer that carried them.
    pub fn info(&self) -> Option<ModelInfo> {
        self.info.read().ok().and_then(|i| i.clone())
    }

    /// The model's info as a reader reports it: unknown until the sidecar has said.
    pub fn reader_info(&self) -> ReaderInfo {
        self.info().map(ReaderInfo::from).unwrap_or_default()
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Asks the sidecar how it is, and learns its model's limits and fingerprint when it says.
    pub async fn health(&self) -> Result<Health, AcceleratorError> {
        let response = self
            .http
            .get(format!("{}{HEALTH_PATH}", self.base))
            .timeout(HEALTH_TIMEOUT)
            .send()
            .await
            .map_err(AcceleratorError::Health)?;
        let health = response
            .json::<Health>()
            .await
            .map_err(AcceleratorError::HealthAnswer)?;
        if let Ok(mut info) = self.info.write() {
            // A restarted sidecar may serve another checkpoint: forget what the old one said.
            *info = health.info.clone();
        }
        Ok(health)
    }

    fn unreachable(&self, e: &reqwest::Error) -> ReadError {
        if e.is_timeout() {
            return ReadError::Timeout;
        }
        ReadError::unavailable(
            format!(
                "the accelerator for model {} cannot be reached ({e}); it may be restarting",
                self.name
            ),
            RETRY_AFTER,
        )
    }

    pub async fn read_request(&self, request: &ReadRequest) -> Result<ReadOutcome, ReadError> {
        if self.info().is_none() {
            // Not learnt yet (an external sidecar, or one that just became ready): one health
            // check, so the limits below are the sidecar's own. A failure leaves the defaults.
            let _ = self.health().await;
        }
        let without_ids;
        let request = match self.info() {
            // The caller's ids and the whole set go only to a model whose prompt reads them
            // (a nimble decision model), so no other read can ever depend on an id; a sidecar
            // not heard from yet gets them, and any other read there ignores them.
            Some(info) if request.asked.is_some() && !info.limits.reads_question_ids => {
                without_ids = ReadRequest {
                    asked: None,
                    ..request.clone()
                };
                &without_ids
            }
            _ => request,
        };
        let response = self
            .http
            .post(format!("{}{READ_PATH}", self.base))
            .timeout(self.read_timeout)
            .json(request)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        // A body cut short (the sidecar died while answering) is a connection failure too.
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if status.is_success() {
            return serde_json::from_slice::<ReadOutcome>(&body).map_err(|e| {
                ReadError::internal(format!("the accelerator's answer is not understood: {e}"))
            });
        }
        if let Ok(error) = serde_json::from_slice::<ReadError>(&body) {
            return Err(error);
        }
        let text = String::from_utf8_lossy(&body);
        Err(error_from_status(status.as_u16(), &text))
    }
}

/// A failure answer without a `ReadError` body (an older sidecar, a proxy): a body the
/// accelerator refused as too large is a 400 `request_too_large`, other 4xx are the caller's
/// fault and stay 4xx, only the rest is retryable or internal.
fn error_from_status(code: u16, text: &str) -> ReadError {
    match code {
        413 => ReadError::TooLarge {
            message: "the read is larger than the accelerator takes".into(),
        },
        503 => ReadError::unavailable(
            format!("the accelerator is unavailable: {text}"),
            RETRY_AFTER,
        ),
        504 => ReadError::Timeout,
        400..=499 => ReadError::Rejected {
            status: code,
            message: format!("the accelerator refused the read: {text}"),
        },
        code => ReadError::internal(format!("the accelerator answered {code}: {text}")),
    }
}

/// A sidecar started elsewhere (`--accelerator NAME=URL`), used as is.
#[derive(Debug, Clone)]
pub struct AcceleratorReader {
    client: AcceleratorClient,
    name: String,
}

impl AcceleratorReader {
    pub fn new(name: &str, client: AcceleratorClient) -> Self {
        AcceleratorReader {
            client,
            name: name.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl Reader for AcceleratorReader {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        self.client.read_request(&request).await
    }

    async fn ready(&self) -> bool {
        matches!(self.client.health().await, Ok(h) if h.state == HealthState::Ready)
    }

    fn info(&self) -> ReaderInfo {
        self.client.reader_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_failure_statuses_keep_their_meaning() {
        assert!(matches!(
            error_from_status(413, ""),
            ReadError::TooLarge { .. }
        ));
        assert!(matches!(
            error_from_status(422, "x"),
            ReadError::Rejected { status: 422, .. }
        ));
        assert!(matches!(
            error_from_status(503, ""),
            ReadError::Unavailable { .. }
        ));
        assert!(matches!(error_from_status(504, ""), ReadError::Timeout));
        assert!(matches!(
            error_from_status(500, ""),
            ReadError::Internal { .. }
        ));
    }

    /// A fake sidecar whose model does or does not read question ids; it keeps every read body.
    async fn sidecar(reads_question_ids: bool) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::routing::{get, post};
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let health = Health {
            state: HealthState::Ready,
            model: "m".into(),
            progress: 1.0,
            message: String::new(),
            refused: false,
            info: Some(ModelInfo {
                fingerprint: "fp".into(),
                limits: hunch_core::ReaderLimits {
                    reads_question_ids,
                    ..Default::default()
                },
                blas_libraries: Vec::new(),
                kind: None,
            }),
        };
        let app = axum::Router::new()
            .route(HEALTH_PATH, get(move || async move { axum::Json(health) }))
            .route(
                READ_PATH,
                post(move |body: String| async move {
                    kept.lock().unwrap().push(body);
                    axum::Json(ReadOutcome {
                        distributions: vec![hunch_core::LabelDistribution(vec![0.5, 0.5])],
                        usage: Default::default(),
                        stats: Default::default(),
                    })
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, bodies)
    }

    #[tokio::test]
    async fn question_ids_are_sent_only_to_a_model_that_reads_them() {
        let question = hunch_core::Question {
            instructions: "ok?".into(),
            kind: hunch_core::QuestionKind::Noul {
                yes: None,
                no: None,
            },
        };
        let request = ReadRequest {
            state: "s".into(),
            questions: vec![question.clone()],
            options: Default::default(),
            asked: Some(hunch_core::RequestQuestions::new(
                vec![hunch_core::AskedQuestion {
                    id: hunch_core::QuestionId("secret-id".into()),
                    question,
                }],
                vec![0],
            )),
        };
        for reads in [false, true] {
            let (url, bodies) = sidecar(reads).await;
            let client = AcceleratorClient::new("m", &url, Duration::from_secs(5)).unwrap();
            client.read_request(&request).await.unwrap();
            let body = bodies.lock().unwrap()[0].clone();
            assert_eq!(body.contains("secret-id"), reads, "{body}");
            if !reads {
                // Byte for byte the read an id-free host sends.
                let bare = ReadRequest {
                    asked: None,
                    ..request.clone()
                };
                assert_eq!(body, serde_json::to_string(&bare).unwrap());
            }
        }
    }
}
