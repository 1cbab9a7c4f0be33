//! The HTTP sink: events are queued (bounded) and a background task POSTs them as gzip JSON
//! arrays (`content-encoding: gzip`), at most `batch_bytes` of JSON each, retrying a failed batch
//! with exponential backoff. While it retries, new events wait in the queue; when the queue is
//! full they are dropped and counted. Requests never wait for the collector.

use super::SinkStats;
use flate2::write::GzEncoder;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

const SINK: &str = "http";
/// How long the task waits for more events before sending a partial batch.
const LINGER: Duration = Duration::from_millis(200);
/// Attempts per batch before it is dropped.
const ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// One POST may take this long before it counts as failed (a hanging collector).
const POST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    pub url: String,
    pub key: Option<String>,
    pub batch_bytes: usize,
    pub buffer: usize,
}

pub struct HttpSink {
    tx: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stats: Arc<SinkStats>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("decision log URL: {0}")]
pub struct HttpSinkError(pub String);

impl HttpSink {
    /// Starts the sending task (inside a tokio runtime).
    pub fn start(config: HttpSinkConfig, stats: Arc<SinkStats>) -> Result<HttpSink, HttpSinkError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(POST_TIMEOUT)
            .build()
            .map_err(|e| HttpSinkError(format!("cannot build an HTTP client: {e}")))?;
        let (tx, rx) = mpsc::channel(config.buffer.max(1));
        let task = tokio::spawn(run(client, config, rx, stats.clone()));
        Ok(HttpSink {
            tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            stats,
        })
    }

    /// Queues one event (its JSON, no newline) without waiting.
    pub fn submit(&self, event: Vec<u8>) {
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let result = match guard.as_ref() {
            Some(tx) => tx.try_send(event).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => "buffer_full",
                mpsc::error::TrySendError::Closed(_) => "closed",
            }),
            None => Err("closed"),
        };
        drop(guard);
        if let Err(cause) = result {
            self.stats.dropped(
                SINK,
                cause,
                1,
                "the decision log collector is not keeping up",
            );
        }
    }

    /// Stops taking events and gives the task `grace` to send what it holds.
    pub async fn close(&self, grace: Duration) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut task) = task {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
                tracing::warn!("decision log collector: events still queued at shutdown were lost");
            }
        }
    }
}

async fn run(
    client: reqwest::Client,
    config: HttpSinkConfig,
    mut rx: mpsc::Receiver<Vec<u8>>,
    stats: Arc<SinkStats>,
) {
    let mut carry: Option<Vec<u8>> = None;
    loop {
        let first = match carry.take() {
            Some(e) => e,
            None => match rx.recv().await {
                Some(e) => e,
                None => return,
            },
        };
        let mut batch = vec![first];
        let mut size = batch[0].len() + 2;
        let deadline = tokio::time::Instant::now() + LINGER;
        while size < config.batch_bytes {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(e)) => {
                    if size + e.len() + 1 > config.batch_bytes {
                        carry = Some(e);
                        break;
                    }
                    size += e.len() + 1;
                    batch.push(e);
                }
                Ok(None) | Err(_) => break,
            }
        }
        send(&client, &config, &batch, &stats).await;
    }
}

/// The body of a batch: a JSON array of the events, gzipped.
pub fn gzip_array(events: &[Vec<u8>]) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"[")?;
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            gz.write_all(b",")?;
        }
        gz.write_all(e)?;
    }
    gz.write_all(b"]")?;
    gz.finish()
}

async fn send(
    client: &reqwest::Client,
    config: &HttpSinkConfig,
    batch: &[Vec<u8>],
    stats: &SinkStats,
) {
    let n = batch.len() as u64;
    let body = match gzip_array(batch) {
        Ok(b) => b,
        Err(e) => return stats.dropped(SINK, "encode_failed", n, &e.to_string()),
    };
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        let mut call = client
            .post(&config.url)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body.clone());
        if let Some(key) = &config.key {
            call = call.bearer_auth(key);
        }
        match call.send().await {
            Ok(r) if r.status().is_success() => {
                stats.written(SINK, n);
                return;
            }
            Ok(r) => {
                let status = r.status();
                last_error = format!("{} answered {status}", config.url);
                // The collector refuses this batch for what it is: a retry would be refused too.
                let permanent = status.is_client_error()
                    && status != reqwest::StatusCode::REQUEST_TIMEOUT
                    && status != reqwest::StatusCode::TOO_MANY_REQUESTS;
                if permanent {
                    return stats.dropped(SINK, "rejected", n, &last_error);
                }
            }
            Err(e) => last_error = format!("{}: {e}", config.url),
        }
    }
    stats.dropped(SINK, "send_failed", n, &last_error);
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use axum::routing::post;
    use std::io::Read;
    use std::sync::atomic::{AtomicU32, Ordering};

    async fn collector(status: u16, seen: Arc<Mutex<Vec<serde_json::Value>>>) -> String {
        let calls = Arc::new(AtomicU32::new(0));
        let app = axum::Router::new().route(
            "/",
            post(move |body: Bytes| {
                let seen = seen.clone();
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::Relaxed);
                    let mut text = String::new();
                    flate2::read::GzDecoder::new(&body[..])
                        .read_to_string(&mut text)
                        .unwrap();
                    let events: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
                    seen.lock().unwrap().extend(events);
                    axum::http::StatusCode::from_u16(status).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn config(url: String, buffer: usize) -> HttpSinkConfig {
        HttpSinkConfig {
            url,
            key: None,
            batch_bytes: 64,
            buffer,
        }
    }

    #[tokio::test]
    async fn events_arrive_as_gzip_batches_under_the_size_cap() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let url = collector(200, seen.clone()).await;
        let stats = Arc::new(SinkStats::default());
        let sink = HttpSink::start(config(url, 100), stats.clone()).unwrap();
        for i in 0..10 {
            sink.submit(format!("{{\"n\":{i}}}").into_bytes());
        }
        sink.close(Duration::from_secs(5)).await;
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 10);
        assert_eq!(seen[9]["n"], 9);
        assert_eq!(stats.written_count("http"), 10);
    }

    #[tokio::test]
    async fn a_refusing_collector_loses_events_counted_never_blocking() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let url = collector(400, seen.clone()).await;
        let stats = Arc::new(SinkStats::default());
        let sink = HttpSink::start(config(url, 2), stats.clone()).unwrap();
        // `submit` never waits: the 50 events are taken or dropped at once.
        for i in 0..50 {
            sink.submit(format!("{{\"n\":{i}}}").into_bytes());
        }
        sink.close(Duration::from_secs(5)).await;
        assert_eq!(stats.written_count("http"), 0);
        assert_eq!(stats.dropped_count("http"), 50);
    }
}
