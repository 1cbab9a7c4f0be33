//! The decision log's resolved settings: what the sinks are started with. Where they come from
//! (flags, `HUNCH_DECISION_LOG…` variables, the TOML file's `[decision_log]`) is
//! `config/decision_log.rs`'s business.

use crate::decision::sink::file::Fsync;
use std::path::PathBuf;
use std::time::Duration;

/// The resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionLogSettings {
    pub path: Option<PathBuf>,
    pub max_bytes: u64,
    /// `None`: no age-based rotation.
    pub rotate_after: Option<Duration>,
    pub keep: usize,
    pub required: bool,
    pub omit_state: bool,
    pub url: Option<String>,
    pub url_key: Option<String>,
    pub batch_bytes: usize,
    /// Events each sink holds at most.
    pub buffer: usize,
    /// Bytes of events each sink holds at most.
    pub buffer_bytes: usize,
    /// How long a required write may take.
    pub write_timeout: Duration,
    pub fsync: Fsync,
    /// Where the collector's events are spooled on disk; `None`: held in memory.
    pub spool: Option<PathBuf>,
    /// Bytes of unsent events the spool holds at most.
    pub spool_bytes: u64,
}

impl Default for DecisionLogSettings {
    fn default() -> Self {
        DecisionLogSettings {
            path: None,
            max_bytes: 100 << 20,
            rotate_after: None,
            keep: 10,
            required: false,
            omit_state: false,
            url: None,
            url_key: None,
            batch_bytes: 1 << 20,
            buffer: 10_000,
            buffer_bytes: 64 << 20,
            write_timeout: Duration::from_secs(2),
            fsync: Fsync::Off,
            spool: None,
            spool_bytes: 256 << 20,
        }
    }
}

impl DecisionLogSettings {
    pub fn enabled(&self) -> bool {
        self.path.is_some() || self.url.is_some()
    }
}
