//! Handing a step's forward passes to the reads that asked for them: chunk K/V before the step's
//! evaluation (so its next pass can build on them), everything else after it.

use super::plan::Work;
use super::{ReadSlot, Scheduler};
use crate::model::{DiffusionGemma, ForwardOutput};
use crate::read::diffusion::draws::SlotRows;
use hunch_core::ReadError;
use std::collections::HashSet;

/// Which requests a step's timing was already added to (prefill: `true`, denoise: `false`).
pub(super) type Timed = HashSet<(usize, bool)>;

impl Scheduler {
    /// Before the evaluation: each planned chunk's (lazy) K/V joins its read, so a later pass of
    /// the same step computes the read's next chunk on top of it.
    pub(super) fn record_chunks(&mut self, work: &[Work], output: &ForwardOutput) {
        let mut outputs = output.chunks.iter();
        for item in work {
            let Work::Chunk {
                request,
                read,
                range,
            } = item
            else {
                continue;
            };
            let Some(kv) = outputs.next() else {
                return; // reported by `apply`
            };
            if let ReadSlot::Prefilling { chunks, done, .. } =
                &mut self.active[*request].reads[*read]
            {
                chunks.push(kv.clone());
                *done = range.end;
            }
        }
    }

    /// After the evaluation: counters and stats, the computed chunks into the prefix cache,
    /// finished prefills into prompt caches, and the draws' readings. Returns the requests that
    /// failed (the caller answers them once the whole step is applied, since answering removes
    /// requests and shifts the indices the step's work refers to).
    pub(super) fn apply(
        &mut self,
        model: &DiffusionGemma,
        work: &[Work],
        output: &ForwardOutput,
        seconds: f64,
        timed: &mut Timed,
    ) -> Vec<(usize, ReadError)> {
        let requests: HashSet<usize> = work.iter().map(Work::request).collect();
        let rows: usize = work.iter().map(Work::rows).sum();
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
                    if let ReadSlot::Prefilling { node, .. } = &mut active.reads[*read] {
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
                    let fetch = |row: usize| output.full_row(i, row);
                    let result = output
                        .slot_summaries(i)
                        .map_err(|e| ReadError::internal(format!("reading logits: {e}")))
                        .and_then(|summaries| {
                            let rows = SlotRows::Reduced {
                                summaries: &summaries,
                                full_row: &fetch,
                            };
                            active.progress.drawn(*read, rows)
                        });
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
        failed
    }
}
