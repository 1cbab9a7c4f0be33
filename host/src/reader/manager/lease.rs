//! A read's hold on its model: [`ModelManager::lease`] decides, under the lock, whether the
//! model is there, loading, or must load (after evicting idle models, [`eviction::choose`]), and
//! waits, bounded, for a change; [`Lease`] keeps the model busy while a read runs; [`LeaseError`]
//! says why a read could not have it; [`ManagedReader`] is a managed model as a [`Reader`].

use super::{Inner, ModelManager, Phase, Reason, Slot, FAILED_LOAD_COOLDOWN};
use crate::reader::models::eviction;
use crate::reader::models::load_eta::{self, LoadPace};
use crate::reader::sidecar::{refused_read_error, Sidecar, SidecarStatus};
use hunch_core::{ReadError, ReadOutcome, ReadRequest, Reader, ReaderInfo};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Why a read could not have its model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseError {
    #[error("unknown model {0:?}")]
    NotFound(String),
    #[error(
        "model {model} needs {needed} bytes and can never fit the memory budget of {budget} bytes \
         ({pinned} bytes of it held by pinned models)"
    )]
    NeverFits {
        model: String,
        needed: u64,
        budget: u64,
        pinned: u64,
    },
    #[error(
        "model {model} needs {needed} bytes, and every model holding the rest of the memory \
         budget is busy; retry shortly"
    )]
    NoRoom { model: String, needed: u64 },
    #[error("model {model} is still loading ({percent:.0}%{})", time_left(.seconds_left))]
    StillLoading {
        model: String,
        percent: f64,
        /// What the load has left, when it can be told (`models::load_eta`).
        seconds_left: Option<f64>,
    },
    #[error("model {model} is being unloaded; it reloads once its reads have finished")]
    Unloading { model: String },
    #[error("model {model} failed to load: {why}")]
    Failed { model: String, why: String },
    /// Its load was refused: its files or settings must change (the sidecar's `refused`).
    #[error("model {model} was refused at load: {why}")]
    Refused { model: String, why: String },
}

impl LeaseError {
    /// The read error a reader reports: a model that can never fit is the request's own
    /// problem (a retry never helps); the rest are worth a retry.
    pub fn into_read_error(self) -> ReadError {
        let retry = match &self {
            LeaseError::NotFound(_) | LeaseError::NeverFits { .. } => {
                return ReadError::TooLarge {
                    message: self.to_string(),
                }
            }
            // Retry when the load should be done, within reason; 5 s when that is unknown.
            LeaseError::StillLoading { seconds_left, .. } => seconds_left
                .map(|s| Duration::from_secs_f64(s.ceil().clamp(1.0, 60.0)))
                .unwrap_or(Duration::from_secs(5)),
            LeaseError::Failed { .. } => FAILED_LOAD_COOLDOWN,
            LeaseError::Refused { model, why } => return refused_read_error(model, why),
            LeaseError::NoRoom { .. } | LeaseError::Unloading { .. } => Duration::from_secs(2),
        };
        ReadError::unavailable(self.to_string(), retry)
    }
}

/// A read's hold on a loaded model: while any exists, the model is busy (never evicted, never
/// unloaded by its TTL); dropping it records the use.
pub struct Lease {
    manager: Arc<ModelManager>,
    name: String,
    sidecar: Arc<Sidecar>,
}

impl Lease {
    pub async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        self.sidecar.read(request).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.manager.release(&self.name);
    }
}

/// What a step of [`ModelManager::lease`] found.
enum Step {
    Leased(Lease),
    /// Wait for a change; on timeout, this is the answer.
    Wait(LeaseError),
}

