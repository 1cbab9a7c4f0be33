//! Finding checkpoints under a `--models-dir` (docs/models.md, "Discovery").
//!
//! A root is scanned one level deep, two where a folder holds models itself (`org/name`):
//!
//! - a folder with `config.json` and at least one `*.safetensors` is a model, named by its path
//!   under the root (`name` or `org/name`);
//! - a Hugging Face cache folder `models--org--name` is the model `org/name`, served from
//!   `snapshots/<rev>` where `refs/main` names the revision;
//! - a file whose first four bytes are GGUF's magic is a model named by its file stem.
//!
//! Anything else is skipped with the reason, for the logs: never fatal, a models directory may
//! hold notes and half-finished downloads. Each model is sized before it is loaded from its
//! tensors' bytes (see [`estimate`]).

use std::path::{Path, PathBuf};

/// GGUF files begin with these four bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// A checkpoint found under a models directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The name requests use: the path under the root (`name`, `org/name`), or `org/name` for a
    /// Hugging Face cache entry, or a GGUF file's stem.
    pub name: String,
    /// What the sidecar is given (`--model`): the folder, the snapshot folder, or the file.
    pub path: PathBuf,
    pub layout: Layout,
    /// The bytes it is expected to take resident, before it is loaded ([`estimate`]).
    pub estimated_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `config.json` beside `*.safetensors`.
    Folder,
    /// A Hugging Face cache entry (`models--org--name/snapshots/<rev>`).
    HfCache,
    /// One `.gguf` file.
    Gguf,
}

/// Something under a models directory that is not a model, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
}

/// One scan of the models directories.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Sorted by name; a name found twice keeps its first root's model (the other is skipped).
    pub models: Vec<Discovered>,
    pub skipped: Vec<Skipped>,
}

