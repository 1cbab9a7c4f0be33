//! Requests over the last minutes, for the console's overview: counts of the API's requests
//! (`/v1/…`) in 10-second buckets over the last ten minutes. `/metrics` has the totals since the
//! start; rates over a recent window are what an operator looking at a page wants.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

/// The width of one bucket, in seconds.
pub const BUCKET_SECONDS: u64 = 10;
/// How many buckets are kept: ten minutes.
pub const BUCKETS: usize = 60;

/// One bucket: the requests that finished in it, by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Unix seconds / [`BUCKET_SECONDS`].
    pub slot: u64,
    pub requests: u64,
    /// Answered 4xx: refused requests.
    pub refused: u64,
    /// Answered 5xx.
    pub failed: u64,
}

/// The kept buckets, oldest first; a bucket in which nothing happened is absent.
#[derive(Debug, Default)]
pub struct RecentRequests {
    buckets: VecDeque<Bucket>,
}

/// The bucket `now` falls in.
pub fn slot_of(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / BUCKET_SECONDS)
        .unwrap_or(0)
}

impl RecentRequests {
    /// Counts one request that finished in `slot` with `status`.
    pub fn record(&mut self, slot: u64, status: u16) {
        match self.buckets.back_mut() {
            Some(b) if b.slot == slot => count(b, status),
            // A clock that stepped back: counted in the newest bucket rather than reordered.
            Some(b) if b.slot > slot => count(b, status),
            _ => {
                let mut b = Bucket {
                    slot,
                    ..Bucket::default()
                };
                count(&mut b, status);
                self.buckets.push_back(b);
            }
        }
        self.forget_before(slot.saturating_sub(BUCKETS as u64 - 1));
    }

    fn forget_before(&mut self, oldest: u64) {
        while self.buckets.front().is_some_and(|b| b.slot < oldest) {
            self.buckets.pop_front();
        }
    }

    /// Every one of the last [`BUCKETS`] buckets up to `now_slot`, oldest first, empty ones
    /// included.
    pub fn series(&self, now_slot: u64) -> Vec<Bucket> {
        let first = now_slot.saturating_sub(BUCKETS as u64 - 1);
        (first..=now_slot)
            .map(|slot| {
                self.buckets
                    .iter()
                    .find(|b| b.slot == slot)
                    .copied()
                    .unwrap_or(Bucket {
                        slot,
                        ..Bucket::default()
                    })
            })
            .collect()
    }
}

fn count(b: &mut Bucket, status: u16) {
    b.requests += 1;
    match status {
        400..=499 => b.refused += 1,
        500..=599 => b.failed += 1,
        _ => {}
    }
}

/// Requests, refusals and failures per second over the last `buckets` buckets of `series`.
pub fn rates(series: &[Bucket], buckets: usize) -> (f64, f64, f64) {
    let tail = &series[series.len().saturating_sub(buckets)..];
    let seconds = (tail.len().max(1) as u64 * BUCKET_SECONDS) as f64;
    let sum = |f: fn(&Bucket) -> u64| tail.iter().map(f).sum::<u64>() as f64 / seconds;
    (sum(|b| b.requests), sum(|b| b.refused), sum(|b| b.failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_bucketed_and_old_buckets_forgotten() {
        let mut r = RecentRequests::default();
        r.record(100, 200);
        r.record(100, 404);
        r.record(101, 503);
        let s = r.series(101);
        assert_eq!(s.len(), BUCKETS);
        assert_eq!(
            s[BUCKETS - 2],
            Bucket {
                slot: 100,
                requests: 2,
                refused: 1,
                failed: 0
            }
        );
        assert_eq!(s[BUCKETS - 1].failed, 1);
        let (rps, refused, failed) = rates(&s, 2);
        assert!((rps - 3.0 / 20.0).abs() < 1e-9);
        assert!((refused - 1.0 / 20.0).abs() < 1e-9);
        assert!((failed - 1.0 / 20.0).abs() < 1e-9);
        // Ten minutes after the last one, the old buckets are gone.
        let later = 101 + BUCKETS as u64;
        r.record(later, 200);
        assert_eq!(r.buckets.len(), 1);
        assert_eq!(r.series(later).iter().map(|b| b.requests).sum::<u64>(), 1);
    }
}
