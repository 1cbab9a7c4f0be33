//! The model manager (docs/models.md): every model a sidecar of this server serves, under one
//! memory budget. It is the one owner of those sidecars: which run, which load next, which go.
//!
//! - A `--model` is *pinned*: loaded at start, never evicted, restarted by its supervisor when
//!   it dies, exactly as before models were managed.
//! - A model found under a `--models-dir` is *available* until a read asks for it. Its first
//!   read starts its sidecar (one sidecar however many reads ask at once: the slot turns
//!   `loading` under the lock, and every other read waits for it), after evicting idle models
//!   until its size fits (`models::eviction::choose`, decided before the load starts, so memory is
//!   never over-committed while a model loads). It unloads after its idle TTL, after a read that
//!   sent `x_keep_alive: 0`, on `POST /v1/models/NAME/unload`, or when evicted; a read in flight
//!   always finishes first (the slot turns `unloading` and new reads wait for a reload).
//!
//! The lock guards bookkeeping only and is never held across an await: a load, a stop or a
//! read of one model never waits on another model's.
//!
//! Where each part lives: this file holds the bookkeeping (slots, phases, rescans, unloads);
//! `lease.rs` the way a read gets its model (the load-or-wait decision, [`LeaseError`],
//! [`ManagedReader`]); `lifecycle.rs` what moves on its own (loads, stops, the clock);
//! `view.rs` what is shown ([`ModelsView`], the snapshot the API and the console read, and
//! `/metrics`).

mod lease;
mod lifecycle;
mod settings;
pub mod view;

use super::models::discovery;
use super::models::load_eta::LoadPace;
use super::models::settings::ModelSettings;
use super::sidecar::{Sidecar, SidecarConfig, SidecarStatus};
use hunch_core::{Reader, ReaderInfo};
pub use lease::{Lease, LeaseError, ManagedReader};
pub use settings::{SettingsApplied, SettingsError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;
pub use view::{ModelState, ModelView, ModelsView};

/// How often idle TTLs, dead sidecars and measured sizes are looked at.
const TICK: Duration = Duration::from_millis(250);
/// How often the models directories are rescanned by the clock (a listing and a miss rescan
/// too, at most once per [`RESCAN_AT_MOST`]).
const RESCAN_EVERY: Duration = Duration::from_secs(10);
const RESCAN_AT_MOST: Duration = Duration::from_secs(1);
/// A request for an unknown name rescans at most this often (a scan reads directories and
/// headers only, but a stream of 404s must not turn into a stream of scans).
const RESCAN_ON_MISS_AT_MOST: Duration = Duration::from_millis(200);
/// A load that has not become ready by then has failed.
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
const LOAD_POLL: Duration = Duration::from_millis(50);
/// A model whose load failed is not retried before this (every read would start a doomed
/// sidecar otherwise); reads meanwhile get 503 with the reason.
const FAILED_LOAD_COOLDOWN: Duration = Duration::from_secs(5);

/// What the manager is given.
#[derive(Debug, Clone)]
pub struct ManagerSettings {
    pub budget_bytes: u64,
    pub models_dirs: Vec<PathBuf>,
    /// Idle time after which a discovered model unloads.
    pub ttl: Duration,
    /// Longest a read waits for a load, or for room to load, before 503 + `Retry-After`.
    pub wait: Duration,
    pub binary: PathBuf,
    /// Arguments every sidecar gets after its own (`--sidecar-arg`, `--memory-limit`).
    pub extra_args: Vec<String>,
    pub read_timeout: Duration,
    /// Names served by something else (`--accelerator`, `--upstream`, aliases): a discovered
    /// model of the same name is skipped.
    pub reserved: Vec<String>,
    /// Arguments one pinned `--model`'s sidecar gets after everyone's (its `--chat-template`
    /// from `hunch serve --chat-template NAME=…`), by model name.
    pub model_args: std::collections::BTreeMap<String, Vec<String>>,
}

/// Why a model was unloaded (`hunch_model_evictions_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// To make room for another model.
    Budget,
    /// Idle past its TTL.
    Ttl,
    /// A read sent `x_keep_alive: 0`.
    KeepAlive,
    /// `POST /v1/models/NAME/unload`.
    Admin,
    /// Its checkpoint left the models directory.
    Removed,
    /// Its sidecar exited on its own.
    Died,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Budget => "budget",
            Reason::Ttl => "ttl",
            Reason::KeepAlive => "keep_alive",
            Reason::Admin => "admin",
            Reason::Removed => "removed",
            Reason::Died => "died",
        }
    }
}

