//! The manager's moving parts: a load (evictions first), a stop that gives a model's share
//! back, the end of a lease, and the clock (TTLs, dead sidecars, measurements, rescans).

use super::{
    ModelManager, Phase, Reason, FAILED_LOAD_COOLDOWN, LOAD_POLL, LOAD_TIMEOUT, RESCAN_EVERY,
};
use crate::reader::sidecar::{Sidecar, SidecarStatus};
use hunch_core::{Reader, ReaderInfo};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

impl ModelManager {
    /// Evicts `stopping` (their processes gone before this one starts), then loads `name`.
    /// Runs on its own task: a read that gave up waiting does not cancel the load.
    pub(super) async fn load(self: Arc<Self>, name: String, stopping: Vec<(String, Arc<Sidecar>)>) {
        for (victim, sidecar) in stopping {
            self.clone().stop(victim, sidecar, Reason::Budget).await;
        }
        let Some(config) = self.sidecar_config(&name) else {
            return;
        };
        let started = Instant::now();
        tracing::info!(model = %name, path = %config.model_path.display(), "loading");
        let sidecar = Sidecar::spawn(config);
        {
            let mut inner = self.lock();
            if let Some(slot) = inner.models.get_mut(&name) {
                slot.phase = Phase::Loading {
                    sidecar: Some(sidecar.clone()),
                };
                slot.load_started = Some(started);
            }
        }
        let outcome = loop {
            match sidecar.status() {
                SidecarStatus::Ready => break Ok(()),
                SidecarStatus::Down { message, refused } => break Err((message, refused)),
                SidecarStatus::Starting | SidecarStatus::Loading { .. } => {}
            }
            if started.elapsed() > LOAD_TIMEOUT {
                break Err((format!("not loaded after {LOAD_TIMEOUT:?}"), false));
            }
            tokio::time::sleep(LOAD_POLL).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                let measured = sidecar.resident_bytes();
                let info = sidecar.info();
                let mut guard = self.lock();
                let inner = &mut *guard;
                if let Some(slot) = inner.models.get_mut(&name) {
                    slot.phase = Phase::Loaded {
                        sidecar: sidecar.clone(),
                    };
                    slot.measured = measured;
                    slot.info = info;
                    slot.expires = Some(Instant::now() + slot.ttl(self.settings.ttl));
                    let estimated = slot.estimated_bytes;
                    if let Some(m) = measured {
                        inner.overhead = inner.overhead.max(m.saturating_sub(estimated));
                    }
                    inner.pace.record(estimated, seconds);
                }
                tracing::info!(model = %name, seconds, resident_bytes = ?measured, "loaded");
                self.counters.loaded(&name, true, seconds);
            }
            Err((why, refused)) => {
                sidecar.stop().await;
                tracing::warn!(model = %name, %why, refused, "load failed");
                let mut inner = self.lock();
                if let Some(slot) = inner.models.get_mut(&name) {
                    // A refusal waits out the same cooldown: the next read after it loads again,
                    // with the files and settings of then, so a fix takes effect.
                    slot.phase = Phase::Failed {
                        why,
                        retry_at: Instant::now() + FAILED_LOAD_COOLDOWN,
                        refused,
                    };
                    slot.measured = None;
                }
                self.counters.loaded(&name, false, seconds);
            }
        }
        self.changed.notify_waiters();
    }

    /// Ends `name`'s process, then gives its share back.
    pub(super) async fn stop(self: Arc<Self>, name: String, sidecar: Arc<Sidecar>, reason: Reason) {
        let last_status = sidecar.status();
        sidecar.stop().await;
        tracing::info!(model = %name, reason = reason.as_str(), "unloaded");
        self.counters.evicted(reason);
        {
            let mut inner = self.lock();
            let gone = match inner.models.get_mut(&name) {
                Some(slot) => {
                    slot.measured = None;
                    slot.expires = None;
                    slot.phase = match (reason, last_status) {
                        (Reason::Died, SidecarStatus::Down { message, .. }) => Phase::Failed {
                            why: message,
                            refused: false,
                            // A read may bring it back at once: the process died, the
                            // checkpoint did load.
                            retry_at: Instant::now(),
                        },
                        _ => Phase::Available,
                    };
                    slot.removed
                }
                None => false,
            };
            if gone {
                inner.models.remove(&name);
            }
        }
        self.changed.notify_waiters();
    }

    /// A lease ended: the model was used now, and an unloading one whose last read this was
    /// can go.
    pub(super) fn release(self: &Arc<Self>, name: &str) {
        let mut to_stop = None;
        {
            let mut inner = self.lock();
            if let Some(slot) = inner.models.get_mut(name) {
                slot.in_flight = slot.in_flight.saturating_sub(1);
                slot.last_used = Some((Instant::now(), SystemTime::now()));
                match &slot.phase {
                    Phase::Unloading { sidecar, reason } if slot.in_flight == 0 => {
                        to_stop = Some((sidecar.clone(), *reason));
                    }
                    Phase::Loaded { .. } if !slot.pinned => {
                        slot.expires = Some(Instant::now() + slot.ttl(self.settings.ttl));
                    }
                    _ => {}
                }
            }
        }
        if let Some((sidecar, reason)) = to_stop {
            tokio::spawn(self.clone().stop(name.to_string(), sidecar, reason));
        }
        self.changed.notify_waiters();
    }

    /// One tick of the clock: measure what runs, unload what is idle past its TTL or removed,
    /// account a dead sidecar as gone, rescan now and then.
    pub(super) async fn tick(self: &Arc<Self>) {
        let running: Vec<(String, Arc<Sidecar>)> = {
            let inner = self.lock();
            inner
                .models
                .iter()
                .filter_map(|(n, s)| match &s.phase {
                    Phase::Loaded { sidecar } | Phase::Unloading { sidecar, .. } => {
                        Some((n.clone(), sidecar.clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        // /proc reads and status looks, outside the lock.
        let looked: Vec<(String, Option<u64>, SidecarStatus, ReaderInfo)> = running
            .into_iter()
            .map(|(n, s)| (n, s.resident_bytes(), s.status(), s.info()))
            .collect();
        let now = Instant::now();
        let mut to_stop = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            for (name, measured, status, info) in looked {
                let Some(slot) = inner.models.get_mut(&name) else {
                    continue;
                };
                let Phase::Loaded { sidecar } = &slot.phase else {
                    continue;
                };
                let sidecar = sidecar.clone();
                if status == SidecarStatus::Ready {
                    // Its load is done; a restart's clock is not this one.
                    slot.load_started = None;
                    slot.measured = measured.or(slot.measured);
                    slot.info = info;
                    // A process grows once it reads (buffers, caches): what it holds then is
                    // what the next load must be ready to hold too.
                    let overhead = measured.map(|m| m.saturating_sub(slot.estimated_bytes));
                    if let Some(o) = overhead {
                        inner.overhead = inner.overhead.max(o);
                    }
                }
                // A pinned model whose checkpoint left its directory goes like any other.
                if slot.pinned && !slot.removed {
                    // Its supervisor restarts it; while no process runs it holds nothing.
                    slot.measured = measured;
                    continue;
                }
                let reason = if matches!(status, SidecarStatus::Down { .. }) {
                    Some(Reason::Died)
                } else if slot.in_flight > 0 {
                    None
                } else if slot.removed {
                    Some(Reason::Removed)
                } else if slot.expires.is_some_and(|e| e <= now) {
                    Some(Reason::Ttl)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    if reason == Reason::Died {
                        // Gone already: its share is free now, not after the stop below.
                        slot.measured = Some(0);
                    }
                    slot.phase = Phase::Unloading {
                        sidecar: sidecar.clone(),
                        reason,
                    };
                    to_stop.push((name, sidecar, reason));
                }
            }
        }
        for (name, sidecar, reason) in to_stop {
            tokio::spawn(self.clone().stop(name, sidecar, reason));
        }
        let due = self
            .lock()
            .last_scan
            .is_none_or(|t| t.elapsed() >= RESCAN_EVERY);
        if due {
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.rescan(true)).await;
        }
    }
}
