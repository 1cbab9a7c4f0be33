//! Quality reports: what `scripts/quality.sh` measured of a model (docs/quality.md), kept where
//! the server finds them, and found again for the very model it serves.
//!
//! The script stores each report as `DIR/KEY/MEASURED_AT.json`: DIR the quality directory
//! ([`default_dir`], or `--quality-dir` / `HUNCH_QUALITY_DIR`), KEY the [`key`] of the model's
//! fingerprint (`x_fingerprint` in `GET /v1/models`: its checkpoint's digest, kernels and read),
//! and never overwrites one. [`QualityReports::latest`] returns the newest report whose stored
//! fingerprint equals the model's current one: the folder's name only says where to look, the
//! fingerprint inside decides, so a report never describes another file (a re-quantised or
//! replaced checkpoint has another fingerprint and starts with none).
//!
//! A leaf of the host: it imports no other module of it (docs/architecture.md).

pub mod report;

pub use report::{BadReport, Estimate, Figures, Reference, Report};

use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The variable naming the quality directory (the script reads it too).
pub const QUALITY_DIR_ENV: &str = "HUNCH_QUALITY_DIR";

/// What makes a report, as a 404 without one says.
pub const MEASURE_COMMAND: &str = "scripts/quality.sh --url URL --model NAME";

/// The quality directory when none is configured: `quality/` beside the models cache
/// (`$HOME/.cache/hunch/quality` by default), the rule `scripts/quality_store.py` `quality_dir`
/// follows too.
pub fn default_dir(models_cache: Option<&Path>) -> Option<PathBuf> {
    let cache = models_cache?;
    Some(match cache.parent() {
        Some(parent) => parent.join("quality"),
        None => cache.join("quality"),
    })
}

