//! The accelerator sidecar's client: `POST /read` with a `ReadRequest`, `GET /health`.
//!
//! Every failure to reach the sidecar (refused, reset, died mid-request) is `Unavailable` with a
//! retry-after, and every call has a timeout: a request never hangs on a dead sidecar.

use hunch_core::{ReadError, ReadOutcome, ReadRequest, Reader};
use serde::Deserialize;
use std::time::Duration;

/// How long a client waits before retrying when the sidecar cannot be reached.
const RETRY_AFTER: Duration = Duration::from_secs(2);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// What `GET /health` reports while loading and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    Loading,
    Ready,
    Failed,
    /// A state this host does not know yet: treated as not ready, never as an error.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Health {
    pub state: HealthState,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub progress: f64,
    #[serde(default)]
    pub message: String,
}

/// A client of one sidecar at a loopback URL.
#[derive(Debug, Clone)]
pub struct AcceleratorClient {
    name: String,
    base: String,
    http: reqwest::Client,
    read_timeout: Duration,
}

impl AcceleratorClient {
    /// `base` is `http://HOST:PORT` (a trailing slash is ignored). `read_timeout` bounds one read.
    pub fn new(name: &str, base: &str, read_timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(AcceleratorClient {
            name: name.to_string(),
            base: base.trim_end_matches('/').to_string(),
            http,
            read_timeout,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub async fn health(&self) -> Result<Health, String> {
        let response = self
            .http
            .get(format!("{}/health", self.base))
            .timeout(HEALTH_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("health check failed: {e}"))?;
        response
            .json::<Health>()
            .await
            .map_err(|e| format!("health answer is not understood: {e}"))
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
        let response = self
            .http
            .post(format!("{}/read", self.base))
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
        Err(match status.as_u16() {
            503 => ReadError::unavailable(
                format!("the accelerator is unavailable: {text}"),
                RETRY_AFTER,
            ),
            504 => ReadError::Timeout,
            code => ReadError::internal(format!("the accelerator answered {code}: {text}")),
        })
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
}
