//! Where decision events go: an NDJSON file ([`file`]) and an HTTP collector ([`http`]). Both
//! take events without waiting, holding them in a [`Buffer`] bounded in events and in bytes;
//! what they cannot take is counted here (rendered in `/metrics`) and the cause logged, at most
//! every few seconds per cause.

pub mod file;
pub mod http;
pub mod spool;
pub mod spooled;

use crate::metrics::family;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The collector's sink: events held in memory ([`http::HttpSink`]), or spooled on disk
/// ([`spooled::SpooledSink`], with `--decision-log-spool`).
pub enum Collector {
    Memory(http::HttpSink),
    Spooled(spooled::SpooledSink),
}

impl Collector {
    /// Starts the sink (inside a tokio runtime); with `spool`, opens it and resumes what a
    /// previous run left unsent.
    pub fn start(
        config: http::HttpSinkConfig,
        spool: Option<spool::SpoolConfig>,
        stats: Arc<SinkStats>,
    ) -> Result<Collector, http::HttpSinkError> {
        Ok(match spool {
            Some(spool) => Collector::Spooled(spooled::SpooledSink::start(config, spool, stats)?),
            None => Collector::Memory(http::HttpSink::start(config, stats)?),
        })
    }

    /// Offers an event: in memory it is queued at once; spooled, this waits for its append, at
    /// most `wait`.
    pub async fn submit(&self, event: Vec<u8>, wait: Duration) {
        match self {
            Collector::Memory(sink) => sink.submit(event),
            Collector::Spooled(sink) => sink.submit(event, wait).await,
        }
    }

    /// Counts an event that was never offered to the collector.
    pub fn skipped(&self, cause: &'static str, detail: &str) {
        match self {
            Collector::Memory(sink) => sink.skipped(cause, detail),
            Collector::Spooled(sink) => sink.skipped(cause, detail),
        }
    }

    pub async fn close(&self, grace: Duration) {
        match self {
            Collector::Memory(sink) => sink.close(grace).await,
            Collector::Spooled(sink) => sink.close(grace).await,
        }
    }

    /// The sink's own gauges (the spool's), beside the counters of [`SinkStats`].
    pub fn render_metrics(&self, out: &mut String) {
        if let Collector::Spooled(sink) = self {
            sink.render_metrics(out);
        }
    }
}

/// How often a repeated drop cause is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Events written and dropped, per sink and cause.
#[derive(Debug, Default)]
pub struct SinkStats {
    written: Mutex<BTreeMap<&'static str, u64>>,
    dropped: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    last_warned: Mutex<BTreeMap<(&'static str, &'static str), Instant>>,
    fsyncs: AtomicU64,
    /// POSTs to the collector that failed (and were retried or given up), per sink.
    send_failures: Mutex<BTreeMap<&'static str, u64>>,
}

impl SinkStats {
    pub fn written(&self, sink: &'static str, events: u64) {
        *lock(&self.written).entry(sink).or_default() += events;
    }

    /// Counts `events` lost by `sink` for `cause` and logs `detail` unless that cause was logged
    /// recently.
    pub fn dropped(&self, sink: &'static str, cause: &'static str, events: u64, detail: &str) {
        *lock(&self.dropped).entry((sink, cause)).or_default() += events;
        let mut warned = lock(&self.last_warned);
        let now = Instant::now();
        let due = warned
            .get(&(sink, cause))
            .is_none_or(|t| now.duration_since(*t) >= WARN_EVERY);
        if due {
            warned.insert((sink, cause), now);
            tracing::warn!(
                sink,
                cause,
                events,
                error = detail,
                "decision events dropped"
            );
        }
    }

    /// Counts one POST that did not deliver its batch.
    pub fn send_failed(&self, sink: &'static str) {
        *lock(&self.send_failures).entry(sink).or_default() += 1;
    }

    pub fn send_failures(&self, sink: &str) -> u64 {
        lock(&self.send_failures).get(sink).copied().unwrap_or(0)
    }

