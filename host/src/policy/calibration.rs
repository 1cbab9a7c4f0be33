//! Which calibration a policy's reads are calibrated with (docs/calibration.md, "Policies").
//!
//! A policy's `NAME.toml` may name its own calibration file (`[calibration] file = "…"`, relative
//! to the policy directory) or turn calibration off (`calibration = "off"`); without either its
//! reads use the server's `--calibration`. The file is read when the version loads, so it is part
//! of the version: a change to it reloads the policy like a change to its `.wasm` or `.toml`
//! would, and an invocation finishes on the calibration it started with.

use crate::calibration::file::Calibrations;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a version's own calibration did not load (the file, and what is wrong with it). The
/// loader reports it as `LoadError::Calibration`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CalibrationError(pub String);

/// `NAME.toml`'s `calibration`: the word `"off"`, or a table naming a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawCalibration", into = "RawCalibration")]
pub enum CalibrationConfig {
    /// Raw probabilities, whatever the server serves.
    Off,
    /// This calibration file instead of the server's.
    File(PathBuf),
}

/// What TOML holds, before it is checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RawCalibration {
    Word(String),
    Table(BTreeMap<String, String>),
}

const EXPECTED: &str =
    "`calibration` is \"off\" or a table `[calibration]` with `file = \"PATH\"` (a calibration file \
     written by `hunch calibrate`, relative to the policy directory)";

impl TryFrom<RawCalibration> for CalibrationConfig {
    type Error = String;

    fn try_from(raw: RawCalibration) -> Result<Self, String> {
        match raw {
            RawCalibration::Word(w) if w == "off" => Ok(CalibrationConfig::Off),
            RawCalibration::Word(w) => Err(format!("{EXPECTED}; got {w:?}")),
            RawCalibration::Table(mut t) => {
                let file = t.remove("file").filter(|f| !f.is_empty());
                match (file, t.keys().next()) {
                    (Some(f), None) => Ok(CalibrationConfig::File(PathBuf::from(f))),
                    (_, Some(unknown)) => Err(format!("{EXPECTED}; unknown key `{unknown}`")),
                    (None, None) => Err(format!("{EXPECTED}; no `file`")),
                }
            }
        }
    }
}

impl From<CalibrationConfig> for RawCalibration {
    fn from(c: CalibrationConfig) -> Self {
        match c {
            CalibrationConfig::Off => RawCalibration::Word("off".into()),
            CalibrationConfig::File(f) => RawCalibration::Table(BTreeMap::from([(
                "file".to_string(),
                f.to_string_lossy().into_owned(),
            )])),
        }
    }
}

impl CalibrationConfig {
    /// A relative file made relative to `dir` (the policy directory, or the directory of the
    /// `NAME.toml` a command was given); an absolute one, or `off`, unchanged.
    pub fn relative_to(self, dir: &Path) -> CalibrationConfig {
        match self {
            CalibrationConfig::File(f) if f.is_relative() => CalibrationConfig::File(dir.join(f)),
            other => other,
        }
    }
}

/// A loaded version's calibration.
#[derive(Debug, Clone, Default)]
pub enum PolicyCalibration {
    /// No `calibration` in `NAME.toml`: the server's, whichever is served when a read starts.
    #[default]
    Server,
    /// `calibration = "off"`.
    Off,
    /// The policy's own file, as it was when this version loaded.
    File {
        path: PathBuf,
        calibrations: Arc<Calibrations>,
    },
    /// The policy's own file from the bundle that brought this version (docs/deploy.md,
    /// "Policy bundles"): verified with the bundle, never read from disk, so never stale.
    Bundled {
        file: String,
        calibrations: Arc<Calibrations>,
    },
}

