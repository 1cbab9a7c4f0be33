//! What a batch run did: totals kept while it runs, the server's prefix-cache counters read from
//! `/metrics` before and after, and the closing report.

use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Totals of this run, bumped by the workers.
#[derive(Debug, Default)]
pub struct Totals {
    /// Lines answered with a `response` in this run, by class.
    pub answered: AtomicU64,
    pub answered_2xx: AtomicU64,
    pub answered_4xx: AtomicU64,
    pub answered_5xx: AtomicU64,
    /// Lines that got an `error` line in this run because no answer came.
    pub transport_errors: AtomicU64,
    /// Reads behind the 2xx answers (one per System One request; a policy's reads).
    pub reads: AtomicU64,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
}

impl Totals {
    /// Counts one server answer.
    pub fn record_response(&self, status: u16, body: &Value) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        let class = match status {
            200..=299 => &self.answered_2xx,
            400..=499 => &self.answered_4xx,
            _ => &self.answered_5xx,
        };
        class.fetch_add(1, Ordering::Relaxed);
        if !(200..=299).contains(&status) {
            return;
        }
        let reads = match body.get("reads").and_then(Value::as_array) {
            // A policy's decision lists its reads.
            Some(reads) => reads.len() as u64,
            None => 1,
        };
        self.reads.fetch_add(reads, Ordering::Relaxed);
        let usage = body.get("usage");
        let tokens = |k: &str| {
            usage
                .and_then(|u| u.get(k))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        self.input_tokens
            .fetch_add(tokens("input_tokens"), Ordering::Relaxed);
        self.output_tokens
            .fetch_add(tokens("output_tokens"), Ordering::Relaxed);
    }
}

/// The prefix-cache counters of a Hunch server's `/metrics`, summed over its models.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheCounters {
    /// Model reads that prefilled a prompt.
    pub prefills: u64,
    /// Of them, reads whose prompt started from a cached prefix.
    pub hits: u64,
}

/// Sums a counter over its label sets in Prometheus text.
fn sum_counter(text: &str, name: &str) -> Option<u64> {
    let mut found = false;
    let mut total = 0u64;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            found = true;
            total += v as u64;
        }
    }
    found.then_some(total)
}

pub fn parse_cache_counters(text: &str) -> Option<CacheCounters> {
    Some(CacheCounters {
        prefills: sum_counter(text, "hunch_model_prefills_total")?,
        hits: sum_counter(text, "hunch_model_prefix_cache_hits_total")?,
    })
}

/// Reads the counters; `None` from a server without them (not Hunch, or `/metrics` closed).
pub async fn scrape(base: &str) -> Option<CacheCounters> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .ok()?;
    let response = http.get(format!("{base}/metrics")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    parse_cache_counters(&response.text().await.ok()?)
}

/// The closing report's figures.
#[derive(Debug)]
pub struct Report {
    pub lines: usize,
    /// Lines with a `response` in the output now (earlier runs included).
    pub answered: usize,
    pub answered_before: usize,
    /// Lines refused before sending (malformed, duplicate `custom_id`).
    pub refused: usize,
    pub transport_errors: u64,
    /// Lines neither answered nor failed (an interrupted run).
    pub unanswered: usize,
    pub sent: usize,
    pub elapsed: Duration,
    pub answered_2xx: u64,
    pub answered_4xx: u64,
    pub answered_5xx: u64,
    pub reads: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prefix-cache hits and prefills on the server during the run (other clients included).
    pub cache: Option<CacheCounters>,
    pub interrupted: bool,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        writeln!(
            f,
            "hunch batch: {} lines: {} answered ({} in earlier runs), {} errors ({} refused, {} not sent), {} unanswered{}",
            self.lines,
            self.answered,
            self.answered_before,
            self.refused as u64 + self.transport_errors,
            self.refused,
            self.transport_errors,
            self.unanswered,
            if self.interrupted { " (interrupted)" } else { "" }
        )?;
        writeln!(
            f,
            "  this run: {} sent in {secs:.1} s: {} × 2xx, {} × 4xx, {} × 5xx; {} reads ({:.2} reads/s); tokens {} in, {} out",
            self.sent,
            self.answered_2xx,
            self.answered_4xx,
            self.answered_5xx,
            self.reads,
            self.reads as f64 / secs.max(1e-9),
            self.input_tokens,
            self.output_tokens
        )?;
        match self.cache {
            Some(c) if c.prefills > 0 => write!(
                f,
                "  prefix cache: {} hits of {} prefills ({:.1}%)",
                c.hits,
                c.prefills,
                100.0 * c.hits as f64 / c.prefills as f64
            ),
            Some(_) => write!(f, "  prefix cache: no prefills"),
            None => write!(
                f,
                "  prefix cache: unknown (the server has no Hunch /metrics)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cache_counters_sum_over_models() {
        let text = "# TYPE hunch_model_prefills_total counter\n\
                    hunch_model_prefills_total{model=\"a\"} 10\n\
                    hunch_model_prefills_total{model=\"b\"} 5\n\
                    hunch_model_prefills_total_other 99\n\
                    hunch_model_prefix_cache_hits_total{model=\"a\"} 9\n";
        assert_eq!(
            parse_cache_counters(text),
            Some(CacheCounters {
                prefills: 15,
                hits: 9
            })
        );
        assert_eq!(parse_cache_counters("other 1\n"), None);
    }

    #[test]
    fn responses_count_reads_and_tokens() {
        let t = Totals::default();
        t.record_response(
            200,
            &json!({"usage": {"input_tokens": 10, "output_tokens": 2}}),
        );
        t.record_response(
            200,
            &json!({"reads": [{}, {}], "usage": {"input_tokens": 5}}),
        );
        t.record_response(422, &json!({"detail": []}));
        assert_eq!(t.answered.load(Ordering::Relaxed), 3);
        assert_eq!(t.answered_4xx.load(Ordering::Relaxed), 1);
        assert_eq!(t.reads.load(Ordering::Relaxed), 3);
        assert_eq!(t.input_tokens.load(Ordering::Relaxed), 15);
        assert_eq!(t.output_tokens.load(Ordering::Relaxed), 2);
    }
}
