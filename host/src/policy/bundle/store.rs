//! The last good bundle on disk (`--bundle-dir`), so a restarted replica serves it before it
//! reaches the bundle server, or while it cannot. Written to a temporary file, synced, then
//! renamed over the previous one: a crash leaves the old bundle or the new, never half of one.
//! What is read back is verified again like a download (the disk is not trusted more than the
//! network).

use std::io::Write;
use std::path::{Path, PathBuf};

const FILE: &str = "bundle.tar.gz";
const TEMPORARY: &str = ".bundle.tar.gz.tmp";

#[derive(Debug, Clone)]
pub struct BundleStore {
    dir: PathBuf,
}

impl BundleStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        BundleStore { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The persisted bundle's bytes, `None` when there is none yet.
    pub fn load(&self) -> std::io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path()) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the persisted bundle with `bytes`, atomically.
    pub fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(TEMPORARY);
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, self.path())?;
        sync_dir(&self.dir);
        Ok(())
    }
}

/// Makes the rename durable where the platform allows (best effort: the bundle server still has
/// the bundle if this one is lost).
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_saved_bundle_is_what_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = BundleStore::new(dir.path().join("nested"));
        assert_eq!(store.load().unwrap(), None);
        store.save(b"first").unwrap();
        store.save(b"second").unwrap();
        assert_eq!(store.load().unwrap().as_deref(), Some(&b"second"[..]));
        let names: Vec<_> = std::fs::read_dir(dir.path().join("nested"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![FILE], "no temporary is left behind");
    }
}