impl PolicyCalibration {
    /// Reads the file `config` names (blocking: called while a version loads, off the async
    /// workers).
    pub fn load(config: Option<&CalibrationConfig>) -> Result<PolicyCalibration, CalibrationError> {
        match config {
            None => Ok(PolicyCalibration::Server),
            Some(CalibrationConfig::Off) => Ok(PolicyCalibration::Off),
            Some(CalibrationConfig::File(path)) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    CalibrationError(format!("cannot read {}: {e}", path.display()))
                })?;
                let calibrations = Calibrations::from_bytes(&bytes)
                    .map_err(|e| CalibrationError(format!("{}: {e}", path.display())))?;
                Ok(PolicyCalibration::File {
                    path: path.clone(),
                    calibrations: Arc::new(calibrations),
                })
            }
        }
    }

    /// What this version's reads are calibrated with, given the server's current calibration.
    pub fn reads_with(&self, server: Option<Arc<Calibrations>>) -> Option<Arc<Calibrations>> {
        match self {
            PolicyCalibration::Server => server,
            PolicyCalibration::Off => None,
            PolicyCalibration::File { calibrations, .. }
            | PolicyCalibration::Bundled { calibrations, .. } => Some(calibrations.clone()),
        }
    }

    /// The calibration file `config` names, taken from a bundle's `files` (by its bare file
    /// name) instead of the disk: a bundle carries everything its policies need, and a path
    /// outside it (absolute, or with a directory) is refused rather than read from the replica.
    pub fn from_bundle(
        config: Option<&CalibrationConfig>,
        files: &BTreeMap<String, Vec<u8>>,
    ) -> Result<PolicyCalibration, CalibrationError> {
        let path = match config {
            None => return Ok(PolicyCalibration::Server),
            Some(CalibrationConfig::Off) => return Ok(PolicyCalibration::Off),
            Some(CalibrationConfig::File(path)) => path,
        };
        let file = path
            .to_str()
            .filter(|f| path.components().count() == 1 && path.is_relative() && !f.is_empty())
            .ok_or_else(|| {
                CalibrationError(format!(
                    "{}: a bundled policy names its calibration file by a bare file name \
                     beside it in the bundle",
                    path.display()
                ))
            })?;
        let bytes = files
            .get(file)
            .ok_or_else(|| CalibrationError(format!("{file} is not in the bundle")))?;
        let calibrations = Calibrations::from_bytes(bytes)
            .map_err(|e| CalibrationError(format!("{file}: {e}")))?;
        Ok(PolicyCalibration::Bundled {
            file: file.to_string(),
            calibrations: Arc::new(calibrations),
        })
    }

    /// Whether the policy's own file no longer holds what was loaded (changed, removed or
    /// unreadable): the version must be reloaded, which refuses a broken file and keeps the
    /// loaded one serving.
    pub fn is_stale(&self) -> bool {
        match self {
            PolicyCalibration::File { path, calibrations } => std::fs::read(path)
                .map(|bytes| crate::calibration::file_id(&bytes) != calibrations.id)
                .unwrap_or(true),
            _ => false,
        }
    }

    /// Whether this is the policy's own file at `changed` (a path the directory watcher saw).
    pub fn reads_file(&self, changed: &Path) -> bool {
        let PolicyCalibration::File { path, .. } = self else {
            return false;
        };
        // The watcher reports paths under the directory as given, the config may name the file
        // through another spelling (`./x.json`, a symlinked directory): compare canonical paths
        // when both exist, else the paths themselves.
        match (path.canonicalize(), changed.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => path == changed,
        }
    }

    /// What `GET /v1/policies/NAME` says about it.
    pub fn active(&self, server: Option<&Calibrations>) -> ActiveCalibration {
        match self {
            PolicyCalibration::Server => ActiveCalibration {
                source: "server",
                id: server.map(|c| c.id.clone()),
                questions: server.map(Calibrations::len),
                file: None,
            },
            PolicyCalibration::Off => ActiveCalibration {
                source: "off",
                id: None,
                questions: None,
                file: None,
            },
            PolicyCalibration::File { path, calibrations } => ActiveCalibration {
                source: "policy",
                id: Some(calibrations.id.clone()),
                questions: Some(calibrations.len()),
                file: Some(path.clone()),
            },
            PolicyCalibration::Bundled { file, calibrations } => ActiveCalibration {
                source: "bundle",
                id: Some(calibrations.id.clone()),
                questions: Some(calibrations.len()),
                file: Some(PathBuf::from(file)),
            },
        }
    }
}

