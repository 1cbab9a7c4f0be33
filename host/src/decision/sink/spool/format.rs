//! The spool's files on disk (docs/decision-records.md, "Spool"): a segment's records (a
//! little-endian `u32` length, a `u32` CRC-32, the payload), their names, and the cursor file
//! replaced atomically. The writer and the reader in `mod.rs` go through these alone.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::Position;

/// Bytes before each record's payload: its length and its checksum.
pub const HEADER: u64 = 8;
pub(super) const SUFFIX: &str = ".spool";
pub(super) const CURSOR: &str = "cursor";
pub(super) const CURSOR_TMP: &str = "cursor.tmp";

/// The record at `offset`, if it is whole (within `limit`) and checks.
pub(super) fn read_record(file: &File, offset: u64, limit: u64) -> Option<Vec<u8>> {
    if offset + HEADER > limit {
        return None;
    }
    let mut header = [0u8; HEADER as usize];
    file.read_exact_at(&mut header, offset).ok()?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as u64;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    // An event is never empty: a zero length is a hole (zeros a crash left), not a record.
    if len == 0 || offset + HEADER + len > limit {
        return None;
    }
    let mut payload = vec![0u8; len as usize];
    file.read_exact_at(&mut payload, offset + HEADER).ok()?;
    (crc32fast::hash(&payload) == crc).then_some(payload)
}

/// What a scan of a segment found: its whole records from `from` on, where the last one ends,
/// and whether `from` is a record's start (or at or past the end of the whole records).
pub(super) struct Scan {
    pub(super) events: u64,
    pub(super) end: u64,
    pub(super) aligned: bool,
}

/// Checks a segment's records from its start (a record can only be found from the one before
/// it), counting those from `from` on.
pub(super) fn scan(file: &File, from: u64, len: u64) -> Scan {
    let mut at = Scan {
        events: 0,
        end: 0,
        aligned: from == 0,
    };
    while let Some(event) = read_record(file, at.end, len) {
        if at.end >= from {
            at.events += 1;
        }
        at.end += HEADER + event.len() as u64;
        at.aligned |= at.end == from;
    }
    at.aligned |= from >= at.end;
    at
}

pub(super) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}{SUFFIX}"))
}

/// The segment ids in `dir`, oldest first.
pub(super) fn segment_ids(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(SUFFIX).and_then(|n| n.parse().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

pub(super) fn create_segment(dir: &Path, id: u64) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(segment_path(dir, id))
}

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The persisted cursor; `Ok(None)` when there is none yet, `Err` when it cannot be read.
pub(super) fn read_cursor(dir: &Path) -> Result<Option<Position>, String> {
    let text = match std::fs::read_to_string(dir.join(CURSOR)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut parts = text.split_whitespace().map(str::parse::<u64>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(segment)), Some(Ok(offset)), None) => Ok(Some(Position { segment, offset })),
        _ => Err(format!("not `<segment> <offset>`: {text:?}")),
    }
}

/// Replaces the cursor atomically: a crash leaves the old one or the new one, never a mix.
pub(super) fn write_cursor(dir: &Path, at: Position, fsync: bool) -> std::io::Result<()> {
    let tmp = dir.join(CURSOR_TMP);
    let mut file = File::create(&tmp)?;
    file.write_all(format!("{} {}\n", at.segment, at.offset).as_bytes())?;
    if fsync {
        file.sync_data()?;
    }
    std::fs::rename(&tmp, dir.join(CURSOR))?;
    if fsync {
        sync_dir(dir)?;
    }
    Ok(())
}
