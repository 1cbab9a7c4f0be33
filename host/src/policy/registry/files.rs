//! A policy's files on disk: written whole or not at all (a temporary file renamed over the
//! old one), copied, renamed and removed, each failure a `LoadError` naming the path.

use std::path::Path;

use crate::policy::invoke::LoadError;

/// Write to a temporary sibling, then rename: the watcher never sees a half-written file.
pub(super) async fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    tokio::fs::write(&tmp, bytes)
        .await
        .map_err(|e| LoadError::Io(format!("cannot write {}: {e}", tmp.display())))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| LoadError::Io(format!("cannot rename to {}: {e}", path.display())))
}

pub(super) async fn rename(from: &Path, to: &Path) -> Result<(), LoadError> {
    tokio::fs::rename(from, to).await.map_err(|e| {
        LoadError::Io(format!(
            "cannot rename {} to {}: {e}",
            from.display(),
            to.display()
        ))
    })
}

/// Copies `from` to `to` through a temporary (atomic for readers of `to`).
pub(super) async fn copy_if_exists(from: &Path, to: &Path) -> Result<(), LoadError> {
    match tokio::fs::read(from).await {
        Ok(bytes) => write_atomically(to, &bytes).await,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoadError::Io(format!(
            "cannot read {}: {e}",
            from.display()
        ))),
    }
}

/// `to` becomes a copy of `from`, or is removed when `from` does not exist.
pub(super) async fn copy_or_remove(from: &Path, to: &Path) -> Result<(), LoadError> {
    if tokio::fs::metadata(from).await.is_ok() {
        copy_if_exists(from, to).await
    } else {
        remove_if_exists(to).await
    }
}

pub(super) async fn remove_if_exists(path: &Path) -> Result<(), LoadError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoadError::Io(format!(
            "cannot remove {}: {e}",
            path.display()
        ))),
    }
}
