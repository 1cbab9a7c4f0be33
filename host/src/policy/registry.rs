//! The policy registry: the versions being served, by name, loaded from a directory
//! (`NAME.wasm` + optional `NAME.toml`) or deployed over the API.
//!
//! Semantics:
//! - A version is compiled, linked, described and its schemas checked *before* it is swapped in,
//!   on a blocking thread (never on a request's path).
//! - The swap replaces an `Arc` under a short write lock: requests that already hold the old
//!   `Arc` finish on it, later ones get the new one; there is never a moment with no version.
//! - A file that fails to load is refused with a logged reason recorded as the policy's last
//!   reload status, and the previous version keeps serving.
//! - Versions are content hashes, so touching a file without changing it reloads nothing.

use crate::calibration::file::Calibrations;
use crate::policy::invoke::{Invocation, InvokeError, LoadError, LoadedPolicy, PolicyConfig};
use crate::policy::limits::Limits;
use crate::policy::readers::ReaderSource;
use crate::policy::rollout::RolloutStats;
use hunch_core::Reader;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;
use wasmtime::Engine;

mod bundle;
mod files;
mod stages;
mod summary;

pub use bundle::{SetError, StagedPolicy, Version};
use files::{remove_if_exists, write_atomically};
use summary::{describe, summary};
pub use summary::{CandidateSummary, PolicySummary};

/// The outcome of the last attempt to (re)load a policy.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadStatus {
    /// Unix milliseconds.
    pub at_ms: u64,
    pub ok: bool,
    /// The version that attempt produced (or refused).
    pub version: Option<String>,
    pub error: Option<String>,
}

/// The outcome of one load attempt, for the reload status.
enum Attempt {
    /// The version now serving, and the hash of the config it was loaded with.
    Loaded(Arc<LoadedPolicy>, Option<String>),
    /// Why it was refused, and the version (hash) refused when known.
    Refused(String, Option<String>),
}

#[derive(Default)]
struct Entry {
    current: Option<Arc<LoadedPolicy>>,
    /// Hash of the `.toml` the current version was loaded with, to notice config-only changes.
    config_hash: Option<String>,
    last_reload: Option<ReloadStatus>,
    /// A version running beside the current one (`NAME.candidate.wasm`, or deployed with
    /// `?stage=candidate`), in shadow or canary as its `[rollout]` says.
    candidate: Option<Arc<LoadedPolicy>>,
    candidate_config_hash: Option<String>,
    /// The version a promotion replaced: what a rollback restores.
    previous: Option<Arc<LoadedPolicy>>,
}

/// A stage's files: `NAME.wasm`, `NAME.candidate.wasm`, `NAME.previous.wasm` (and `.toml`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Active,
    Candidate,
    Previous,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Active => "active",
            Stage::Candidate => "candidate",
            Stage::Previous => "previous",
        }
    }

    fn file(self, name: &str, ext: &str) -> String {
        match self {
            Stage::Active => format!("{name}.{ext}"),
            Stage::Candidate => format!("{name}.candidate.{ext}"),
            Stage::Previous => format!("{name}.previous.{ext}"),
        }
    }

    /// The policy name and stage of a file stem (`x`, `x.candidate`, `x.previous`).
    pub fn of_stem(stem: &str) -> Option<(&str, Stage)> {
        let (name, stage) = match stem.rsplit_once('.') {
            None => (stem, Stage::Active),
            Some((n, "candidate")) => (n, Stage::Candidate),
            Some((n, "previous")) => (n, Stage::Previous),
            Some(_) => return None,
        };
        valid_name(name).then_some((name, stage))
    }
}

/// What running a version gave: its outcome, the model its reads went to, and the calibration
/// they were calibrated with (a decision's event records it beside the reads).
#[derive(Debug)]
pub struct VersionRun {
    pub outcome: Result<Invocation, InvokeError>,
    pub model: Option<String>,
    pub calibration: Option<Arc<Calibrations>>,
}

/// Which version decides a request, and which (if any) shadows it.
#[derive(Debug, Clone)]
pub struct Route {
    pub decider: Arc<LoadedPolicy>,
    pub stage: Stage,
    pub shadow: Option<Arc<LoadedPolicy>>,
    /// Whether a candidate in canary mode took part in the routing (counted per stage).
    pub canary: bool,
}

