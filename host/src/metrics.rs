//! The host's counters, gauges and histograms, rendered in Prometheus' text format by
//! `GET /metrics`. Hand-rolled: a few mutex-guarded maps are cheaper to build and to read than a
//! metrics framework, and the format is small.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency buckets: sub-millisecond host overhead up to minutes-long
/// reads on a CPU.
const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {}",
                self.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Everything `/metrics` shows. Shared by the HTTP layer and the readers' queue.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (route, status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// route → latency.
    latency: Mutex<BTreeMap<String, Histogram>>,
    /// (model, outcome) → reads.
    reads: Mutex<BTreeMap<(String, String), u64>>,
    /// model → read latency (queue wait excluded).
    read_latency: Mutex<BTreeMap<String, Histogram>>,
    /// Content-Encoding → request bodies decoded.
    encodings: Mutex<BTreeMap<String, u64>>,
    draws: AtomicU64,
    /// model → what its reads cost inside the model (from `ReadStats`).
    model_figures: Mutex<BTreeMap<String, ModelFigures>>,
    http_in_flight: AtomicI64,
    reads_in_flight: AtomicI64,
    queue_depth: AtomicI64,
}

/// The model-side figures of a model's reads (the sidecar's per-read log line, summed).
#[derive(Debug, Clone, Default)]
struct ModelFigures {
    prefills: u64,
    prompt_tokens: u64,
    reused_tokens: u64,
    prefill: Histogram,
    denoise: Histogram,
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record_request(&self, route: &str, status: u16, elapsed: Duration) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), status)).or_default() += 1;
        }
        if let Ok(mut m) = self.latency.lock() {
            m.entry(route.to_string())
                .or_default()
                .observe(elapsed.as_secs_f64());
        }
    }

    pub fn record_read(&self, model: &str, outcome: &str, draws: u32, elapsed: Duration) {
        if let Ok(mut m) = self.reads.lock() {
            *m.entry((model.to_string(), outcome.to_string()))
                .or_default() += 1;
        }
        if let Ok(mut m) = self.read_latency.lock() {
            m.entry(model.to_string())
                .or_default()
                .observe(elapsed.as_secs_f64());
        }
        self.draws.fetch_add(u64::from(draws), Ordering::Relaxed);
    }

    /// The model-side cost of one successful read request: prefills, prompt tokens (and those
    /// reused from a prefix cache), prefill and denoise seconds.
    pub fn record_read_stats(&self, model: &str, stats: &hunch_core::ReadStats) {
        if let Ok(mut m) = self.model_figures.lock() {
            let f = m.entry(model.to_string()).or_default();
            f.prefills += u64::from(stats.reads);
            f.prompt_tokens += stats.prompt_tokens;
            f.reused_tokens += stats.reused_tokens;
            f.prefill.observe(stats.prefill_seconds);
            f.denoise.observe(stats.denoise_seconds);
        }
    }

    pub fn record_body_encoding(&self, encoding: &str) {
        if let Ok(mut m) = self.encodings.lock() {
            *m.entry(encoding.to_string()).or_default() += 1;
        }
    }

    pub fn http_in_flight(&self, delta: i64) {
        self.http_in_flight.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn reads_in_flight(&self, delta: i64) {
        self.reads_in_flight.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn queue_depth(&self, delta: i64) {
        self.queue_depth.fetch_add(delta, Ordering::Relaxed);
    }

    fn render_model_figures(&self, out: &mut String) {
        let Ok(m) = self.model_figures.lock() else {
            return;
        };
        type Counter = (&'static str, &'static str, fn(&ModelFigures) -> u64);
        type Hist = (&'static str, &'static str, fn(&ModelFigures) -> &Histogram);
        let counters: [Counter; 3] = [
            (
                "hunch_model_prefills_total",
                "Prompt prefills (one per model read).",
                |f| f.prefills,
            ),
            (
                "hunch_model_prompt_tokens_total",
                "Prompt tokens prefilled or reused.",
                |f| f.prompt_tokens,
            ),
            (
                "hunch_model_reused_prompt_tokens_total",
                "Prompt tokens served from the prefix cache.",
                |f| f.reused_tokens,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (model, f) in m.iter() {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(model), value(f));
            }
        }
        let histograms: [Hist; 2] = [
            (
                "hunch_model_prefill_seconds",
                "Prefill time of a request's reads.",
                |f| &f.prefill,
            ),
            (
                "hunch_model_denoise_seconds",
                "Decoder (denoise) time of a request's reads.",
                |f| &f.denoise,
            ),
        ];
        for (name, help, hist) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (model, f) in m.iter() {
                hist(f).render(out, name, &format!("model=\"{}\"", escape(model)));
            }
        }
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_model_figures(&mut out);
        out.push_str("# HELP hunch_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE hunch_http_requests_total counter\n");
        if let Ok(m) = self.requests.lock() {
            for ((route, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "hunch_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        out.push_str("# HELP hunch_http_request_duration_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE hunch_http_request_duration_seconds histogram\n");
        if let Ok(m) = self.latency.lock() {
            for (route, h) in m.iter() {
                h.render(
                    &mut out,
                    "hunch_http_request_duration_seconds",
                    &format!("route=\"{}\"", escape(route)),
                );
            }
        }
        out.push_str("# HELP hunch_reads_total Reader calls by model and outcome.\n");
        out.push_str("# TYPE hunch_reads_total counter\n");
        if let Ok(m) = self.reads.lock() {
            for ((model, outcome), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "hunch_reads_total{{model=\"{}\",outcome=\"{}\"}} {n}",
                    escape(model),
                    escape(outcome)
                );
            }
        }
        out.push_str("# HELP hunch_read_duration_seconds Reader call latency by model (queue wait excluded).\n");
        out.push_str("# TYPE hunch_read_duration_seconds histogram\n");
        if let Ok(m) = self.read_latency.lock() {
            for (model, h) in m.iter() {
                h.render(
                    &mut out,
                    "hunch_read_duration_seconds",
                    &format!("model=\"{}\"", escape(model)),
                );
            }
        }
        out.push_str(
            "# HELP hunch_request_bodies_total Request bodies decoded, by Content-Encoding.\n",
        );
        out.push_str("# TYPE hunch_request_bodies_total counter\n");
        if let Ok(m) = self.encodings.lock() {
            for (encoding, n) in m.iter() {
                let _ = writeln!(
                    out,
                    "hunch_request_bodies_total{{encoding=\"{}\"}} {n}",
                    escape(encoding)
                );
            }
        }
        let gauges = [
            (
                "hunch_read_draws_total",
                "counter",
                "Noise draws over all reads.",
                self.draws.load(Ordering::Relaxed) as i64,
            ),
            (
                "hunch_http_in_flight",
                "gauge",
                "HTTP requests being handled.",
                self.http_in_flight.load(Ordering::Relaxed),
            ),
            (
                "hunch_reads_in_flight",
                "gauge",
                "Reads being served by a reader.",
                self.reads_in_flight.load(Ordering::Relaxed),
            ),
            (
                "hunch_queue_depth",
                "gauge",
                "Reads waiting for a reader slot.",
                self.queue_depth.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::new();
        m.record_request("/v1/systemone", 200, Duration::from_millis(3));
        m.record_request("/v1/systemone", 200, Duration::from_millis(30));
        m.record_read("jev", "ok", 4, Duration::from_millis(2));
        let text = m.render();
        assert!(
            text.contains("hunch_http_requests_total{route=\"/v1/systemone\",status=\"200\"} 2")
        );
        assert!(text.contains(
            "hunch_http_request_duration_seconds_bucket{route=\"/v1/systemone\",le=\"0.005\"} 1"
        ));
        assert!(
            text.contains("hunch_http_request_duration_seconds_count{route=\"/v1/systemone\"} 2")
        );
        assert!(text.contains("hunch_reads_total{model=\"jev\",outcome=\"ok\"} 1"));
        assert!(text.contains("hunch_read_draws_total 4"));
        assert!(text.contains("hunch_queue_depth 0"));
    }

    #[test]
    fn renders_the_model_side_figures_of_reads() {
        let m = Metrics::new();
        let stats = hunch_core::ReadStats {
            reads: 2,
            draws: 5,
            prompt_tokens: 300,
            reused_tokens: 120,
            tokenize_seconds: 0.001,
            prefill_seconds: 0.2,
            denoise_seconds: 0.05,
            ..Default::default()
        };
        m.record_read_stats("dg", &stats);
        m.record_read_stats("dg", &stats);
        let text = m.render();
        assert!(text.contains("hunch_model_prefills_total{model=\"dg\"} 4"));
        assert!(text.contains("hunch_model_prompt_tokens_total{model=\"dg\"} 600"));
        assert!(text.contains("hunch_model_reused_prompt_tokens_total{model=\"dg\"} 240"));
        assert!(text.contains("hunch_model_prefill_seconds_count{model=\"dg\"} 2"));
        assert!(text.contains("hunch_model_denoise_seconds_bucket{model=\"dg\",le=\"0.05\"} 2"));
    }
}
