//! The bundle file (docs/deploy.md, "Policy bundles"): a gzip tar whose top level holds a policy
//! directory's files exactly as the directory holds them (`NAME.wasm`, `NAME.toml`,
//! `NAME.candidate.wasm`, `NAME.candidate.toml`, and the calibration files `*.json` a
//! `NAME.toml` names), a `.manifest` (revision, creation time, and
//! every file's sha256 and size) and, when signed, a `.signature` over the manifest's exact bytes.
//!
//! Packing is deterministic (sorted entries, zero times and owners), so the same files make the
//! same bytes except for `created_at`. Unpacking is bounded: a bundle larger than
//! [`MAX_BUNDLE_BYTES`] compressed or [`MAX_UNPACKED_BYTES`] unpacked is refused before it is
//! held in memory.

use super::error::{BundleError, Fault};
use crate::policy::registry::Stage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Largest bundle downloaded (compressed bytes): a few dozen policies of a few MiB each.
pub const MAX_BUNDLE_BYTES: u64 = 64 << 20;
/// Largest total of a bundle's unpacked files: bounds a gzip bomb.
pub const MAX_UNPACKED_BYTES: u64 = 256 << 20;

pub const MANIFEST: &str = ".manifest";
pub const SIGNATURE: &str = ".signature";

/// `.manifest`. Fields Hunch does not read (another tool's `roots` or `metadata`) are ignored:
/// the signature covers the manifest's bytes, so they cannot be changed unseen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub revision: String,
    /// RFC 3339: what "older" compares.
    pub created_at: String,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    /// Hex.
    pub sha256: String,
    pub size: u64,
}

/// `.signature`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignatureFile {
    /// Always `ed25519`.
    pub algorithm: String,
    /// The first 16 hex characters of the sha256 of the public key's 32 raw bytes.
    pub key_id: String,
    /// Base64 (standard, padded) of the ed25519 signature over the exact bytes of `.manifest`.
    pub signature: String,
}

/// A bundle's entries as read from its tar, nothing checked yet but the bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Unpacked {
    /// `.manifest`'s exact bytes (what the signature covers).
    pub manifest_bytes: Option<Vec<u8>>,
    pub signature_bytes: Option<Vec<u8>>,
    /// Every other file, by path.
    pub files: BTreeMap<String, Vec<u8>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::decision::event::sha256_hex(bytes)
}

/// The revision a bundle gets when none is given: the same files make the same revision.
pub fn content_revision(files: &BTreeMap<String, Vec<u8>>) -> String {
    let mut listing = String::new();
    for (path, bytes) in files {
        listing.push_str(path);
        listing.push('\0');
        listing.push_str(&sha256_hex(bytes));
        listing.push('\n');
    }
    format!("sha256:{}", &sha256_hex(listing.as_bytes())[..12])
}

/// Whether `name` is a file a bundle may carry: a policy's active or candidate component or
/// configuration (`NAME.previous.*` is a server's local rollback state, never shipped).
pub fn policy_file(name: &str) -> Option<(&str, Stage, &str)> {
    let (stem, ext) = name.rsplit_once('.')?;
    if ext != "wasm" && ext != "toml" {
        return None;
    }
    let (policy, stage) = Stage::of_stem(stem)?;
    (stage != Stage::Previous).then_some((policy, stage, ext))
}

/// Whether `name` is a calibration file a bundle may carry beside its policies (what a
/// `NAME.toml`'s `[calibration] file` names): a bare `*.json` file name.
pub fn calibration_file(name: &str) -> bool {
    name.len() > ".json".len()
        && name.ends_with(".json")
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
}

/// Whether a bundle may carry the file `name`.
pub fn bundle_file(name: &str) -> bool {
    policy_file(name).is_some() || calibration_file(name)
}

