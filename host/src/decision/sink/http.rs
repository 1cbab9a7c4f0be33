//! The HTTP sink: events are queued (bounded in events and in bytes, counting the batch being
//! sent) and a background task POSTs them as gzip JSON arrays (`content-encoding: gzip`), at most
//! `batch_bytes` of JSON each, retrying a failed batch with exponential backoff. While it
//! retries, new events wait in the queue; when the queue is full they are dropped and counted.
//! Requests never wait for the collector. What is still held when the shutdown grace ends is
//! counted as dropped (cause `shutdown`).

use super::{lock, Buffer, Held, Settled, SinkStats};
use flate2::write::GzEncoder;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

const SINK: &str = "http";
/// How long the task waits for more events before sending a partial batch.
pub(super) const LINGER: Duration = Duration::from_millis(200);
/// Attempts per batch before it is dropped (without a spool).
const ATTEMPTS: u32 = 6;
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// One POST may take this long before it counts as failed (a hanging collector).
const POST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    pub url: String,
    pub key: Option<String>,
    pub batch_bytes: usize,
    /// Events held at most.
    pub buffer: usize,
    /// Bytes of events held at most.
    pub buffer_bytes: usize,
}

/// One queued event and its room in the buffer.
type Queued = (Vec<u8>, Held);

pub struct HttpSink {
    tx: Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    buffer: Arc<Buffer>,
    settled: Arc<Settled>,
    stats: Arc<SinkStats>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("decision log collector: {0}")]
pub struct HttpSinkError(pub String);

/// The client every POST to the collector goes through.
pub(super) fn client() -> Result<reqwest::Client, HttpSinkError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(POST_TIMEOUT)
        .build()
        .map_err(|e| HttpSinkError(format!("cannot build an HTTP client: {e}")))
}

impl HttpSink {
    /// Starts the sending task (inside a tokio runtime).
    pub fn start(config: HttpSinkConfig, stats: Arc<SinkStats>) -> Result<HttpSink, HttpSinkError> {
        let client = client()?;
        // The buffer bounds the queue; the channel itself never refuses.
        let (tx, rx) = mpsc::unbounded_channel();
        let buffer = Buffer::new(config.buffer, config.buffer_bytes);
        let settled = Arc::new(Settled::default());
        let counter = Counter {
            stats: stats.clone(),
            settled: settled.clone(),
        };
        let task = tokio::spawn(run(client, config, rx, counter));
        Ok(HttpSink {
            tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            buffer,
            settled,
            stats,
        })
    }

    /// Queues one event (its JSON, no newline) without waiting.
    pub fn submit(&self, event: Vec<u8>) {
        let held = match self.buffer.hold(event.len()) {
            Ok(h) => h,
            Err(full) => {
                return self
                    .stats
                    .dropped(SINK, full.cause("buffer_full"), 1, full.detail())
            }
        };
        self.settled.accepted(1);
        let sent = match lock(&self.tx).as_ref() {
            Some(tx) => tx.send((event, held)).is_ok(),
            None => false,
        };
        if !sent {
            self.settled.settled(1);
            self.stats.dropped(
                SINK,
                "closed",
                1,
                "the decision log collector sink has stopped",
            );
        }
    }

    /// Counts an event that was never offered to the collector (the required file write failed
    /// first), so every event is counted once per sink, written or dropped.
    pub fn skipped(&self, cause: &'static str, detail: &str) {
        self.stats.dropped(SINK, cause, 1, detail);
    }

    /// Stops taking events and gives the task `grace` to send what it holds; what it still holds
    /// then is lost, and counted as dropped (cause `shutdown`).
    pub async fn close(&self, grace: Duration) {
        lock(&self.tx).take();
        let task = lock(&self.task).take();
        if let Some(mut task) = task {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
                // Once the task has stopped, nothing it held can be counted by it any more.
                let _ = task.await;
                self.settled.lost_at_shutdown(
                    &self.stats,
                    SINK,
                    "events still held for the collector at shutdown were lost",
                );
            }
        }
    }
}

/// Counts a batch's fate, and that it is settled.
struct Counter {
    stats: Arc<SinkStats>,
    settled: Arc<Settled>,
}

impl Counter {
    fn written(&self, n: u64) {
        self.stats.written(SINK, n);
        self.settled.settled(n);
    }

    fn dropped(&self, cause: &'static str, n: u64, detail: &str) {
        self.stats.dropped(SINK, cause, n, detail);
        self.settled.settled(n);
    }
}