#[derive(Debug, Clone)]
enum Phase {
    Available,
    /// Room being made, then the sidecar starting (`None` until it is spawned).
    Loading {
        sidecar: Option<Arc<Sidecar>>,
    },
    Loaded {
        sidecar: Arc<Sidecar>,
    },
    /// Reads in flight finish, then the process ends; new reads wait for a reload.
    Unloading {
        sidecar: Arc<Sidecar>,
        reason: Reason,
    },
    Failed {
        why: String,
        /// No load is tried before then.
        retry_at: Instant,
        /// The sidecar refused the checkpoint (its files or settings): reads get a 4xx until
        /// the next load is tried (after `retry_at`, with the settings of then).
        refused: bool,
    },
}

#[derive(Debug)]
struct Slot {
    path: PathBuf,
    estimated_bytes: u64,
    /// Never evicted, never unloaded by a TTL: a `--model`, or pinned by its settings.
    pinned: bool,
    /// A `--model`: its settings are its flags, not a settings file's.
    fixed: bool,
    /// Its settings file's table for it (`hunch-models.toml`), as last applied.
    settings: ModelSettings,
    /// Why its table in the settings file was not applied, if it was not.
    settings_error: Option<String>,
    phase: Phase,
    in_flight: usize,
    last_used: Option<(Instant, SystemTime)>,
    /// When an idle, loaded, unpinned model unloads.
    expires: Option<Instant>,
    /// `VmRSS` of its process, refreshed every tick while it runs.
    measured: Option<u64>,
    /// Its checkpoint is gone from the models directory: it unloads once idle, then is dropped.
    removed: bool,
    /// What the sidecar said of its model (limits, fingerprint) when it last ran.
    info: ReaderInfo,
    /// When its process last started, for the time its load has left.
    load_started: Option<Instant>,
}

impl Slot {
    fn new(path: PathBuf, estimated_bytes: u64, pinned: bool) -> Self {
        Slot {
            path,
            estimated_bytes,
            pinned,
            fixed: pinned,
            settings: ModelSettings::default(),
            settings_error: None,
            phase: Phase::Available,
            in_flight: 0,
            last_used: None,
            expires: None,
            measured: None,
            removed: false,
            info: ReaderInfo::default(),
            load_started: None,
        }
    }

    /// The bytes it holds against the budget now: nothing unless a sidecar runs or is about
    /// to; the estimate (plus the runtime's overhead) while it loads; once it runs, the larger of
    /// its measured size and that estimate. A process grows as it reads (buffers, caches), so
    /// the budget keeps room for what it will hold, not only for what it held when last measured;
    /// a process that measures larger than its estimate counts as measured.
    /// Idle time after which it unloads: its own TTL, else the server's.
    fn ttl(&self, default: Duration) -> Duration {
        self.settings.ttl.unwrap_or(default)
    }