/// The policy files of a directory (what `hunch bundle build` packs); other files are skipped
/// and returned by name so the command can say so.
pub fn read_policy_dir(dir: &Path) -> std::io::Result<(BTreeMap<String, Vec<u8>>, Vec<String>)> {
    let mut files = BTreeMap::new();
    let mut skipped = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type()?.is_file() || !bundle_file(&name) {
            skipped.push(name);
            continue;
        }
        files.insert(name, std::fs::read(entry.path())?);
    }
    skipped.sort();
    Ok((files, skipped))
}

/// The manifest of `files`.
pub fn manifest_of(
    files: &BTreeMap<String, Vec<u8>>,
    revision: String,
    created_at: String,
) -> Manifest {
    Manifest {
        revision,
        created_at,
        files: files
            .iter()
            .map(|(path, bytes)| FileEntry {
                path: path.clone(),
                sha256: sha256_hex(bytes),
                size: bytes.len() as u64,
            })
            .collect(),
    }
}

/// Packs a bundle: `.manifest`, `.signature` (when given), then the files, sorted.
pub fn pack(
    manifest_bytes: &[u8],
    signature_bytes: Option<&[u8]>,
    files: &BTreeMap<String, Vec<u8>>,
) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut append = |path: &str, bytes: &[u8]| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path, bytes)
    };
    append(MANIFEST, manifest_bytes)?;
    if let Some(signature) = signature_bytes {
        append(SIGNATURE, signature)?;
    }
    for (path, bytes) in files {
        append(path, bytes)?;
    }
    tar.into_inner()?.finish()
}

/// Reads a bundle's entries. Refuses anything but plain files at the top level, duplicates, and
/// more than [`MAX_UNPACKED_BYTES`]; reads the gzip stream to its end so a truncated download
/// fails its length and CRC check instead of passing as a shorter archive.
pub fn unpack(bytes: &[u8]) -> Result<Unpacked, BundleError> {
    if bytes.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(Fault::TooLarge {
            what: "compressed",
            limit: MAX_BUNDLE_BYTES,
        }
        .into());
    }
    let corrupt = |e: std::io::Error| BundleError::from(Fault::Corrupt(e.to_string()));
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut out = Unpacked {
        manifest_bytes: None,
        signature_bytes: None,
        files: BTreeMap::new(),
    };
    let mut budget = MAX_UNPACKED_BYTES;
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry
            .path()
            .map_err(corrupt)?
            .to_string_lossy()
            .into_owned();
        let path = raw.strip_prefix("./").unwrap_or(&raw).to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() && path.is_empty() {
            continue;
        }
        if !kind.is_file() {
            return Err(Fault::Layout {
                path,
                why: "not a plain file".into(),
            }
            .into());
        }
        if path.is_empty() || path.contains('/') || path == "." || path == ".." {
            return Err(Fault::Layout {
                path,
                why: "a bundle's files are at its top level".into(),
            }
            .into());
        }
        let mut data = Vec::new();
        (&mut entry)
            .take(budget + 1)
            .read_to_end(&mut data)
            .map_err(corrupt)?;
        if data.len() as u64 > budget {
            return Err(Fault::TooLarge {
                what: "unpacked",
                limit: MAX_UNPACKED_BYTES,
            }
            .into());
        }
        budget -= data.len() as u64;
        let slot = match path.as_str() {
            MANIFEST => &mut out.manifest_bytes,
            SIGNATURE => &mut out.signature_bytes,
            _ => {
                if out.files.insert(path.clone(), data).is_some() {
                    return Err(duplicate(path));
                }
                continue;
            }
        };
        if slot.replace(data).is_some() {
            return Err(duplicate(path));
        }
    }
    // The rest of the stream (the tar's end blocks and the gzip trailer) must be there.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(corrupt)?;
    Ok(out)
}

fn duplicate(path: String) -> BundleError {
    Fault::Layout {
        path,
        why: "appears twice in the bundle".into(),
    }
    .into()
}