/// The calibration a version's reads are calibrated with now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActiveCalibration {
    /// `server` (the server's `--calibration`, if any), `policy` (its own file), `bundle` (its own
    /// file, from the bundle that brought it) or `off`.
    pub source: &'static str,
    /// The calibration's id (sha256 of the file); `null` when none applies.
    pub id: Option<String>,
    /// How many questions it covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub questions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyConfig;

    fn calibration_file(temperature: f64) -> Vec<u8> {
        let metrics =
            serde_json::json!({"nll": 0.0, "brier": 0.0, "ece": 0.0, "accuracy": 0.0, "bins": []});
        serde_json::to_vec(&serde_json::json!({
            "format": crate::calibration::file::FORMAT, "folds": 5, "ece_bins": 10,
            "ece_binning": "", "min_labels": 30,
            "questions": [{"key": "", "ids": ["urgent"],
                "question": {"instructions": "urgent?", "type": "noul"},
                "temperature": temperature, "labels": 0, "fold_temperatures": [],
                "before": metrics, "after": metrics}]
        }))
        .unwrap()
    }

    #[test]
    fn the_toml_says_off_or_names_a_file_and_nothing_else() {
        let c = PolicyConfig::parse("calibration = \"off\"").unwrap();
        assert_eq!(c.calibration, Some(CalibrationConfig::Off));
        let c = PolicyConfig::parse("[calibration]\nfile = \"p.calibration.json\"").unwrap();
        assert_eq!(
            c.calibration,
            Some(CalibrationConfig::File("p.calibration.json".into()))
        );
        // It writes back as it reads (deployments write NAME.toml from a config).
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PolicyConfig::parse(&text).unwrap(), c);
        for bad in [
            "calibration = \"on\"",
            "[calibration]\nfile = \"\"",
            "[calibration]\nfile = \"x\"\nid = \"y\"",
            "[calibration]\n",
        ] {
            let e = PolicyConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains("calibration"), "{bad}: {e}");
        }
        assert_eq!(PolicyConfig::parse("").unwrap().calibration, None);
    }

    #[test]
    fn relative_files_are_under_the_policy_directory() {
        let dir = Path::new("/srv/policies");
        assert_eq!(
            CalibrationConfig::File("a.json".into()).relative_to(dir),
            CalibrationConfig::File("/srv/policies/a.json".into())
        );
        assert_eq!(
            CalibrationConfig::File("/etc/a.json".into()).relative_to(dir),
            CalibrationConfig::File("/etc/a.json".into())
        );
        assert_eq!(
            CalibrationConfig::Off.relative_to(dir),
            CalibrationConfig::Off
        );
    }

    #[test]
    fn the_policy_file_overrides_the_server_and_off_turns_both_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("own.json");
        std::fs::write(&path, calibration_file(2.0)).unwrap();
        let server = Arc::new(Calibrations::from_bytes(&calibration_file(0.5)).unwrap());
        let own = PolicyCalibration::load(Some(&CalibrationConfig::File(path.clone()))).unwrap();
        let own_id = own.reads_with(Some(server.clone())).unwrap().id.clone();
        assert_ne!(own_id, server.id);
        assert_eq!(own.active(Some(&server)).id, Some(own_id.clone()));
        assert_eq!(own.active(Some(&server)).source, "policy");
        let inherit = PolicyCalibration::load(None).unwrap();
        assert_eq!(
            inherit.reads_with(Some(server.clone())).unwrap().id,
            server.id
        );
        assert!(inherit.reads_with(None).is_none());
        assert_eq!(inherit.active(None).id, None);
        let off = PolicyCalibration::load(Some(&CalibrationConfig::Off)).unwrap();
        assert!(off.reads_with(Some(server.clone())).is_none());
        assert_eq!(off.active(Some(&server)).source, "off");

        // Staleness follows the file's bytes; the watcher's path matches through `./`.
        assert!(!own.is_stale());
        assert!(own.reads_file(&dir.path().join(".").join("own.json")));
        assert!(!own.reads_file(&dir.path().join("other.json")));
        std::fs::write(&path, calibration_file(3.0)).unwrap();
        assert!(own.is_stale());
        std::fs::remove_file(&path).unwrap();
        assert!(own.is_stale());
        assert!(!inherit.is_stale() && !off.is_stale());
    }

    #[test]
    fn a_missing_or_broken_file_refuses_the_version_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("own.json");
        let e = PolicyCalibration::load(Some(&CalibrationConfig::File(path.clone())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("own.json"), "{e}");
        std::fs::write(&path, b"{}").unwrap();
        let e = PolicyCalibration::load(Some(&CalibrationConfig::File(path)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a calibration file"), "{e}");
    }
}