/// Why a deployment or removal was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid policy name `{0}`: use 1-64 of a-z, 0-9, '-', '_', starting with a letter or digit")]
    InvalidName(String),
    #[error("no policy named `{0}`")]
    NotFound(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A stage change that the policy's current stages do not allow.
    #[error("{0}")]
    Conflict(String),
    /// A change of one policy while a bundle owns the set (`--bundle-url`).
    #[error("policy `{0}` cannot be changed here: a policy bundle owns this server's policies (publish a new bundle revision instead)")]
    BundleOwned(String),
}

pub struct Registry {
    engine: Engine,
    dir: Option<PathBuf>,
    ceiling: Limits,
    readers: Arc<dyn ReaderSource>,
    entries: RwLock<BTreeMap<String, Entry>>,
    /// Invocations wait here rather than fail when every pool slot is in use.
    slots: Semaphore,
    /// Shadow runs take these, never a live slot; when none is free the shadow run is
    /// skipped (counted), so a candidate can never make a live decision wait.
    shadow_slots: Arc<Semaphore>,
    /// One reload at a time: two events for one file must not race their swaps.
    reload_lock: tokio::sync::Mutex<()>,
    /// Shadow agreement and canary routing counts, per policy.
    rollouts: Arc<RolloutStats>,
    /// A bundle owns the set: only [`Registry::replace_all`] changes it.
    bundle_owned: bool,
}

/// Who a policy run is for: a live decision waits for one of the live slots; a shadow run holds
/// one of its own, taken before it was scheduled ([`Registry::shadow_slot`]).
#[derive(Debug)]
pub enum Admission {
    Live,
    Shadow(ShadowSlot),
}

/// A shadow run's instance slot, given back when dropped.
#[derive(Debug)]
pub struct ShadowSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// How the instance pool is shared out (`max_concurrent` = the engine's pool size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Live invocations at once.
    pub live: usize,
    /// Shadow runs at once.
    pub shadow: usize,
}

impl Capacity {
    /// One instance stays free for `describe` during reloads; shadow runs get up to a quarter
    /// of the rest (at most `shadow_max`), live decisions the remainder.
    pub fn split(pool: u32, shadow_max: usize) -> Capacity {
        let usable = (pool as usize).saturating_sub(1).max(1);
        let shadow = shadow_max.min(usable / 4);
        Capacity {
            live: (usable - shadow).max(1),
            shadow,
        }
    }
}

