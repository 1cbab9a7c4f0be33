//! Planning one forward pass from what the reads in flight need next, and building its inputs.

use super::prefix_cache::NodeId;
use super::{ReadSlot, Scheduler};
use crate::model::{CanvasBatch, DiffusionGemma, ForwardOutput, ModelError, PromptChunk};
use crate::read::diffusion::Need;
use std::collections::HashSet;

/// One unit of work in a planned forward.
pub(super) enum Work {
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
        /// Each position's label ids: the logits are reduced on the device.
        labels: Vec<Vec<u32>>,
    },
}

impl Work {
    pub(super) fn request(&self) -> usize {
        match self {
            Work::Chunk { request, .. } | Work::Draws { request, .. } => *request,
        }
    }

    /// Rows (tokens) it adds to a forward.
    pub(super) fn rows(&self) -> usize {
        match self {
            Work::Chunk { range, .. } => range.len(),
            Work::Draws { canvases, .. } => canvases.iter().map(Vec::len).sum(),
        }
    }
}

impl Scheduler {
    /// What the next forward pass of this step runs, within `budget` rows. The step's first
    /// pass takes the decoder passes of ready reads first (small and latency-bound) and always
    /// takes its first item; every pass then takes one chunk per prefilling read. `scheduled`
    /// holds the shareable chunks the step has planned so far: the same chunk after the same
    /// cached path is computed once per step, and the other reads take it from the cache next
    /// step. Where reads may not share forwards (batching not exact here), the step works on
    /// one read only: `focus` holds it once the first item is planned.
    pub(super) fn plan_forward(
        &self,
        budget: usize,
        first_pass: bool,
        scheduled: &mut HashSet<(Option<NodeId>, Vec<u32>)>,
        focus: &mut Option<(usize, usize)>,
    ) -> Vec<Work> {
        let mut work = Vec::new();
        let mut rows = 0usize;
        let fits = |rows: usize, more: usize, work: &Vec<Work>| {
            (first_pass && work.is_empty()) || rows + more <= budget
        };
        let alone = !self.reads_share_forwards();
        let allowed = |focus: &Option<(usize, usize)>, unit: (usize, usize)| {
            !alone || focus.is_none_or(|f| f == unit)
        };
        if first_pass {
            for (request, active) in self.active.iter().enumerate() {
                for (read, slot) in active.reads.iter().enumerate() {
                    if !matches!(slot, ReadSlot::Ready { .. }) || !allowed(focus, (request, read)) {
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
                            if alone {
                                *focus = Some((request, read));
                            }
                            work.push(Work::Draws {
                                request,
                                read,
                                canvases,
                                positions,
                                labels: active.progress.slot_labels(read),
                            });
                        }
                    }
                }
            }
        }
        let chunk = self.config.prefill_chunk;
        for (request, active) in self.active.iter().enumerate() {
            for (read, slot) in active.reads.iter().enumerate() {
                let ReadSlot::Prefilling { done, node, .. } = slot else {
                    continue;
                };
                if !allowed(focus, (request, read)) {
                    continue;
                }
                let ids = active.progress.prompt_ids(read);
                if *done >= ids.len() {
                    // Its last chunk ran in an earlier pass of this step.
                    continue;
                }
                let range = *done..(*done + chunk).min(ids.len());
                let shareable =
                    range.len() == chunk && self.cache.enabled() && (node.is_some() || *done == 0);
                let key = (*node, ids[range.clone()].to_vec());
                if shareable && scheduled.contains(&key) {
                    continue;
                }
                if fits(rows, range.len(), &work) {
                    rows += range.len();
                    if alone {
                        *focus = Some((request, read));
                    }
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

    /// Builds a planned pass (lazy: the step evaluates all its passes at once).
    pub(super) fn run_forward(
        &self,
        model: &DiffusionGemma,
        work: &[Work],
    ) -> Result<ForwardOutput, ModelError> {
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
                    labels,
                } => {
                    if let ReadSlot::Ready { cache, .. } = &self.active[*request].reads[*read] {
                        canvases.push(CanvasBatch {
                            cache,
                            canvases: rows,
                            positions: Some(positions),
                            self_conditioning: None,
                            labels: Some(labels),
                        });
                    }
                }
            }
        }
        model.forward_lazy(&chunks, &canvases)
    }
}
