//! The HTTP sink with a spool on disk (`--decision-log-spool DIR`, [`spool`](super::spool)):
//! durable, at-least-once delivery to the collector.
//!
//! - A decision hands its event to the appender thread, which appends it to the spool (events
//!   queued together share one commit, and with `--decision-log-fsync always` one sync), and
//!   waits for that, at most the write timeout: an event answered with its decision is on disk
//!   and survives a crash of the process. A failed append never fails the decision: it is
//!   counted as dropped.
//! - The sending task reads batches from the spool and POSTs them; a failing collector is
//!   retried for as long as it takes (backoff capped at 10 s), and the acknowledged position is
//!   persisted only after a 2xx. A batch the collector refuses for what it is (a 4xx other than
//!   408/429) is dropped and counted, so one bad batch never blocks the spool.
//! - Events are dropped (counted, `spool_full`) only when the spool holds its byte bound.
//! - At shutdown the task gets the grace to send what is spooled; what is left stays in the
//!   spool for the next start, and is not counted as dropped.

use super::http::{client, gzip_array, post, HttpSinkConfig, HttpSinkError, PostFailed};
use super::http::{FIRST_BACKOFF, LINGER, MAX_BACKOFF};
use super::spool::{Batch, Spool, SpoolConfig, SpoolError, SpoolReader, SpoolWriter};
use super::{lock, Buffer, Held, Settled, SinkStats};
use crate::metrics::family;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

const SINK: &str = "http";
/// Bytes of events appended under one commit at most.
const MAX_GROUP_BYTES: usize = 1 << 20;
/// How often an idle sender looks at the spool even when nothing woke it.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// One event waiting for its append, and the decision waiting for it.
struct Append {
    event: Vec<u8>,
    /// Its room in the memory buffer until it is on disk.
    _held: Held,
    reply: oneshot::Sender<Result<(), SpoolError>>,
}

/// What the appender thread, the sending task and the sink share.
struct Shared {
    stats: Arc<SinkStats>,
    /// Events taken by the sink and not yet appended (or dropped): what a shutdown can lose.
    settled: Arc<Settled>,
    spool: Arc<Spool>,
    /// Rung after each commit, and to end an idle wait at shutdown.
    wake: Notify,
    closing: AtomicBool,
    appender_done: AtomicBool,
    /// Decisions answered before their append finished (a slow disk).
    slow_appends: AtomicU64,
    /// The first and the longest wait between POSTs of a batch.
    backoff: (Duration, Duration),
}

