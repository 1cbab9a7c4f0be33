//! The candidate version beside the active one (docs/decision-records.md), as the registry keeps
//! it: loading it from
//! `NAME.candidate.wasm` or a deployment, removing it, promoting it to active and rolling back
//! (both persisted when the policies come from a directory), and routing each request to the
//! version that decides it (shadow, canary).

use super::files::{copy_if_exists, copy_or_remove, remove_if_exists, rename};
use super::*;

impl Registry {
    /// Loads `NAME.candidate.wasm` (with `NAME.candidate.toml`, else the active version's
    /// config) if it changed, or forgets the candidate when its file is gone. A refused
    /// candidate is logged and recorded; the active version is never affected.
    pub(super) async fn sync_candidate(&self, dir: &Path, name: &str, active_toml: Option<String>) {
        let wasm = match tokio::fs::read(dir.join(Stage::Candidate.file(name, "wasm"))).await {
            Ok(w) => w,
            Err(_) => {
                let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
                if let Some(e) = entries.get_mut(name) {
                    if e.candidate.take().is_some() {
                        tracing::info!(policy = name, "candidate removed");
                    }
                    e.candidate_config_hash = None;
                }
                return;
            }
        };
        let toml_text = tokio::fs::read_to_string(dir.join(Stage::Candidate.file(name, "toml")))
            .await
            .ok()
            .or(active_toml);
        if let Err(e) = self.install_candidate(name, wasm, toml_text).await {
            tracing::warn!(policy = name, error = %e, "candidate refused");
        }
    }

    /// Builds and sets the candidate unless it is the one loaded. `Some` when swapped.
    async fn install_candidate(
        &self,
        name: &str,
        wasm: Vec<u8>,
        toml_text: Option<String>,
    ) -> Result<Option<Arc<LoadedPolicy>>, RegistryError> {
        if self.get(name).is_none() {
            return Err(RegistryError::Conflict(format!(
                "policy `{name}` has no active version to run a candidate beside"
            )));
        }
        let Some((_, config_hash)) =
            self.changed(name, Stage::Candidate, &wasm, toml_text.as_deref())
        else {
            return Ok(None);
        };
        let config = toml_text
            .as_deref()
            .map(PolicyConfig::parse)
            .transpose()?
            .unwrap_or_default();
        let policy = Arc::new(self.build(name, wasm, config).await?);
        tracing::info!(
            policy = name,
            version = policy.version,
            mode = policy.rollout.mode.as_str(),
            "candidate loaded"
        );
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get_mut(name) {
            e.candidate = Some(policy.clone());
            e.candidate_config_hash = config_hash;
        }
        Ok(Some(policy))
    }

    /// Deploys a candidate over the API (written to `NAME.candidate.wasm` with a directory).
    pub async fn deploy_candidate(
        &self,
        name: &str,
        wasm: Vec<u8>,
        toml_text: Option<String>,
    ) -> Result<Arc<LoadedPolicy>, RegistryError> {
        let _guard = self.change(name).await?;
        if self.get(name).is_none() {
            return Err(RegistryError::Conflict(format!(
                "policy `{name}` has no active version to run a candidate beside"
            )));
        }
        if let Some(dir) = &self.dir {
            self.validate_and_write(dir, Stage::Candidate, name, &wasm, toml_text.as_deref())
                .await?;
        }
        // A new candidate starts a new comparison.
        self.rollouts.reset(name);
        match self.install_candidate(name, wasm, toml_text).await? {
            Some(p) => Ok(p),
            None => self
                .candidate(name)
                .ok_or_else(|| RegistryError::NotFound(name.to_string())),
        }
    }

