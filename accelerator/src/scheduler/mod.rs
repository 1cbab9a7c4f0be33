//! The engine's scheduler: many requests in flight at once, their model work batched into shared
//! forward passes, their prompts' K/V reused from a prefix cache — with every answer
//! bit-identical to what the same request gets alone (docs/batching.md).
//!
//! Each step builds one forward from what the reads in flight need next: first the decoder
//! passes of reads whose prompt is ready (small and latency-bound), then one prompt chunk per
//! prefilling read, up to `max_rows` rows. A read's prompt is prefilled in fixed chunks aligned
//! from position 0; every full chunk goes into the prefix cache, and a read advances through
//! cached chunks before it computes any, so a chunk another read computed a step earlier — or a
//! request earlier — is reused. Two reads about to compute the same chunk in one step are not
//! both run: the second waits one step and takes it from the cache.
//!
//! A read starts its prefill only when its prompt K/V fits the memory budget next to the reads
//! already in flight (one read always may), so a burst of long prompts queues instead of running
//! the machine out of memory.

pub mod prefix_cache;
mod probe;

pub use probe::measure_batch_deviation;

use crate::model::{CanvasBatch, ChunkKv, DiffusionGemma, ModelError, PromptCache, PromptChunk};
use crate::read::{Need, Planner, ReadSettings, ReadTokenizer, RequestProgress};
use hunch_core::{EngineGauges, ReadError, ReadOutcome, ReadRequest};
use prefix_cache::{NodeId, PrefixCache};
use std::collections::HashSet;
use std::time::Instant;

/// Where a request's answer goes, and whether anyone still waits for it.
pub struct Reply {
    send: Box<dyn FnOnce(Result<ReadOutcome, ReadError>) + Send>,
    abandoned: Box<dyn Fn() -> bool + Send>,
}

impl Reply {
    /// An answer handed to `send`; never abandoned.
    pub fn new(send: impl FnOnce(Result<ReadOutcome, ReadError>) + Send + 'static) -> Self {
        Reply {
            send: Box::new(send),
            abandoned: Box::new(|| false),
        }
    }

    /// `abandoned` says when the client has gone away (its connection closed, its timeout
    /// passed): the scheduler then drops the request's remaining work instead of spending
    /// forward passes on an answer nobody reads.
    pub fn with_abandoned(mut self, abandoned: impl Fn() -> bool + Send + 'static) -> Self {
        self.abandoned = Box::new(abandoned);
        self
    }

    pub fn send(self, outcome: Result<ReadOutcome, ReadError>) {
        (self.send)(outcome)
    }

    pub fn is_abandoned(&self) -> bool {
        (self.abandoned)()
    }
}

/// How much the scheduler batches and caches.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Requests read at once; their work shares forward passes. 1 = one request at a time (the
    /// reads of that request still share passes).
    pub max_requests: usize,
    /// Most rows (prompt-chunk tokens plus canvas tokens) in one forward pass.
    pub max_rows: usize,
    /// Bytes of prompt K/V that reads in flight may hold; a read waits to start its prefill
    /// until its K/V fits (one read always may).
    pub kv_budget_bytes: u64,
    /// Prefill chunk length. Chunk boundaries are the prefix cache's reuse points.
    pub prefill_chunk: usize,
    /// Prefix cache capacity in bytes; 0 turns the cache off.
    pub cache_bytes: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_requests: 16,
            max_rows: 2048,
            kv_budget_bytes: 2 << 30,
            prefill_chunk: crate::model::DEFAULT_PREFILL_CHUNK,
            cache_bytes: 1 << 30,
        }
    }
}

/// Where one read of a request is.
enum ReadSlot {
    /// Admitted with its request, waiting for room in the memory budget.
    Waiting,
    /// Prefilling: `chunks` hold the K/V of the first `done` prompt tokens; `node` is the
    /// prefix-cache node of the last chunk (pinned) while the path is cached.
    Prefilling {
        chunks: Vec<ChunkKv>,
        done: usize,
        node: Option<NodeId>,
        budget: u64,
    },
    /// Prompt ready; decoder passes pending.
    Ready {
        cache: PromptCache,
        budget: u64,
    },
    Done,
}

impl ReadSlot {
    fn budget(&self) -> u64 {
        match self {
            ReadSlot::Prefilling { budget, .. } | ReadSlot::Ready { budget, .. } => *budget,
            ReadSlot::Waiting | ReadSlot::Done => 0,
        }
    }
}