pub struct SpooledSink {
    tx: Mutex<Option<Sender<Append>>>,
    buffer: Arc<Buffer>,
    shared: Arc<Shared>,
    /// Closed when the appender thread ends.
    appender_stopped: Mutex<Option<oneshot::Receiver<()>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SpooledSink {
    /// Opens the spool (resuming what a previous run left unsent), starts the appender thread
    /// and the sending task (inside a tokio runtime).
    pub fn start(
        config: HttpSinkConfig,
        spool: SpoolConfig,
        stats: Arc<SinkStats>,
    ) -> Result<SpooledSink, HttpSinkError> {
        Self::start_with_backoff(config, spool, stats, (FIRST_BACKOFF, MAX_BACKOFF))
    }

    fn start_with_backoff(
        config: HttpSinkConfig,
        spool: SpoolConfig,
        stats: Arc<SinkStats>,
        backoff: (Duration, Duration),
    ) -> Result<SpooledSink, HttpSinkError> {
        let client = client()?;
        let (spool, writer, reader, recovered) =
            Spool::open(spool).map_err(|e| HttpSinkError(e.to_string()))?;
        if recovered.corrupt_segments > 0 {
            stats.dropped(
                SINK,
                "spool_corrupt",
                recovered.corrupt_segments,
                "damaged records in the decision log spool; the rest of their segments is lost",
            );
        }
        tracing::info!(
            dir = %spool.dir().display(),
            unsent = recovered.events,
            "decision log spool"
        );
        let shared = Arc::new(Shared {
            stats,
            settled: Arc::default(),
            spool,
            wake: Notify::new(),
            closing: AtomicBool::new(false),
            appender_done: AtomicBool::new(false),
            slow_appends: AtomicU64::new(0),
            backoff,
        });
        let (tx, rx) = channel();
        let (stopping, stopped) = oneshot::channel();
        let appender = shared.clone();
        std::thread::Builder::new()
            .name("hunch-decision-spool".into())
            .spawn(move || append_loop(writer, rx, appender, stopping))
            .map_err(|e| HttpSinkError(format!("cannot start the spool's thread: {e}")))?;
        let task = tokio::spawn(send_loop(client, config.clone(), reader, shared.clone()));
        Ok(SpooledSink {
            tx: Mutex::new(Some(tx)),
            buffer: Buffer::new(config.buffer, config.buffer_bytes),
            shared,
            appender_stopped: Mutex::new(Some(stopped)),
            task: Mutex::new(Some(task)),
        })
    }

    /// Appends one event (its JSON, no newline) to the spool and waits for that, at most
    /// `wait`. Never fails: an event that cannot be appended is counted as dropped; one still
    /// waiting after `wait` stays queued for the appender (the decision is answered meanwhile,
    /// and a crash before the append loses it).
    pub async fn submit(&self, event: Vec<u8>, wait: Duration) {
        let stats = &self.shared.stats;
        let held = match self.buffer.hold(event.len()) {
            Ok(h) => h,
            Err(full) => return stats.dropped(SINK, full.cause("buffer_full"), 1, full.detail()),
        };
        let (reply, appended) = oneshot::channel();
        self.shared.settled.accepted(1);
        let sent = match lock(&self.tx).as_ref() {
            Some(tx) => tx
                .send(Append {
                    event,
                    _held: held,
                    reply,
                })
                .is_ok(),
            None => false,
        };
        if !sent {
            self.shared.settled.settled(1);
            return stats.dropped(
                SINK,
                "closed",
                1,
                "the decision log collector sink has stopped",
            );
        }
        if tokio::time::timeout(wait, appended).await.is_err() {
            let slow = self.shared.slow_appends.fetch_add(1, Ordering::Relaxed) + 1;
            if slow.is_power_of_two() {
                tracing::warn!(
                    slow,
                    ?wait,
                    "a decision was answered before its event reached the decision log spool (a slow disk)"
                );
            }
        }
    }

    /// Counts an event that was never offered to the collector.
    pub fn skipped(&self, cause: &'static str, detail: &str) {
        self.shared.stats.dropped(SINK, cause, 1, detail);
    }

    /// Stops taking events, appends what is queued and gives the task `grace` to send what the
    /// spool holds. What is still spooled then stays for the next start (not dropped); only
    /// events not yet appended when the grace ends (a hung disk) are lost, counted `shutdown`.
    pub async fn close(&self, grace: Duration) {
        lock(&self.tx).take();
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        let stopped = lock(&self.appender_stopped).take();
        let task = lock(&self.task).take();
        let mut task = match task {
            Some(t) => t,
            None => return,
        };
        let finished = tokio::time::timeout(grace, async {
            if let Some(stopped) = stopped {
                let _ = stopped.await;
            }
            let _ = (&mut task).await;
        })
        .await;
        if finished.is_err() {
            task.abort();
            let _ = task.await;
            self.shared.settled.lost_at_shutdown(
                &self.shared.stats,
                SINK,
                "events not yet in the decision log spool at shutdown were lost",
            );
        }
        let (events, bytes) = self.shared.spool.pending();
        if events > 0 {
            tracing::info!(
                events,
                bytes,
                dir = %self.shared.spool.dir().display(),
                "unsent decision events stay in the spool for the next start"
            );
        }
    }

    /// The spool's gauges.
    pub fn render_metrics(&self, out: &mut String) {
        let (events, bytes) = self.shared.spool.pending();
        family(
            out,
            "hunch_decision_log_spool_events",
            "gauge",
            "Decision events in the spool not yet acknowledged by the collector.",
        );
        let _ = writeln!(out, "hunch_decision_log_spool_events {events}");
        family(
            out,
            "hunch_decision_log_spool_bytes",
            "gauge",
            "Bytes of the spool's unacknowledged records (bounded by --decision-log-spool-bytes).",
        );
        let _ = writeln!(out, "hunch_decision_log_spool_bytes {bytes}");
    }
}

impl Drop for SpooledSink {
    /// A sink dropped without [`close`](Self::close) stops sending at once; what it has not
    /// sent stays in the spool.
    fn drop(&mut self) {
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

/// The appender thread: appends queued events in groups, one commit per group.
fn append_loop(
    mut writer: SpoolWriter,
    rx: Receiver<Append>,
    shared: Arc<Shared>,
    _stopping: oneshot::Sender<()>,
) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        let mut bytes = group[0].event.len();
        while bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.event.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let mut appended = Vec::with_capacity(group.len());
        for a in group {
            match writer.append(&a.event) {
                Ok(()) => appended.push(a),
                Err(e) => {
                    shared.stats.dropped(SINK, e.cause(), 1, &e.to_string());
                    shared.settled.settled(1);
                    let _ = a.reply.send(Err(e));
                }
            }
        }
        let committed = writer.commit();
        let n = appended.len() as u64;
        match &committed {
            Ok(()) if n > 0 => shared.wake.notify_one(),
            Ok(()) => {}
            Err(e) => shared.stats.dropped(SINK, e.cause(), n, &e.to_string()),
        }
        shared.settled.settled(n);
        for a in appended {
            let _ = a.reply.send(committed.clone());
        }
    }
    shared.appender_done.store(true, Ordering::SeqCst);
    shared.wake.notify_one();
}

/// The sending task: batches from the spool to the collector, in order, each acknowledged
/// before the next is read.
async fn send_loop(
    client: reqwest::Client,
    config: HttpSinkConfig,
    reader: SpoolReader,
    shared: Arc<Shared>,
) {
    let reader = Arc::new(Mutex::new(reader));
    let mut trouble = FIRST_BACKOFF;
    loop {
        let read = {
            let reader = reader.clone();
            let max = config.batch_bytes;
            tokio::task::spawn_blocking(move || lock(&reader).read_batch(max)).await
        };
        let batch = match read {
            Ok(Ok(batch)) => batch,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the decision log spool; retrying");
                tokio::time::sleep(trouble).await;
                trouble = (trouble * 2).min(MAX_BACKOFF);
                continue;
            }
            // The blocking pool is shutting down: so is the runtime.
            Err(_) => return,
        };
        trouble = FIRST_BACKOFF;
        if batch.corrupt > 0 {
            shared.stats.dropped(
                SINK,
                "spool_corrupt",
                batch.corrupt,
                "damaged records in the decision log spool were skipped",
            );
        }
        if batch.events.is_empty() {
            if batch.bytes > 0 {
                acknowledge(&reader, batch).await;
            }
            let closing = shared.closing.load(Ordering::SeqCst);
            if closing && shared.appender_done.load(Ordering::SeqCst) && lock(&reader).caught_up() {
                return;
            }
            let woken = tokio::time::timeout(IDLE_CHECK, shared.wake.notified())
                .await
                .is_ok();
            if woken && !shared.closing.load(Ordering::SeqCst) {
                // Let events gather into one POST.
                tokio::time::sleep(LINGER).await;
            }
            continue;
        }
        deliver(&client, &config, &batch, &shared).await;
        acknowledge(&reader, batch).await;
    }
}

