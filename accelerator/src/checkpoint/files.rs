//! Which safetensors files hold a checkpoint's weights, whoever wrote the directory.
//!
//! In order: `model.safetensors.index.json`, then a `manifest.json` of any shape that maps
//! tensors to files (`weight_map` as name→file, or `tensors` as name→file or
//! name→{`shard`|`file`|`filename`|`path`, …}; every other key is ignored), and with neither,
//! every `*.safetensors` file in the directory (their own headers say what they hold). The map
//! only chooses files; what a tensor is comes from the headers (docs/checkpoint-layouts.md).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::{INDEX, MANIFEST};

/// Where the file list came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapSource {
    /// A JSON file (the index or a manifest) in the directory.
    Map(&'static str),
    /// The `*.safetensors` files found in the directory.
    Headers,
}

impl std::fmt::Display for MapSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapSource::Map(name) => f.write_str(name),
            MapSource::Headers => f.write_str("the *.safetensors files' headers"),
        }
    }
}

/// The weight files of a checkpoint directory.
#[derive(Debug, Clone)]
pub struct WeightFiles {
    /// Paths, sorted, each once.
    pub files: Vec<PathBuf>,
    /// How they were found (named in errors).
    pub source: MapSource,
}

/// Why the weight files could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not JSON ({why})")]
    Json { path: PathBuf, why: String },
    #[error("{path}: tensor {tensor} is mapped to {file:?}, which is not a file name inside the checkpoint directory")]
    OutsideDir {
        path: PathBuf,
        tensor: String,
        file: String,
    },
    #[error("{dir}: no weights (no {INDEX} or {MANIFEST} mapping tensors to files, and no *.safetensors file)")]
    NoWeights { dir: PathBuf },
}

/// The file a map entry names: a string, or an object's `shard` / `file` / `filename` / `path`.
fn entry_file(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => ["shard", "file", "filename", "path"]
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_str)),
        _ => None,
    }
}

/// The tensor→file entries of a map file, if it has any: `weight_map`, else `tensors`.
fn map_entries(json: &Value) -> Option<Vec<(&str, &str)>> {
    ["weight_map", "tensors"].iter().find_map(|key| {
        let entries: Vec<(&str, &str)> = json
            .get(*key)?
            .as_object()?
            .iter()
            .filter_map(|(name, v)| Some((name.as_str(), entry_file(v)?)))
            .collect();
        (!entries.is_empty()).then_some(entries)
    })
}

/// A file name from a map, checked to stay inside `dir` (no absolute paths, no `..`).
fn inside(dir: &Path, path: &Path, tensor: &str, file: &str) -> Result<PathBuf, FilesError> {
    let p = Path::new(file);
    let plain = p
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if file.is_empty() || !plain {
        return Err(FilesError::OutsideDir {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            file: file.to_string(),
        });
    }
    Ok(dir.join(p))
}

/// Lists the weight files of `dir` (see the module notes for the order of the rules).
pub fn weight_files(dir: &Path) -> Result<WeightFiles, FilesError> {
    for name in [INDEX, MANIFEST] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|source| FilesError::Io {
            path: path.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| FilesError::Json {
            path: path.clone(),
            why: e.to_string(),
        })?;
        // A JSON file that maps no tensor (another tool's notes) is not a map: look further.
        let Some(entries) = map_entries(&json) else {
            continue;
        };
        let mut files = BTreeSet::new();
        for (tensor, file) in entries {
            files.insert(inside(dir, &path, tensor, file)?);
        }
        return Ok(WeightFiles {
            files: files.into_iter().collect(),
            source: MapSource::Map(name),
        });
    }
    let read = std::fs::read_dir(dir).map_err(|source| FilesError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in read {
        let entry = entry.map_err(|source| FilesError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some("safetensors") && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(FilesError::NoWeights {
            dir: dir.to_path_buf(),
        });
    }
    files.sort();
    Ok(WeightFiles {
        files,
        source: MapSource::Headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, names: &[&str]) {
        for n in names {
            std::fs::write(dir.join(n), b"").expect("write");
        }
    }

    #[test]
    fn maps_of_any_shape_and_headers() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path();
        touch(d, &["b.safetensors", "a.safetensors", "notes.txt"]);
        let found = weight_files(d).expect("headers");
        assert_eq!(found.source, MapSource::Headers);
        assert_eq!(
            found.files,
            vec![d.join("a.safetensors"), d.join("b.safetensors")]
        );

        // A manifest with unknown keys and `tensors` as name→{shard, …}; no `format`.
        let m = r#"{"producer": "x", "tensors": {"t1": {"shard": "s1.safetensors", "dtype": "U32"},
                     "t2": {"shard": "s2.safetensors"}, "t3": "s1.safetensors"}}"#;
        std::fs::write(d.join(MANIFEST), m).expect("write");
        let found = weight_files(d).expect("manifest");
        assert_eq!(found.source, MapSource::Map(MANIFEST));
        assert_eq!(
            found.files,
            vec![d.join("s1.safetensors"), d.join("s2.safetensors")]
        );

        // A manifest that maps nothing is passed over.
        std::fs::write(d.join(MANIFEST), r#"{"format": "other", "shards": 8}"#).expect("write");
        assert_eq!(weight_files(d).expect("headers").source, MapSource::Headers);

        // The index wins, and may not point outside the directory.
        std::fs::write(
            d.join(INDEX),
            r#"{"weight_map": {"t": "../x.safetensors"}}"#,
        )
        .expect("write");
        let e = weight_files(d).expect_err("outside").to_string();
        assert!(
            e.contains("tensor t") && e.contains("../x.safetensors"),
            "{e}"
        );
        std::fs::write(d.join(INDEX), r#"{"weight_map": {"t": "a.safetensors"}}"#).expect("write");
        assert_eq!(
            weight_files(d).expect("index").files,
            vec![d.join("a.safetensors")]
        );

        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).expect("mkdir");
        assert!(matches!(
            weight_files(&empty),
            Err(FilesError::NoWeights { .. })
        ));
    }
}