/// A request in flight.
struct Active {
    progress: RequestProgress,
    reply: Option<Reply>,
    reads: Vec<ReadSlot>,
    /// Shared a forward with another request at least once.
    shared: bool,
}

/// One unit of work in a planned forward.
enum Work {
    Chunk {
        request: usize,
        read: usize,
        range: std::ops::Range<usize>,
    },
    Draws {
        request: usize,
        read: usize,
        canvases: Vec<Vec<u32>>,
        positions: Vec<usize>,
    },
}

impl Work {
    fn request(&self) -> usize {
        match self {
            Work::Chunk { request, .. } | Work::Draws { request, .. } => *request,
        }
    }
}

/// What one [`Scheduler::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// Nothing in flight.
    Idle,
    /// Ran a forward pass (or answered requests).
    Worked,
}

/// Counters over the scheduler's life (for logs and the bench).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    pub forwards: u64,
    pub rows: u64,
    pub reused_tokens: u64,
    pub prefilled_tokens: u64,
    /// Requests dropped because their clients went away.
    pub abandoned: u64,
}

/// Many requests in flight over one model.
pub struct Scheduler {
    config: SchedulerConfig,
    cache: PrefixCache<ChunkKv>,
    active: Vec<Active>,
    /// Prompt K/V bytes per token, every layer (an upper bound while a read prefills).
    kv_bytes_per_token: u64,
    /// Measured by [`measure_batch_deviation`] (`None`: not measured); reported with answers
    /// computed in a shared forward.
    batch_deviation: Option<f64>,
    queued: u32,
    counters: SchedulerCounters,
}

