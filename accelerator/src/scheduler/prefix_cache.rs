//! A byte-bounded LRU cache of prompt K/V, shared between prompts through their common prefix.
//!
//! # Why chunks
//!
//! A prompt's K/V is computed in fixed-size chunks of `chunk` tokens aligned from position 0:
//! chunk `k` covers positions `k*chunk .. (k+1)*chunk`. Reusing cached K/V must give the same
//! bits as computing it afresh, and the bits of a chunk's K/V depend on how the work was cut
//! (matmul shapes and reduction order change with the split). So a prompt only ever reuses whole
//! chunks cut at those same aligned boundaries, and only *full* chunks are stored: a trailing
//! partial chunk is always recomputed.
//!
//! # Why a trie
//!
//! The scheduler's prompts share long heads — the same instructions and question list — and
//! differ only in the state that follows. One node per chunk, keyed by its parent and the exact
//! token ids of the chunk, stores each shared chunk once however many prompts start with it; a
//! prompt's reusable prefix is the longest path from the root that matches its leading chunks.
//!
//! # Eviction
//!
//! Least-recently-used by bytes, leaves only. Touching a node also touches its ancestors, so a
//! parent is never older than its children, and only a node without children may go; evicting
//! the least recently used leaf until the cache fits therefore never strands a child without its
//! parent. Pinned nodes (a reader standing on a node while it computes the next chunk) are never
//! evicted, and as leaves-only eviction never removes a node with children, neither are their
//! ancestors. Evictable leaves are kept in a `BTreeSet` ordered by last use, so each eviction is
//! `O(log n)` and a touch is `O(depth · log n)`; nothing scans the whole cache except
//! [`PrefixCache::insert`] under pressure when pins exist, which walks the pinned nodes' ancestor
//! chains once to tell whether room can be made at all.
//!
//! Node ids come from a counter that only grows, so a stale [`NodeId`] held past its node's
//! eviction never names another node: [`PrefixCache::contains`] is false for it and
//! [`PrefixCache::insert`] under it refuses.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

/// An opaque handle to one cached chunk. Never reused for another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u64);

/// Lifetime counters of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// [`PrefixCache::lookup`]s that returned at least one chunk.
    pub hits: u64,
    /// Chunks returned by all [`PrefixCache::lookup`]s together.
    pub hit_chunks: u64,
    /// [`PrefixCache::lookup`]s that returned nothing (including while disabled).
    pub misses: u64,
    /// Nodes evicted to make room or to fit a smaller capacity.
    pub evictions: u64,
    /// Nodes created by [`PrefixCache::insert`] (not counting inserts that found the node).
    pub inserted: u64,
}

/// One full chunk of some prompt, under its parent chunk (or the root).
struct Node<T> {
    parent: Option<NodeId>,
    /// The chunk's token ids: this node's key in its parent's children map.
    tokens: Vec<u32>,
    children: HashMap<Vec<u32>, NodeId>,
    payload: T,
    bytes: u64,
    /// Tick of the last touch; never older than any child's.
    last_used: u64,
    pins: u32,
}

/// A trie of per-chunk payloads (see the module documentation), bounded by bytes.
pub struct PrefixCache<T> {
    chunk: usize,
    capacity: u64,
    bytes: u64,
    nodes: HashMap<NodeId, Node<T>>,
    /// Children of the root: the first chunk of each cached prompt.
    roots: HashMap<Vec<u32>, NodeId>,
    /// `(last_used, id)` of every unpinned leaf; the first is the next to evict.
    evictable: BTreeSet<(u64, NodeId)>,
    /// Nodes with at least one pin.
    pinned: HashSet<NodeId>,
    next_id: u64,
    tick: u64,
    stats: CacheStats,
}

