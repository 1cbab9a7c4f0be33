//! Streaming safetensors output: the header is written from a plan first, then each tensor's
//! bytes in plan order, so a multi-gigabyte file never has to be held in memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::checkpoint::tensors::{io_err, PlannedTensor, TensorError};

/// A safetensors file being written.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    plan: Vec<PlannedTensor>,
    next: usize,
}

impl SafetensorsWriter {
    pub fn create(
        path: impl AsRef<Path>,
        plan: Vec<PlannedTensor>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, TensorError> {
        let path = path.as_ref().to_path_buf();
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert(
                "__metadata__".into(),
                serde_json::to_value(metadata).unwrap_or_default(),
            );
        }
        let mut off = 0usize;
        for t in &plan {
            let n = t.nbytes();
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [off, off + n]}),
            );
            off += n;
        }
        let mut hb = serde_json::to_vec(&header).map_err(|e| TensorError::Write {
            path: path.clone(),
            name: String::new(),
            why: e.to_string(),
        })?;
        // Pad the header with spaces so tensor data starts 8-byte aligned (as the Python writer does).
        while hb.len() % 8 != 0 {
            hb.push(b' ');
        }
        let file = File::create(&path).map_err(io_err(&path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(hb.len() as u64).to_le_bytes())
            .map_err(io_err(&path))?;
        out.write_all(&hb).map_err(io_err(&path))?;
        Ok(Self {
            path,
            out,
            plan,
            next: 0,
        })
    }

    /// Name of the tensor expected next, if any.
    pub fn next_name(&self) -> Option<&str> {
        self.plan.get(self.next).map(|t| t.name.as_str())
    }

    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), TensorError> {
        let t = self.plan.get(self.next).ok_or_else(|| TensorError::Write {
            path: self.path.clone(),
            name: name.to_string(),
            why: "not in the plan".into(),
        })?;
        if t.name != name || t.nbytes() != bytes.len() {
            return Err(TensorError::Write {
                path: self.path.clone(),
                name: name.to_string(),
                why: format!(
                    "expected {} with {} bytes next, got {} bytes",
                    t.name,
                    t.nbytes(),
                    bytes.len()
                ),
            });
        }
        self.out.write_all(bytes).map_err(io_err(&self.path))?;
        self.next += 1;
        Ok(())
    }

    pub fn finish(mut self) -> Result<(), TensorError> {
        if let Some(t) = self.plan.get(self.next) {
            return Err(TensorError::Write {
                path: self.path.clone(),
                name: t.name.clone(),
                why: "file closed before this tensor was written".into(),
            });
        }
        self.out.flush().map_err(io_err(&self.path))
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of f32 values rounded to bf16 (nearest, ties to even).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tensors::{Dtype, TensorSet};

    #[test]
    fn write_then_map() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a.safetensors");
        let plan = vec![
            PlannedTensor {
                name: "x".into(),
                dtype: Dtype::BF16,
                shape: vec![2, 3],
            },
            PlannedTensor {
                name: "c".into(),
                dtype: Dtype::U32,
                shape: vec![1],
            },
        ];
        let mut w = SafetensorsWriter::create(&p, plan, &BTreeMap::new()).expect("create");
        assert!(w.write("c", &[0; 4]).is_err(), "out of order");
        w.write("x", &bf16_bytes(&[1.0, -2.0, 0.5, 3.0, 0.0, 1.5]))
            .expect("x");
        w.write("c", &u32_bytes(&[0xDEADBEEF])).expect("c");
        w.finish().expect("finish");
        let set = TensorSet::open(&[p]).expect("open");
        let x = set.get("x").expect("x");
        assert_eq!(x.shape, &[2, 3]);
        assert_eq!(
            x.to_f32().expect("f32"),
            vec![1.0, -2.0, 0.5, 3.0, 0.0, 1.5]
        );
        assert_eq!(
            set.get("c").expect("c").to_u32().expect("u32"),
            vec![0xDEADBEEF]
        );
    }
}