impl ModelManager {
    /// A hold on `name`, loading it first when it is not loaded (waiting at most the
    /// configured wait for the load, or for room).
    pub async fn lease(self: &Arc<Self>, name: &str) -> Result<Lease, LeaseError> {
        let deadline = tokio::time::Instant::now() + self.settings.wait;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.step(name)? {
                Step::Leased(lease) => return Ok(lease),
                Step::Wait(on_timeout) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        // A load's progress moves without waking anyone: say where it is now.
                        return Err(match on_timeout {
                            LeaseError::StillLoading { .. } => {
                                self.still_loading(name).unwrap_or(on_timeout)
                            }
                            other => other,
                        });
                    }
                }
            }
        }
    }

    /// Refuses at once a model that can never fit (the API answers 507 before reading).
    pub fn check_fits(&self, name: &str) -> Result<(), LeaseError> {
        let inner = self.lock();
        let slot = inner
            .models
            .get(name)
            .ok_or_else(|| LeaseError::NotFound(name.into()))?;
        if slot.pinned || !matches!(slot.phase, Phase::Available | Phase::Failed { .. }) {
            return Ok(());
        }
        let needed = slot.estimated_bytes + inner.overhead;
        let pinned = pinned_bytes(&inner);
        if needed > self.settings.budget_bytes.saturating_sub(pinned) {
            return Err(LeaseError::NeverFits {
                model: name.into(),
                needed,
                budget: self.settings.budget_bytes,
                pinned,
            });
        }
        Ok(())
    }

    fn step(self: &Arc<Self>, name: &str) -> Result<Step, LeaseError> {
        let mut inner = self.lock();
        let overhead = inner.overhead;
        let pace = inner.pace;
        let slot = inner
            .models
            .get_mut(name)
            .ok_or_else(|| LeaseError::NotFound(name.into()))?;
        match &slot.phase {
            Phase::Loaded { sidecar } => {
                slot.in_flight += 1;
                slot.last_used = Some((Instant::now(), SystemTime::now()));
                return Ok(Step::Leased(Lease {
                    manager: self.clone(),
                    name: name.into(),
                    sidecar: sidecar.clone(),
                }));
            }
            Phase::Loading { .. } => {
                let (progress, seconds_left) = loading(slot, &pace);
                return Ok(Step::Wait(LeaseError::StillLoading {
                    model: name.into(),
                    percent: progress * 100.0,
                    seconds_left,
                }));
            }
            Phase::Unloading { .. } => {
                return Ok(Step::Wait(LeaseError::Unloading { model: name.into() }))
            }
            Phase::Failed {
                why,
                retry_at,
                refused,
            } if Instant::now() < *retry_at => {
                let (model, why) = (name.into(), why.clone());
                return Err(if *refused {
                    LeaseError::Refused { model, why }
                } else {
                    LeaseError::Failed { model, why }
                });
            }
            Phase::Available | Phase::Failed { .. } => {}
        }
        let needed = slot.estimated_bytes + overhead;
        // What runs is measured now, not as of the last tick: a process that has just read may
        // have grown since.
        for s in inner.models.values_mut() {
            if let Phase::Loaded { sidecar } | Phase::Unloading { sidecar, .. } = &s.phase {
                if let Some(m) = sidecar.resident_bytes() {
                    s.measured = Some(m);
                }
            }
        }
        let residents: Vec<eviction::Resident> = inner
            .models
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .filter_map(|(n, s)| {
                let bytes = s.held(overhead);
                (bytes > 0).then(|| eviction::Resident {
                    name: n.clone(),
                    bytes,
                    // A model never read since it loaded counts as used when it loaded.
                    last_used: s.last_used.map_or_else(Instant::now, |(t, _)| t),
                    pinned: s.pinned,
                    busy: s.in_flight > 0 || !matches!(s.phase, Phase::Loaded { .. }),
                })
            })
            .collect();
        match eviction::choose(&residents, needed, self.settings.budget_bytes) {
            eviction::Choice::Never {
                needed,
                budget,
                pinned,
            } => Err(LeaseError::NeverFits {
                model: name.into(),
                needed,
                budget,
                pinned,
            }),
            eviction::Choice::Busy { needed, .. } => Ok(Step::Wait(LeaseError::NoRoom {
                model: name.into(),
                needed,
            })),
            eviction::Choice::Evict(victims) => {
                let mut stopping = Vec::new();
                for victim in victims {
                    if let Some(v) = inner.models.get_mut(&victim) {
                        if let Phase::Loaded { sidecar } = &v.phase {
                            let sidecar = sidecar.clone();
                            tracing::info!(model = %victim, to_load = name, "evicting to make room");
                            v.phase = Phase::Unloading {
                                sidecar: sidecar.clone(),
                                reason: Reason::Budget,
                            };
                            stopping.push((victim, sidecar));
                        }
                    }
                }
                let seconds_left = inner.models.get_mut(name).and_then(|slot| {
                    slot.phase = Phase::Loading { sidecar: None };
                    // Its clock starts when its process does (`load`).
                    slot.load_started = None;
                    loading(slot, &pace).1
                });
                drop(inner);
                tokio::spawn(self.clone().load(name.to_string(), stopping));
                Ok(Step::Wait(LeaseError::StillLoading {
                    model: name.into(),
                    percent: 0.0,
                    seconds_left,
                }))
            }
        }
    }

    /// `POST /v1/models/NAME/load`: loads it (waiting as a read would) and holds nothing.
    pub async fn load_now(self: &Arc<Self>, name: &str) -> Result<(), LeaseError> {
        self.lease(name).await.map(drop)
    }

    /// The reader for `name`: every read holds a lease (and loads the model first if needed).
    pub fn reader(self: &Arc<Self>, name: &str) -> ManagedReader {
        ManagedReader {
            name: name.to_string(),
            manager: self.clone(),
        }
    }
}