    fn held(&self, overhead: u64) -> u64 {
        let expected = self.estimated_bytes + overhead;
        match self.phase {
            // A pinned model is about to run (before `start`): it counts from the beginning.
            Phase::Available | Phase::Failed { .. } if self.pinned => {
                self.estimated_bytes + overhead
            }
            Phase::Available | Phase::Failed { .. } => 0,
            // Its process is gone already: its share is free.
            Phase::Unloading {
                reason: Reason::Died,
                ..
            } => 0,
            Phase::Loading { .. } => expected,
            Phase::Loaded { .. } | Phase::Unloading { .. } => {
                self.measured.map_or(expected, |m| m.max(expected))
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    models: BTreeMap<String, Slot>,
    /// What a sidecar process holds beyond its checkpoint's tensors (the runtime, buffers): the
    /// most seen so far, learnt from measured sizes, added to every estimate.
    overhead: u64,
    skipped: Vec<discovery::Skipped>,
    /// How fast this server's loads have gone, for the time a load has left.
    pace: LoadPace,
    last_scan: Option<Instant>,
    /// The last rescan a request for an unknown name made.
    last_miss_scan: Option<Instant>,
}

/// Why `unload` did not unload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnloadError {
    #[error("unknown model {0:?}")]
    NotFound(String),
    #[error("model {0} is pinned (a --model): it stays loaded while the server runs")]
    Pinned(String),
    #[error("model {0} is loading; unload it once it has loaded")]
    Loading(String),
}

/// What `unload` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unloaded {
    /// It was not loaded.
    NotLoaded,
    /// Its process has ended.
    Stopped,
    /// Reads are in flight: it ends once they have finished.
    Draining,
}

#[derive(Debug)]
pub struct ModelManager {
    /// Itself, for the loads a rescan starts (a model pinned by its settings file).
    me: std::sync::Weak<ModelManager>,
    settings: ManagerSettings,
    inner: Mutex<Inner>,
    /// Woken on every change a waiting read may care about: a load done, a read done, an
    /// unload done.
    changed: Notify,
    counters: view::Counters,
    /// Whether [`ModelManager::start`] ran: a model pinned after that loads at once.
    started: std::sync::atomic::AtomicBool,
    /// Held while a settings file is read, changed, written and applied (a PUT), or read and
    /// applied (a rescan): two changes of one file never lose either, and a rescan never applies
    /// a table a PUT has just replaced.
    settings_file: Mutex<()>,
}

impl ModelManager {
    /// A manager with `pinned` models (name, checkpoint, estimated bytes) and what the models
    /// directories hold now. Nothing runs until [`ModelManager::start`].
    pub fn new(settings: ManagerSettings, pinned: Vec<(String, PathBuf, u64)>) -> Arc<Self> {
        let mut inner = Inner::default();
        for (name, path, estimated) in pinned {
            inner.models.insert(name, Slot::new(path, estimated, true));
        }
        let manager = Arc::new_cyclic(|me| ModelManager {
            me: me.clone(),
            settings,
            inner: Mutex::new(inner),
            changed: Notify::new(),
            counters: view::Counters::default(),
            started: Default::default(),
            settings_file: Mutex::new(()),
        });
        manager.rescan(true);
        manager
    }

    pub fn settings(&self) -> &ManagerSettings {
        &self.settings
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The bookkeeping stays consistent at every unlock, so a panic elsewhere never leaves it
        // half-written: keep serving with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the pinned models' sidecars and the clock (TTLs, dead sidecars, rescans).
    pub fn start(self: &Arc<Self>) {
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let pinned: Vec<String> = {
            let inner = self.lock();
            inner
                .models
                .iter()
                .filter(|(_, s)| s.pinned)
                .map(|(n, _)| n.clone())
                .collect()
        };
        for name in pinned {
            // A pinned model's supervisor restarts it when it dies, with backoff, as it always
            // has: its state is its sidecar's.
            if let Some(config) = self.sidecar_config(&name) {
                let sidecar = Sidecar::spawn(config);
                let mut inner = self.lock();
                if let Some(slot) = inner.models.get_mut(&name) {
                    slot.phase = Phase::Loaded { sidecar };
                    slot.load_started = Some(Instant::now());
                }
            }
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(manager) = weak.upgrade() else { break };
                manager.tick().await;
            }
        });
    }

