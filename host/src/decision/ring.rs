//! The recent decisions the server keeps in memory for the operator console (`/console/decisions`):
//! the last N events, masked exactly as the decision log writes them, each with a sequence number
//! a live tail asks "what came after" with.
//!
//! A decision never waits for the ring: [`DecisionRing::push`] takes its lock with `try_lock`, and
//! when a reader holds it (a console page copying rows out) the event is dropped and counted
//! instead. Readers copy what they need (`Arc`s) and let go at once.

use super::event::DecisionEvent;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

/// One kept decision: its place in the order the server finished them, and the masked event.
#[derive(Debug, Clone)]
pub struct Kept {
    /// 1, 2, 3, … in the order the decisions were pushed; never reused.
    pub seq: u64,
    pub event: Arc<DecisionEvent>,
}

/// A bounded ring of the most recent decisions.
#[derive(Debug)]
pub struct DecisionRing {
    capacity: usize,
    events: Mutex<VecDeque<Kept>>,
    next_seq: AtomicU64,
    /// Events not kept because the ring was busy when they came.
    dropped: AtomicU64,
}

impl DecisionRing {
    /// A ring keeping the last `capacity` decisions; `None` for 0 (nothing is kept).
    pub fn new(capacity: usize) -> Option<DecisionRing> {
        (capacity > 0).then(|| DecisionRing {
            capacity,
            events: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            next_seq: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keeps `event`, forgetting the oldest beyond the capacity; drops it (counted) rather than
    /// wait when the ring is busy.
    pub fn push(&self, event: Arc<DecisionEvent>) {
        let mut events = match self.events.try_lock() {
            Ok(guard) => guard,
            // A panic while holding the lock left a whole VecDeque behind: keep using it.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(Kept { seq, event });
    }

    /// Events dropped because the ring was busy.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The kept decisions with a sequence number above `after`, oldest first.
    pub fn after(&self, after: u64) -> Vec<Kept> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().filter(|k| k.seq > after).cloned().collect()
    }

    /// The decision with this id, if it is still kept.
    pub fn find(&self, decision_id: &str) -> Option<Kept> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events
            .iter()
            .rev()
            .find(|k| k.event.decision_id == decision_id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DecisionLog;

    fn event(id: &str) -> Arc<DecisionEvent> {
        let log = DecisionLog::disabled();
        let mut e = log.begin("/v1/systemone", None, None).event(200);
        e.decision_id = id.into();
        Arc::new(e)
    }

    #[test]
    fn keeps_the_last_n_in_order_with_growing_sequence_numbers() {
        assert!(DecisionRing::new(0).is_none());
        let ring = DecisionRing::new(2).unwrap();
        for id in ["a", "b", "c"] {
            ring.push(event(id));
        }
        let kept = ring.after(0);
        let ids: Vec<_> = kept.iter().map(|k| k.event.decision_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
        assert_eq!(kept.iter().map(|k| k.seq).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(ring.after(2).len(), 1);
        assert!(ring.find("a").is_none());
        assert_eq!(ring.find("b").map(|k| k.seq), Some(2));
    }

    #[test]
    fn a_busy_ring_drops_instead_of_waiting() {
        let ring = DecisionRing::new(4).unwrap();
        let held = ring.events.lock().unwrap();
        ring.push(event("x"));
        drop(held);
        assert_eq!(ring.dropped(), 1);
        assert!(ring.after(0).is_empty());
        ring.push(event("y"));
        assert_eq!(ring.after(0).len(), 1);
    }
}
