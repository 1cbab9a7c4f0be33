//! Keeping a replica on the published bundle: restore the persisted bundle at start, then poll
//! the bundle URL every `--bundle-poll` (±10 % jitter, so a fleet does not poll in step) with
//! `If-None-Match` when the server gave an `ETag`. A `304`, or a download whose bytes (sha256)
//! or revision equal the active bundle's, is a successful check that changes nothing. Anything
//! new is unpacked (bounded), verified, compiled whole and swapped in whole
//! ([`Registry::replace_all`]), then persisted. A bad bundle is refused and reported; the active
//! revision keeps serving. No failure of a poll, a panic included, stops the loop.

use super::error::{BundleError, Fault};
use super::format::{self, MAX_BUNDLE_BYTES};
use super::keys::{self, KeyError};
use super::status::BundleStatus;
use super::store::BundleStore;
use super::verify::{self, Trust, Verified};
use super::BundleSettings;
use crate::policy::Registry;
use std::sync::Arc;
use std::time::Duration;

/// The longest one download may take (a 64 MiB bundle over a slow link).
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why bundle polling cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("cannot build the bundle HTTP client: {0}")]
    Client(String),
}

/// What the replica serves from the bundle now.
#[derive(Debug, Default)]
struct Active {
    /// The `ETag` of the response that brought (or confirmed) the active bundle.
    etag: Option<String>,
    sha256: Option<String>,
    revision: Option<String>,
    created_at: Option<String>,
    created_at_ms: Option<i64>,
    /// The last bundle refused, by sha256, with why: the same bytes served again are refused
    /// again (and counted) without being unpacked and compiled again at every poll. Whatever
    /// refused them stays true: their content cannot change, and the active revision only
    /// grows newer.
    refused: Option<(String, BundleError)>,
}

/// Where a bundle offered for activation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The persisted copy: already on disk, not written again.
    Disk,
    Network,
}

/// What offering a bundle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    Unchanged,
    Activated(String),
}

pub struct BundleSync {
    registry: Arc<Registry>,
    status: Arc<BundleStatus>,
    trust: Trust,
    url: String,
    poll: Duration,
    store: Option<BundleStore>,
    client: reqwest::Client,
    active: tokio::sync::Mutex<Active>,
}

impl BundleSync {
    pub fn new(settings: &BundleSettings, registry: Arc<Registry>) -> Result<Self, StartError> {
        let trust = match &settings.public_key {
            Some(path) => Trust::Key(keys::read_public_key(path)?),
            None => Trust::Unsigned,
        };
        let client = reqwest::Client::builder()
            .timeout(DOWNLOAD_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| StartError::Client(e.to_string()))?;
        Ok(BundleSync {
            registry,
            status: Arc::new(BundleStatus::new(&settings.url, settings.stale_after)),
            trust,
            url: settings.url.clone(),
            poll: settings.poll,
            store: settings.dir.as_ref().map(BundleStore::new),
            client,
            active: tokio::sync::Mutex::default(),
        })
    }

    pub fn status(&self) -> &Arc<BundleStatus> {
        &self.status
    }

    /// Activates the persisted bundle, if there is one and it still verifies: called before the
    /// server listens and before the first poll, so a replica serves while the bundle server is
    /// down. Its failure is reported and leaves the set empty until a poll brings one.
    pub async fn restore(&self) {
        let Some(store) = &self.store else { return };
        let bytes = match store.load() {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return,
            Err(e) => {
                let error = BundleError::from(Fault::Persist(format!(
                    "cannot read {}: {e}",
                    store.path().display()
                )));
                tracing::warn!(error = %error, "persisted bundle not restored");
                self.status.failed(&error);
                return;
            }
        };
        match self.offer(bytes, None, Origin::Disk).await {
            Ok(_) => tracing::info!(
                path = %store.path().display(),
                revision = self.status.revision().unwrap_or_default(),
                "persisted bundle restored"
            ),
            Err(error) => {
                tracing::warn!(error = %error, "persisted bundle refused");
                self.status.failed(&error);
            }
        }
    }