    fn sidecar_config(&self, name: &str) -> Option<SidecarConfig> {
        let inner = self.lock();
        let slot = inner.models.get(name)?;
        Some(SidecarConfig {
            name: name.to_string(),
            model_path: slot.path.clone(),
            binary: self.settings.binary.clone(),
            // The model's own `--dtype` and sidecar arguments, after the server's.
            extra_args: {
                let mut args = slot.settings.sidecar_args(&self.settings.extra_args);
                args.extend(
                    self.settings
                        .model_args
                        .get(name)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                args
            },
            read_timeout: self.settings.read_timeout,
        })
    }

    /// Whether the manager serves `name` (a pinned or a discovered model); a name it does not
    /// know triggers a rescan first, so a model just copied in is found on its first request.
    pub fn contains(&self, name: &str) -> bool {
        if self.lock().models.contains_key(name) {
            return true;
        }
        // Timed apart from the other scans: a listing just before the checkpoint was copied in
        // must not hide it from the request that follows.
        {
            let mut inner = self.lock();
            if inner
                .last_miss_scan
                .is_some_and(|t| t.elapsed() < RESCAN_ON_MISS_AT_MOST)
            {
                return false;
            }
            inner.last_miss_scan = Some(Instant::now());
        }
        self.rescan_if_older(Duration::ZERO);
        self.lock().models.contains_key(name)
    }

    /// Whether `name` is one of its models (no rescan).
    pub fn manages(&self, name: &str) -> bool {
        self.lock().models.contains_key(name)
    }

    /// Every model's name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().models.keys().cloned().collect()
    }

    /// Looks at the models directories again (at most once a second unless `force`): new
    /// checkpoints become available, removed ones unload once idle and are dropped.
    pub fn rescan(&self, force: bool) {
        self.rescan_if_older(if force {
            Duration::ZERO
        } else {
            RESCAN_AT_MOST
        });
    }

    fn rescan_if_older(&self, age: Duration) {
        if self.settings.models_dirs.is_empty() {
            return;
        }
        {
            let mut inner = self.lock();
            if !age.is_zero() && inner.last_scan.is_some_and(|t| t.elapsed() < age) {
                return;
            }
            inner.last_scan = Some(Instant::now());
        }
        // The scan reads directories and headers, and the settings files: outside the lock. The
        // files are read and applied under `settings_file`, as a PUT writes and applies them, so
        // a rescan never applies a table a PUT has just replaced.
        let scan = discovery::scan(&self.settings.models_dirs);
        let settings_file = self.settings_file.lock().unwrap_or_else(|e| e.into_inner());
        let files = self.read_settings_files();
        let mut inner = self.lock();
        for skipped in &scan.skipped {
            if !inner.skipped.contains(skipped) {
                tracing::warn!(path = %skipped.path.display(), why = %skipped.why, "models dir: skipped");
            }
        }
        inner.skipped = scan.skipped;
        let mut found = Vec::new();
        for model in scan.models {
            if self.settings.reserved.contains(&model.name) {
                continue;
            }
            found.push(model.name.clone());
            match inner.models.get_mut(&model.name) {
                Some(slot) if slot.fixed => {}
                Some(slot) => {
                    slot.removed = false;
                    if matches!(slot.phase, Phase::Available | Phase::Failed { .. }) {
                        slot.path = model.path;
                        slot.estimated_bytes = model.estimated_bytes;
                    }
                }
                None => {
                    tracing::info!(model = %model.name, path = %model.path.display(), estimated_bytes = model.estimated_bytes, "models dir: found");
                    inner.models.insert(
                        model.name,
                        Slot::new(model.path, model.estimated_bytes, false),
                    );
                }
            }
        }
        inner.models.retain(|name, slot| {
            if slot.fixed || found.contains(name) {
                return true;
            }
            if matches!(slot.phase, Phase::Available | Phase::Failed { .. }) {
                tracing::info!(model = %name, "models dir: removed");
                return false;
            }
            // Loaded or loading: it unloads once idle (the clock), then goes.
            slot.removed = true;
            true
        });
        let newly_pinned = self.apply_settings_files(&mut inner, &files);
        drop(inner);
        drop(settings_file);
        self.load_pinned(newly_pinned);
    }