impl<T> fmt::Debug for PrefixCache<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixCache")
            .field("chunk", &self.chunk)
            .field("capacity_bytes", &self.capacity)
            .field("bytes", &self.bytes)
            .field("entries", &self.nodes.len())
            .field("pinned", &self.pinned.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<T: Clone> PrefixCache<T> {
    /// An empty cache of `chunk`-token chunks holding at most `capacity_bytes` of payload.
    /// A `chunk` of 0 is taken as 1; a capacity of 0 disables the cache.
    pub fn new(chunk: usize, capacity_bytes: u64) -> Self {
        PrefixCache {
            chunk: chunk.max(1),
            capacity: capacity_bytes,
            bytes: 0,
            nodes: HashMap::new(),
            roots: HashMap::new(),
            evictable: BTreeSet::new(),
            pinned: HashSet::new(),
            next_id: 0,
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    /// Tokens per chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Whether the cache stores anything at all (its capacity is above 0).
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The most payload bytes the cache holds (pinned nodes may briefly hold more after
    /// [`set_capacity`](Self::set_capacity) shrinks it; they go when unpinned).
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// Payload bytes held now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Chunks held now.
    pub fn entries(&self) -> usize {
        self.nodes.len()
    }

    /// Lifetime counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Whether `node` is still cached.
    pub fn contains(&self, node: NodeId) -> bool {
        self.nodes.contains_key(&node)
    }

    /// The longest cached run of full chunks at the head of `tokens`: the nodes along the path,
    /// first chunk first, with clones of their payloads. Touches them (LRU). Returns at most
    /// `tokens.len() / chunk` chunks; a trailing partial chunk is never matched. Counts a hit
    /// when anything is returned, else a miss.
    pub fn lookup(&mut self, tokens: &[u32]) -> Vec<(NodeId, T)> {
        let path = self.match_path(tokens);
        match path.last() {
            Some(&deepest) => {
                self.touch(deepest);
                self.stats.hits += 1;
                self.stats.hit_chunks += path.len() as u64;
            }
            None => self.stats.misses += 1,
        }
        path.into_iter()
            .filter_map(|id| self.nodes.get(&id).map(|n| (id, n.payload.clone())))
            .collect()
    }

    /// The child of `parent` (`None`: the root) whose chunk is exactly `chunk_tokens`, if cached
    /// (and the cache is enabled), with a clone of its payload. Touches it. Used to advance one
    /// chunk at a time; does not count in the hit/miss statistics.
    pub fn child(&mut self, parent: Option<NodeId>, chunk_tokens: &[u32]) -> Option<(NodeId, T)> {
        if !self.enabled() {
            return None;
        }
        let id = self.find_child(parent, chunk_tokens)?;
        self.touch(id);
        self.nodes.get(&id).map(|n| (id, n.payload.clone()))
    }

    /// Caches `payload` (`bytes` bytes) for chunk `chunk_tokens` under `parent` (`None`: the
    /// root) and returns its node. If that chunk is already cached there, its node is touched
    /// and returned and the old payload kept. Returns `None`, caching nothing, when the cache is
    /// disabled, `parent` is no longer cached, `chunk_tokens` is not exactly one chunk long, the
    /// entry alone is larger than the capacity, or pinned nodes leave no room for it.
    ///
    /// Evicts least-recently-used leaves to make room, never `parent`'s chain nor pinned nodes;
    /// when room cannot be made, nothing is evicted.
    pub fn insert(
        &mut self,
        parent: Option<NodeId>,
        chunk_tokens: &[u32],
        payload: T,
        bytes: u64,
    ) -> Option<NodeId> {
        if !self.enabled() || chunk_tokens.len() != self.chunk {
            return None;
        }
        if parent.is_some_and(|p| !self.contains(p)) {
            return None;
        }
        if let Some(existing) = self.find_child(parent, chunk_tokens) {
            self.touch(existing);
            return Some(existing);
        }
        if !self.make_room(parent, bytes) {
            return None;
        }
        self.attach(parent, chunk_tokens.to_vec(), payload, bytes)
    }

    /// Adds a pin to `node`: while it has any, neither it nor its ancestors are evicted.
    /// Returns false (and does nothing) when `node` is no longer cached.
    pub fn pin(&mut self, node: NodeId) -> bool {
        let Some(n) = self.nodes.get_mut(&node) else {
            return false;
        };
        n.pins = n.pins.saturating_add(1);
        self.pinned.insert(node);
        self.unlist(node);
        true
    }

    /// Removes one pin from `node`. When its last pin goes, it becomes evictable again and the
    /// cache is brought back within capacity. Returns false when `node` was not pinned.
    pub fn unpin(&mut self, node: NodeId) -> bool {
        if !self.release_pin(node) {
            return false;
        }
        self.evict_to(self.capacity);
        true
    }

    /// Changes the capacity, evicting down to it (pinned nodes and their ancestors stay). A
    /// capacity of 0 disables the cache.
    pub fn set_capacity(&mut self, bytes: u64) {
        self.capacity = bytes;
        self.evict_to(self.capacity);
    }

    /// The cached nodes along the head of `tokens`, without touching them.
    fn match_path(&self, tokens: &[u32]) -> Vec<NodeId> {
        let mut path = Vec::new();
        if !self.enabled() {
            return path;
        }
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.chunk) {
            let Some(id) = self.find_child(parent, chunk) else {
                break;
            };
            path.push(id);
            parent = Some(id);
        }
        path
    }

    /// The children map of `parent` (`None`: the root's), if that node exists.
    fn children_of(&self, parent: Option<NodeId>) -> Option<&HashMap<Vec<u32>, NodeId>> {
        match parent {
            None => Some(&self.roots),
            Some(p) => self.nodes.get(&p).map(|n| &n.children),
        }
    }

    fn find_child(&self, parent: Option<NodeId>, chunk_tokens: &[u32]) -> Option<NodeId> {
        self.children_of(parent)?.get(chunk_tokens).copied()
    }

    /// Marks `node` and all its ancestors used now.
    fn touch(&mut self, node: NodeId) {
        self.tick += 1;
        let now = self.tick;
        let mut cur = Some(node);
        while let Some(id) = cur {
            self.unlist(id);
            cur = match self.nodes.get_mut(&id) {
                Some(n) => {
                    n.last_used = now;
                    n.parent
                }
                None => None,
            };
            self.relist(id);
        }
    }

    /// Takes `node` off the evictable set (before its tick, children or pins change).
    fn unlist(&mut self, node: NodeId) {
        if let Some(n) = self.nodes.get(&node) {
            self.evictable.remove(&(n.last_used, node));
        }
    }

    /// Puts `node` on the evictable set if it is an unpinned leaf.
    fn relist(&mut self, node: NodeId) {
        if let Some(n) = self.nodes.get(&node) {
            if n.children.is_empty() && n.pins == 0 {
                self.evictable.insert((n.last_used, node));
            }
        }
    }

    /// Removes one pin without evicting anything; false when `node` had none.
    fn release_pin(&mut self, node: NodeId) -> bool {
        let Some(n) = self.nodes.get_mut(&node) else {
            return false;
        };
        if n.pins == 0 {
            return false;
        }
        n.pins -= 1;
        if n.pins == 0 {
            self.pinned.remove(&node);
            self.relist(node);
        }
        true
    }

    /// Evicts until `need` more bytes fit, sparing `parent`'s chain. False, evicting nothing,
    /// when they cannot fit.
    fn make_room(&mut self, parent: Option<NodeId>, need: u64) -> bool {
        if need > self.capacity {
            return false;
        }
        if self.bytes.saturating_add(need) <= self.capacity {
            return true;
        }
        if self.protected_bytes(parent).saturating_add(need) > self.capacity {
            return false;
        }
        // Pin the parent for the duration: evicting its other children may make it a leaf.
        if let Some(p) = parent {
            self.pin(p);
        }
        let limit = self.capacity - need;
        self.evict_to(limit);
        if let Some(p) = parent {
            self.release_pin(p);
        }
        self.bytes <= limit
    }

    /// Bytes no eviction can free: pinned nodes, `extra`, and all their ancestors.
    fn protected_bytes(&self, extra: Option<NodeId>) -> u64 {
        let mut seen = HashSet::new();
        let mut total = 0u64;
        for &start in self.pinned.iter().chain(extra.iter()) {
            let mut cur = Some(start);
            while let Some(id) = cur {
                if !seen.insert(id) {
                    break;
                }
                let Some(n) = self.nodes.get(&id) else {
                    break;
                };
                total = total.saturating_add(n.bytes);
                cur = n.parent;
            }
        }
        total
    }

    /// Evicts least-recently-used leaves until at most `limit` bytes are held or none is left.
    fn evict_to(&mut self, limit: u64) {
        while self.bytes > limit && self.evict_one() {}
    }

    /// Evicts the least recently used unpinned leaf; false when there is none.
    fn evict_one(&mut self) -> bool {
        let Some((_, id)) = self.evictable.pop_first() else {
            return false;
        };
        let Some(node) = self.nodes.remove(&id) else {
            return true;
        };
        match node.parent {
            None => {
                self.roots.remove(&node.tokens);
            }
            Some(p) => {
                if let Some(pn) = self.nodes.get_mut(&p) {
                    pn.children.remove(&node.tokens);
                }
                self.relist(p);
            }
        }
        self.bytes = self.bytes.saturating_sub(node.bytes);
        self.stats.evictions += 1;
        true
    }

    /// Creates the node (room already made) and touches it and its chain.
    fn attach(
        &mut self,
        parent: Option<NodeId>,
        tokens: Vec<u32>,
        payload: T,
        bytes: u64,
    ) -> Option<NodeId> {
        let id = NodeId(self.next_id);
        match parent {
            None => {
                self.roots.insert(tokens.clone(), id);
            }
            Some(p) => {
                self.unlist(p);
                self.nodes.get_mut(&p)?.children.insert(tokens.clone(), id);
            }
        }
        self.next_id += 1;
        let node = Node {
            parent,
            tokens,
            children: HashMap::new(),
            payload,
            bytes,
            last_used: 0,
            pins: 0,
        };
        self.nodes.insert(id, node);
        self.bytes = self.bytes.saturating_add(bytes);
        self.stats.inserted += 1;
        self.touch(id);
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4-token chunk derived from `seed`; different seeds give different chunks.
    fn ch(seed: u32) -> Vec<u32> {
        (0..4).map(|i| seed * 10 + i).collect()
    }

    /// The prompt made of the chunks of `seeds`, in order.
    fn prompt(seeds: &[u32]) -> Vec<u32> {
        seeds.iter().flat_map(|&s| ch(s)).collect()
    }

    /// Inserts the chain of `seeds` from the root (payload = the seed), `bytes` each.
    fn chain(c: &mut PrefixCache<u32>, seeds: &[u32], bytes: u64) -> Vec<NodeId> {
        let mut parent = None;
        let mut ids = Vec::new();
        for &s in seeds {
            let id = c.insert(parent, &ch(s), s, bytes).unwrap();
            ids.push(id);
            parent = Some(id);
        }
        ids
    }

    /// Checks every structural invariant of the cache.
    fn check<T: Clone>(c: &PrefixCache<T>) {
        let sum: u64 = c.nodes.values().map(|n| n.bytes).sum();
        assert_eq!(c.bytes, sum, "bytes == sum of node bytes");
        assert!(
            c.bytes <= c.capacity || c.evictable.is_empty(),
            "over capacity ({} > {}) with evictable leaves left",
            c.bytes,
            c.capacity
        );
        let mut links = 0;
        for (k, id) in &c.roots {
            let n = c.nodes.get(id).expect("roots exist");
            assert_eq!(n.parent, None);
            assert_eq!(&n.tokens, k);
            links += 1;
        }
        for (&id, n) in &c.nodes {
            assert!(id.0 < c.next_id, "ids come from the counter");
            assert_eq!(n.tokens.len(), c.chunk);
            match n.parent {
                None => assert_eq!(c.roots.get(&n.tokens), Some(&id)),
                Some(p) => {
                    let pn = c.nodes.get(&p).expect("every node's parent exists");
                    assert_eq!(pn.children.get(&n.tokens), Some(&id));
                    assert!(pn.last_used >= n.last_used, "a parent is never older");
                }
            }
            for (k, &child) in &n.children {
                let cn = c.nodes.get(&child).expect("children exist");
                assert_eq!(cn.parent, Some(id));
                assert_eq!(&cn.tokens, k);
                links += 1;
            }
            let listed = c.evictable.contains(&(n.last_used, id));
            assert_eq!(
                listed,
                n.children.is_empty() && n.pins == 0,
                "evictable set exact"
            );
            assert_eq!(c.pinned.contains(&id), n.pins > 0, "pinned set exact");
        }
        assert_eq!(links, c.nodes.len(), "each node is linked exactly once");
        assert!(c.evictable.len() <= c.nodes.len());
        assert!(c.pinned.len() <= c.nodes.len());
    }

    #[test]
    fn lookup_on_empty_misses() {
        let mut c: PrefixCache<u32> = PrefixCache::new(4, 1000);
        assert!(c.lookup(&prompt(&[1, 2])).is_empty());
        assert!(c.lookup(&[]).is_empty());
        assert_eq!(c.stats().misses, 2);
        assert_eq!(c.stats().hits, 0);
        check(&c);
    }

    #[test]
    fn lookup_returns_the_shared_head() {
        let mut c = PrefixCache::new(4, 1000);
        let ids = chain(&mut c, &[1, 2, 3], 10);
        let got = c.lookup(&prompt(&[1, 2, 9]));
        assert_eq!(got, vec![(ids[0], 1), (ids[1], 2)]);
        let all = c.lookup(&prompt(&[1, 2, 3, 4]));
        assert_eq!(all, vec![(ids[0], 1), (ids[1], 2), (ids[2], 3)]);
        assert!(
            c.lookup(&prompt(&[2, 1])).is_empty(),
            "a chunk only matches at its depth"
        );
        check(&c);
    }

    #[test]
    fn partial_trailing_chunk_never_matched() {
        let mut c = PrefixCache::new(4, 1000);
        let ids = chain(&mut c, &[1, 2], 10);
        let mut p = prompt(&[1, 2]);
        p.pop();
        assert_eq!(c.lookup(&p), vec![(ids[0], 1)]);
        assert!(c.lookup(&p[..3]).is_empty());
        assert_eq!(
            c.insert(Some(ids[1]), &[1, 2, 3], 7, 10),
            None,
            "not a full chunk"
        );
        assert_eq!(
            c.insert(None, &[1, 2, 3, 4, 5], 7, 10),
            None,
            "longer than a chunk"
        );
        assert_eq!(c.entries(), 2);
        check(&c);
    }

    #[test]
    fn lru_evicts_oldest_leaf_first() {
        let mut c = PrefixCache::new(4, 30);
        let a = chain(&mut c, &[1], 10)[0];
        let b = chain(&mut c, &[2], 10)[0];
        let cc = chain(&mut c, &[3], 10)[0];
        assert_eq!(c.lookup(&prompt(&[1])).len(), 1); // a is now the most recent
        let d = chain(&mut c, &[4], 10)[0];
        assert!(c.contains(a) && c.contains(cc) && c.contains(d));
        assert!(!c.contains(b), "the oldest untouched leaf goes first");
        assert!(c.child(None, &ch(3)).is_some()); // c is now the most recent
        chain(&mut c, &[5], 10);
        assert!(!c.contains(a) && c.contains(cc));
        assert_eq!(c.bytes(), 30);
        assert_eq!(c.stats().evictions, 2);
        check(&c);
    }

    #[test]
    fn parent_never_evicted_before_children() {
        // Inserting the child touches the parent at the same tick; plain LRU would take the
        // (lower-id) parent first.
        let mut c = PrefixCache::new(4, 20);
        let ids = chain(&mut c, &[1, 2], 10);
        c.set_capacity(10);
        assert!(c.contains(ids[0]) && !c.contains(ids[1]));
        check(&c);

        // A lookup of the parent alone leaves its child older than an unrelated leaf.
        let mut c = PrefixCache::new(4, 30);
        let pc = chain(&mut c, &[1, 2], 10);
        let x = chain(&mut c, &[3], 10)[0];
        assert_eq!(c.lookup(&prompt(&[1])).len(), 1);
        c.set_capacity(20);
        assert!(!c.contains(pc[1]) && c.contains(pc[0]) && c.contains(x));
        c.set_capacity(10);
        assert!(
            c.contains(pc[0]) && !c.contains(x),
            "the touched parent outlives x"
        );
        check(&c);
    }

    #[test]
    fn insert_spares_the_parent_chain() {
        // p has an old child a; q is a newer root. Making room for b under p evicts a, which
        // leaves p an old leaf: it must be spared and q taken instead.
        let mut c = PrefixCache::new(4, 30);
        let pa = chain(&mut c, &[1, 2], 10);
        let q = chain(&mut c, &[3], 10)[0];
        let b = c.insert(Some(pa[0]), &ch(4), 4, 20).unwrap();
        assert!(c.contains(pa[0]) && c.contains(b));
        assert!(!c.contains(pa[1]) && !c.contains(q));
        assert_eq!(c.lookup(&prompt(&[1, 4])), vec![(pa[0], 1), (b, 4)]);
        check(&c);
    }

    #[test]
    fn pinned_nodes_survive_pressure() {
        let mut c = PrefixCache::new(4, 20);
        let a = chain(&mut c, &[1], 10)[0];
        let b = chain(&mut c, &[2], 10)[0];
        assert!(c.pin(a));
        chain(&mut c, &[3], 10);
        assert!(
            c.contains(a) && !c.contains(b),
            "the pinned oldest leaf is skipped"
        );

        // Pins leave too little room: the insert is refused and evicts nothing, not even the
        // unpinned leaf it could have taken.
        let mut c = PrefixCache::new(4, 30);
        let a = chain(&mut c, &[1], 10)[0];
        let b = chain(&mut c, &[2], 10)[0];
        let d = chain(&mut c, &[3], 10)[0];
        assert!(c.pin(a) && c.pin(b));
        assert_eq!(c.insert(None, &ch(4), 4, 20), None);
        assert!(c.contains(a) && c.contains(b) && c.contains(d));
        assert_eq!(c.stats().evictions, 0);
        assert!(
            c.insert(None, &ch(4), 4, 10).is_some(),
            "room for 10 is made from d"
        );
        assert!(!c.contains(d));
        check(&c);

        // A pinned deep node keeps its ancestors, even below capacity 0, until unpinned.
        let mut c = PrefixCache::new(4, 100);
        let ids = chain(&mut c, &[1, 2, 3], 10);
        let other = chain(&mut c, &[4, 5], 10);
        assert!(c.pin(ids[2]) && c.pin(ids[2]));
        c.set_capacity(0);
        assert!(ids.iter().all(|&i| c.contains(i)));
        assert!(other.iter().all(|&i| !c.contains(i)));
        assert_eq!(c.bytes(), 30);
        check(&c);
        assert!(c.unpin(ids[2]));
        assert!(c.contains(ids[0]), "still pinned once");
        assert!(c.unpin(ids[2]));
        assert!(!c.unpin(ids[2]), "no pin left");
        assert_eq!(c.entries(), 0);
        assert_eq!(c.bytes(), 0);
        assert!(!c.pin(ids[0]), "gone");
        check(&c);
    }

    #[test]
    fn insert_under_evicted_parent_returns_none() {
        let mut c = PrefixCache::new(4, 20);
        let a = chain(&mut c, &[1], 10)[0];
        chain(&mut c, &[2], 10);
        chain(&mut c, &[3], 10);
        assert!(!c.contains(a));
        let evictions = c.stats().evictions;
        assert_eq!(c.insert(Some(a), &ch(4), 4, 10), None);
        assert_eq!(
            c.stats().evictions,
            evictions,
            "a refused insert evicts nothing"
        );
        assert_eq!(c.entries(), 2);
        assert!(c.child(Some(a), &ch(4)).is_none());
        let a2 = c.insert(None, &ch(1), 1, 10).unwrap();
        assert_ne!(a2, a, "ids are never reused");
        assert_eq!(
            c.insert(Some(a), &ch(4), 4, 10),
            None,
            "stale id stays stale"
        );
        check(&c);
    }

    #[test]
    fn capacity_zero_disables() {
        let mut c = PrefixCache::new(4, 0);
        assert!(!c.enabled());
        assert_eq!(c.insert(None, &ch(1), 1, 1), None);
        assert!(c.lookup(&prompt(&[1])).is_empty());
        assert_eq!(c.child(None, &ch(1)), None);
        assert_eq!(c.entries(), 0);
        assert_eq!(c.stats().inserted, 0);

        let mut c = PrefixCache::new(4, 100);
        let ids = chain(&mut c, &[1, 2], 10);
        assert!(c.pin(ids[0]));
        c.set_capacity(0);
        assert!(!c.enabled());
        assert_eq!(c.entries(), 1, "only the pinned node is left");
        assert!(
            c.lookup(&prompt(&[1])).is_empty(),
            "what is left is not served"
        );
        assert_eq!(c.child(None, &ch(1)), None);
        assert_eq!(c.insert(Some(ids[0]), &ch(3), 3, 1), None);
        assert!(c.unpin(ids[0]));
        assert!(c.entries() == 0 && c.bytes() == 0);
        check(&c);
    }

    #[test]
    fn entry_larger_than_capacity_is_refused() {
        let mut c = PrefixCache::new(4, 100);
        let a = chain(&mut c, &[1], 10)[0];
        assert_eq!(c.insert(None, &ch(2), 2, 101), None);
        assert!(c.contains(a), "a refused insert evicts nothing");
        assert!(
            c.insert(None, &ch(2), 2, 100).is_some(),
            "exactly the capacity fits"
        );
        assert!(!c.contains(a));
        check(&c);
    }

    #[test]
    fn prompts_sharing_a_prefix_share_nodes() {
        let mut c = PrefixCache::new(4, 1000);
        let p1 = chain(&mut c, &[1, 2, 3], 10);
        let head = c.lookup(&prompt(&[1, 2, 4]));
        assert_eq!(head.len(), 2);
        let (last, _) = head[1];
        let four = c.insert(Some(last), &ch(4), 4, 10).unwrap();
        assert_eq!(c.entries(), 4);
        assert_eq!(c.bytes(), 40);
        // Re-inserting an existing chunk returns its node and keeps the old payload.
        assert_eq!(c.insert(None, &ch(1), 99, 500), Some(p1[0]));
        assert_eq!(c.child(None, &ch(1)), Some((p1[0], 1)));
        assert_eq!(c.bytes(), 40);
        assert_eq!(c.stats().inserted, 4);
        let got: Vec<NodeId> = c.lookup(&prompt(&[1, 2, 4])).iter().map(|x| x.0).collect();
        assert_eq!(got, vec![p1[0], p1[1], four]);
        check(&c);
    }

    #[test]
    fn set_capacity_shrinks() {
        let mut c = PrefixCache::new(4, 50);
        let ids: Vec<NodeId> = (1..=5).map(|s| chain(&mut c, &[s], 10)[0]).collect();
        c.set_capacity(25);
        assert_eq!(c.capacity_bytes(), 25);
        assert_eq!(c.entries(), 2);
        assert_eq!(c.bytes(), 20);
        assert!(ids[3..].iter().all(|&i| c.contains(i)));
        c.set_capacity(100);
        assert_eq!(c.entries(), 2, "growing evicts nothing");
        check(&c);
    }

    #[test]
    fn stats_count() {
        let mut c = PrefixCache::new(4, 20);
        chain(&mut c, &[1, 2], 10);
        c.lookup(&prompt(&[1, 2]));
        c.lookup(&prompt(&[1, 3]));
        c.lookup(&prompt(&[3]));
        c.child(None, &ch(1));
        chain(&mut c, &[5], 10);
        c.insert(None, &ch(5), 5, 10); // already there: not counted
        let s = c.stats();
        assert_eq!(
            s,
            CacheStats {
                hits: 2,
                hit_chunks: 3,
                misses: 1,
                evictions: 1,
                inserted: 3
            }
        );
    }

    #[test]
    fn chunk_zero_is_taken_as_one() {
        let mut c = PrefixCache::new(0, 10);
        assert_eq!(c.chunk(), 1);
        let a = c.insert(None, &[7], 7, 1).unwrap();
        assert_eq!(c.lookup(&[7, 8]), vec![(a, 7)]);
        assert!(format!("{c:?}").contains("entries: 1"));
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random prompts over a 2-letter alphabet with 2-token chunks (so prefixes collide often),
    /// read the way the scheduler would: look up the head, then pin the node it stands on,
    /// insert the next chunk, unpin. Payloads are the whole prefix up to their chunk, so a
    /// wrong path shows. Invariants are checked after every operation.
    #[test]
    fn randomized_invariants() {
        let chunk = 2;
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut c: PrefixCache<Vec<u32>> = PrefixCache::new(chunk, 120);
        let mut held: Vec<NodeId> = Vec::new();
        for _ in 0..4000 {
            match rng.below(20) {
                0 => c.set_capacity(rng.below(200)),
                1 => {
                    if !held.is_empty() {
                        let i = rng.below(held.len() as u64) as usize;
                        assert!(c.unpin(held.swap_remove(i)));
                    }
                }
                _ => read_one(&mut c, &mut rng, &mut held),
            }
            check(&c);
            assert!(held.iter().all(|&h| c.contains(h)), "pinned nodes stay");
        }
        for h in held.drain(..) {
            assert!(c.unpin(h));
            check(&c);
        }
        assert!(c.bytes() <= c.capacity_bytes());
        let s = c.stats();
        assert!(s.hits > 100 && s.misses > 10 && s.evictions > 100, "{s:?}");
    }

    fn read_one(c: &mut PrefixCache<Vec<u32>>, rng: &mut XorShift, held: &mut Vec<NodeId>) {
        let chunk = c.chunk();
        let len = rng.below(13) as usize;
        let tokens: Vec<u32> = (0..len).map(|_| rng.below(2) as u32).collect();
        let head = c.lookup(&tokens);
        assert!(head.len() <= tokens.len() / chunk);
        for (k, (_, payload)) in head.iter().enumerate() {
            assert_eq!(
                &payload[..],
                &tokens[..(k + 1) * chunk],
                "payload is the prefix"
            );
        }
        let mut parent = head.last().map(|x| x.0);
        if let Some(next) = tokens.chunks_exact(chunk).nth(head.len()) {
            assert_eq!(
                c.find_child(parent, next),
                None,
                "lookup returns the longest run"
            );
        }
        for k in head.len()..tokens.len() / chunk {
            if let Some(p) = parent {
                c.pin(p);
            }
            let span = &tokens[k * chunk..(k + 1) * chunk];
            let payload = tokens[..(k + 1) * chunk].to_vec();
            let got = c.insert(parent, span, payload, 1 + rng.below(25));
            if let Some(p) = parent {
                assert!(c.unpin(p));
            }
            check(c);
            match got {
                Some(id) => parent = Some(id),
                None => break,
            }
        }
        if let Some(p) = parent.filter(|_| rng.below(8) == 0 && held.len() < 4) {
            if c.pin(p) {
                held.push(p);
            }
        }
    }
}