    /// Polls for ever. Each poll runs as its own task, so even a panic inside one is a logged,
    /// counted failure and the next poll still comes.
    pub fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let this = self.clone();
                if let Err(e) = tokio::spawn(async move { this.poll_once().await }).await {
                    let error = BundleError::from(Fault::Download(format!("the poll failed: {e}")));
                    tracing::error!(error = %error, "bundle poll");
                    self.status.failed(&error);
                }
                tokio::time::sleep(jittered(self.poll)).await;
            }
        })
    }

    /// One check of the bundle server; the outcome is logged and reported in the status.
    pub async fn poll_once(&self) {
        match self.fetch_and_offer().await {
            Ok(Offered::Unchanged) => self.status.checked(),
            // The activation recorded the successful check itself (and a failure to persist
            // after it, which must stay visible).
            Ok(Offered::Activated(revision)) => {
                tracing::info!(revision, url = self.url, "bundle revision activated");
            }
            Err(error) => {
                tracing::warn!(error = %error, url = self.url, "bundle refused; the active revision keeps serving");
                self.status.failed(&error);
            }
        }
    }

    async fn fetch_and_offer(&self) -> Result<Offered, BundleError> {
        let etag = self.active.lock().await.etag.clone();
        let mut request = self.client.get(&self.url);
        if let Some(etag) = &etag {
            request = request.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        let download = |e: reqwest::Error| BundleError::from(Fault::Download(e.to_string()));
        let mut response = request.send().await.map_err(download)?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(Offered::Unchanged);
        }
        if !status.is_success() {
            return Err(Fault::Download(format!("{} answered {status}", self.url)).into());
        }
        let etag = response
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BUNDLE_BYTES)
        {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(download)? {
            if (bytes.len() + chunk.len()) as u64 > MAX_BUNDLE_BYTES {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        self.offer(bytes, etag, Origin::Network).await
    }

    /// Activates `bytes` unless they are the active bundle (same sha256, or the same revision);
    /// refuses a bundle that fails verification, is older than the active one, or does not
    /// compile whole.
    async fn offer(
        &self,
        bytes: Vec<u8>,
        etag: Option<String>,
        origin: Origin,
    ) -> Result<Offered, BundleError> {
        let mut active = self.active.lock().await;
        let sha256 = format::sha256_hex(&bytes);
        if active.sha256.as_deref() == Some(sha256.as_str()) {
            active.etag = etag;
            return Ok(Offered::Unchanged);
        }
        if let Some((refused, error)) = &active.refused {
            if *refused == sha256 {
                return Err(error.clone());
            }
        }
        let result = self
            .activate(&mut active, bytes, sha256.clone(), etag, origin)
            .await;
        if let Err(error) = &result {
            active.refused = Some((sha256, error.clone()));
        }
        result
    }

    /// [`BundleSync::offer`] for bytes that are not the active bundle.
    async fn activate(
        &self,
        active: &mut Active,
        bytes: Vec<u8>,
        sha256: String,
        etag: Option<String>,
        origin: Origin,
    ) -> Result<Offered, BundleError> {
        let trust = self.trust.clone();
        let (verified, bytes) = tokio::task::spawn_blocking(move || {
            let verified = format::unpack(&bytes).and_then(|u| verify::verify(u, &trust));
            (verified, bytes)
        })
        .await
        .map_err(|e| BundleError::from(Fault::Corrupt(format!("the unpacker failed: {e}"))))?;
        let verified = verified?;
        let revision = verified.revision().to_string();
        if active.revision.as_deref() == Some(revision.as_str()) {
            // The same revision packed again (a new created_at, the same files): unchanged.
            active.sha256 = Some(sha256);
            active.etag = etag;
            return Ok(Offered::Unchanged);
        }
        check_not_older(&verified, active)?;
        let names: Vec<String> = verified.policies.iter().map(|p| p.name.clone()).collect();
        let created_at = verified.manifest.created_at.clone();
        let created_at_ms = verified.created_at_ms;
        self.registry
            .replace_all(&revision, verified.policies)
            .await
            .map_err(|e| {
                BundleError::new(
                    Some(&revision),
                    Fault::Compile {
                        policy: e.policy,
                        stage: e.stage.as_str(),
                        message: e.error.to_string(),
                    },
                )
            })?;
        self.status
            .activated(&revision, names, origin == Origin::Network);
        *active = Active {
            etag,
            sha256: Some(sha256),
            revision: Some(revision.clone()),
            created_at: Some(created_at),
            created_at_ms: Some(created_at_ms),
            refused: None,
        };
        if origin == Origin::Network {
            if let Some(store) = self.store.clone() {
                let saved = tokio::task::spawn_blocking(move || store.save(&bytes)).await;
                let failure = match saved {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(e.to_string()),
                };
                if let Some(why) = failure {
                    // The revision serves; only a restart before the next good download would
                    // miss it. Reported, not fatal.
                    let error = BundleError::new(Some(&revision), Fault::Persist(why));
                    tracing::warn!(error = %error, "bundle not persisted");
                    self.status.failed(&error);
                }
            }
        }
        Ok(Offered::Activated(revision))
    }
}

fn too_large() -> BundleError {
    Fault::TooLarge {
        what: "download",
        limit: MAX_BUNDLE_BYTES,
    }
    .into()
}

/// A bundle created before the active one is a rollback nobody asked for (a stale cache or
/// mirror): refused. To go back, publish the old files as a new revision.
fn check_not_older(verified: &Verified, active: &Active) -> Result<(), BundleError> {
    match (active.created_at_ms, &active.revision, &active.created_at) {
        (Some(active_ms), Some(active_revision), Some(active_created_at))
            if verified.created_at_ms < active_ms =>
        {
            Err(BundleError::new(
                Some(verified.revision()),
                Fault::Older {
                    created_at: verified.manifest.created_at.clone(),
                    active: active_revision.clone(),
                    active_created_at: active_created_at.clone(),
                },
            ))
        }
        _ => Ok(()),
    }
}

/// `poll` ± 10 %.
fn jittered(poll: Duration) -> Duration {
    poll.mul_f64(0.9 + 0.2 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bundle::format::{manifest_of, pack, unpack, Manifest};
    use std::collections::BTreeMap;

    fn verified(revision: &str, created_at: &str) -> Verified {
        let files = BTreeMap::from([("a.wasm".to_string(), b"x".to_vec())]);
        let manifest: Manifest = manifest_of(&files, revision.into(), created_at.into());
        let bytes = pack(&serde_json::to_vec(&manifest).unwrap(), None, &files).unwrap();
        verify::verify(unpack(&bytes).unwrap(), &Trust::Unsigned).unwrap()
    }

    #[test]
    fn an_older_revision_is_refused_and_a_newer_or_equal_time_is_not() {
        let active = Active {
            revision: Some("r2".into()),
            created_at: Some("2026-12-01T12:00:00Z".into()),
            created_at_ms: format::parse_rfc3339_ms("2026-12-01T12:00:00Z"),
            ..Active::default()
        };
        let err =
            check_not_older(&verified("r1", "2026-12-01T11:59:59.999Z"), &active).unwrap_err();
        assert_eq!(err.reason().as_str(), "older");
        assert!(
            err.to_string()
                .starts_with("bundle r1: older than the active revision r2"),
            "{err}"
        );
        assert!(check_not_older(&verified("r3", "2026-12-01T12:00:00Z"), &active).is_ok());
        assert!(check_not_older(&verified("r3", "2026-12-01T13:00:00+01:00"), &active).is_ok());
        assert!(
            check_not_older(&verified("r1", "2000-01-01T00:00:00Z"), &Active::default()).is_ok()
        );
    }

    #[test]
    fn polls_are_jittered_within_ten_percent() {
        let poll = Duration::from_secs(10);
        for _ in 0..1000 {
            let d = jittered(poll);
            assert!(
                d >= Duration::from_secs(9) && d <= Duration::from_secs(11),
                "{d:?}"
            );
        }
    }
}
