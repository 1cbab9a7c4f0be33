//! The answer cache: isolated answers kept by everything they depend on, bounded in bytes,
//! least recently used out first (docs/read.md, "The answer cache").
//!
//! An isolated read's distribution is a function of the model (its fingerprint), the rendered
//! state, the rendered question and the seed settings, so a cached one is the very answer a new
//! read would give. Joint answers depend on the other questions and are never cached.

use crate::question::Question;
use crate::reader::{LabelDistribution, ReadOptions};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Everything an isolated answer depends on, serialised: equal keys, equal answers. The whole
/// key is kept (not a hash of it), so two different questions can never share an entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(Vec<u8>);

impl CacheKey {
    pub fn new(fingerprint: &str, state: &str, question: &Question, options: &ReadOptions) -> Self {
        // Length-prefixed parts: no part can run into the next.
        let question = serde_json::to_vec(question).unwrap_or_default();
        let seed = options.seed.map_or(String::from("-"), |s| s.to_string());
        let draws = options.draws.map_or(String::from("-"), |d| d.to_string());
        let mut key = Vec::with_capacity(fingerprint.len() + state.len() + question.len() + 64);
        for part in [
            fingerprint.as_bytes(),
            state.as_bytes(),
            &question,
            seed.as_bytes(),
            draws.as_bytes(),
        ] {
            key.extend_from_slice(&(part.len() as u64).to_le_bytes());
            key.extend_from_slice(part);
        }
        CacheKey(key)
    }

