//! Where decision events go: an NDJSON file ([`file`]) and an HTTP collector ([`http`]). Both
//! take events without waiting; what they cannot take is counted here (rendered in `/metrics`)
//! and the cause logged, at most every few seconds per cause.

pub mod file;
pub mod http;

use crate::metrics::family;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated drop cause is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Events written and dropped, per sink and cause.
#[derive(Debug, Default)]
pub struct SinkStats {
    written: Mutex<BTreeMap<&'static str, u64>>,
    dropped: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    last_warned: Mutex<BTreeMap<(&'static str, &'static str), Instant>>,
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
    }
}
