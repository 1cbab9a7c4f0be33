//! Memory sizes as people write them in flags, variables and TOML (`48G`, `512MiB`, `1.5GB` or
//! plain bytes): one grammar for the host's `--memory-limit` and the sidecar's.

use serde::{Deserialize, Deserializer};

/// Parses a memory size: bytes, or a number with `K`, `M`, `G`, `T` (powers of 1024, optional
/// `iB`/`B`), e.g. `64G`, `512MiB`, `1.5GB`.
pub fn parse_size(s: &str) -> Result<u64, InvalidSize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| InvalidSize(s.to_string()))?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches("IB").trim_end_matches('B');
    let scale = match unit {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(InvalidSize(s.to_string())),
    };
    if !value.is_finite() || value < 0.0 {
        return Err(InvalidSize(s.to_string()));
    }
    Ok((value * scale as f64) as u64)
}

/// A memory size that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a memory size (bytes, or a number with K, M, G or T, e.g. 48G)")]
pub struct InvalidSize(pub String);

/// A size in bytes, read from a string in [`parse_size`]'s grammar or, in TOML and JSON, from a
/// plain integer of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = InvalidSize;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size(s).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Bytes(bytes) => Ok(ByteSize(bytes)),
            Written::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn a_byte_size_reads_from_text_or_a_number() {
        let text: ByteSize = serde_json::from_str("\"48G\"").expect("text");
        assert_eq!(text, ByteSize(48 << 30));
        let number: ByteSize = serde_json::from_str("4096").expect("number");
        assert_eq!(number, ByteSize(4096));
        let wrong = serde_json::from_str::<ByteSize>("\"lots\"").expect_err("not a size");
        assert!(
            wrong.to_string().contains("\"lots\" is not a memory size"),
            "{wrong}"
        );
    }
}