/// Persists that `batch` is done with.
async fn acknowledge(reader: &Arc<Mutex<SpoolReader>>, batch: Batch) {
    let reader = reader.clone();
    let acked = tokio::task::spawn_blocking(move || lock(&reader).ack(&batch)).await;
    if let Ok(Err(e)) = acked {
        tracing::warn!(error = %e, "cannot persist the decision log spool's cursor: after a restart its events would be sent again");
    }
}

/// POSTs a batch until the collector takes it (retrying with capped backoff, for as long as it
/// takes) or refuses it for what it is (dropped, counted `rejected`).
async fn deliver(
    client: &reqwest::Client,
    config: &HttpSinkConfig,
    batch: &Batch,
    shared: &Shared,
) {
    let n = batch.events.len() as u64;
    let body = match gzip_array(&batch.events) {
        Ok(b) => b,
        Err(e) => {
            return shared
                .stats
                .dropped(SINK, "encode_failed", n, &e.to_string())
        }
    };
    let (mut backoff, longest) = shared.backoff;
    let mut failures: u64 = 0;
    loop {
        match post(client, config, body.clone()).await {
            Ok(()) => return shared.stats.written(SINK, n),
            Err(PostFailed::Refused(e)) => return shared.stats.dropped(SINK, "rejected", n, &e),
            Err(PostFailed::Failed(e)) => {
                shared.stats.send_failed(SINK);
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(error = %e, failures, events = n, "the decision log collector did not take a batch; it stays in the spool and is retried");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(longest);
    }
}

#[cfg(test)]
mod tests {
    use super::super::file::Fsync;
    use super::*;
    use crate::decision::testing::{flaky_collector, recording_collector};
    use std::path::Path;

    const WAIT: Duration = Duration::from_secs(5);

    fn http(url: String) -> HttpSinkConfig {
        HttpSinkConfig {
            url,
            key: None,
            batch_bytes: 256,
            buffer: 1000,
            buffer_bytes: 1 << 20,
        }
    }

    /// Starts a sink on a spool a dropped sink held: its sending task and appender thread let
    /// the directory's lock go once they have ended, as a dead process's would at once.
    async fn restart(
        config: HttpSinkConfig,
        spool: SpoolConfig,
        stats: Arc<SinkStats>,
    ) -> SpooledSink {
        for _ in 0..500 {
            match SpooledSink::start(config.clone(), spool.clone(), stats.clone()) {
                Ok(sink) => return sink,
                Err(e) if e.0.contains("in use") => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("the dropped sink never let its spool go");
    }

    fn spool(dir: &Path, max_bytes: u64) -> SpoolConfig {
        SpoolConfig {
            dir: dir.to_path_buf(),
            max_bytes,
            fsync: Fsync::Off,
        }
    }

    fn event(i: usize) -> Vec<u8> {
        format!("{{\"decision_id\":\"d{i}\"}}").into_bytes()
    }

    /// A collector that answers every POST with `status`.
    async fn answering(status: u16) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move || async move {
                axum::http::StatusCode::from_u16(status).unwrap()
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// The decision ids `seen` holds, sorted and without repeats.
    fn ids(seen: &Mutex<Vec<serde_json::Value>>) -> Vec<String> {
        let mut ids: Vec<String> = lock(seen)
            .iter()
            .map(|e| e["decision_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn expected(range: std::ops::Range<usize>) -> Vec<String> {
        let mut ids: Vec<String> = range.map(|i| format!("d{i}")).collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn spooled_events_arrive_and_leave_the_spool_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (url, seen) = recording_collector().await;
        let stats = Arc::new(SinkStats::default());
        let sink =
            SpooledSink::start(http(url), spool(dir.path(), 1 << 20), stats.clone()).unwrap();
        for i in 0..30 {
            sink.submit(event(i), WAIT).await;
        }
        sink.close(WAIT).await;
        assert_eq!(ids(&seen), expected(0..30));
        assert_eq!(lock(&seen).len(), 30, "sent twice without a crash");
        assert_eq!(stats.written_count("http"), 30);
        assert_eq!(sink.shared.spool.pending(), (0, 0));
        let mut out = String::new();
        sink.render_metrics(&mut out);
        assert!(out.contains("hunch_decision_log_spool_events 0\n"), "{out}");
    }

    #[tokio::test]
    async fn unacknowledged_events_are_sent_again_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        // The collector fails every POST (503): nothing is acknowledged, and nothing dropped.
        let failing = answering(503).await;
        let stats = Arc::new(SinkStats::default());
        let sink =
            SpooledSink::start(http(failing), spool(dir.path(), 1 << 20), stats.clone()).unwrap();
        for i in 0..10 {
            sink.submit(event(i), WAIT).await;
        }
        assert_eq!(sink.shared.spool.pending().0, 10);
        // A crash: no shutdown, the sink is simply gone.
        drop(sink);
        assert_eq!(stats.dropped_count("http"), 0);

        let (url, seen) = recording_collector().await;
        let stats = Arc::new(SinkStats::default());
        let sink = restart(http(url), spool(dir.path(), 1 << 20), stats.clone()).await;
        sink.submit(event(10), WAIT).await;
        sink.close(WAIT).await;
        assert_eq!(ids(&seen), expected(0..11));
        assert_eq!(stats.dropped_count("http"), 0);
    }

    #[tokio::test]
    async fn a_collector_down_for_longer_than_the_retries_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // Down for 20 POSTs, more than a sink without a spool tries (6) before it drops.
        let (url, seen) = flaky_collector(20).await;
        let stats = Arc::new(SinkStats::default());
        let quick = (Duration::from_millis(1), Duration::from_millis(5));
        let sink = SpooledSink::start_with_backoff(
            http(url),
            spool(dir.path(), 1 << 20),
            stats.clone(),
            quick,
        )
        .unwrap();
        for i in 0..5 {
            sink.submit(event(i), WAIT).await;
        }
        sink.close(Duration::from_secs(30)).await;
        assert_eq!(ids(&seen), expected(0..5));
        assert_eq!(stats.dropped_count("http"), 0);
        assert!(stats.send_failures("http") >= 20);
    }

    #[tokio::test]
    async fn a_full_spool_drops_and_counts_and_shutdown_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let failing = answering(503).await;
        let stats = Arc::new(SinkStats::default());
        let size = super::super::spool::HEADER + event(0).len() as u64;
        let sink =
            SpooledSink::start(http(failing), spool(dir.path(), 4 * size), stats.clone()).unwrap();
        for i in 0..6 {
            sink.submit(event(i), WAIT).await;
        }
        assert_eq!(stats.dropped_for("http", "spool_full"), 2);
        sink.close(Duration::from_millis(300)).await;
        // The four spooled events are not lost: not counted, still there for the next start.
        assert_eq!(stats.dropped_count("http"), 2);
        drop(sink);
        let (url, seen) = recording_collector().await;
        let sink = restart(http(url), spool(dir.path(), 4 * size), stats.clone()).await;
        sink.close(WAIT).await;
        assert_eq!(ids(&seen), expected(0..4));
    }

    #[tokio::test]
    async fn a_refused_batch_is_dropped_and_counted_not_retried_forever() {
        let dir = tempfile::tempdir().unwrap();
        let refusing = answering(400).await;
        let stats = Arc::new(SinkStats::default());
        let sink =
            SpooledSink::start(http(refusing), spool(dir.path(), 1 << 20), stats.clone()).unwrap();
        for i in 0..3 {
            sink.submit(event(i), WAIT).await;
        }
        sink.close(WAIT).await;
        assert_eq!(stats.dropped_for("http", "rejected"), 3);
        assert_eq!(sink.shared.spool.pending(), (0, 0));
    }
}
