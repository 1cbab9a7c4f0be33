//! What one invocation may use, and the typed error for breaking it.
//!
//! Every limit is checked where the resource is handed out (the store for fuel and memory, the
//! read capability for reads and questions, the invoker for time and output), and every breach
//! becomes a [`LimitExceeded`] naming the limit, so the client and the logs say *which* limit
//! stopped the policy. A breach stops only its own invocation: the store is dropped, the host
//! and every other invocation carry on.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Limits of one invocation. Defaults suit a policy that makes a handful of reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Guest computation, in wasmtime fuel (≈ one unit per wasm instruction). Deterministic,
    /// and time spent waiting for reads does not count.
    pub fuel: u64,
    /// Wall-clock budget of the whole invocation, reads included.
    pub timeout_ms: u64,
    /// Linear memory of the guest.
    pub memory_bytes: u64,
    /// Question sets read (a batch of n sets counts n).
    pub max_reads: u32,
    /// Questions asked over all reads.
    pub max_questions: u32,
    /// Bytes of the JSON decision.
    pub max_output_bytes: u64,
    /// Bytes of one read's state text.
    pub max_state_bytes: u64,
    /// Log lines kept (more are counted, not stored), so a chatty policy cannot fill the host.
    pub max_log_lines: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // ~50 ms of tight guest code here; JSON handling of a large input fits easily.
            fuel: 1_000_000_000,
            // A read of the default chat model on a 2-core CPU takes ~4 s a question (three
            // questions: ~12 s), and a policy may read several times; the request timeout still
            // bounds the whole request.
            timeout_ms: 60_000,
            memory_bytes: 64 << 20,
            max_reads: 16,
            max_questions: 128,
            max_output_bytes: 1 << 20,
            max_state_bytes: 256 << 10,
            max_log_lines: 100,
        }
    }
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Caps every limit at `ceiling`'s (a per-policy file may tighten, never loosen, the server's
    /// ceilings; memory is also bounded by the pooling allocator's slot size).
    pub fn capped_by(self, ceiling: &Limits) -> Limits {
        Limits {
            fuel: self.fuel.min(ceiling.fuel),
            timeout_ms: self.timeout_ms.min(ceiling.timeout_ms),
            memory_bytes: self.memory_bytes.min(ceiling.memory_bytes),
            max_reads: self.max_reads.min(ceiling.max_reads),
            max_questions: self.max_questions.min(ceiling.max_questions),
            max_output_bytes: self.max_output_bytes.min(ceiling.max_output_bytes),
            max_state_bytes: self.max_state_bytes.min(ceiling.max_state_bytes),
            max_log_lines: self.max_log_lines.min(ceiling.max_log_lines),
        }
    }
}

/// Which limit an invocation broke: the decision records' vocabulary (a policy's limits are
/// among the limits an event can name).
pub use crate::decision::event::Limit;

/// A broken limit: which one, what it is, and what the policy tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("policy exceeded its {} limit ({limit_value}): {detail}", limit.as_str())]
pub struct LimitExceeded {
    pub limit: Limit,
    /// The configured limit, in its unit.
    pub limit_value: u64,
    pub detail: String,
}

impl LimitExceeded {
    pub fn new(limit: Limit, limit_value: u64, detail: impl Into<String>) -> Self {
        LimitExceeded {
            limit,
            limit_value,
            detail: detail.into(),
        }
    }
}

/// The store's resource limiter: caps linear memory and, unlike wasmtime's `StoreLimits`, reports
/// a breach as a typed [`LimitExceeded`] trap instead of a failed `memory.grow` (which Rust guests
/// turn into an abort that would not say why).
pub struct MemoryLimiter {
    max_bytes: u64,
}

impl MemoryLimiter {
    pub fn new(max_bytes: u64) -> Self {
        MemoryLimiter { max_bytes }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.max_bytes {
            return Err(wasmtime::Error::new(LimitExceeded::new(
                Limit::Memory,
                self.max_bytes,
                format!("tried to grow linear memory from {current} to {desired} bytes"),
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million entries is far beyond any real policy.
        Ok(desired <= 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_tightens_but_never_loosens() {
        let ceiling = Limits::default();
        let wanted = Limits {
            fuel: u64::MAX,
            max_reads: 2,
            ..Limits::default()
        };
        let got = wanted.capped_by(&ceiling);
        assert_eq!(got.fuel, ceiling.fuel);
        assert_eq!(got.max_reads, 2);
    }

    #[test]
    fn partial_limits_parse_with_defaults_and_typos_are_refused() {
        let l: Limits = toml::from_str("max_reads = 3").unwrap();
        assert_eq!(l.max_reads, 3);
        assert_eq!(l.fuel, Limits::default().fuel);
        assert!(toml::from_str::<Limits>("max_raeds = 3").is_err());
    }

    #[test]
    fn errors_name_the_limit() {
        let e = LimitExceeded::new(Limit::Reads, 16, "17th read");
        assert_eq!(
            e.to_string(),
            "policy exceeded its reads limit (16): 17th read"
        );
    }
}