/// Scans every root in order. A root that cannot be read is itself reported as skipped.
pub fn scan(roots: &[PathBuf]) -> Scan {
    let mut out = Scan::default();
    for root in roots {
        scan_root(root, &mut out);
    }
    out.models.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn scan_root(root: &Path, out: &mut Scan) {
    let entries = match sorted_entries(root) {
        Ok(e) => e,
        Err(e) => {
            out.skipped.push(Skipped {
                path: root.into(),
                why: format!("cannot read the models directory: {e}"),
            });
            return;
        }
    };
    for path in entries {
        let name = file_name(&path);
        // The per-model settings file is the directory's own, not a model to report.
        if name.starts_with('.') || name == super::settings::FILE_NAME {
            continue;
        }
        let found = if path.is_dir() {
            if let Some(repo) = name.strip_prefix("models--") {
                hf_cache_entry(&path, repo).map(|m| vec![m])
            } else if is_folder_model(&path) {
                folder_model(&path, name.clone()).map(|m| vec![m])
            } else {
                org_folder(&path, &name, out)
            }
        } else {
            gguf_model(&path).map(|m| vec![m])
        };
        match found {
            Ok(models) => {
                for m in models {
                    if out.models.iter().any(|o| o.name == m.name) {
                        out.skipped.push(Skipped {
                            why: format!("the name {:?} is already taken by another model", m.name),
                            path: m.path,
                        });
                    } else {
                        out.models.push(m);
                    }
                }
            }
            Err(why) => out.skipped.push(Skipped { path, why }),
        }
    }
}

/// An `org` folder: the models one level down, named `org/name`. A folder with none is no model.
fn org_folder(dir: &Path, org: &str, out: &mut Scan) -> Result<Vec<Discovered>, String> {
    let entries = sorted_entries(dir).map_err(|e| format!("cannot read: {e}"))?;
    let mut models = Vec::new();
    let mut strays = Vec::new();
    for path in entries {
        let name = file_name(&path);
        if name.starts_with('.') {
            continue;
        }
        let found = if path.is_dir() {
            if is_folder_model(&path) {
                folder_model(&path, format!("{org}/{name}"))
            } else {
                Err("no config.json with *.safetensors beside it, and no GGUF file".into())
            }
        } else {
            gguf_model(&path).map(|m| Discovered {
                name: format!("{org}/{}", m.name),
                ..m
            })
        };
        match found {
            Ok(m) => models.push(m),
            Err(why) => strays.push(Skipped { path, why }),
        }
    }
    if models.is_empty() {
        // A folder with no model is one report, not one per file in it.
        return Err("no model in it (no config.json with *.safetensors, no GGUF file)".into());
    }
    // Beside models, each stray entry is worth its own line.
    out.skipped.extend(strays);
    Ok(models)
}

fn is_folder_model(dir: &Path) -> bool {
    dir.join("config.json").is_file() && !safetensors_files(dir).is_empty()
}

fn folder_model(dir: &Path, name: String) -> Result<Discovered, String> {
    Ok(Discovered {
        name,
        path: dir.into(),
        layout: Layout::Folder,
        estimated_bytes: folder_tensor_bytes(dir)?,
    })
}

/// `models--org--name`: `refs/main` names the snapshot served.
fn hf_cache_entry(dir: &Path, repo: &str) -> Result<Discovered, String> {
    let name = repo.replacen("--", "/", 1);
    let rev = std::fs::read_to_string(dir.join("refs").join("main"))
        .map_err(|e| format!("a Hugging Face cache entry without a readable refs/main: {e}"))?;
    let rev = rev.trim();
    if rev.is_empty() || rev.contains('/') || rev.contains("..") {
        return Err(format!("refs/main names no snapshot ({rev:?})"));
    }
    let snapshot = dir.join("snapshots").join(rev);
    if !is_folder_model(&snapshot) {
        return Err(format!(
            "snapshot {rev} has no config.json with *.safetensors beside it (an unfinished download?)"
        ));
    }
    Ok(Discovered {
        name,
        estimated_bytes: folder_tensor_bytes(&snapshot)?,
        path: snapshot,
        layout: Layout::HfCache,
    })
}

fn gguf_model(path: &Path) -> Result<Discovered, String> {
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut magic)
    });
    if read.is_err() || &magic != GGUF_MAGIC {
        return Err("not a model: a file that is not GGUF".into());
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Discovered {
        name: stem,
        path: path.into(),
        layout: Layout::Gguf,
        estimated_bytes: estimate::gguf(path)?,
    })
}

fn folder_tensor_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0u64;
    for file in safetensors_files(dir) {
        total += estimate::safetensors(&file)?;
    }
    Ok(total)
}