/// The folder a fingerprint's reports are kept in: the first 32 hex digits of the SHA-256 of
/// its UTF-8 bytes (`scripts/quality_store.py` `report_key`; both test suites check the same
/// pairs). A hash, not the fingerprint itself, because a fingerprint holds `/` and may be long.
pub fn key(fingerprint: &str) -> String {
    let digest = Sha256::digest(fingerprint.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The reports of one quality directory.
#[derive(Debug)]
pub struct QualityReports {
    dir: PathBuf,
    /// Bad files already warned about (path and modification time), so a page viewed every
    /// few seconds does not repeat the same warning; a file changed since is judged again.
    warned: Mutex<HashSet<(PathBuf, Option<SystemTime>)>>,
}

impl QualityReports {
    pub fn new(dir: PathBuf) -> QualityReports {
        QualityReports {
            dir,
            warned: Mutex::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the reports of `fingerprint` are looked for.
    pub fn folder(&self, fingerprint: &str) -> PathBuf {
        self.dir.join(key(fingerprint))
    }

    /// The newest report of `fingerprint` (by its `measured_at`, then its file name), if any.
    /// Never fails: a missing folder has no reports, and a file that is no report, or the
    /// report of another fingerprint, is skipped with a warning in the log. Blocking (it reads
    /// files).
    pub fn latest(&self, fingerprint: &str) -> Option<Report> {
        let folder = self.folder(fingerprint);
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.warn_once(&folder, &format!("cannot list the quality reports: {e}"));
                return None;
            }
        };
        let mut newest: Option<Report> = None;
        for entry in entries.flatten() {
            let path = entry.path();
            if !is_report_name(&path) {
                continue;
            }
            let report = match report::read(&path) {
                Ok(report) => report,
                Err(e) => {
                    self.warn_once(&path, &format!("skipped: {e}"));
                    continue;
                }
            };
            if report.figures.fingerprint != fingerprint {
                self.warn_once(
                    &path,
                    &format!(
                        "skipped: it describes fingerprint {:?}, not {fingerprint:?} (the file \
                         was put in another model's folder)",
                        report.figures.fingerprint
                    ),
                );
                continue;
            }
            let newer = newest
                .as_ref()
                .is_none_or(|n| (&report.when, &report.file) > (&n.when, &n.file));
            if newer {
                newest = Some(report);
            }
        }
        newest
    }

    fn warn_once(&self, path: &Path, what: &str) {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let first = self
            .warned
            .lock()
            .map(|mut warned| warned.insert((path.to_path_buf(), modified)))
            .unwrap_or(true);
        if first {
            tracing::warn!(file = %path.display(), "quality report {what}");
        }
    }
}

/// `*.json`, not hidden: the script writes a `.tmp-…` file first and links it into place.
fn is_report_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.starts_with('.') && name.ends_with(".json") && path.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The same pairs are in scripts/test_quality_store.py: the script and the server must
    /// agree on where a fingerprint's reports are.
    #[test]
    fn the_key_is_the_one_the_script_computes() {
        assert_eq!(
            key("5e1f0c2a9b7d4e38/llama-gguf-as-stored/mlx-cpu/openblas/float32/avx2/logits-v1/chunk64/prompt4096"),
            "78fa2605bffd82dfbe717329e1f3c069"
        );
        assert_eq!(key("modèle/ü"), "5d9df56997802c70cd6cae42513bbbde");
    }

    #[test]
    fn the_default_directory_is_beside_the_models_cache() {
        assert_eq!(
            default_dir(Some(Path::new("/home/u/.cache/hunch/models"))),
            Some(PathBuf::from("/home/u/.cache/hunch/quality"))
        );
        assert_eq!(
            default_dir(Some(Path::new("/models"))),
            Some(PathBuf::from("/quality"))
        );
        assert_eq!(default_dir(None), None);
    }

    fn write(dir: &Path, fingerprint: &str, name: &str, measured_at: &str, score: f64) {
        let folder = dir.join(key(fingerprint));
        std::fs::create_dir_all(&folder).unwrap();
        let doc = json!({"model": "m", "fingerprint": fingerprint, "measured_at": measured_at,
                         "command": "scripts/quality.sh", "score": {"value": score}});
        std::fs::write(folder.join(name), doc.to_string()).unwrap();
    }

    fn score(r: &Report) -> Option<f64> {
        r.figures.score.as_ref().and_then(|s| s.value)
    }

    #[test]
    fn the_newest_report_wins_by_its_time_not_its_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let reports = QualityReports::new(dir.path().to_path_buf());
        assert!(reports.latest("fp").is_none(), "no folder, no report");
        write(dir.path(), "fp", "b.json", "2026-12-01T00:00:00Z", 0.1);
        write(dir.path(), "fp", "a.json", "2026-12-07T00:00:00Z", 0.7);
        write(dir.path(), "fp", "c.json", "2026-12-03T00:00:00Z", 0.3);
        let latest = reports.latest("fp").expect("a report");
        assert_eq!(score(&latest), Some(0.7));
        assert!(latest.file.ends_with("a.json"));
        // Another model's reports are in another folder.
        assert!(reports.latest("other").is_none());
    }

    #[test]
    fn a_report_of_another_fingerprint_is_never_shown_even_in_the_right_folder() {
        let dir = tempfile::tempdir().unwrap();
        let reports = QualityReports::new(dir.path().to_path_buf());
        write(dir.path(), "fp", "old.json", "2026-12-01T00:00:00Z", 0.2);
        // Copied by hand into fp's folder: newer, but it describes another file.
        let doc = json!({"model": "m", "fingerprint": "fp-requantised",
                         "measured_at": "2026-12-09T00:00:00Z", "command": "c"});
        std::fs::write(reports.folder("fp").join("new.json"), doc.to_string()).unwrap();
        assert_eq!(
            score(&reports.latest("fp").expect("the old one")),
            Some(0.2)
        );
        assert!(reports.latest("fp-requantised").is_none());
    }

    #[test]
    fn bad_files_are_skipped_and_the_good_one_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let reports = QualityReports::new(dir.path().to_path_buf());
        write(dir.path(), "fp", "good.json", "2026-12-01T00:00:00Z", 0.4);
        let folder = reports.folder("fp");
        std::fs::write(folder.join("broken.json"), "{\"model\": ").unwrap();
        std::fs::write(folder.join("partial.json"), "{\"model\": \"m\"}").unwrap();
        std::fs::write(folder.join("list.json"), "[1, 2]").unwrap();
        std::fs::create_dir(folder.join("dir.json")).unwrap();
        // Hidden (the script's temporary file) and other names are not looked at.
        write(dir.path(), "fp", ".tmp-x.json", "2026-12-09T00:00:00Z", 0.9);
        write(dir.path(), "fp", "notes.txt", "2026-12-09T00:00:00Z", 0.9);
        for _ in 0..2 {
            assert_eq!(score(&reports.latest("fp").expect("good")), Some(0.4));
        }
        // Each bad file is warned about once.
        assert_eq!(reports.warned.lock().unwrap().len(), 3);
    }
}