    /// Counts one `fsync` of the decision log file.
    pub fn fsynced(&self) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fsync_count(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// Events `sink` lost for `cause`.
    pub fn dropped_for(&self, sink: &str, cause: &str) -> u64 {
        lock(&self.dropped)
            .iter()
            .filter(|((s, c), _)| *s == sink && *c == cause)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn written_count(&self, sink: &str) -> u64 {
        lock(&self.written).get(sink).copied().unwrap_or(0)
    }

    pub fn dropped_count(&self, sink: &str) -> u64 {
        lock(&self.dropped)
            .iter()
            .filter(|((s, _), _)| *s == sink)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn render(&self, out: &mut String) {
        family(
            out,
            "hunch_decision_events_written_total",
            "counter",
            "Decision events a sink accepted.",
        );
        for (sink, n) in lock(&self.written).iter() {
            let _ = writeln!(
                out,
                "hunch_decision_events_written_total{{sink=\"{sink}\"}} {n}"
            );
        }
        family(
            out,
            "hunch_decision_events_dropped_total",
            "counter",
            "Decision events a sink could not take.",
        );
        for ((sink, cause), n) in lock(&self.dropped).iter() {
            let _ = writeln!(
                out,
                "hunch_decision_events_dropped_total{{sink=\"{sink}\",cause=\"{cause}\"}} {n}"
            );
        }
        family(
            out,
            "hunch_decision_log_fsyncs_total",
            "counter",
            "fsync calls on the decision log file (--decision-log-fsync always).",
        );
        let _ = writeln!(
            out,
            "hunch_decision_log_fsyncs_total {}",
            self.fsyncs.load(Ordering::Relaxed)
        );
        family(
            out,
            "hunch_decision_log_send_failures_total",
            "counter",
            "POSTs to the decision log collector that failed (retried, or given up and counted as dropped).",
        );
        for (sink, n) in lock(&self.send_failures).iter() {
            let _ = writeln!(
                out,
                "hunch_decision_log_send_failures_total{{sink=\"{sink}\"}} {n}"
            );
        }
    }
}

/// What a sink holds in memory (queued, or in a batch being sent), bounded both in events and
/// in bytes: an event carries its reads' state text, so a count of events alone does not bound
/// memory.
#[derive(Debug)]
pub struct Buffer {
    max_events: usize,
    max_bytes: usize,
    /// (events, bytes) held now.
    held: Mutex<(usize, usize)>,
}

/// Why a [`Buffer`] would not take an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferFull {
    /// It holds its maximum number of events.
    Events,
    /// The event does not fit in the bytes left.
    Bytes,
    /// The event alone is larger than the whole buffer: it could never be taken.
    TooLarge,
}

impl BufferFull {
    /// The `cause` label of the drop; `full` is the sink's own name for a full buffer.
    pub fn cause(self, full: &'static str) -> &'static str {
        match self {
            BufferFull::Events | BufferFull::Bytes => full,
            BufferFull::TooLarge => "too_large",
        }
    }

    pub fn detail(self) -> &'static str {
        match self {
            BufferFull::Events => "the sink holds its maximum number of events",
            BufferFull::Bytes => "the sink holds its maximum number of bytes",
            BufferFull::TooLarge => "the event is larger than the sink's whole buffer",
        }
    }
}

impl Buffer {
    pub fn new(max_events: usize, max_bytes: usize) -> Arc<Buffer> {
        Arc::new(Buffer {
            max_events: max_events.max(1),
            max_bytes: max_bytes.max(1),
            held: Mutex::new((0, 0)),
        })
    }

    /// Takes room for one event of `bytes` until the returned [`Held`] is dropped.
    pub fn hold(self: &Arc<Self>, bytes: usize) -> Result<Held, BufferFull> {
        if bytes > self.max_bytes {
            return Err(BufferFull::TooLarge);
        }
        let mut held = lock(&self.held);
        if held.0 >= self.max_events {
            return Err(BufferFull::Events);
        }
        if held.1 + bytes > self.max_bytes {
            return Err(BufferFull::Bytes);
        }
        held.0 += 1;
        held.1 += bytes;
        Ok(Held {
            buffer: self.clone(),
            bytes,
        })
    }

    /// (events, bytes) held now.
    pub fn held(&self) -> (usize, usize) {
        *lock(&self.held)
    }
}

/// One event's room in a [`Buffer`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    buffer: Arc<Buffer>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = lock(&self.buffer.held);
        held.0 = held.0.saturating_sub(1);
        held.1 = held.1.saturating_sub(self.bytes);
    }
}

/// Events a sink took, and of those, how many it has counted as written or dropped: the rest
/// are still held, and are what a sink that stops early loses.
#[derive(Debug, Default)]
pub struct Settled {
    accepted: AtomicU64,
    settled: AtomicU64,
}

impl Settled {
    pub fn accepted(&self, events: u64) {
        self.accepted.fetch_add(events, Ordering::Relaxed);
    }

    pub fn settled(&self, events: u64) {
        self.settled.fetch_add(events, Ordering::Relaxed);
    }

    /// Events taken and not yet counted either way.
    pub fn outstanding(&self) -> u64 {
        self.accepted
            .load(Ordering::Relaxed)
            .saturating_sub(self.settled.load(Ordering::Relaxed))
    }

    /// Counts every event still outstanding as dropped at shutdown, with `why`.
    pub fn lost_at_shutdown(&self, stats: &SinkStats, sink: &'static str, why: &str) {
        let lost = self.outstanding();
        if lost > 0 {
            self.settled(lost);
            stats.dropped(sink, "shutdown", lost, why);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_per_sink_and_cause() {
        let s = SinkStats::default();
        s.written("file", 3);
        s.dropped("http", "buffer_full", 2, "full");
        s.dropped("http", "buffer_full", 1, "full");
        let mut out = String::new();
        s.render(&mut out);
        assert!(out.contains("hunch_decision_events_written_total{sink=\"file\"} 3\n"));
        assert!(out.contains(
            "hunch_decision_events_dropped_total{sink=\"http\",cause=\"buffer_full\"} 3\n"
        ));
        assert_eq!(s.dropped_count("http"), 3);
        assert_eq!(s.dropped_for("http", "buffer_full"), 3);
        assert_eq!(s.dropped_for("http", "closed"), 0);
    }

    #[test]
    fn a_buffer_is_bounded_in_events_and_in_bytes_and_gives_room_back() {
        let b = Buffer::new(3, 100);
        let first = b.hold(60).unwrap();
        assert_eq!(b.hold(41).unwrap_err(), BufferFull::Bytes);
        assert_eq!(b.hold(101).unwrap_err(), BufferFull::TooLarge);
        let small: Vec<Held> = (0..2).map(|_| b.hold(1).unwrap()).collect();
        assert_eq!(b.hold(1).unwrap_err(), BufferFull::Events);
        assert_eq!(b.held(), (3, 62));
        drop(first);
        drop(small);
        assert_eq!(b.held(), (0, 0));
        assert!(b.hold(100).is_ok());
    }
}
