//! The goldens of the tiny random checkpoint (`tests/data/tiny-hf/`: a transformers-written
//! checkpoint with the outputs of its forward pass, see docs/model.md), for the tests that compare
//! against them (`parity.rs`, `quantized_layouts.rs`).

use std::path::{Path, PathBuf};

/// The folder of the checkpoint and its goldens.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-hf")
}

/// A golden array, as a minimal `.npy` reader reads it: little-endian `<f4` or `<i8`, C order,
/// format version 1 or 2.
pub struct Npy {
    pub shape: Vec<usize>,
    descr: String,
    data: Vec<u8>,
}

/// The golden `name` in [`data_dir`].
pub fn read_npy(name: &str) -> Result<Npy, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(data_dir().join(name))?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(format!("{name}: not an npy file").into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len])?;
    if header.contains("'fortran_order': True") {
        return Err(format!("{name}: Fortran order").into());
    }
    let field = |key: &str| -> Result<&str, String> {
        let at = header
            .find(key)
            .ok_or_else(|| format!("{name}: no {key}"))?;
        Ok(&header[at + key.len()..])
    };
    let descr = field("'descr': '")?
        .split('\'')
        .next()
        .unwrap_or_default()
        .to_owned();
    let shape_text = field("'shape': (")?.split(')').next().unwrap_or_default();
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<usize>, _>>()?;
    Ok(Npy {
        shape,
        descr,
        data: bytes[start + header_len..].to_vec(),
    })
}

impl Npy {
    pub fn f32s(&self) -> Result<Vec<f32>, String> {
        if self.descr != "<f4" {
            return Err(format!("expected <f4, got {}", self.descr));
        }
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub fn ids(&self) -> Result<Vec<u32>, String> {
        if self.descr != "<i8" {
            return Err(format!("expected <i8, got {}", self.descr));
        }
        Ok(self
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as u32)
            .collect())
    }

    pub fn rows(&self) -> Result<Vec<Vec<u32>>, String> {
        let width = *self.shape.last().ok_or("scalar")?;
        Ok(self.ids()?.chunks(width).map(<[u32]>::to_vec).collect())
    }
}