fn safetensors_files(dir: &Path) -> Vec<PathBuf> {
    sorted_entries(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect()
}

fn sorted_entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    out.sort();
    Ok(out)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The size estimate: the bytes of a checkpoint's tensors as stored, which is what the sidecar
/// holds resident when it runs in the checkpoint's own dtype (the default; docs/models.md says
/// what a different `--dtype` changes). Once a model is loaded its measured resident size
/// replaces this.
pub mod estimate {
    use std::io::Read;
    use std::path::Path;

    /// A safetensors file: its length minus the 8-byte header length and the JSON header.
    pub fn safetensors(path: &Path) -> Result<u64, String> {
        let err = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = std::fs::File::open(path).map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        let mut header = [0u8; 8];
        file.read_exact(&mut header).map_err(err)?;
        let header_len = u64::from_le_bytes(header);
        len.checked_sub(8)
            .and_then(|l| l.checked_sub(header_len))
            .ok_or_else(|| {
                format!(
                    "{}: not a safetensors file (a header of {header_len} bytes in {len})",
                    path.display()
                )
            })
    }

    /// A `--model` checkpoint as given: a GGUF file, or a folder of `*.safetensors` (what it
    /// is not sized from, e.g. an MLX folder without safetensors, is 0: measured once it runs).
    pub fn checkpoint(path: &Path) -> u64 {
        if path.is_dir() {
            super::folder_tensor_bytes(path).unwrap_or(0)
        } else {
            gguf(path).unwrap_or(0)
        }
    }

    /// A GGUF file: its length. The metadata before the tensor data (the vocabulary, mostly) is
    /// a few MB at most, a fair over-estimate next to the weights.
    pub fn gguf(path: &Path) -> Result<u64, String> {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of `data` tensor bytes behind a small header.
    fn safetensors(path: &Path, data: usize) {
        let header =
            format!(r#"{{"w":{{"dtype":"U8","shape":[{data}],"data_offsets":[0,{data}]}}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend(std::iter::repeat_n(0u8, data));
        std::fs::write(path, bytes).unwrap();
    }

    fn folder(dir: &Path, data: usize) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        safetensors(&dir.join("model.safetensors"), data);
    }

    #[test]
    fn every_layout_is_found_and_sized_and_the_rest_is_skipped() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        folder(&r.join("flat"), 100);
        folder(&r.join("org").join("name"), 200);
        // Two shards count together.
        safetensors(&r.join("org").join("name").join("model-2.safetensors"), 50);
        let hf = r.join("models--acme--tiny");
        folder(&hf.join("snapshots").join("abc123"), 300);
        folder(&hf.join("snapshots").join("old"), 1);
        std::fs::create_dir_all(hf.join("refs")).unwrap();
        std::fs::write(hf.join("refs").join("main"), "abc123\n").unwrap();
        let mut gguf = b"GGUF".to_vec();
        gguf.extend([0u8; 96]);
        std::fs::write(r.join("small.gguf"), &gguf).unwrap();
        // Not models.
        std::fs::write(r.join("notes.txt"), "hello").unwrap();
        std::fs::write(r.join("fake.gguf"), "not gguf at all").unwrap();
        std::fs::create_dir_all(r.join("empty")).unwrap();
        std::fs::create_dir_all(r.join("half")).unwrap();
        std::fs::write(r.join("half").join("config.json"), "{}").unwrap();

        let scan = scan(&[r.to_path_buf()]);
        let found: Vec<_> = scan
            .models
            .iter()
            .map(|m| (m.name.as_str(), m.layout, m.estimated_bytes))
            .collect();
        assert_eq!(
            found,
            [
                ("acme/tiny", Layout::HfCache, 300),
                ("flat", Layout::Folder, 100),
                ("org/name", Layout::Folder, 250),
                ("small", Layout::Gguf, 100),
            ]
        );
        assert_eq!(
            scan.models[0].path,
            hf.join("snapshots").join("abc123"),
            "refs/main picks the snapshot"
        );
        let skipped: Vec<_> = scan.skipped.iter().map(|s| file_name(&s.path)).collect();
        for name in ["notes.txt", "fake.gguf", "empty", "half"] {
            assert!(skipped.contains(&name.to_string()), "{name} in {skipped:?}");
        }
    }

    #[test]
    fn a_missing_root_or_a_broken_cache_entry_is_reported_not_fatal() {
        let root = tempfile::tempdir().unwrap();
        let hf = root.path().join("models--acme--gone");
        std::fs::create_dir_all(hf.join("snapshots")).unwrap();
        let scan = scan(&[root.path().join("nope"), root.path().to_path_buf()]);
        assert!(scan.models.is_empty());
        assert_eq!(scan.skipped.len(), 2, "{:?}", scan.skipped);
        assert!(scan.skipped[1].why.contains("refs/main"));
    }

    #[test]
    fn a_name_found_in_two_roots_keeps_the_first() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        folder(&a.path().join("m"), 10);
        folder(&b.path().join("m"), 20);
        let scan = scan(&[a.path().into(), b.path().into()]);
        assert_eq!(scan.models.len(), 1);
        assert_eq!(scan.models[0].estimated_bytes, 10);
        assert!(scan.skipped[0].why.contains("already taken"));
    }

    #[test]
    fn a_truncated_safetensors_header_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&path, bytes).unwrap();
        assert!(estimate::safetensors(&path).is_err());
    }
}