impl Scheduler {
    pub fn new(model: &DiffusionGemma, config: SchedulerConfig) -> Self {
        let dtype_bytes = match model.dtype() {
            mlx_rs::Dtype::Float32 => 4,
            _ => 2,
        };
        let kv_bytes_per_token = model
            .config()
            .layers
            .iter()
            .map(|l| 2 * (l.num_kv_heads as u64) * (l.head_dim as u64) * dtype_bytes)
            .sum();
        let chunk = config.prefill_chunk.max(1);
        Scheduler {
            cache: PrefixCache::new(chunk, config.cache_bytes),
            config: SchedulerConfig {
                prefill_chunk: chunk,
                max_requests: config.max_requests.max(1),
                max_rows: config.max_rows.max(1),
                ..config
            },
            active: Vec::new(),
            kv_bytes_per_token,
            batch_deviation: None,
            queued: 0,
            counters: SchedulerCounters::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn counters(&self) -> SchedulerCounters {
        self.counters
    }

    /// Whether another request can be admitted now.
    pub fn has_room(&self) -> bool {
        self.active.len() < self.config.max_requests
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// Requests waiting in front of the scheduler (reported in the gauges).
    pub fn set_queued(&mut self, queued: usize) {
        self.queued = queued as u32;
    }

    /// The deviation to report with answers computed in a shared forward.
    pub fn set_batch_deviation(&mut self, deviation: Option<f64>) {
        self.batch_deviation = deviation.filter(|d| d.is_finite());
    }

    pub fn batch_deviation(&self) -> Option<f64> {
        self.batch_deviation
    }

    /// The scheduler's gauges now.
    pub fn gauges(&self) -> EngineGauges {
        EngineGauges {
            active_requests: self.active.len() as u32,
            queued_requests: self.queued,
            cache_bytes: self.cache.bytes(),
            cache_entries: self.cache.entries() as u64,
            inflight_kv_bytes: self.inflight_budget(),
        }
    }

    fn inflight_budget(&self) -> u64 {
        self.active
            .iter()
            .flat_map(|a| a.reads.iter().map(ReadSlot::budget))
            .sum()
    }

    /// Admits a request: plans it (a bad request is answered at once) and puts it in flight.
    pub fn submit<T: ReadTokenizer>(
        &mut self,
        planner: &Planner<T>,
        settings: &ReadSettings,
        vocab: u32,
        request: &ReadRequest,
        reply: Reply,
    ) {
        match RequestProgress::start(planner, settings, vocab, request) {
            Err(e) => reply.send(Err(e)),
            Ok(progress) => {
                let reads = (0..progress.read_count())
                    .map(|_| ReadSlot::Waiting)
                    .collect();
                self.active.push(Active {
                    progress,
                    reply: Some(reply),
                    reads,
                    shared: false,
                });
                // A request whose questions all have one answer needs no model work.
                self.finish_done();
            }
        }
    }

    /// Runs one forward pass of batched work.
    pub fn step(&mut self, model: &DiffusionGemma) -> StepOutcome {
        self.drop_abandoned();
        if self.active.is_empty() {
            return StepOutcome::Idle;
        }
        self.start_prefills();
        self.advance_through_cache(model);
        self.finish_done();
        if self.active.is_empty() {
            return StepOutcome::Worked;
        }
        let work = self.plan_forward();
        if work.is_empty() {
            // Every read in flight always has a next piece of work (one waiting read may always
            // start); an empty plan is a bug. Answer rather than spin.
            let failed = (0..self.active.len())
                .map(|r| {
                    (
                        r,
                        ReadError::internal("the scheduler found no work for this request"),
                    )
                })
                .collect();
            self.fail(failed);
            return StepOutcome::Worked;
        }
        let started = Instant::now();
        let result = self.run_forward(model, &work);
        let elapsed = started.elapsed().as_secs_f64();
        match result {
            Ok(output) => self.apply(model, &work, output, elapsed),
            Err(e) => {
                let message = format!("forward pass failed: {e}");
                tracing::error!(%message, "failing the requests of this batch");
                let failed: HashSet<usize> = work.iter().map(Work::request).collect();
                for &r in &failed {
                    if let Some(reply) = self.active[r].reply.take() {
                        reply.send(Err(ReadError::internal(message.clone())));
                    }
                }
                self.release_failed();
            }
        }
        self.finish_done();
        StepOutcome::Worked
    }

    /// Moves waiting reads into prefill while their K/V fits the budget (in arrival order).
    fn start_prefills(&mut self) {
        let mut inflight = self.inflight_budget();
        let per_token = self.kv_bytes_per_token;
        for active in &mut self.active {
            for (read, slot) in active.reads.iter_mut().enumerate() {
                if !matches!(slot, ReadSlot::Waiting) {
                    continue;
                }
                let budget = per_token * active.progress.prompt_ids(read).len() as u64;
                if inflight > 0 && inflight + budget > self.config.kv_budget_bytes {
                    return;
                }
                inflight += budget;
                *slot = ReadSlot::Prefilling {
                    chunks: Vec::new(),
                    done: 0,
                    node: None,
                    budget,
                };
            }
        }
    }

    /// Lets every prefilling read take the cached chunks that continue its prompt; a read whose
    /// whole prompt is cached becomes ready.
    fn advance_through_cache(&mut self, model: &DiffusionGemma) {
        if !self.cache.enabled() {
            return;
        }
        let chunk = self.config.prefill_chunk;
        let mut failed = Vec::new();
        for (r, active) in self.active.iter_mut().enumerate() {
            for read in 0..active.reads.len() {
                let ids = active.progress.prompt_ids(read);
                let len = ids.len();
                let ReadSlot::Prefilling {
                    chunks, done, node, ..
                } = &mut active.reads[read]
                else {
                    continue;
                };
                let before = *done;
                // A path that is not (or no longer) cached cannot continue from the root.
                while (node.is_some() || *done == 0) && *done + chunk <= len {
                    let Some((child, kv)) = self.cache.child(*node, &ids[*done..*done + chunk])
                    else {
                        break;
                    };
                    self.cache.pin(child);
                    if let Some(old) = node.replace(child) {
                        self.cache.unpin(old);
                    }
                    chunks.push(kv);
                    *done += chunk;
                }
                let reused = (*done - before) as u64;
                if reused > 0 {
                    if before == 0 {
                        active.progress.stats.cache_hits += 1;
                    }
                    active.progress.stats.reused_tokens += reused;
                    self.counters.reused_tokens += reused;
                }
                if *done == len {
                    if let Err(e) = Self::finish_prefill(&mut self.cache, model, active, read) {
                        failed.push((r, e));
                    }
                }
            }
        }
        self.fail(failed);
    }

    /// Turns a fully prefilled read's chunks into the decoder's prompt cache.
    fn finish_prefill(
        cache: &mut PrefixCache<ChunkKv>,
        model: &DiffusionGemma,
        active: &mut Active,
        read: usize,
    ) -> Result<(), ReadError> {
        let slot = std::mem::replace(&mut active.reads[read], ReadSlot::Done);
        let ReadSlot::Prefilling {
            chunks,
            node,
            budget,
            ..
        } = slot
        else {
            active.reads[read] = slot;
            return Ok(());
        };
        if let Some(node) = node {
            cache.unpin(node);
        }
        let prompt = model
            .prompt_cache(&chunks)
            .map_err(|e| ReadError::internal(format!("assembling the prompt cache: {e}")))?;
        active.reads[read] = ReadSlot::Ready {
            cache: prompt,
            budget,
        };
        active.progress.prefilled(read)
    }

    /// What the next forward runs: decoder passes first, then one chunk per prefilling read,
    /// within `max_rows` (the first item always fits).
    fn plan_forward(&self) -> Vec<Work> {
        let mut work = Vec::new();
        let mut rows = 0usize;
        let max_rows = self.config.max_rows;
        let fits =
            |rows: usize, more: usize, work: &Vec<Work>| work.is_empty() || rows + more <= max_rows;
        for (request, active) in self.active.iter().enumerate() {
            for (read, slot) in active.reads.iter().enumerate() {
                if !matches!(slot, ReadSlot::Ready { .. }) {
                    continue;
                }
                if let Some(Need::Draws {
                    canvases,
                    positions,
                }) = active.progress.need(read)
                {
                    let more = canvases.iter().map(Vec::len).sum::<usize>();
                    if fits(rows, more, &work) {
                        rows += more;
                        work.push(Work::Draws {
                            request,
                            read,
                            canvases,
                            positions,
                        });
                    }
                }
            }
        }
        let chunk = self.config.prefill_chunk;
        let mut scheduled: HashSet<(Option<NodeId>, &[u32])> = HashSet::new();
        for (request, active) in self.active.iter().enumerate() {
            for (read, slot) in active.reads.iter().enumerate() {
                let ReadSlot::Prefilling { done, node, .. } = slot else {
                    continue;
                };
                let ids = active.progress.prompt_ids(read);
                let range = *done..(*done + chunk).min(ids.len());
                // The same chunk after the same cached path is computed once per step; the
                // other reads take it from the cache next step.
                let shareable =
                    range.len() == chunk && self.cache.enabled() && (node.is_some() || *done == 0);
                let key = (*node, &ids[range.clone()]);
                if shareable && scheduled.contains(&key) {
                    continue;
                }
                if fits(rows, range.len(), &work) {
                    rows += range.len();
                    if shareable {
                        scheduled.insert(key);
                    }
                    work.push(Work::Chunk {
                        request,
                        read,
                        range,
                    });
                }
            }
        }
        work
    }

    fn run_forward(
        &self,
        model: &DiffusionGemma,
        work: &[Work],
    ) -> Result<crate::model::ForwardOutput, ModelError> {
        let mut chunks = Vec::new();
        let mut canvases = Vec::new();
        for item in work {
            match item {
                Work::Chunk {
                    request,
                    read,
                    range,
                } => {
                    let active = &self.active[*request];
                    if let ReadSlot::Prefilling { chunks: past, .. } = &active.reads[*read] {
                        chunks.push(PromptChunk {
                            past,
                            ids: &active.progress.prompt_ids(*read)[range.clone()],
                        });
                    }
                }
                Work::Draws {
                    request,
                    read,
                    canvases: rows,
                    positions,
                } => {
                    if let ReadSlot::Ready { cache, .. } = &self.active[*request].reads[*read] {
                        canvases.push(CanvasBatch {
                            cache,
                            canvases: rows,
                            positions: Some(positions),
                            self_conditioning: None,
                        });
                    }
                }
            }
        }
        model.forward(&chunks, &canvases)
    }

    /// Hands a forward's results to the reads that asked for them.
    fn apply(
        &mut self,
        model: &DiffusionGemma,
        work: &[Work],
        output: crate::model::ForwardOutput,
        seconds: f64,
    ) {
        let requests: HashSet<usize> = work.iter().map(Work::request).collect();
        let rows: usize = work
            .iter()
            .map(|w| match w {
                Work::Chunk { range, .. } => range.len(),
                Work::Draws { canvases, .. } => canvases.iter().map(Vec::len).sum(),
            })
            .sum();
        self.counters.forwards += 1;
        self.counters.rows += rows as u64;
        for &r in &requests {
            let active = &mut self.active[r];
            let stats = &mut active.progress.stats;
            stats.forwards += 1;
            stats.max_batch_requests = stats.max_batch_requests.max(requests.len() as u32);
            stats.max_batch_rows = stats.max_batch_rows.max(rows as u32);
            active.shared |= requests.len() > 1;
        }
        let chunk_len = self.config.prefill_chunk;
        let mut chunk_outputs = output.chunks.iter();
        let mut canvas_index = 0;
        let mut failed = Vec::new();
        let mut timed: HashSet<(usize, bool)> = HashSet::new();
        for item in work {
            match item {
                Work::Chunk {
                    request,
                    read,
                    range,
                } => {
                    let Some(kv) = chunk_outputs.next() else {
                        failed.push((*request, ReadError::internal("a chunk's K/V is missing")));
                        continue;
                    };
                    let active = &mut self.active[*request];
                    if timed.insert((*request, true)) {
                        active.progress.stats.prefill_seconds += seconds;
                    }
                    self.counters.prefilled_tokens += range.len() as u64;
                    let ids = active.progress.prompt_ids(*read);
                    let complete = range.end == ids.len();
                    if let ReadSlot::Prefilling {
                        chunks, done, node, ..
                    } = &mut active.reads[*read]
                    {
                        // Only full chunks on a cached path (or at the root) are cacheable.
                        if range.len() == chunk_len
                            && self.cache.enabled()
                            && (node.is_some() || range.start == 0)
                        {
                            let parent = *node;
                            let inserted = self.cache.insert(
                                parent,
                                &ids[range.clone()],
                                kv.clone(),
                                kv.bytes(),
                            );
                            if let Some(id) = inserted {
                                self.cache.pin(id);
                            }
                            *node = inserted;
                            if let Some(old) = parent {
                                self.cache.unpin(old);
                            }
                        }
                        chunks.push(kv.clone());
                        *done = range.end;
                    }
                    if complete {
                        if let Err(e) = Self::finish_prefill(&mut self.cache, model, active, *read)
                        {
                            failed.push((*request, e));
                        }
                    }
                }
                Work::Draws { request, read, .. } => {
                    let i = canvas_index;
                    canvas_index += 1;
                    let active = &mut self.active[*request];
                    if timed.insert((*request, false)) {
                        active.progress.stats.denoise_seconds += seconds;
                    }
                    let result = output
                        .logits(i)
                        .map_err(|e| ReadError::internal(format!("reading logits: {e}")))
                        .and_then(|logits| active.progress.drawn(*read, logits));
                    match result {
                        Err(e) => failed.push((*request, e)),
                        Ok(()) if active.progress.read_done(*read) => {
                            active.reads[*read] = ReadSlot::Done;
                        }
                        Ok(()) => {}
                    }
                }
            }
        }
        self.fail(failed);
    }

    /// Drops the requests whose clients have gone away (their cache pins with them).
    fn drop_abandoned(&mut self) {
        let mut dropped = 0u64;
        for active in &mut self.active {
            if active.reply.as_ref().is_some_and(Reply::is_abandoned) {
                active.reply = None;
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!(dropped, "dropping reads whose clients went away");
            self.counters.abandoned += dropped;
            self.release_failed();
        }
    }

    /// Answers the given requests with their errors and drops them.
    fn fail(&mut self, failed: Vec<(usize, ReadError)>) {
        if failed.is_empty() {
            return;
        }
        for (r, e) in failed {
            if let Some(reply) = self.active[r].reply.take() {
                reply.send(Err(e));
            }
        }
        self.release_failed();
    }

    /// Drops requests that were already answered (with an error) or abandoned, unpinning their
    /// cache nodes.
    fn release_failed(&mut self) {
        let cache = &mut self.cache;
        self.active.retain_mut(|a| {
            if a.reply.is_some() {
                return true;
            }
            for slot in &a.reads {
                if let ReadSlot::Prefilling {
                    node: Some(node), ..
                } = slot
                {
                    cache.unpin(*node);
                }
            }
            false
        });
    }

    /// Answers every request whose reads are all done.
    fn finish_done(&mut self) {
        let gauges = self.gauges();
        let deviation = self.batch_deviation;
        let mut i = 0;
        while i < self.active.len() {
            if !self.active[i].progress.is_done() {
                i += 1;
                continue;
            }
            // `remove`, not `swap_remove`: arrival order is the batching priority.
            let mut active = self.active.remove(i);
            let stats = &mut active.progress.stats;
            if active.shared {
                stats.batch_deviation = deviation;
            }
            stats.engine = Some(EngineGauges {
                active_requests: gauges.active_requests.saturating_sub(1),
                ..gauges
            });
            if let Some(reply) = active.reply.take() {
                reply.send(active.progress.finish());
            }
        }
    }
}
