//! A registry whose policy set a bundle owns (docs/deploy.md, "Policy bundles"): the whole set
//! is replaced in one step by [`Registry::replace_all`], every version of the new set compiled
//! and described before the swap, so a request sees all of one revision or all of the other.
//! Changes of single policies (HTTP deploys, removals, promotions, rollbacks) are refused: a
//! bundle server, not a replica, decides what a fleet serves.

use super::*;

/// One version's files: the component, its `NAME.toml`, and the bundle's calibration files
/// (by file name), of which the one `NAME.toml` names is this version's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub wasm: Vec<u8>,
    pub toml: Option<String>,
    pub calibrations: Arc<BTreeMap<String, Vec<u8>>>,
}

/// A policy of a set: its active version and, optionally, a candidate (shadow or canary as its
/// `[rollout]` says).
#[derive(Debug, Clone, PartialEq)]
pub struct StagedPolicy {
    pub name: String,
    pub active: Version,
    pub candidate: Option<Version>,
}

/// Why a set was refused: the first version that did not load. Nothing was swapped.
#[derive(Debug, thiserror::Error)]
#[error("policy {policy} ({}): {error}", stage.as_str())]
pub struct SetError {
    pub policy: String,
    pub stage: Stage,
    pub error: LoadError,
}

impl Registry {
    /// Refuses a change of one policy when a bundle owns the set.
    pub(super) fn local_change(&self, name: &str) -> Result<(), RegistryError> {
        if self.bundle_owned {
            return Err(RegistryError::BundleOwned(name.to_string()));
        }
        Ok(())
    }

    /// Whether a bundle owns the policy set.
    pub fn is_bundle_owned(&self) -> bool {
        self.bundle_owned
    }

    /// Builds every version of `set` (off the request path), then swaps the whole set in under
    /// one write lock: policies not in `set` stop being served. Each version records `label` as
    /// its bundle revision (decision events name it). On any refusal nothing changes.
    pub async fn replace_all(&self, label: &str, set: Vec<StagedPolicy>) -> Result<(), SetError> {
        let _guard = self.reload_lock.lock().await;
        let mut built = BTreeMap::new();
        for policy in set {
            let name = policy.name.clone();
            let fail = |stage: Stage| {
                let name = name.clone();
                move |error: LoadError| SetError {
                    policy: name,
                    stage,
                    error,
                }
            };
            if !valid_name(&name) {
                return Err(fail(Stage::Active)(LoadError::Config(format!(
                    "`{name}` is not a valid policy name"
                ))));
            }
            let active = self
                .build_version(&name, policy.active, label)
                .await
                .map_err(fail(Stage::Active))?;
            let candidate = match policy.candidate {
                Some(v) => Some(
                    self.build_version(&name, v, label)
                        .await
                        .map_err(fail(Stage::Candidate))?,
                ),
                None => None,
            };
            built.insert(name, (active, candidate));
        }
        let now = unix_ms(SystemTime::now());
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let mut fresh = BTreeMap::new();
        for (name, ((active, config_hash), candidate)) in built {
            let old_candidate = entries
                .get(&name)
                .and_then(|e| e.candidate.as_ref().map(|c| c.version.clone()));
            let new_candidate = candidate.as_ref().map(|(c, _)| c.version.clone());
            if old_candidate != new_candidate {
                // Another candidate (or none) starts another comparison.
                self.rollouts.reset(&name);
            }
            let (candidate, candidate_config_hash) = match candidate {
                Some((c, hash)) => (Some(c), hash),
                None => (None, None),
            };
            fresh.insert(
                name,
                Entry {
                    last_reload: Some(ReloadStatus {
                        at_ms: now,
                        ok: true,
                        version: Some(active.version.clone()),
                        error: None,
                    }),
                    current: Some(active),
                    config_hash,
                    candidate,
                    candidate_config_hash,
                    previous: None,
                },
            );
        }
        for gone in entries.keys().filter(|n| !fresh.contains_key(*n)) {
            self.rollouts.reset(gone);
        }
        *entries = fresh;
        drop(entries);
        tracing::info!(
            revision = label,
            policies = self.summaries().len(),
            "policy set replaced"
        );
        Ok(())
    }

    async fn build_version(
        &self,
        name: &str,
        version: Version,
        label: &str,
    ) -> Result<(Arc<LoadedPolicy>, Option<String>), LoadError> {
        let (_, config_hash) = hashes(&version.wasm, version.toml.as_deref());
        let mut config = version
            .toml
            .as_deref()
            .map(PolicyConfig::parse)
            .transpose()?
            .unwrap_or_default();
        // A bundled policy's calibration comes from the bundle, never from the replica's disk.
        let calibration = crate::policy::calibration::PolicyCalibration::from_bundle(
            config.calibration.take().as_ref(),
            &version.calibrations,
        )?;
        let mut policy = self.build(name, version.wasm, config).await?;
        policy.calibration = calibration;
        policy.bundle_revision = Some(label.to_string());
        Ok((Arc::new(policy), config_hash))
    }
}
