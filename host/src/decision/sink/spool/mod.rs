//! The HTTP sink's spool on disk (`--decision-log-spool DIR`): events are appended to segment
//! files before they are sent, and a cursor file records how far the collector has acknowledged,
//! so events survive a crash of the process (and, with `--decision-log-fsync always`, of the
//! machine) and a collector that is down for a long time. The format and its recovery are
//! described in docs/decision-records.md ("Spool").
//!
//! - Segments `DIR/<20-digit id>.spool` hold records: a little-endian `u32` payload length, a
//!   little-endian `u32` CRC-32 of the payload, the payload (one event's JSON). A record whose
//!   length runs past the end of its segment, or whose checksum does not match, is never sent.
//! - `DIR/cursor` holds the acknowledged position (`<segment> <offset>`), replaced atomically
//!   (written to `cursor.tmp`, then renamed over it). Segments wholly before it are deleted.
//! - Each open starts a new segment to append to, so nothing is ever appended after a torn tail.
//!
//! One [`SpoolWriter`] appends (owned by one thread) and one [`SpoolReader`] reads and
//! acknowledges (owned by the sending task); they share the committed end and the pending
//! counts through [`Spool`]. Only one process may use a DIR at a time.

mod format;
#[cfg(test)]
mod tests;

pub use format::HEADER;
use format::{
    create_segment, read_cursor, read_record, scan, segment_ids, segment_path, sync_dir,
    write_cursor,
};

use super::file::Fsync;
use super::lock;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A segment is sealed and a new one started once it holds this share of the bound...
const SEGMENTS_PER_BOUND: u64 = 16;
/// ...but at least and at most this many bytes.
const MIN_SEGMENT: u64 = 4 << 10;
const MAX_SEGMENT: u64 = 16 << 20;

/// A place in the spool: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

#[derive(Debug, Clone)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    /// Bytes of unacknowledged records (headers included) the spool holds at most.
    pub max_bytes: u64,
    /// `Always`: segments and the cursor are synced to the disk before an append or an
    /// acknowledgement counts as done.
    pub fsync: Fsync,
}

/// Why an event was not appended.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpoolError {
    #[error("the decision log spool holds its maximum of {0} bytes of unsent events")]
    Full(u64),
    #[error("the event ({0} bytes) is larger than the whole decision log spool")]
    TooLarge(u64),
    #[error("the decision log spool cannot be written: {0}")]
    Io(String),
    /// Two processes appending to one spool would interleave their records and each acknowledge
    /// the other's: one directory, one process.
    #[error(
        "the decision log spool {0} is in use by another process (give each its own directory)"
    )]
    InUse(String),
}

impl SpoolError {
    /// The `cause` label of the drop.
    pub fn cause(&self) -> &'static str {
        match self {
            SpoolError::Full(_) => "spool_full",
            SpoolError::TooLarge(_) => "too_large",
            SpoolError::Io(_) | SpoolError::InUse(_) => "spool_write_failed",
        }
    }
}

/// What opening found in an existing spool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovered {
    /// Unacknowledged events, to be sent again.
    pub events: u64,
    pub bytes: u64,
    /// Bytes cut off the end of the newest segment: an append torn by a crash. Its event was
    /// never acknowledged to its request, so nothing answered is lost.
    pub torn_bytes: u64,
    /// Older segments cut short at a record that did not check: the events from there to their
    /// end are lost (at least one each).
    pub corrupt_segments: u64,
}

/// What the writer and the reader share.
#[derive(Debug)]
struct Shared {
    /// The end of what has been appended (and synced, with `Fsync::Always`): the reader never
    /// reads past it.
    committed: Position,
    /// Unacknowledged events and their bytes (headers included), committed or being appended.
    pending_events: u64,
    pending_bytes: u64,
}

/// The spool's shared state: its directory, its bound and what it holds.
#[derive(Debug)]
pub struct Spool {
    config: SpoolConfig,
    segment_bytes: u64,
    shared: Mutex<Shared>,
    /// `DIR/lock`, locked exclusively while the spool is open (the operating system releases
    /// it when the process dies, however it dies).
    _lock: std::fs::File,
}