fn pinned_bytes(inner: &Inner) -> u64 {
    inner
        .models
        .values()
        .filter(|s| s.pinned)
        .map(|s| s.held(inner.overhead))
        .sum()
}

impl ModelManager {
    /// `name`'s load as it stands now, if it is loading.
    fn still_loading(&self, name: &str) -> Option<LeaseError> {
        let inner = self.lock();
        let slot = inner.models.get(name)?;
        if !matches!(slot.phase, Phase::Loading { .. }) {
            return None;
        }
        let (progress, seconds_left) = loading(slot, &inner.pace);
        Some(LeaseError::StillLoading {
            model: name.into(),
            percent: progress * 100.0,
            seconds_left,
        })
    }
}

/// How far `slot`'s load is (0–1, as its sidecar reports it) and the seconds it has left
/// (`models::load_eta`), while it loads.
pub(super) fn loading(slot: &Slot, pace: &LoadPace) -> (f64, Option<f64>) {
    let sidecar = match &slot.phase {
        Phase::Loading { sidecar } => sidecar.as_deref(),
        Phase::Loaded { sidecar } => Some(sidecar.as_ref()),
        _ => None,
    };
    let progress = sidecar.map_or(0.0, progress);
    let elapsed = match (&slot.phase, slot.load_started) {
        (_, Some(started)) => started.elapsed(),
        // A loaded model loading again is a pinned one its supervisor restarted: when its new
        // process started is not known here.
        (Phase::Loaded { .. }, None) => return (progress, None),
        _ => Duration::ZERO,
    };
    let left = load_eta::seconds_left(progress, elapsed, slot.estimated_bytes, pace);
    (progress, left)
}

/// ", about 12 s left", or nothing when unknown.
fn time_left(seconds: &Option<f64>) -> String {
    seconds.map_or_else(String::new, |s| format!(", about {:.0} s left", s.ceil()))
}

/// How far `sidecar`'s load is, 0–1, as it reports it.
pub(super) fn progress(sidecar: &Sidecar) -> f64 {
    match sidecar.status() {
        SidecarStatus::Loading { progress, .. } => progress.clamp(0.0, 1.0),
        SidecarStatus::Ready => 1.0,
        _ => 0.0,
    }
}

/// A managed model as a [`Reader`]: each read leases the model (loading it first when needed)
/// for as long as it runs.
pub struct ManagedReader {
    name: String,
    manager: Arc<ModelManager>,
}

impl ManagedReader {
    pub fn manager(&self) -> &Arc<ModelManager> {
        &self.manager
    }
}

#[async_trait::async_trait]
impl Reader for ManagedReader {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let lease = self
            .manager
            .lease(&self.name)
            .await
            .map_err(LeaseError::into_read_error)?;
        lease.read(request).await
    }

    async fn ready(&self) -> bool {
        self.manager.is_ready(&self.name)
    }

    fn info(&self) -> ReaderInfo {
        self.manager.info(&self.name)
    }
}
