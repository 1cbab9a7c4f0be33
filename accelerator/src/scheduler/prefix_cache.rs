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
mod tests;