    pub fn candidate(&self, name: &str) -> Option<Arc<LoadedPolicy>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries.get(name).and_then(|e| e.candidate.clone())
    }

    /// Stops running the candidate and deletes its files.
    pub async fn remove_candidate(&self, name: &str) -> Result<(), RegistryError> {
        self.local_change(name)?;
        let _guard = self.reload_lock.lock().await;
        let existed = {
            let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
            entries
                .get_mut(name)
                .and_then(|e| {
                    e.candidate_config_hash = None;
                    e.candidate.take()
                })
                .is_some()
        };
        if let Some(dir) = &self.dir {
            remove_if_exists(&dir.join(Stage::Candidate.file(name, "wasm"))).await?;
            remove_if_exists(&dir.join(Stage::Candidate.file(name, "toml"))).await?;
        }
        self.rollouts.reset(name);
        if existed {
            Ok(())
        } else {
            Err(RegistryError::NotFound(format!("{name} (candidate)")))
        }
    }

    /// The candidate becomes the active version and the active one the previous (what a
    /// rollback restores). Files first, in an order where a crash between two steps leaves a
    /// directory that loads as either the old or the new state; then one swap in memory.
    pub async fn promote(&self, name: &str) -> Result<Arc<LoadedPolicy>, RegistryError> {
        self.local_change(name)?;
        let _guard = self.reload_lock.lock().await;
        let (candidate, current) = {
            let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
            let e = entries
                .get(name)
                .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            let candidate = e.candidate.clone().ok_or_else(|| {
                RegistryError::Conflict(format!("policy `{name}` has no candidate to promote"))
            })?;
            (candidate, e.current.clone())
        };
        if let Some(dir) = &self.dir {
            let file = |stage: Stage, ext: &str| dir.join(stage.file(name, ext));
            // 1. Keep the active version as the previous one.
            copy_if_exists(&file(Stage::Active, "wasm"), &file(Stage::Previous, "wasm")).await?;
            copy_or_remove(&file(Stage::Active, "toml"), &file(Stage::Previous, "toml")).await?;
            // 2. The candidate's config (if it has its own), then its component, replace the
            //    active ones; each rename is atomic.
            if tokio::fs::metadata(file(Stage::Candidate, "toml"))
                .await
                .is_ok()
            {
                rename(
                    &file(Stage::Candidate, "toml"),
                    &file(Stage::Active, "toml"),
                )
                .await?;
            }
            rename(
                &file(Stage::Candidate, "wasm"),
                &file(Stage::Active, "wasm"),
            )
            .await?;
        }
        {
            let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
            let e = entries.entry(name.to_string()).or_default();
            e.previous = current;
            e.current = Some(candidate.clone());
            e.config_hash = e.candidate_config_hash.take();
            e.candidate = None;
        }
        // The directory now holds exactly what serves: let the next reload see no change.
        if let Some(dir) = &self.dir {
            let toml = tokio::fs::read_to_string(dir.join(Stage::Active.file(name, "toml")))
                .await
                .ok();
            let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = entries.get_mut(name) {
                e.config_hash = toml
                    .as_deref()
                    .map(|t| crate::policy::invoke::content_hash(t.as_bytes()));
            }
        }
        self.rollouts.reset(name);
        tracing::info!(
            policy = name,
            version = candidate.version,
            "candidate promoted"
        );
        Ok(candidate)
    }

    /// The previous version becomes the active one again; the demoted version is dropped.
    pub async fn rollback(&self, name: &str) -> Result<Arc<LoadedPolicy>, RegistryError> {
        self.local_change(name)?;
        let _guard = self.reload_lock.lock().await;
        let mut previous = {
            let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
            let e = entries
                .get(name)
                .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            e.previous.clone()
        };
        let mut previous_toml = None;
        if let Some(dir) = &self.dir {
            let file = |stage: Stage, ext: &str| dir.join(stage.file(name, ext));
            let wasm = tokio::fs::read(file(Stage::Previous, "wasm")).await.ok();
            previous_toml = tokio::fs::read_to_string(file(Stage::Previous, "toml"))
                .await
                .ok();
            let in_memory = previous.is_some();
            match (in_memory, wasm) {
                (_, None) => previous = None,
                // After a restart the previous version is only on disk.
                (false, Some(wasm)) => {
                    let config = previous_toml
                        .as_deref()
                        .map(PolicyConfig::parse)
                        .transpose()?
                        .unwrap_or_default();
                    previous = Some(Arc::new(self.build(name, wasm, config).await?));
                }
                (true, Some(_)) => {}
            }
            if previous.is_some() {
                match &previous_toml {
                    Some(_) => {
                        rename(&file(Stage::Previous, "toml"), &file(Stage::Active, "toml")).await?
                    }
                    None => remove_if_exists(&file(Stage::Active, "toml")).await?,
                }
                rename(&file(Stage::Previous, "wasm"), &file(Stage::Active, "wasm")).await?;
            }
        }
        let previous = previous.ok_or_else(|| {
            RegistryError::Conflict(format!(
                "policy `{name}` has no previous version to restore"
            ))
        })?;
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let e = entries.entry(name.to_string()).or_default();
        e.current = Some(previous.clone());
        e.previous = None;
        e.config_hash = previous_toml
            .as_deref()
            .map(|t| crate::policy::invoke::content_hash(t.as_bytes()));
        drop(entries);
        self.rollouts.reset(name);
        tracing::info!(policy = name, version = previous.version, "rolled back");
        Ok(previous)
    }

    /// Which version decides this request: the active one, or in canary mode the candidate for
    /// its share of route keys; in shadow mode (when sampled) the candidate runs after.
    pub fn route(&self, name: &str, input: &Value, route_key: Option<&str>) -> Option<Route> {
        use crate::policy::rollout::RolloutMode;
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let e = entries.get(name)?;
        let active = e.current.clone()?;
        let plain = Route {
            decider: active.clone(),
            stage: Stage::Active,
            shadow: None,
            canary: false,
        };
        let Some(candidate) = e.candidate.clone() else {
            return Some(plain);
        };
        let rollout = &candidate.rollout;
        Some(match rollout.mode {
            RolloutMode::Off => plain,
            RolloutMode::Shadow => Route {
                shadow: rollout.shadow_takes().then_some(candidate.clone()),
                ..plain
            },
            RolloutMode::Canary => {
                let key = rollout.route_key(input, route_key);
                if rollout.canary_takes(key.as_deref()) {
                    Route {
                        decider: candidate.clone(),
                        stage: Stage::Candidate,
                        shadow: None,
                        canary: true,
                    }
                } else {
                    Route {
                        canary: true,
                        ..plain
                    }
                }
            }
        })
    }
}