    /// A request's `x_keep_alive` for `name`, applied once its read is done: keep it loaded
    /// for `keep` from now, or unload it once idle when `keep` is zero. Pinned models stay.
    pub fn keep_alive(self: &Arc<Self>, name: &str, keep: Duration) {
        if keep.is_zero() {
            match self.unload_for(name, Reason::KeepAlive) {
                Ok(_) | Err(UnloadError::Pinned(_)) | Err(UnloadError::Loading(_)) => {}
                Err(UnloadError::NotFound(_)) => {}
            }
            return;
        }
        let mut inner = self.lock();
        if let Some(slot) = inner.models.get_mut(name) {
            if !slot.pinned && matches!(slot.phase, Phase::Loaded { .. }) {
                slot.expires = Some(Instant::now() + keep);
            }
        }
    }

    /// `POST /v1/models/NAME/unload`.
    pub fn unload(self: &Arc<Self>, name: &str) -> Result<Unloaded, UnloadError> {
        self.unload_for(name, Reason::Admin)
    }

    fn unload_for(self: &Arc<Self>, name: &str, reason: Reason) -> Result<Unloaded, UnloadError> {
        let mut inner = self.lock();
        let slot = inner
            .models
            .get_mut(name)
            .ok_or_else(|| UnloadError::NotFound(name.into()))?;
        if slot.pinned {
            return Err(UnloadError::Pinned(name.into()));
        }
        match &slot.phase {
            Phase::Available | Phase::Failed { .. } => Ok(Unloaded::NotLoaded),
            Phase::Loading { .. } => Err(UnloadError::Loading(name.into())),
            Phase::Unloading { .. } => Ok(Unloaded::Draining),
            Phase::Loaded { sidecar } => {
                let sidecar = sidecar.clone();
                slot.phase = Phase::Unloading {
                    sidecar: sidecar.clone(),
                    reason,
                };
                if slot.in_flight > 0 {
                    return Ok(Unloaded::Draining);
                }
                drop(inner);
                tokio::spawn(self.clone().stop(name.to_string(), sidecar, reason));
                Ok(Unloaded::Stopped)
            }
        }
    }

    /// Stops every sidecar (shutdown): reads in flight have had the grace period.
    pub async fn stop_all(&self) {
        let sidecars: Vec<Arc<Sidecar>> = {
            let mut inner = self.lock();
            inner
                .models
                .values_mut()
                .filter_map(|s| {
                    let sidecar = match &s.phase {
                        Phase::Loaded { sidecar } | Phase::Unloading { sidecar, .. } => {
                            Some(sidecar.clone())
                        }
                        Phase::Loading { sidecar } => sidecar.clone(),
                        _ => None,
                    };
                    s.phase = Phase::Available;
                    sidecar
                })
                .collect()
        };
        for sidecar in sidecars {
            sidecar.stop().await;
        }
    }

    /// Whether `name` is loaded and its sidecar ready.
    pub fn is_ready(&self, name: &str) -> bool {
        let inner = self.lock();
        matches!(
            inner.models.get(name).map(|s| &s.phase),
            Some(Phase::Loaded { sidecar }) if sidecar.status() == SidecarStatus::Ready
        )
    }

    /// What `name`'s sidecar said of its model when it last ran (unknown before its first load).
    pub fn info(&self, name: &str) -> ReaderInfo {
        let inner = self.lock();
        match inner.models.get(name) {
            Some(Slot {
                phase: Phase::Loaded { sidecar },
                ..
            }) => {
                let info = sidecar.info();
                if info == ReaderInfo::default() {
                    inner.models[name].info.clone()
                } else {
                    info
                }
            }
            Some(slot) => slot.info.clone(),
            None => ReaderInfo::default(),
        }
    }
}

#[cfg(test)]
mod tests;