    /// Heap bytes the key holds (its capacity: what the allocator gave it).
    fn bytes(&self) -> usize {
        self.0.capacity()
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub entries: u64,
    pub bytes: u64,
}

struct Entry {
    distribution: LabelDistribution,
    bytes: usize,
    tick: u64,
}

/// The entries and their recency order. A key's bytes are stored once, shared by the map and
/// the order (a key is mostly the state text: two copies would hold twice the bound).
#[derive(Default)]
struct Lru {
    entries: HashMap<Arc<CacheKey>, Entry>,
    /// Recency order: tick → key.
    order: BTreeMap<u64, Arc<CacheKey>>,
    tick: u64,
    bytes: usize,
}

/// A byte-bounded LRU map from [`CacheKey`] to a distribution. Shared by every request.
pub struct AnswerCache {
    max_bytes: usize,
    lru: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for AnswerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerCache")
            .field("max_bytes", &self.max_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Bytes an entry holds besides its key's and its distribution's heap bytes, an upper bound:
/// the shared key's allocation (reference counts and the `Vec` header, 40 bytes), its map slot
/// (49 bytes, at most 16/7 slots per entry right after the table grows: 112), its place in the
/// recency order (a B-tree node of 11 slots of 16 bytes is at least 5 full: 40) and the
/// distribution's `Vec` header inside the slot (counted in the slot). The unit test
/// `accounted_bytes_bound_the_real_footprint` measures the real figure with a counting allocator.
const ENTRY_OVERHEAD: usize = 256;

impl AnswerCache {
    pub fn new(max_bytes: usize) -> Self {
        AnswerCache {
            max_bytes,
            lru: Mutex::new(Lru::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // The map stays consistent at every await-free step; a panic elsewhere cannot break it.
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached distribution for `key`, counting a hit or a miss.
    pub fn get(&self, key: &CacheKey) -> Option<LabelDistribution> {
        let mut lru = self.lock();
        lru.tick += 1;
        let tick = lru.tick;
        let found = lru.entries.get_mut(key).map(|e| {
            let old = std::mem::replace(&mut e.tick, tick);
            (old, e.distribution.clone())
        });
        match found {
            Some((old, distribution)) => {
                if let Some(k) = lru.order.remove(&old) {
                    lru.order.insert(tick, k);
                }
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(distribution)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keeps `distribution` under `key`, evicting the least recently used entries to stay within
    /// the byte bound. An entry larger than the whole bound is not kept.
    pub fn put(&self, key: CacheKey, distribution: LabelDistribution) {
        let bytes = key.bytes() + distribution.0.capacity() * 8 + ENTRY_OVERHEAD;
        if bytes > self.max_bytes {
            return;
        }
        let mut lru = self.lock();
        if let Some(old) = lru.entries.remove(&key) {
            lru.order.remove(&old.tick);
            lru.bytes -= old.bytes;
        }
        while lru.bytes + bytes > self.max_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some(e) = lru.entries.remove(&oldest) {
                lru.bytes -= e.bytes;
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        let key = Arc::new(key);
        lru.order.insert(tick, Arc::clone(&key));
        lru.bytes += bytes;
        lru.entries.insert(
            key,
            Entry {
                distribution,
                bytes,
                tick,
            },
        );
    }

    pub fn stats(&self) -> CacheStats {
        let lru = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: lru.entries.len() as u64,
            bytes: lru.bytes as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::question::QuestionKind;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting the bytes each thread holds (allocated minus freed), so a
    /// test can measure what a data structure it builds really takes.
    struct Counting;

    thread_local! {
        static HELD: Cell<isize> = const { Cell::new(0) };
    }

    fn held() -> isize {
        HELD.with(Cell::get)
    }

    fn count(delta: isize) {
        // `try_with`: the allocator may run while this thread's locals are torn down.
        let _ = HELD.try_with(|h| h.set(h.get() + delta));
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size() as isize);
            System.alloc(layout)
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(layout.size() as isize));
            System.dealloc(ptr, layout)
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size as isize - layout.size() as isize);
            System.realloc(ptr, layout, new_size)
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    #[test]
    fn accounted_bytes_bound_the_real_footprint() {
        // States of a realistic size, and entry counts at several fill levels of the map's table
        // (right after it grows it is at its emptiest), some of them touched so the recency order
        // is reshuffled.
        for (entries, state_bytes) in [(57, 300), (448, 300), (900, 2000), (1800, 40)] {
            let before = held();
            let cache = AnswerCache::new(usize::MAX);
            for i in 0..entries {
                let state = format!("{i:0width$}", width = state_bytes);
                let key = CacheKey::new(
                    "fingerprint",
                    &state,
                    &q("a question?"),
                    &ReadOptions::default(),
                );
                cache.put(key.clone(), LabelDistribution(vec![0.5; 3]));
                if i % 3 == 0 {
                    cache.get(&key);
                }
            }
            let real = held() - before;
            let accounted = cache.stats().bytes as isize;
            assert!(
                real <= accounted,
                "{entries} entries of {state_bytes}-byte states hold {real} bytes, {accounted} accounted"
            );
            // And the bound is not wildly loose.
            assert!(
                accounted <= 3 * real,
                "{accounted} accounted for {real} held"
            );
            drop(cache);
        }
    }

    fn q(text: &str) -> Question {
        Question {
            instructions: text.into(),
            kind: QuestionKind::Noul {
                yes: None,
                no: None,
            },
        }
    }

    fn key(state: &str, question: &str) -> CacheKey {
        CacheKey::new("fp", state, &q(question), &ReadOptions::default())
    }

    #[test]
    fn every_part_of_the_key_matters() {
        let base = key("s", "q?");
        assert_eq!(base, key("s", "q?"));
        assert_ne!(base, key("s2", "q?"));
        assert_ne!(base, key("s", "q2?"));
        assert_ne!(
            base,
            CacheKey::new("fp2", "s", &q("q?"), &ReadOptions::default())
        );
        let seeded = ReadOptions {
            seed: Some(1),
            ..Default::default()
        };
        assert_ne!(base, CacheKey::new("fp", "s", &q("q?"), &seeded));
        let drawn = ReadOptions {
            draws: Some(2),
            ..Default::default()
        };
        assert_ne!(base, CacheKey::new("fp", "s", &q("q?"), &drawn));
        // Parts cannot run into each other.
        assert_ne!(
            CacheKey::new("ab", "c", &q("x"), &ReadOptions::default()),
            CacheKey::new("a", "bc", &q("x"), &ReadOptions::default())
        );
    }

    #[test]
    fn hits_return_what_was_put_and_the_bound_evicts_the_least_recent() {
        let one = key("s", "one");
        let entry_bytes = one.bytes() + 16 + ENTRY_OVERHEAD;
        let cache = AnswerCache::new(entry_bytes * 2);
        assert_eq!(cache.get(&one), None);
        cache.put(one.clone(), LabelDistribution(vec![0.25, 0.75]));
        assert_eq!(cache.get(&one), Some(LabelDistribution(vec![0.25, 0.75])));
        let two = key("s", "two");
        let three = key("s", "thr");
        cache.put(two.clone(), LabelDistribution(vec![0.5, 0.5]));
        // Touch `one`, so `two` is the least recently used.
        assert!(cache.get(&one).is_some());
        cache.put(three.clone(), LabelDistribution(vec![0.1, 0.9]));
        assert!(cache.get(&two).is_none(), "the least recently used went");
        assert!(cache.get(&one).is_some());
        assert!(cache.get(&three).is_some());
        let stats = cache.stats();
        assert_eq!(stats.entries, 2);
        assert!(stats.bytes <= (entry_bytes * 2) as u64);
        assert_eq!(stats.evictions, 1);
        assert_eq!((stats.hits, stats.misses), (4, 2));
        // Too large for the bound: not kept, nothing evicted.
        let huge = key(&"x".repeat(entry_bytes * 3), "one");
        cache.put(huge.clone(), LabelDistribution(vec![1.0, 0.0]));
        assert!(cache.get(&huge).is_none());
        assert_eq!(cache.stats().entries, 2);
    }
}
