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

//!
//! Where batching is not exact on the backend (the start-up probe measured a deviation), the
//! default [`Batching::Auto`] reads one request at a time, so every answer is bit-identical to
//! the same read alone unless the operator chose throughput (`--batching on`).
//!
//! Files: [`config`] (settings), [`reply`] (where answers go), `plan` (what the next forward
//! runs), `apply` (handing its results back), [`prefix_cache`], `probe`.

mod apply;
mod config;
mod plan;
pub mod prefix_cache;
mod probe;
mod reply;

pub use config::{Batching, SchedulerConfig, UnknownBatching};
pub use probe::measure_batch_deviation;
pub use reply::Reply;

use crate::model::{ChunkKv, DiffusionGemma, ForwardOutput, PromptCache};
use crate::read::diffusion::{Planner, ReadSettings, ReadTokenizer, RequestProgress};
use apply::Timed;
use hunch_core::{EngineGauges, ReadError, ReadRequest};
use plan::Work;
use prefix_cache::{NodeId, PrefixCache};
use std::collections::HashSet;
use std::time::Instant;

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
    /// Blocking evaluations: one per step with work, whatever its number of passes.
    pub evaluations: u64,
    /// MLX operations built for them, when counted ([`Scheduler::count_operations`]).
    pub operations: u64,
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
    /// Count the MLX operations of every step (walks each step's graph; for benchmarks).
    count_operations: bool,
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
            count_operations: false,
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
        self.active.len() < self.request_limit()
    }

    /// Requests in flight at once: the configured most where batching is allowed (see
    /// [`Batching`]), else 1.
    pub fn request_limit(&self) -> usize {
        self.config
            .batching
            .request_limit(self.config.max_requests, self.batch_deviation)
    }

    /// Whether the reads in flight may share forward passes: only where batching is exact here
    /// or asked for (`--batching on`); otherwise every read runs in passes of its own.
    pub fn reads_share_forwards(&self) -> bool {
        self.config
            .batching
            .reads_share_forwards(self.batch_deviation)
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// Whether to count the MLX operations each step builds (`ReadStats.operations`): a walk
    /// of the step's graph, so off unless a benchmark asks.
    pub fn count_operations(&mut self, on: bool) {
        self.count_operations = on;
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
            cache_capacity_bytes: self.cache.capacity_bytes(),
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
        // The step: passes planned one after another within `max_rows` rows in all (decoder
        // passes in the first, then further prompt chunks of the prefilling reads on top of the
        // previous pass's lazy K/V), built lazily and evaluated once. A read alone prefills a
        // prompt of up to `max_rows` tokens in one evaluation.
        let mut scheduled = HashSet::new();
        let mut focus = None;
        let mut passes: Vec<(Vec<Work>, ForwardOutput)> = Vec::new();
        let mut failed: Vec<(usize, ReadError)> = Vec::new();
        let mut budget = self.config.max_rows;
        let started = Instant::now();
        loop {
            let work = self.plan_forward(budget, passes.is_empty(), &mut scheduled, &mut focus);
            if work.is_empty() {
                break;
            }
            budget = budget.saturating_sub(work.iter().map(Work::rows).sum());
            match self.run_forward(model, &work) {
                Ok(output) => {
                    self.record_chunks(&work, &output);
                    passes.push((work, output));
                }
                Err(e) => {
                    let message = format!("forward pass failed: {e}");
                    tracing::error!(%message, "failing the requests of this pass");
                    let requests: HashSet<usize> = work.iter().map(Work::request).collect();
                    failed.extend(
                        requests
                            .into_iter()
                            .map(|r| (r, ReadError::internal(message.clone()))),
                    );
                    break;
                }
            }
            if budget == 0 {
                break;
            }
        }
        if passes.is_empty() && failed.is_empty() {
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
        let outputs: Vec<&mlx_rs::Array> = passes
            .iter()
            .flat_map(|(_, output)| output.outputs())
            .collect();
        let operations = if self.count_operations {
            crate::model::graph_operations(&outputs) as u64
        } else {
            0
        };
        let evaluated = mlx_rs::transforms::eval(outputs);
        let elapsed = started.elapsed().as_secs_f64();
        let in_step: HashSet<usize> = passes
            .iter()
            .flat_map(|(work, _)| work.iter().map(Work::request))
            .collect();
        self.counters.evaluations += 1;
        self.counters.operations += operations;
        for &r in &in_step {
            let stats = &mut self.active[r].progress.stats;
            stats.evaluations += 1;
            stats.operations += operations;
        }
        match evaluated {
            Ok(()) => {
                let mut timed = Timed::new();
                for (work, output) in &passes {
                    failed.extend(self.apply(model, work, output, elapsed, &mut timed));
                }
            }
            Err(e) => {
                let message = format!("forward pass failed: {e}");
                tracing::error!(%message, "failing the requests of this step");
                failed.extend(
                    in_step
                        .into_iter()
                        .map(|r| (r, ReadError::internal(message.clone()))),
                );
            }
        }
        self.fail(failed);
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
