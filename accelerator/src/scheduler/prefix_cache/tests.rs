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