/// `[a-z0-9][a-z0-9_-]{0,63}`: a file stem and a URL segment, never a path.
pub fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// `max_concurrent` must not exceed the engine's pool size.
    pub fn new(
        engine: Engine,
        dir: Option<PathBuf>,
        ceiling: Limits,
        readers: Arc<dyn ReaderSource>,
        capacity: Capacity,
    ) -> Arc<Registry> {
        Self::with_owner(engine, dir, ceiling, readers, capacity, false)
    }

    /// A registry whose policy set a bundle owns: no directory, and every change of a single
    /// policy refused ([`RegistryError::BundleOwned`]); the set changes with
    /// [`Registry::replace_all`].
    pub fn bundle_owned(
        engine: Engine,
        ceiling: Limits,
        readers: Arc<dyn ReaderSource>,
        capacity: Capacity,
    ) -> Arc<Registry> {
        Self::with_owner(engine, None, ceiling, readers, capacity, true)
    }

    fn with_owner(
        engine: Engine,
        dir: Option<PathBuf>,
        ceiling: Limits,
        readers: Arc<dyn ReaderSource>,
        capacity: Capacity,
        bundle_owned: bool,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            engine,
            dir,
            ceiling,
            readers,
            entries: RwLock::new(BTreeMap::new()),
            slots: Semaphore::new(capacity.live.max(1)),
            shadow_slots: Arc::new(Semaphore::new(capacity.shadow)),
            reload_lock: tokio::sync::Mutex::new(()),
            rollouts: Arc::default(),
            bundle_owned,
        })
    }

    /// A slot for one more shadow run, or `None` when every shadow slot is taken (the run is then
    /// skipped, never queued: a queue of shadow runs would grow without bound while live
    /// decisions keep the CPU).
    pub fn shadow_slot(&self) -> Option<ShadowSlot> {
        let permit = self.shadow_slots.clone().try_acquire_owned().ok()?;
        Some(ShadowSlot { _permit: permit })
    }

    /// Shadow agreement and canary routing counts (reset when a candidate comes or goes).
    pub fn rollouts(&self) -> &Arc<RolloutStats> {
        &self.rollouts
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn get(&self, name: &str) -> Option<Arc<LoadedPolicy>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries.get(name).and_then(|e| e.current.clone())
    }

    pub fn summaries(&self) -> Vec<PolicySummary> {
        let server = self.readers.calibration();
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .map(|(name, e)| summary(name, e, server.as_deref()))
            .collect()
    }

    pub fn summary(&self, name: &str) -> Option<PolicySummary> {
        let server = self.readers.calibration();
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries
            .get(name)
            .map(|e| summary(name, e, server.as_deref()))
    }

    /// Every loaded active and candidate version, by policy name.
    pub fn versions(&self) -> Vec<(String, Arc<LoadedPolicy>)> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .flat_map(|(name, e)| {
                e.current
                    .iter()
                    .chain(&e.candidate)
                    .map(move |p| (name.clone(), p.clone()))
            })
            .collect()
    }

    /// What `GET /v1/policies/NAME?stage=…` shows: the summary with the version of `stage`
    /// described (its schemas, limits, declared version), or `None` when the policy has no
    /// version at that stage.
    pub fn summary_of(&self, name: &str, stage: Stage) -> Option<PolicySummary> {
        let server = self.readers.calibration();
        let server = server.as_deref();
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let e = entries.get(name)?;
        match stage {
            Stage::Active => Some(summary(name, e, server)),
            Stage::Candidate => e
                .candidate
                .as_ref()
                .map(|v| describe(summary(name, e, server), v, server)),
            Stage::Previous => e
                .previous
                .as_ref()
                .map(|v| describe(summary(name, e, server), v, server)),
        }
    }

    /// Runs the current version of `name` on `input` as a live decision.
    pub async fn invoke(&self, name: &str, input: &Value) -> Result<Invocation, InvokeError> {
        let policy = self
            .get(name)
            .ok_or_else(|| InvokeError::NotFound(name.to_string()))?;
        self.invoke_version(&policy, input, Admission::Live, |r| r)
            .await
            .outcome
    }

    /// The one way the server runs a policy version: a slot for `admission`, the reader the
    /// version reads with passed through `wrap` (a decision's recording reader), the server's
    /// answer settings (question mode, answer cache) and the calibration the version reads with.
    pub async fn invoke_version(
        &self,
        policy: &LoadedPolicy,
        input: &Value,
        admission: Admission,
        wrap: impl FnOnce(Arc<dyn Reader>) -> Arc<dyn Reader>,
    ) -> VersionRun {
        // A live run waits for a live slot; a shadow run already holds its own (in `admission`,
        // alive until this function returns).
        let _live_slot = match &admission {
            Admission::Live => match self.slots.acquire().await {
                Ok(permit) => Some(permit),
                Err(_) => {
                    return VersionRun {
                        outcome: Err(InvokeError::Busy),
                        model: None,
                        calibration: None,
                    }
                }
            },
            Admission::Shadow(_) => None,
        };
        let reader = match &admission {
            Admission::Live => self.readers.reader(policy.reader.as_deref()),
            Admission::Shadow(_) => self.readers.shadow_reader(policy.reader.as_deref()),
        };
        let model = reader.as_ref().map(|r| r.model_name().to_string());
        let answering = self.readers.answering();
        // Taken once: a calibration reloaded meanwhile applies from the next decision on.
        let calibration = policy.calibration.reads_with(self.readers.calibration());
        VersionRun {
            outcome: policy
                .invoke(reader.map(wrap), answering, calibration.clone(), input)
                .await,
            model,
            calibration,
        }
    }

    /// Compiles and describes a version off the async workers.
    async fn build(
        &self,
        name: &str,
        wasm: Vec<u8>,
        config: PolicyConfig,
    ) -> Result<LoadedPolicy, LoadError> {
        let engine = self.engine.clone();
        let ceiling = self.ceiling;
        // A calibration file the config names is relative to the policy directory.
        let config = match &self.dir {
            Some(dir) => config.relative_to(dir),
            None => config,
        };
        let name = name.to_string();
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            LoadedPolicy::load(&engine, &name, &wasm, config, &ceiling, &handle)
        })
        .await
        .map_err(|e| LoadError::Io(format!("the loader panicked: {e}")))?
    }

    fn record(&self, name: &str, result: Attempt) {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let entry = entries.entry(name.to_string()).or_default();
        let now = unix_ms(SystemTime::now());
        match result {
            Attempt::Loaded(policy, config_hash) => {
                entry.last_reload = Some(ReloadStatus {
                    at_ms: now,
                    ok: true,
                    version: Some(policy.version.clone()),
                    error: None,
                });
                entry.current = Some(policy);
                entry.config_hash = config_hash;
            }
            Attempt::Refused(error, version) => {
                entry.last_reload = Some(ReloadStatus {
                    at_ms: now,
                    ok: false,
                    version,
                    error: Some(error),
                });
            }
        }
    }

    /// Loads `name` from the directory if its content changed; returns whether a new version is
    /// now serving. A refusal is logged and recorded; the old version keeps serving.
    pub async fn reload_from_disk(&self, name: &str) -> Result<bool, RegistryError> {
        if !valid_name(name) {
            return Err(RegistryError::InvalidName(name.to_string()));
        }
        let Some(dir) = &self.dir else {
            return Ok(false);
        };
        let _guard = self.reload_lock.lock().await;
        let wasm_path = dir.join(format!("{name}.wasm"));
        let toml_path = dir.join(format!("{name}.toml"));
        let wasm = match tokio::fs::read(&wasm_path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The file is gone: stop serving it.
                let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
                if entries.remove(name).is_some() {
                    tracing::info!(policy = name, "policy file removed; no longer served");
                }
                return Ok(false);
            }
            Err(e) => {
                let error = LoadError::Io(format!("cannot read {}: {e}", wasm_path.display()));
                self.record(name, Attempt::Refused(error.to_string(), None));
                return Err(error.into());
            }
        };
        let toml_text = match tokio::fs::read_to_string(&toml_path).await {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                let error = LoadError::Io(format!("cannot read {}: {e}", toml_path.display()));
                self.record(name, Attempt::Refused(error.to_string(), None));
                return Err(error.into());
            }
        };
        let changed = self.install(name, wasm, toml_text.clone()).await?.is_some();
        self.sync_candidate(dir, name, toml_text).await;
        Ok(changed)
    }

    /// Builds `wasm` with its configuration, then writes both as `stage`'s files in `dir` (without
    /// a configuration, its file is removed). Validating before touching the directory means a
    /// bad upload never replaces a good file.
    async fn validate_and_write(
        &self,
        dir: &Path,
        stage: Stage,
        name: &str,
        wasm: &[u8],
        toml_text: Option<&str>,
    ) -> Result<(), RegistryError> {
        let config = toml_text
            .map(PolicyConfig::parse)
            .transpose()?
            .unwrap_or_default();
        self.build(name, wasm.to_vec(), config).await?;
        write_atomically(&dir.join(stage.file(name, "wasm")), wasm).await?;
        let toml_path = dir.join(stage.file(name, "toml"));
        match toml_text {
            Some(t) => write_atomically(&toml_path, t.as_bytes()).await?,
            None => remove_if_exists(&toml_path).await?,
        }
        Ok(())
    }

    /// Runs the live reader for `policy` (what a shadow candidate falls back to).
    pub fn reader_for(&self, policy: &LoadedPolicy) -> Option<Arc<dyn Reader>> {
        self.readers.reader(policy.reader.as_deref())
    }

    /// The version and config hash of `wasm` with `toml_text`; `None` when `stage` of `name`
    /// holds exactly them already (installing them again would change nothing).
    fn changed(
        &self,
        name: &str,
        stage: Stage,
        wasm: &[u8],
        toml_text: Option<&str>,
    ) -> Option<(String, Option<String>)> {
        let (version, config_hash) = hashes(wasm, toml_text);
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let held = entries.get(name).and_then(|e| match stage {
            Stage::Active => Some((e.current.as_ref()?, &e.config_hash)),
            Stage::Candidate => Some((e.candidate.as_ref()?, &e.candidate_config_hash)),
            Stage::Previous => None,
        });
        match held {
            // A version whose calibration file changed on disk is rebuilt though its own files
            // did not change.
            Some((policy, hash))
                if policy.version == version
                    && *hash == config_hash
                    && !policy.calibration.is_stale() =>
            {
                None
            }
            _ => Some((version, config_hash)),
        }
    }

    /// Builds and swaps in a version unless it is the one serving. `Some(policy)` when swapped.
    async fn install(
        &self,
        name: &str,
        wasm: Vec<u8>,
        toml_text: Option<String>,
    ) -> Result<Option<Arc<LoadedPolicy>>, RegistryError> {
        let Some((version, config_hash)) =
            self.changed(name, Stage::Active, &wasm, toml_text.as_deref())
        else {
            return Ok(None);
        };
        let config = match toml_text.as_deref().map(PolicyConfig::parse).transpose() {
            Ok(c) => c.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(policy = name, version, error = %e, "policy refused");
                self.record(name, Attempt::Refused(e.to_string(), Some(version)));
                return Err(e.into());
            }
        };
        let started = std::time::Instant::now();
        match self.build(name, wasm, config).await {
            Ok(policy) => {
                let policy = Arc::new(policy);
                tracing::info!(
                    policy = name,
                    version = policy.version,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "policy version serving"
                );
                self.record(name, Attempt::Loaded(policy.clone(), config_hash));
                Ok(Some(policy))
            }
            Err(e) => {
                tracing::warn!(policy = name, version, error = %e, "policy refused; the previous version keeps serving");
                self.record(name, Attempt::Refused(e.to_string(), Some(version)));
                Err(e.into())
            }
        }
    }

    /// Loads every `*.wasm` of the directory (startup and rescans).
    pub async fn scan(&self) -> Vec<(String, Result<bool, RegistryError>)> {
        let Some(dir) = self.dir.clone() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        if let Ok(mut rd) = tokio::fs::read_dir(&dir).await {
            while let Ok(Some(entry)) = rd.next_entry().await {
                let path = entry.path();
                if path.extension().and_then(|e| e.to_str()) == Some("wasm") {
                    if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                        names.push(stem.to_string());
                    }
                }
            }
        }
        names.sort();
        let mut results = Vec::new();
        for name in names {
            let Some((policy, stage)) = Stage::of_stem(&name) else {
                tracing::warn!(file = name, "ignoring a policy file with an invalid name");
                continue;
            };
            if stage != Stage::Active {
                // Loaded with the active version of the same name.
                continue;
            }
            let name = policy.to_string();
            let r = self.reload_from_disk(&name).await;
            results.push((name, r));
        }
        results
    }

    /// The lock every change of a policy's versions holds, once `name` is known to be valid.
    async fn change(&self, name: &str) -> Result<tokio::sync::MutexGuard<'_, ()>, RegistryError> {
        self.local_change(name)?;
        if !valid_name(name) {
            return Err(RegistryError::InvalidName(name.to_string()));
        }
        Ok(self.reload_lock.lock().await)
    }

    /// Deploys a version over the API: validated first, then written to the directory (so it
    /// survives a restart; the watcher then sees an unchanged hash) and swapped in.
    pub async fn deploy(
        &self,
        name: &str,
        wasm: Vec<u8>,
        toml_text: Option<String>,
    ) -> Result<Arc<LoadedPolicy>, RegistryError> {
        let _guard = self.change(name).await?;
        if let Some(dir) = &self.dir {
            self.validate_and_write(dir, Stage::Active, name, &wasm, toml_text.as_deref())
                .await?;
        }
        match self.install(name, wasm, toml_text).await? {
            Some(p) => Ok(p),
            None => self
                .get(name)
                .ok_or_else(|| RegistryError::NotFound(name.to_string())),
        }
    }

    /// Stops serving `name` and deletes its files.
    pub async fn remove(&self, name: &str) -> Result<(), RegistryError> {
        let _guard = self.change(name).await?;
        let existed = {
            let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
            entries.remove(name).is_some()
        };
        if let Some(dir) = &self.dir {
            for stage in [Stage::Active, Stage::Candidate, Stage::Previous] {
                remove_if_exists(&dir.join(stage.file(name, "wasm"))).await?;
                remove_if_exists(&dir.join(stage.file(name, "toml"))).await?;
            }
        }
        self.rollouts.reset(name);
        if existed {
            Ok(())
        } else {
            Err(RegistryError::NotFound(name.to_string()))
        }
    }
}

/// A version's content hash and its config's: together, what makes a reload a change.
fn hashes(wasm: &[u8], toml_text: Option<&str>) -> (String, Option<String>) {
    use crate::policy::invoke::content_hash;
    (
        content_hash(wasm),
        toml_text.map(|t| content_hash(t.as_bytes())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_file_stems_never_paths() {
        assert!(valid_name("invoice-vat"));
        assert!(valid_name("a_1"));
        assert!(!valid_name(""));
        assert!(!valid_name("../etc"));
        assert!(!valid_name("A"));
        assert!(!valid_name("-x"));
        assert!(!valid_name(&"a".repeat(65)));
    }
}