/// Unix milliseconds of an RFC 3339 timestamp (`2026-12-01T18:00:00Z`,
/// `2026-12-01T18:00:00.123+01:00`).
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = text.get(start..i)?;
        if digits.is_empty() {
            return None;
        }
        let first3: String = digits.chars().chain("000".chars()).take(3).collect();
        ms = first3.parse().ok()?;
    }
    let offset_min = match text.get(i..)? {
        "Z" | "z" => 0,
        rest if rest.len() == 6 && matches!(rest.as_bytes()[0], b'+' | b'-') => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            if rest.as_bytes()[3] != b':' {
                return None;
            }
            sign * (oh * 60 + om)
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let seconds = days * 86_400 + h * 3600 + mi * 60 + s - offset_min * 60;
    Some(seconds * 1000 + ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            ("a.wasm".to_string(), b"component a".to_vec()),
            ("a.toml".to_string(), b"reader = \"m\"\n".to_vec()),
        ])
    }

    #[test]
    fn a_bundle_unpacks_to_what_was_packed() {
        let packed = pack(b"{}", Some(b"sig"), &files()).unwrap();
        let unpacked = unpack(&packed).unwrap();
        assert_eq!(unpacked.manifest_bytes.as_deref(), Some(&b"{}"[..]));
        assert_eq!(unpacked.signature_bytes.as_deref(), Some(&b"sig"[..]));
        assert_eq!(unpacked.files, files());
        assert_eq!(pack(b"{}", Some(b"sig"), &files()).unwrap(), packed);
    }

    #[test]
    fn a_truncated_or_corrupt_download_is_refused() {
        let packed = pack(b"{}", None, &files()).unwrap();
        for cut in [10, packed.len() / 2, packed.len() - 4, packed.len() - 1] {
            let err = unpack(&packed[..cut]).unwrap_err();
            assert!(
                matches!(err.fault, Fault::Corrupt(_)),
                "cut at {cut}: {err}"
            );
        }
        let mut flipped = packed.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0xff;
        assert!(unpack(&flipped).is_err());
        assert!(matches!(
            unpack(b"not gzip at all").unwrap_err().fault,
            Fault::Corrupt(_)
        ));
    }

    #[test]
    fn the_default_revision_follows_the_content() {
        let mut changed = files();
        assert_eq!(content_revision(&files()), content_revision(&changed));
        changed.insert("a.wasm".into(), b"component b".to_vec());
        assert_ne!(content_revision(&files()), content_revision(&changed));
        assert!(content_revision(&files()).starts_with("sha256:"));
        assert_eq!(content_revision(&files()).len(), "sha256:".len() + 12);
    }

    #[test]
    fn calibration_files_are_bare_json_file_names() {
        assert!(calibration_file("ticket_router.calibration.json"));
        assert!(bundle_file("a.json") && bundle_file("a.wasm"));
        for not in [
            "../a.json",
            "d/a.json",
            "d\\a.json",
            ".json",
            ".hidden.json",
            "a.jsonl",
        ] {
            assert!(!calibration_file(not), "{not}");
        }
    }

    #[test]
    fn only_active_and_candidate_policy_files_belong_in_a_bundle() {
        assert_eq!(policy_file("a.wasm"), Some(("a", Stage::Active, "wasm")));
        assert_eq!(
            policy_file("a.candidate.toml"),
            Some(("a", Stage::Candidate, "toml"))
        );
        assert_eq!(policy_file("a.previous.wasm"), None);
        assert_eq!(policy_file("a.wasm.tmp"), None);
        assert_eq!(policy_file("README.md"), None);
        assert_eq!(policy_file("../a.wasm"), None);
    }

    #[test]
    fn rfc3339_timestamps_parse_to_the_same_instant_in_any_offset() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_796_032_681_123);
        let ours = hunch_core::date::rfc3339_ms(t);
        assert_eq!(parse_rfc3339_ms(&ours), Some(1_796_032_681_123));
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T10:58:01.123+01:00"),
            Some(1_796_032_681_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T09:58:01Z"),
            Some(1_796_032_681_000)
        );
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-30T09:58:01",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
