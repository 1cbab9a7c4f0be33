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
}