impl Spool {
    /// Opens (creating) the spool in `config.dir`: reads the cursor, deletes acknowledged
    /// segments, checks every unacknowledged record (cutting a torn or corrupt segment short)
    /// and starts a new segment to append to.
    pub fn open(
        config: SpoolConfig,
    ) -> Result<(Arc<Spool>, SpoolWriter, SpoolReader, Recovered), SpoolError> {
        let dir = config.dir.clone();
        let io = |what: &str, e: std::io::Error| {
            SpoolError::Io(format!("{what} in {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("cannot create the directory", e))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(|e| io("cannot open the lock file", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(SpoolError::InUse(dir.display().to_string()))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("cannot lock the spool", e)),
        }
        let segments = segment_ids(&dir).map_err(|e| io("cannot list the segments", e))?;
        let mut start = match read_cursor(&dir) {
            Ok(Some(c)) => c,
            Ok(None) => Position {
                segment: segments.first().copied().unwrap_or(0),
                offset: 0,
            },
            Err(why) => {
                // Sending everything again is at-least-once; skipping it would lose events.
                tracing::warn!(dir = %dir.display(), error = %why, "the decision log spool's cursor is unreadable; sending every spooled event again");
                Position {
                    segment: segments.first().copied().unwrap_or(0),
                    offset: 0,
                }
            }
        };
        let mut recovered = Recovered::default();
        let newest = segments.last().copied();
        for &id in &segments {
            let path = segment_path(&dir, id);
            if id < start.segment {
                std::fs::remove_file(&path).map_err(|e| io("cannot delete a sent segment", e))?;
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io("cannot open a segment", e))?;
            let len = file
                .metadata()
                .map_err(|e| io("cannot read a segment", e))?
                .len();
            let mut from = if id == start.segment { start.offset } else { 0 };
            let mut whole = scan(&file, from, len);
            if !whole.aligned {
                // Not a record's start (a cursor not written by this spool): sending the
                // segment again beats reading garbage or cutting good records off.
                tracing::warn!(segment = %path.display(), offset = from, "the decision log spool's cursor is not at a record; sending its segment again");
                from = 0;
                start.offset = 0;
                whole = scan(&file, 0, len);
            }
            recovered.events += whole.events;
            recovered.bytes += whole.end.saturating_sub(from);
            if whole.end < len {
                file.set_len(whole.end)
                    .map_err(|e| io("cannot cut a damaged segment short", e))?;
                let cut = len - whole.end;
                if Some(id) == newest {
                    recovered.torn_bytes += cut;
                    tracing::warn!(segment = %path.display(), bytes = cut, "a torn append at the end of the decision log spool was cut off (its decision was never answered)");
                } else {
                    recovered.corrupt_segments += 1;
                    tracing::warn!(segment = %path.display(), bytes = cut, "a damaged record in the decision log spool: the rest of its segment is lost");
                }
            }
        }
        let head_id = newest.map_or(start.segment, |n| n + 1).max(start.segment);
        let head = create_segment(&dir, head_id).map_err(|e| io("cannot start a segment", e))?;
        if config.fsync == Fsync::Always {
            sync_dir(&dir).map_err(|e| io("cannot sync the directory", e))?;
        }
        let start = if segments.contains(&start.segment) {
            start
        } else {
            // The cursor's segment is gone (it was wholly sent): start at the next one there is.
            Position {
                segment: segments
                    .iter()
                    .copied()
                    .find(|&id| id > start.segment)
                    .unwrap_or(head_id),
                offset: 0,
            }
        };
        let segment_bytes = (config.max_bytes / SEGMENTS_PER_BOUND).clamp(MIN_SEGMENT, MAX_SEGMENT);
        let spool = Arc::new(Spool {
            config,
            segment_bytes,
            shared: Mutex::new(Shared {
                committed: Position {
                    segment: head_id,
                    offset: 0,
                },
                pending_events: recovered.events,
                pending_bytes: recovered.bytes,
            }),
            _lock: lock,
        });
        let writer = SpoolWriter {
            spool: spool.clone(),
            head,
            head_id,
            head_len: 0,
            group_start: 0,
            group: (0, 0),
            failed: false,
        };
        let reader = SpoolReader {
            spool: spool.clone(),
            read: start,
            acked: start,
            file: None,
        };
        Ok((spool, writer, reader, recovered))
    }

    /// (unacknowledged events, their bytes).
    pub fn pending(&self) -> (u64, u64) {
        let s = lock(&self.shared);
        (s.pending_events, s.pending_bytes)
    }

    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    fn fsync(&self) -> bool {
        self.config.fsync == Fsync::Always
    }
}

/// Appends records to the newest segment; [`SpoolWriter::commit`] makes a group of appends
/// visible to the reader (after syncing them, with `Fsync::Always`).
#[derive(Debug)]
pub struct SpoolWriter {
    spool: Arc<Spool>,
    head: File,
    head_id: u64,
    head_len: u64,
    /// Where the uncommitted group began in the head segment.
    group_start: u64,
    /// (events, bytes) appended since the last commit.
    group: (u64, u64),
    /// A write failed: the head is replaced by a new segment before the next append.
    failed: bool,
}

impl SpoolWriter {
    /// Appends one event (its JSON), unless the spool would hold more than its bound. Not
    /// visible to the reader, nor durable, until [`commit`](Self::commit).
    pub fn append(&mut self, event: &[u8]) -> Result<(), SpoolError> {
        let size = HEADER + event.len() as u64;
        let max = self.spool.config.max_bytes;
        if size > max || event.len() > u32::MAX as usize {
            return Err(SpoolError::TooLarge(size));
        }
        {
            let mut shared = lock(&self.spool.shared);
            if shared.pending_bytes + size > max {
                return Err(SpoolError::Full(max));
            }
            shared.pending_bytes += size;
            shared.pending_events += 1;
        }
        let written = self.write_record(event);
        if let Err(e) = written {
            let mut shared = lock(&self.spool.shared);
            shared.pending_bytes -= size;
            shared.pending_events -= 1;
            return Err(e);
        }
        self.group.0 += 1;
        self.group.1 += size;
        Ok(())
    }

    fn write_record(&mut self, event: &[u8]) -> Result<(), SpoolError> {
        let size = HEADER + event.len() as u64;
        let full = self.head_len > 0 && self.head_len + size > self.spool.segment_bytes;
        // A group never spans two segments, so a failed commit can take the whole group back
        // out of the head: the head is replaced only between groups (and grows past its size
        // until then).
        if self.group.0 == 0 && (self.failed || full) {
            self.rotate()?;
        } else if self.failed {
            return Err(SpoolError::Io(
                "an earlier append of this group failed; appending resumes in a new segment".into(),
            ));
        }
        let mut record = Vec::with_capacity(size as usize);
        record.extend_from_slice(&(event.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(event).to_le_bytes());
        record.extend_from_slice(event);
        // One `write` for the record: a crash tears at most this one, at the end.
        if let Err(e) = self.head.write_all(&record) {
            // Take the partial record back out; if that fails too, the next append starts a new
            // segment and the reader's check skips what was left.
            let _ = self.head.set_len(self.head_len);
            self.failed = true;
            return Err(self.error("cannot append to", &e));
        }
        self.head_len += size;
        Ok(())
    }

    /// Seals the head segment (everything in it is committed) and starts the next one.
    fn rotate(&mut self) -> Result<(), SpoolError> {
        let dir = self.spool.config.dir.clone();
        let next = self.head_id + 1;
        let head = create_segment(&dir, next).map_err(|e| self.error("cannot start", &e))?;
        if self.spool.fsync() {
            sync_dir(&dir).map_err(|e| self.error("cannot sync the directory of", &e))?;
        }
        self.head = head;
        self.head_id = next;
        self.head_len = 0;
        self.group_start = 0;
        self.failed = false;
        Ok(())
    }

    /// Makes the appends since the last commit durable (with `Fsync::Always`) and visible to
    /// the reader. On `Err` they are taken back out, uncounted in the pending figures: the
    /// caller counts them as dropped.
    pub fn commit(&mut self) -> Result<(), SpoolError> {
        if self.group.0 == 0 {
            return Ok(());
        }
        if self.spool.fsync() {
            if let Err(e) = self.head.sync_data() {
                let error = self.error("cannot sync", &e);
                let _ = self.head.set_len(self.group_start);
                self.head_len = self.group_start;
                self.failed = true;
                let mut shared = lock(&self.spool.shared);
                shared.pending_events = shared.pending_events.saturating_sub(self.group.0);
                shared.pending_bytes = shared.pending_bytes.saturating_sub(self.group.1);
                self.group = (0, 0);
                return Err(error);
            }
        }
        lock(&self.spool.shared).committed = Position {
            segment: self.head_id,
            offset: self.head_len,
        };
        self.group_start = self.head_len;
        self.group = (0, 0);
        Ok(())
    }

    fn error(&self, what: &str, e: &std::io::Error) -> SpoolError {
        SpoolError::Io(format!(
            "{what} {}: {e}",
            segment_path(&self.spool.config.dir, self.head_id).display()
        ))
    }
}

/// Events read from the spool for one POST, and where the reader stands after them.
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Vec<u8>>,
    /// Bytes of the spool the batch covers (headers included).
    pub bytes: u64,
    /// Records found damaged and skipped on the way (their events are lost).
    pub corrupt: u64,
    /// The position after the batch: the cursor once it is acknowledged.
    pub end: Position,
}

impl Batch {
    /// Bytes of the JSON array the batch is POSTed as.
    pub fn json_bytes(&self) -> usize {
        self.events.iter().map(|e| e.len() + 1).sum::<usize>() + 1
    }
}

/// Reads committed records in order and persists the acknowledged position.
#[derive(Debug)]
pub struct SpoolReader {
    spool: Arc<Spool>,
    /// Where the next batch starts.
    read: Position,
    /// The persisted cursor.
    acked: Position,
    /// The open segment being read.
    file: Option<(u64, File)>,
}

impl SpoolReader {
    /// The next committed records after the last batch read, up to `max_json` bytes of JSON
    /// (at least one record, whatever its size). Empty when the reader has caught up.
    pub fn read_batch(&mut self, max_json: usize) -> Result<Batch, SpoolError> {
        let mut batch = Batch {
            end: self.read,
            ..Default::default()
        };
        let mut json = 1;
        loop {
            let committed = lock(&self.spool.shared).committed;
            if self.read.segment > committed.segment {
                break;
            }
            let limit = if self.read.segment == committed.segment {
                committed.offset
            } else {
                self.segment_len(self.read.segment)?
            };
            if self.read.offset >= limit {
                if self.read.segment == committed.segment {
                    break;
                }
                self.read = Position {
                    segment: self.read.segment + 1,
                    offset: 0,
                };
                self.file = None;
                batch.end = self.read;
                continue;
            }
            let at = self.read;
            let record = read_record(self.file(at.segment)?, at.offset, limit);
            match record {
                Some(event) => {
                    if !batch.events.is_empty() && json + event.len() + 1 > max_json {
                        break;
                    }
                    json += event.len() + 1;
                    self.read.offset += HEADER + event.len() as u64;
                    batch.bytes += HEADER + event.len() as u64;
                    batch.events.push(event);
                }
                None => {
                    // Damaged after it was checked at open (or by the disk since): skip the
                    // rest of the segment; its events are lost.
                    batch.corrupt += 1;
                    batch.bytes += limit - self.read.offset;
                    self.read.offset = limit;
                    tracing::warn!(segment = %segment_path(self.spool.dir(), self.read.segment).display(), "a damaged record in the decision log spool: the rest of its segment is skipped");
                }
            }
            batch.end = self.read;
        }
        Ok(batch)
    }

    /// Records that the collector took `batch`: persists the cursor after it and deletes the
    /// segments wholly before it. When persisting fails the batch is still taken off the
    /// pending figures; after a restart it would be sent again (at-least-once).
    pub fn ack(&mut self, batch: &Batch) -> Result<(), SpoolError> {
        {
            let mut shared = lock(&self.spool.shared);
            shared.pending_events = shared
                .pending_events
                .saturating_sub(batch.events.len() as u64 + batch.corrupt);
            shared.pending_bytes = shared.pending_bytes.saturating_sub(batch.bytes);
        }
        let previous = self.acked;
        self.acked = batch.end;
        let dir = self.spool.config.dir.clone();
        let io = |what: &str, e: std::io::Error| {
            SpoolError::Io(format!("{what} in {}: {e}", dir.display()))
        };
        write_cursor(&dir, batch.end, self.spool.fsync())
            .map_err(|e| io("cannot persist the cursor", e))?;
        for id in previous.segment..batch.end.segment {
            match std::fs::remove_file(segment_path(&dir, id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot delete a sent segment", e)),
            }
        }
        Ok(())
    }

    /// Whether every committed record has been read.
    pub fn caught_up(&self) -> bool {
        self.read >= lock(&self.spool.shared).committed
    }

    fn file(&mut self, id: u64) -> Result<&File, SpoolError> {
        if self.file.as_ref().is_none_or(|(open, _)| *open != id) {
            let path = segment_path(self.spool.dir(), id);
            let file = File::open(&path)
                .map_err(|e| SpoolError::Io(format!("cannot read {}: {e}", path.display())))?;
            self.file = Some((id, file));
        }
        match &self.file {
            Some((_, f)) => Ok(f),
            None => Err(SpoolError::Io("no segment open".into())),
        }
    }

    /// A sealed segment's length (0 when it is missing: nothing to read there).
    fn segment_len(&self, id: u64) -> Result<u64, SpoolError> {
        let path = segment_path(self.spool.dir(), id);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(SpoolError::Io(format!(
                "cannot read {}: {e}",
                path.display()
            ))),
        }
    }
}