async fn run(
    client: reqwest::Client,
    config: HttpSinkConfig,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    counter: Counter,
) {
    let mut carry: Option<Queued> = None;
    loop {
        let first = match carry.take() {
            Some(e) => e,
            None => match rx.recv().await {
                Some(e) => e,
                None => return,
            },
        };
        let mut size = first.0.len() + 2;
        let (mut batch, mut held) = (vec![first.0], vec![first.1]);
        let deadline = tokio::time::Instant::now() + LINGER;
        while size < config.batch_bytes {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(e)) => {
                    if size + e.0.len() + 1 > config.batch_bytes {
                        carry = Some(e);
                        break;
                    }
                    size += e.0.len() + 1;
                    batch.push(e.0);
                    held.push(e.1);
                }
                Ok(None) | Err(_) => break,
            }
        }
        send(&client, &config, &batch, &counter).await;
        // The batch's room in the buffer is given back once it is sent or given up.
        drop(held);
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
    counter: &Counter,
) {
    let n = batch.len() as u64;
    let body = match gzip_array(batch) {
        Ok(b) => b,
        Err(e) => return counter.dropped("encode_failed", n, &e.to_string()),
    };
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        match post(client, config, body.clone()).await {
            Ok(()) => {
                counter.written(n);
                return;
            }
            Err(PostFailed::Refused(e)) => return counter.dropped("rejected", n, &e),
            Err(PostFailed::Failed(e)) => {
                counter.stats.send_failed(SINK);
                last_error = e;
            }
        }
    }
    counter.dropped("send_failed", n, &last_error);
}

/// Why a POST did not deliver its batch.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PostFailed {
    /// The collector refuses the batch for what it is (a 4xx other than 408 and 429): sending
    /// it again would be refused again.
    Refused(String),
    /// Unreachable, timed out, or a 5xx, 408 or 429: it may pass later.
    Failed(String),
}

/// POSTs one gzip batch to the collector.
pub(super) async fn post(
    client: &reqwest::Client,
    config: &HttpSinkConfig,
    body: Vec<u8>,
) -> Result<(), PostFailed> {
    let mut call = client
        .post(&config.url)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(body);
    if let Some(key) = &config.key {
        call = call.bearer_auth(key);
    }
    match call.send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => {
            let status = r.status();
            let error = format!("{} answered {status}", config.url);
            let permanent = status.is_client_error()
                && status != reqwest::StatusCode::REQUEST_TIMEOUT
                && status != reqwest::StatusCode::TOO_MANY_REQUESTS;
            Err(if permanent {
                PostFailed::Refused(error)
            } else {
                PostFailed::Failed(error)
            })
        }
        Err(e) => Err(PostFailed::Failed(format!("{}: {e}", config.url))),
    }
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
            buffer_bytes: 1 << 20,
        }
    }

    /// A collector that takes the connection and never answers.
    async fn hanging_collector() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/",
            post(|| async {
                std::future::pending::<()>().await;
                axum::http::StatusCode::OK
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
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

    #[tokio::test]
    async fn the_buffer_is_bounded_in_bytes_counting_the_batch_in_flight() {
        let url = hanging_collector().await;
        let stats = Arc::new(SinkStats::default());
        let sink = HttpSink::start(
            HttpSinkConfig {
                batch_bytes: 1 << 20,
                buffer_bytes: 100,
                ..config(url, 10_000)
            },
            stats.clone(),
        )
        .unwrap();
        // 60 bytes taken (and held while its POST hangs); 60 more do not fit in 100.
        let event = |c: char| format!("\"{}\"", c.to_string().repeat(58)).into_bytes();
        sink.submit(event('a'));
        tokio::time::sleep(LINGER * 2).await;
        sink.submit(event('b'));
        sink.submit(b"1".to_vec());
        assert_eq!(stats.dropped_for("http", "buffer_full"), 1);
        sink.submit(vec![b'1'; 101]);
        assert_eq!(stats.dropped_for("http", "too_large"), 1);
        sink.close(Duration::from_millis(200)).await;
    }

    #[tokio::test]
    async fn events_still_held_at_shutdown_are_counted_as_dropped() {
        let url = hanging_collector().await;
        let stats = Arc::new(SinkStats::default());
        let sink = HttpSink::start(config(url, 100), stats.clone()).unwrap();
        for i in 0..5 {
            sink.submit(format!("{{\"n\":{i}}}").into_bytes());
        }
        sink.close(Duration::from_millis(300)).await;
        assert_eq!(stats.written_count("http"), 0);
        assert_eq!(stats.dropped_for("http", "shutdown"), 5);
        sink.submit(b"{}".to_vec());
        assert_eq!(stats.dropped_for("http", "closed"), 1);
    }
}
