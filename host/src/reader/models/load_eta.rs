//! How long a load has left (docs/models.md, "States and the admin routes"): what
//! `x_load_seconds_left` says of a loading model, and what the 503 of a read that waited too long
//! for a load names and sets `Retry-After` from.
//!
//! Two sources, the better first:
//!
//! - the progress the sidecar reports (the share of its checkpoint read): at a steady pace, what
//!   is left takes `elapsed × (1 − p) / p`. Below [`MIN_PROGRESS`] that ratio is noise (the
//!   process is still starting, and 1% in 0.2 s says nothing of the other 99%);
//! - before that, the model's bytes at the pace earlier loads of this server kept (their bytes
//!   over their seconds, from process start to ready), less the time already spent.
//!
//! Neither: unknown (`None`), never a guess.

use std::time::Duration;

/// Below this progress the first source is not used.
pub const MIN_PROGRESS: f64 = 0.05;

/// The pace of this server's loads: bytes loaded over seconds taken, summed over every
/// successful load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadPace {
    bytes: f64,
    seconds: f64,
}

impl LoadPace {
    /// A successful load of `bytes` (the model's estimate) that took `seconds`.
    pub fn record(&mut self, bytes: u64, seconds: f64) {
        if seconds > 0.0 && seconds.is_finite() {
            self.bytes += bytes as f64;
            self.seconds += seconds;
        }
    }

    /// Bytes per second, once a load has been measured.
    pub fn bytes_per_second(&self) -> Option<f64> {
        (self.seconds > 0.0 && self.bytes > 0.0).then(|| self.bytes / self.seconds)
    }
}

/// Seconds a load has left: `progress` (0–1) as the sidecar reports it, `elapsed` since its
/// process started, `bytes` it loads, `pace` of earlier loads.
pub fn seconds_left(progress: f64, elapsed: Duration, bytes: u64, pace: &LoadPace) -> Option<f64> {
    let elapsed = elapsed.as_secs_f64();
    let progress = if progress.is_finite() {
        progress.clamp(0.0, 1.0)
    } else {
        0.0
    };
    if progress >= 1.0 {
        return Some(0.0);
    }
    if progress >= MIN_PROGRESS {
        return Some(elapsed * (1.0 - progress) / progress);
    }
    let total = bytes as f64 / pace.bytes_per_second()?;
    Some((total - elapsed).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_progress_once_there_is_some() {
        let pace = LoadPace::default();
        // 25% in 10 s: 30 s left at that pace.
        let left = seconds_left(0.25, Duration::from_secs(10), 1000, &pace).unwrap();
        assert!((left - 30.0).abs() < 1e-9, "{left}");
        assert_eq!(
            seconds_left(1.0, Duration::from_secs(3), 1000, &pace),
            Some(0.0)
        );
        // No progress and no earlier load: unknown.
        assert_eq!(seconds_left(0.0, Duration::from_secs(1), 1000, &pace), None);
        assert_eq!(
            seconds_left(0.01, Duration::from_secs(1), 1000, &pace),
            None
        );
    }

    #[test]
    fn from_bytes_at_the_pace_of_earlier_loads_before_progress() {
        let mut pace = LoadPace::default();
        pace.record(100_000_000, 2.0);
        pace.record(300_000_000, 6.0);
        assert_eq!(pace.bytes_per_second(), Some(50_000_000.0));
        // 500 MB at 50 MB/s is 10 s, 4 of them spent.
        let left = seconds_left(0.0, Duration::from_secs(4), 500_000_000, &pace).unwrap();
        assert!((left - 6.0).abs() < 1e-9, "{left}");
        // Over the expected time: 0, not negative.
        assert_eq!(
            seconds_left(0.0, Duration::from_secs(60), 500_000_000, &pace),
            Some(0.0)
        );
        // A load of no measurable time teaches nothing.
        let mut none = LoadPace::default();
        none.record(1000, 0.0);
        assert_eq!(none.bytes_per_second(), None);
    }
}
