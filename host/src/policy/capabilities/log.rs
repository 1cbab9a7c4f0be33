//! The `log` capability: a policy's diagnostics go to the host's tracing log, tagged with the
//! policy and version, and into the invocation report — at most `max_log_lines` of them, so a
//! chatty or hostile policy cannot fill the host's memory or logs.

use crate::policy::bindings::hunch::policy::log::{self, Level};
use serde::Serialize;

/// Longest message kept; the rest is cut (on a char boundary).
const MAX_LINE_BYTES: usize = 4096;

#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    pub level: &'static str,
    pub message: String,
}

pub struct LogCapability {
    policy: String,
    version: String,
    max_lines: u32,
    pub lines: Vec<LogLine>,
    /// Lines beyond `max_lines`, counted but dropped.
    pub dropped: u32,
}

impl LogCapability {
    pub fn new(policy: &str, version: &str, max_lines: u32) -> Self {
        LogCapability {
            policy: policy.to_string(),
            version: version.to_string(),
            max_lines,
            lines: Vec::new(),
            dropped: 0,
        }
    }

    fn push(&mut self, level: Level, mut message: String) {
        if self.lines.len() as u32 >= self.max_lines {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        if message.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let (policy, version) = (&self.policy, &self.version);
        let level = match level {
            Level::Debug => {
                tracing::debug!(policy, version, "{message}");
                "debug"
            }
            Level::Info => {
                tracing::info!(policy, version, "{message}");
                "info"
            }
            Level::Warn => {
                tracing::warn!(policy, version, "{message}");
                "warn"
            }
            Level::Error => {
                tracing::error!(policy, version, "{message}");
                "error"
            }
        };
        self.lines.push(LogLine { level, message });
    }
}

impl log::Host for LogCapability {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.push(level, message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped_and_cut() {
        let mut l = LogCapability::new("p", "v", 2);
        l.push(Level::Info, "é".repeat(5000));
        l.push(Level::Warn, "two".into());
        l.push(Level::Error, "three".into());
        assert_eq!(l.lines.len(), 2);
        assert_eq!(l.dropped, 1);
        assert!(l.lines[0].message.len() <= MAX_LINE_BYTES);
        assert_eq!(l.lines[1].level, "warn");
    }
}
