//! How much the scheduler batches and caches, and when batching across requests is allowed.

use std::fmt;
use std::str::FromStr;

/// Whether the work of different requests may share forward passes (`--batching`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batching {
    /// Batch only where the start-up probe measured batching exact (a deviation of 0): every
    /// answer is then bit-identical to the same read alone. Where the probe measured a
    /// deviation, or did not run, requests are read one at a time (docs/batching.md).
    #[default]
    Auto,
    /// Batch whatever the probe measured (throughput first; the deviation is reported with
    /// every batched answer).
    On,
    /// One request at a time.
    Off,
}

impl Batching {
    /// Requests in flight at once under this mode, given the configured most and the measured
    /// batch deviation (`None`: not measured).
    pub fn request_limit(self, max_requests: usize, deviation: Option<f64>) -> usize {
        match self {
            Batching::On => max_requests,
            Batching::Off => 1,
            Batching::Auto if deviation == Some(0.0) => max_requests,
            Batching::Auto => 1,
        }
        .max(1)
    }
}

impl Batching {
    /// Whether the reads of one request may share a forward pass. A request can hold several
    /// reads (one per question when questions are read in isolation, or one per canvas group):
    /// where batching is not exact and not asked for, they run one at a time too, so every
    /// read's answer is the same bits whatever else its request asks (docs/batching.md).
    pub fn reads_share_forwards(self, deviation: Option<f64>) -> bool {
        matches!(self, Batching::On) || deviation == Some(0.0)
    }
}

impl FromStr for Batching {
    type Err = UnknownBatching;

    fn from_str(s: &str) -> Result<Self, UnknownBatching> {
        match s {
            "auto" => Ok(Batching::Auto),
            "on" | "true" | "yes" | "1" => Ok(Batching::On),
            "off" | "false" | "no" | "0" => Ok(Batching::Off),
            other => Err(UnknownBatching(other.to_owned())),
        }
    }
}

impl fmt::Display for Batching {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Batching::Auto => "auto",
            Batching::On => "on",
            Batching::Off => "off",
        })
    }
}

/// A `--batching` value that is not auto, on or off.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a batching mode; use auto, on or off")]
pub struct UnknownBatching(pub String);

/// How much the scheduler batches and caches.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Requests read at once; their work shares forward passes. 1 = one request at a time (the
    /// reads of that request still share passes).
    pub max_requests: usize,
    /// Whether requests may share forwards at all; [`Batching::Auto`] (the default) only where
    /// that is measured exact.
    pub batching: Batching,
    /// Most rows (prompt-chunk tokens plus canvas tokens) in one forward pass.
    pub max_rows: usize,
    /// Bytes of prompt K/V that reads in flight may hold; a read waits to start its prefill
    /// until its K/V fits (one read always may).
    pub kv_budget_bytes: u64,
    /// Prefill chunk length. Chunk boundaries are the prefix cache's reuse points.
    pub prefill_chunk: usize,
    /// Prefix cache capacity in bytes; 0 turns the cache off.
    pub cache_bytes: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_requests: 16,
            batching: Batching::Auto,
            max_rows: 2048,
            kv_budget_bytes: 2 << 30,
            prefill_chunk: crate::model::DEFAULT_PREFILL_CHUNK,
            cache_bytes: 1 << 30,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Batching;

    #[test]
    fn reads_of_a_request_share_forwards_only_where_exact_or_asked() {
        assert!(Batching::Auto.reads_share_forwards(Some(0.0)));
        assert!(!Batching::Auto.reads_share_forwards(Some(1.4e-6)));
        assert!(!Batching::Auto.reads_share_forwards(None));
        assert!(!Batching::Off.reads_share_forwards(None));
        assert!(Batching::Off.reads_share_forwards(Some(0.0)));
        assert!(Batching::On.reads_share_forwards(Some(4.2e-2)));
    }

    #[test]
    fn auto_batches_only_where_the_probe_measured_exactness() {
        assert_eq!(Batching::Auto.request_limit(16, Some(0.0)), 16);
        assert_eq!(Batching::Auto.request_limit(16, Some(1.4e-6)), 1);
        assert_eq!(Batching::Auto.request_limit(16, None), 1);
        assert_eq!(Batching::On.request_limit(16, Some(4.2e-2)), 16);
        assert_eq!(Batching::On.request_limit(0, None), 1);
        assert_eq!(Batching::Off.request_limit(16, Some(0.0)), 1);
    }

    #[test]
    fn modes_parse_and_print_back() {
        for mode in [Batching::Auto, Batching::On, Batching::Off] {
            assert_eq!(mode.to_string().parse::<Batching>().ok(), Some(mode));
        }
        assert!("sometimes".parse::<Batching>().is_err());
    }
}
