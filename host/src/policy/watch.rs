//! Hot reload: `notify` watches the policy directory; a debounced burst of events for
//! `NAME.wasm` or `NAME.toml`, or for a calibration file a loaded version's `NAME.toml` names,
//! reloads `NAME` (off the request path, see `Registry`).

use crate::policy::registry::{Registry, Stage};
use notify::RecursiveMode;
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Long enough to fold a copy's create + write + close into one event, short enough that a new
/// version serves well within a second.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// Keeps the watcher alive; dropping it stops watching.
pub struct PolicyWatcher {
    _debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot watch the policy directory: {0}")]
pub struct WatchError(String);

/// The policy name a changed path belongs to (`x.wasm`, `x.toml`; temporaries are ignored).
fn policy_name(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?;
    if ext != "wasm" && ext != "toml" {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    // `x.candidate.wasm` and `x.previous.wasm` belong to policy `x`.
    Stage::of_stem(stem).map(|(name, _)| name.to_string())
}

/// The policies with a loaded version (active or candidate) whose own calibration is the file at
/// `path` (docs/calibration.md: a policy's calibration reloads with the policy).
fn calibrated_by(registry: &Registry, path: &Path) -> Vec<String> {
    if path.extension().and_then(|e| e.to_str()) != Some("json") {
        return Vec::new();
    }
    registry
        .versions()
        .into_iter()
        .filter(|(_, p)| p.calibration.reads_file(path))
        .map(|(name, _)| name)
        .collect()
}

/// Starts watching the registry's directory. Must be called inside a tokio runtime.
pub fn watch(registry: Arc<Registry>) -> Result<PolicyWatcher, WatchError> {
    let dir = registry
        .dir()
        .ok_or_else(|| WatchError("no policy directory configured".into()))?
        .to_path_buf();
    let (tx, mut rx) = mpsc::unbounded_channel::<BTreeSet<String>>();
    let watched = registry.clone();
    let mut debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
        match result {
            Ok(events) => {
                let names: BTreeSet<String> = events
                    .iter()
                    .flat_map(|e| e.paths.iter())
                    .flat_map(|p| policy_name(p).into_iter().chain(calibrated_by(&watched, p)))
                    .collect();
                if !names.is_empty() {
                    // The receiver only goes away at shutdown; nothing to do then.
                    let _ = tx.send(names);
                }
            }
            Err(errors) => {
                for e in errors {
                    tracing::warn!(error = %e, "policy directory watch error");
                }
            }
        }
    })
    .map_err(|e| WatchError(e.to_string()))?;
    debouncer
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| WatchError(e.to_string()))?;
    let task = tokio::spawn(async move {
        while let Some(names) = rx.recv().await {
            for name in names {
                // Errors are logged and recorded as the policy's reload status by the registry.
                let _ = registry.reload_from_disk(&name).await;
            }
        }
    });
    Ok(PolicyWatcher {
        _debouncer: debouncer,
        _task: task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_policy_files_count() {
        assert_eq!(policy_name(Path::new("/p/a.wasm")), Some("a".into()));
        assert_eq!(policy_name(Path::new("/p/a.toml")), Some("a".into()));
        assert_eq!(policy_name(Path::new("/p/a.wasm.tmp")), None);
        assert_eq!(
            policy_name(Path::new("/p/a.candidate.wasm")),
            Some("a".into())
        );
        assert_eq!(
            policy_name(Path::new("/p/a.previous.toml")),
            Some("a".into())
        );
        assert_eq!(policy_name(Path::new("/p/a.other.wasm")), None);
        assert_eq!(policy_name(Path::new("/p/README.md")), None);
    }
}
