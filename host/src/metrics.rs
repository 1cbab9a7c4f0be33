//! The host's counters, gauges and histograms, rendered in Prometheus' text format by
//! `GET /metrics`. Hand-rolled: a few mutex-guarded maps are cheaper to build and to read than a
//! metrics framework, and the format is small.

pub mod recent;

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

/// Upper bounds of the requests sharing a forward pass (1: alone).
const BATCH_REQUEST_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Upper bounds of the rows (prompt-chunk plus canvas tokens) of a forward pass.
const BATCH_ROW_BUCKETS: [f64; 6] = [16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

/// A latency histogram (seconds).
impl Default for Histogram {
    fn default() -> Self {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl Histogram {
    fn with_bounds(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (i, bound) in self.bounds.iter().enumerate() {
            if value <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in self.bounds.iter().enumerate() {
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

/// More lines of `/metrics`, rendered by the module that owns them (the decision log's sinks, the
/// policies' rollouts) and registered at start-up, so this module knows no layer above it.
pub trait MetricsSource: Send + Sync {
    fn render_metrics(&self, out: &mut String);
}

/// The registered [`MetricsSource`]s.
#[derive(Default)]
struct Sources(std::sync::RwLock<Vec<std::sync::Arc<dyn MetricsSource>>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

/// Everything `/metrics` shows. Shared by the HTTP layer and the readers' queue.
#[derive(Debug, Default)]
pub struct Metrics {
    sources: Sources,
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
    /// The API's requests over the last minutes (the console's rates).
    recent: Mutex<recent::RecentRequests>,
}

/// The model-side figures of a model's reads (the sidecar's per-read log line, summed), and the
/// latest engine snapshot its reads carried back.
#[derive(Debug, Clone)]
struct ModelFigures {
    prefills: u64,
    prompt_tokens: u64,
    reused_tokens: u64,
    cache_hits: u64,
    forwards: u64,
    prefill: Histogram,
    denoise: Histogram,
    /// Requests sharing a forward pass (observed when the sidecar reports it).
    batch_requests: Histogram,
    /// Rows of the largest forward pass of a request (observed when the sidecar reports it).
    batch_rows: Histogram,
    /// The latest deviation between a read alone and batched that a read reported.
    batch_deviation: Option<f64>,
    /// The latest engine snapshot a read reported.
    engine: Option<hunch_core::EngineGauges>,
}

impl Default for ModelFigures {
    fn default() -> Self {
        ModelFigures {
            prefills: 0,
            prompt_tokens: 0,
            reused_tokens: 0,
            cache_hits: 0,
            forwards: 0,
            prefill: Histogram::default(),
            denoise: Histogram::default(),
            batch_requests: Histogram::with_bounds(&BATCH_REQUEST_BUCKETS),
            batch_rows: Histogram::with_bounds(&BATCH_ROW_BUCKETS),
            batch_deviation: None,
            engine: None,
        }
    }
}

/// The three gauges of the inference gateway's model-server protocol, under the names its endpoint
/// picker is told with `--total-queued-requests-metric`, `--total-running-requests-metric` and
/// `--kv-cache-usage-percentage-metric` (docs/deploy.md). A "request" here is a read: one model
/// call (a `/v1/systemone` request is one; a policy run makes as many as it asks for).
pub const QUEUED_REQUESTS: &str = "hunch_queued_requests";
/// See [`QUEUED_REQUESTS`].
pub const RUNNING_REQUESTS: &str = "hunch_running_requests";
/// See [`QUEUED_REQUESTS`].
pub const PREFIX_CACHE_UTILIZATION: &str = "hunch_prefix_cache_utilization";

/// Writes the `# HELP` and `# TYPE` lines that open the metric family `name`.
pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
pub(crate) fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The answer cache's figures in the Prometheus text exposition.
pub fn render_answer_cache(stats: &hunch_core::CacheStats, capacity_bytes: usize) -> String {
    let mut out = String::new();
    for (name, kind, help, value) in [
        (
            "hunch_answer_cache_hits_total",
            "counter",
            "Answers served from the answer cache.",
            stats.hits,
        ),
        (
            "hunch_answer_cache_misses_total",
            "counter",
            "Isolated answers looked up and not found.",
            stats.misses,
        ),
        (
            "hunch_answer_cache_evictions_total",
            "counter",
            "Answers evicted to stay within the byte bound.",
            stats.evictions,
        ),
        (
            "hunch_answer_cache_entries",
            "gauge",
            "Answers held.",
            stats.entries,
        ),
        (
            "hunch_answer_cache_bytes",
            "gauge",
            "Bytes held (keys included).",
            stats.bytes,
        ),
        (
            "hunch_answer_cache_capacity_bytes",
            "gauge",
            "The byte bound.",
            capacity_bytes as u64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    out
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `source`'s lines to every later `render`.
    pub fn add_source(&self, source: std::sync::Arc<dyn MetricsSource>) {
        let mut sources = self.sources.0.write().unwrap_or_else(|p| p.into_inner());
        sources.push(source);
    }

    pub fn record_request(&self, route: &str, status: u16, elapsed: Duration) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), status)).or_default() += 1;
        }
        // The API's requests only: the console's own pages and polls would drown them.
        if route.starts_with("/v1/") {
            if let Ok(mut r) = self.recent.lock() {
                r.record(recent::slot_of(std::time::SystemTime::now()), status);
            }
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
    /// reused from a prefix cache), prefix-cache hits, forward passes, prefill and denoise
    /// seconds, how large its batches were (when the sidecar says), and the engine's latest
    /// gauges and measured batch deviation (when it reports them).
    pub fn record_read_stats(&self, model: &str, stats: &hunch_core::ReadStats) {
        if let Ok(mut m) = self.model_figures.lock() {
            let f = m.entry(model.to_string()).or_default();
            f.prefills += u64::from(stats.reads);
            f.prompt_tokens += stats.prompt_tokens;
            f.reused_tokens += stats.reused_tokens;
            f.cache_hits += u64::from(stats.cache_hits);
            f.forwards += u64::from(stats.forwards);
            f.prefill.observe(stats.prefill_seconds);
            f.denoise.observe(stats.denoise_seconds);
            // 0: a sidecar that does not report batching.
            if stats.max_batch_requests > 0 {
                f.batch_requests
                    .observe(f64::from(stats.max_batch_requests));
            }
            if stats.max_batch_rows > 0 {
                f.batch_rows.observe(f64::from(stats.max_batch_rows));
            }
            if let Some(deviation) = stats.batch_deviation {
                f.batch_deviation = Some(deviation);
            }
            if let Some(engine) = stats.engine {
                f.engine = Some(engine);
            }
        }
    }

    pub fn record_body_encoding(&self, encoding: &str) {
        if let Ok(mut m) = self.encodings.lock() {
            *m.entry(encoding.to_string()).or_default() += 1;
        }
    }

    /// The API's requests in 10-second buckets over the last ten minutes, oldest first.
    pub fn recent_requests(&self) -> Vec<recent::Bucket> {
        let now = recent::slot_of(std::time::SystemTime::now());
        match self.recent.lock() {
            Ok(r) => r.series(now),
            Err(p) => p.into_inner().series(now),
        }
    }

    /// Reads running now, and reads waiting in the queue for a slot.
    pub fn read_queue(&self) -> (i64, i64) {
        (
            self.reads_in_flight.load(Ordering::Relaxed),
            self.queue_depth.load(Ordering::Relaxed),
        )
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

    /// The prefix cache's fullest model: bytes held over the cache's bound, from each model's
    /// latest engine snapshot (a cache changes only when reads run, and each read reports one).
    /// 0 before any read reported a bound.
    fn prefix_cache_utilization(&self) -> f64 {
        let Ok(m) = self.model_figures.lock() else {
            return 0.0;
        };
        m.values()
            .filter_map(|f| f.engine)
            .filter(|e| e.cache_capacity_bytes > 0)
            .map(|e| (e.cache_bytes as f64 / e.cache_capacity_bytes as f64).min(1.0))
            .fold(0.0, f64::max)
    }

    /// The gateway's gauges ([`QUEUED_REQUESTS`]): reads waiting for a reader slot, reads being
    /// served (the engine's own batching queue included: from the host they are running), and
    /// the prefix cache's utilisation as a fraction in [0, 1]. Live, not per model: the endpoint
    /// picker compares pods.
    fn render_gateway_gauges(&self, out: &mut String) {
        let gauges = [
            (
                QUEUED_REQUESTS,
                "Reads waiting for a reader slot (the inference gateway's queued requests).",
                self.queue_depth.load(Ordering::Relaxed).max(0) as f64,
            ),
            (
                RUNNING_REQUESTS,
                "Reads being served by a reader (the inference gateway's running requests).",
                self.reads_in_flight.load(Ordering::Relaxed).max(0) as f64,
            ),
            (
                PREFIX_CACHE_UTILIZATION,
                "Prefix (K/V) cache bytes held over its bound, 0..1, fullest model (the inference gateway's KV-cache utilisation).",
                self.prefix_cache_utilization(),
            ),
        ];
        for (name, help, value) in gauges {
            family(out, name, "gauge", help);
            let _ = writeln!(out, "{name} {value}");
        }
    }

    fn render_model_figures(&self, out: &mut String) {
        let Ok(m) = self.model_figures.lock() else {
            return;
        };
        type Counter = (&'static str, &'static str, fn(&ModelFigures) -> u64);
        type Hist = (&'static str, &'static str, fn(&ModelFigures) -> &Histogram);
        type Gauge = Counter;
        let counters: [Counter; 5] = [
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
            (
                "hunch_model_prefix_cache_hits_total",
                "Reads whose prompt started from a cached prefix.",
                |f| f.cache_hits,
            ),
            (
                "hunch_model_forwards_total",
                "Forward passes requests' rows took part in.",
                |f| f.forwards,
            ),
        ];
        for (name, help, value) in counters {
            family(out, name, "counter", help);
            for (model, f) in m.iter() {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(model), value(f));
            }
        }
        let histograms: [Hist; 4] = [
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
            (
                "hunch_model_batch_requests",
                "The most requests that shared a forward pass with a request (1: alone).",
                |f| &f.batch_requests,
            ),
            (
                "hunch_model_batch_rows",
                "The most rows of a forward pass a request took part in.",
                |f| &f.batch_rows,
            ),
        ];
        for (name, help, hist) in histograms {
            family(out, name, "histogram", help);
            for (model, f) in m.iter() {
                hist(f).render(out, name, &format!("model=\"{}\"", escape(model)));
            }
        }
        // Gauges from the latest engine snapshot; a model shows them once a read reported one.
        let engine_gauges: [Gauge; 5] = [
            (
                "hunch_model_active_requests",
                "Requests the engine admitted and has not answered (latest snapshot).",
                |f| f.engine.map_or(0, |e| u64::from(e.active_requests)),
            ),
            (
                "hunch_model_queued_requests",
                "Requests queued behind the engine, not yet admitted (latest snapshot).",
                |f| f.engine.map_or(0, |e| u64::from(e.queued_requests)),
            ),
            (
                "hunch_model_prefix_cache_bytes",
                "Bytes of K/V held by the prefix cache (latest snapshot).",
                |f| f.engine.map_or(0, |e| e.cache_bytes),
            ),
            (
                "hunch_model_prefix_cache_entries",
                "Prompt chunks held by the prefix cache (latest snapshot).",
                |f| f.engine.map_or(0, |e| e.cache_entries),
            ),
            (
                "hunch_model_inflight_kv_bytes",
                "Bytes of prompt K/V held by reads in flight (latest snapshot).",
                |f| f.engine.map_or(0, |e| e.inflight_kv_bytes),
            ),
        ];
        for (name, help, value) in engine_gauges {
            family(out, name, "gauge", help);
            for (model, f) in m.iter().filter(|(_, f)| f.engine.is_some()) {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(model), value(f));
            }
        }
        let name = "hunch_model_batch_deviation";
        family(
            out,
            name,
            "gauge",
            "Largest |probability change| the engine measured between a read alone and batched (latest reported; 0: bit-exact).",
        );
        for (model, f) in m.iter() {
            if let Some(deviation) = f.batch_deviation {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {deviation}", escape(model));
            }
        }
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_gateway_gauges(&mut out);
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
        for source in self
            .sources
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            source.render_metrics(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests;
