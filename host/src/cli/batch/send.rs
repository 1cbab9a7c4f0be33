//! Sending one batch line: POST with the bearer key, retrying what a retry can fix (429, 5xx,
//! transport failures) with exponential backoff that honours `Retry-After`, and stopping early
//! when the run is interrupted.

use serde_json::Value;
use std::time::Duration;
use tokio::sync::watch;

/// How hard to try.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// The first backoff; doubled each retry, capped at `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 5,
            base_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// What came of sending a line.
#[derive(Debug)]
pub enum Outcome {
    /// The server's final answer (after retries, for a retryable status).
    Response {
        status: u16,
        request_id: Option<String>,
        /// The calibration the answers were computed with (`x-hunch-calibration`).
        calibration: Option<String>,
        body: Value,
        /// Whether the status is one a later run could retry (429, 5xx).
        retryable: bool,
    },
    /// No answer after every retry.
    Transport(String),
    /// The run was interrupted before an answer came.
    Interrupted,
}

/// Statuses worth another try: rate limiting and server-side failures.
pub fn retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

/// `Retry-After` in seconds or as an HTTP date.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// The wait before retry number `attempt` (1-based): the server's `Retry-After` when it gave
/// one, else exponential backoff with jitter so parallel workers do not retry in lockstep.
pub fn backoff(policy: &RetryPolicy, attempt: u32, server_said: Option<Duration>) -> Duration {
    if let Some(d) = server_said {
        return d.min(policy.max_backoff.max(Duration::from_secs(1)) * 10);
    }
    let exp = policy
        .base_backoff
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let capped = exp.min(policy.max_backoff);
    // Jitter in [50%, 100%] from the clock's sub-second noise (no RNG needed for this).
    let noise = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let fraction = 0.5 + f64::from(noise % 1000) / 2000.0;
    capped.mul_f64(fraction)
}

/// A client for one server.
pub struct Sender {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
    policy: RetryPolicy,
}

impl Sender {
    pub fn new(
        base: &str,
        api_key: Option<String>,
        policy: RetryPolicy,
        timeout: Duration,
    ) -> Result<Sender, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("hunch-batch/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Sender {
            http,
            base: base.to_string(),
            api_key,
            policy,
        })
    }

    async fn attempt(&self, url: &str, body: &Value) -> Result<reqwest::Response, reqwest::Error> {
        let mut request = self.http.post(format!("{}{url}", self.base)).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        request.send().await
    }

    /// Sends `body` to `url`, retrying as the policy says; gives up waiting when `stop` turns true.
    pub async fn send(&self, url: &str, body: &Value, stop: &mut watch::Receiver<bool>) -> Outcome {
        let mut attempt = 0;
        loop {
            if *stop.borrow() {
                return Outcome::Interrupted;
            }
            let (wait, last) = match self.attempt(url, body).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let server_said = retry_after(response.headers());
                    let request_id = response
                        .headers()
                        .get(crate::api::middleware::REQUEST_ID_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    let calibration = response
                        .headers()
                        .get(crate::api::systemone::CALIBRATION_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    let text = match response.text().await {
                        Ok(t) => t,
                        Err(e) => {
                            attempt += 1;
                            if attempt > self.policy.retries {
                                return Outcome::Transport(format!(
                                    "the answer's body was cut off: {e}"
                                ));
                            }
                            self.pause(backoff(&self.policy, attempt, None), stop).await;
                            continue;
                        }
                    };
                    // A proxy may answer with HTML: keep it, as a string.
                    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    let retryable = retryable_status(status);
                    let outcome = Outcome::Response {
                        status,
                        request_id,
                        calibration,
                        body,
                        retryable,
                    };
                    if !retryable {
                        return outcome;
                    }
                    (server_said, outcome)
                }
                Err(e) => (None, Outcome::Transport(transport_message(&e))),
            };
            attempt += 1;
            if attempt > self.policy.retries {
                return last;
            }
            if !self.pause(backoff(&self.policy, attempt, wait), stop).await {
                return Outcome::Interrupted;
            }
        }
    }

    /// Sleeps `d` unless interrupted; `false` when interrupted.
    async fn pause(&self, d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        let stopped = async {
            // A dropped sender never stops anything.
            if stop.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = stopped => false,
        }
    }
}

/// reqwest's error with its causes (its `Display` alone says little: "error sending request").
fn transport_message(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_obeys_the_server() {
        let p = RetryPolicy {
            retries: 5,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        let first = backoff(&p, 1, None);
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        let third = backoff(&p, 3, None);
        assert!(third >= Duration::from_millis(175) && third <= Duration::from_millis(350));
        assert_eq!(
            backoff(&p, 1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn only_what_a_retry_can_fix_is_retried() {
        assert!(retryable_status(429));
        assert!(retryable_status(503));
        assert!(!retryable_status(422));
        assert!(!retryable_status(404));
        assert!(!retryable_status(200));
    }
}
