//! Policy bundles (docs/deploy.md, "Policy bundles"): a fleet's policy set published as one
//! signed file that every replica pulls, after OPA's bundle protocol.
//!
//! - [`format`]: the file (gzip tar, `.manifest`, `.signature`), packing and bounded unpacking.
//! - [`keys`]: ed25519 keys as OpenSSL-compatible PEM, signing and checking `.signature`.
//! - [`verify`]: every check before anything of a bundle runs, into the policies it holds.
//! - [`store`]: the last good bundle persisted on disk.
//! - [`poll`]: restore at start, poll with `ETag`s, activate a whole revision or nothing.
//! - [`status`]: what `/v1/status` and `/metrics` report.
//! - [`error`]: why a bundle was refused, and the reason it is counted under.

pub mod error;
pub mod format;
pub mod keys;
pub mod poll;
pub mod status;
pub mod store;
pub mod verify;

pub use error::{BundleError, Fault, Reason};
pub use poll::BundleSync;
pub use status::{BundleStatus, StatusReport};

use ed25519_dalek::SigningKey;
use std::path::PathBuf;
use std::time::Duration;

/// How `hunch serve` follows a bundle (`--bundle-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct BundleSettings {
    pub url: String,
    /// The key bundles must be signed with; `None` only with `allow_unsigned`.
    pub public_key: Option<PathBuf>,
    pub allow_unsigned: bool,
    pub poll: Duration,
    /// A replica whose last successful check is older than this reports itself stale.
    pub stale_after: Duration,
    /// Where the last good bundle is persisted; `None`: not persisted.
    pub dir: Option<PathBuf>,
}

pub const DEFAULT_POLL: Duration = Duration::from_secs(10);

/// A bundle made from a policy directory.
#[derive(Debug)]
pub struct Built {
    pub bytes: Vec<u8>,
    pub manifest: format::Manifest,
    /// Files of the directory that are not policy files, left out.
    pub skipped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot read the policy directory {dir}: {source}")]
    Read {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Layout(Fault),
    /// A version's `NAME.toml` that a server would refuse (it does not parse, or names a
    /// calibration file the bundle does not carry).
    #[error("{file}: {error}")]
    Config {
        file: String,
        error: crate::policy::invoke::LoadError,
    },
    #[error("cannot write the bundle: {0}")]
    Pack(std::io::Error),
}

/// Packs the policy files of `dir` (active versions, candidates and their TOML) with a manifest
/// (`revision`, else one derived from the content) and, with `key`, a signature. The files are
/// checked to form policies exactly as a server will check them.
pub fn build(
    dir: &std::path::Path,
    revision: Option<String>,
    key: Option<&SigningKey>,
) -> Result<Built, BuildError> {
    let (files, skipped) = format::read_policy_dir(dir).map_err(|source| BuildError::Read {
        dir: dir.to_path_buf(),
        source,
    })?;
    let revision = revision.unwrap_or_else(|| format::content_revision(&files));
    let created_at = hunch_core::date::rfc3339_ms(std::time::SystemTime::now());
    let manifest = format::manifest_of(&files, revision, created_at);
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| BuildError::Pack(std::io::Error::other(e)))?;
    let signature = key
        .map(|k| serde_json::to_vec_pretty(&keys::sign(k, &manifest_bytes)))
        .transpose()
        .map_err(|e| BuildError::Pack(std::io::Error::other(e)))?;
    let bytes =
        format::pack(&manifest_bytes, signature.as_deref(), &files).map_err(BuildError::Pack)?;
    // What a server would refuse is refused here, before anyone publishes it.
    let unpacked = format::unpack(&bytes).map_err(|e| BuildError::Layout(e.fault))?;
    let verified = verify::verify(unpacked, &verify::Trust::Unsigned)
        .map_err(|e| BuildError::Layout(e.fault))?;
    for policy in &verified.policies {
        let versions = [
            ("", Some(&policy.active)),
            (".candidate", policy.candidate.as_ref()),
        ];
        for (stage, version) in versions {
            let Some(version) = version else { continue };
            let Some(toml) = &version.toml else { continue };
            let config_error = |error| BuildError::Config {
                file: format!("{}{stage}.toml", policy.name),
                error,
            };
            let config = crate::policy::invoke::PolicyConfig::parse(toml).map_err(config_error)?;
            crate::policy::calibration::PolicyCalibration::from_bundle(
                config.calibration.as_ref(),
                &version.calibrations,
            )
            .map_err(|e| config_error(e.into()))?;
        }
    }
    Ok(Built {
        bytes,
        manifest,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_builds_into_a_bundle_that_verifies_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.wasm"), b"a").unwrap();
        std::fs::write(dir.path().join("a.candidate.wasm"), b"a2").unwrap();
        std::fs::write(dir.path().join("a.previous.wasm"), b"a0").unwrap();
        std::fs::write(dir.path().join("notes.md"), b"x").unwrap();
        let key = SigningKey::from_bytes(&[7; 32]);
        let built = build(dir.path(), None, Some(&key)).unwrap();
        assert_eq!(built.skipped, vec!["a.previous.wasm", "notes.md"]);
        let paths: Vec<_> = built
            .manifest
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(paths, vec!["a.candidate.wasm", "a.wasm"]);
        let again = build(dir.path(), None, None).unwrap();
        assert_eq!(
            again.manifest.revision, built.manifest.revision,
            "same files, same revision"
        );
        let v = verify::verify(
            format::unpack(&built.bytes).unwrap(),
            &verify::Trust::Key(key.verifying_key()),
        )
        .unwrap();
        assert!(v.signed);
        let named = build(dir.path(), Some("r7".into()), None).unwrap();
        assert_eq!(named.manifest.revision, "r7");
        std::fs::write(dir.path().join("b.candidate.wasm"), b"b2").unwrap();
        let err = build(dir.path(), None, None).unwrap_err();
        assert!(err.to_string().contains("no b.wasm beside it"), "{err}");
    }

    #[test]
    fn a_calibration_file_a_toml_names_must_be_in_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.wasm"), b"a").unwrap();
        std::fs::write(
            dir.path().join("a.toml"),
            "[calibration]\nfile = \"a.calibration.json\"\n",
        )
        .unwrap();
        let err = build(dir.path(), None, None).unwrap_err();
        assert!(
            err.to_string().contains("a.toml") && err.to_string().contains("not in the bundle"),
            "{err}"
        );
        let file = serde_json::json!({
            "format": crate::calibration::file::FORMAT, "folds": 5, "ece_bins": 10,
            "ece_binning": "", "min_labels": 30, "questions": []
        });
        std::fs::write(
            dir.path().join("a.calibration.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
        let built = build(dir.path(), None, None).unwrap();
        assert!(built
            .manifest
            .files
            .iter()
            .any(|f| f.path == "a.calibration.json"));
    }
}
