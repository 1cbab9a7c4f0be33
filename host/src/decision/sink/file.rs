//! The NDJSON file sink: one writer thread owns the file; requests hand it lines through a
//! queue bounded in events and bytes ([`Buffer`]) and never wait for the disk, unless the log is
//! required: then a request waits for its own line to be written and flushed (and, with
//! `--decision-log-fsync always`, synced to the disk), at most the write timeout.
//!
//! Crash safety: a line is written with one `write` call on a file opened for appending, so a
//! crash can tear at most the line being written; on reopening, a torn tail is closed with a
//! newline so the next event starts a line of its own. Readers skip lines that do not parse.
//!
//! A required line that is not written in time is never left in the file for a decision the
//! client was told is unrecorded: if the writer has not taken it yet it is abandoned, and if it
//! was being written when the wait ended, the writer cuts the file back to where the batch began.
//! A batch whose write or sync fails is cut back the same way (best effort: a disk that fails a
//! write may fail the cut too).
//!
//! Rotation: when the next write would pass `max_bytes`, or the file has been open for
//! `rotate_after`, it is renamed `PATH.<UTC time>` and a new one started; only the newest `keep`
//! rotated files are kept.

use super::{lock, Buffer, BufferFull, Held, Settled, SinkStats};
use crate::decision::event::rfc3339_ms;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

const SINK: &str = "file";
/// Lines written in one `write` at most (when many are queued).
const MAX_COALESCED_BYTES: usize = 1 << 20;

/// Whether the file is synced to the disk before a write counts as done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fsync {
    /// Written and flushed to the operating system: survives the process, not a power loss.
    #[default]
    Off,
    /// `fsync` after every write (lines queued together share one): survives a power loss.
    Always,
}

impl Fsync {
    pub fn as_str(self) -> &'static str {
        match self {
            Fsync::Off => "off",
            Fsync::Always => "always",
        }
    }
}

/// Why a required event was not written. Every one of them may pass: a client may retry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FileSinkError {
    #[error("the decision log cannot take more events now: {}", .0.detail())]
    Full(BufferFull),
    #[error("the decision log writer has stopped")]
    Closed,
    #[error("the decision log was not written within {0:?}")]
    TimedOut(Duration),
    #[error("the decision log could not be written: {0}")]
    Failed(String),
}

impl FileSinkError {
    /// The `Retry-After` for a decision answered 503 because of this.
    pub fn retry_after_seconds(&self) -> u64 {
        1
    }
}

/// Where a required line stands, shared by the request waiting for it and the writer.
const PENDING: u8 = 0;
/// The writer took it into a batch.
const CLAIMED: u8 = 1;
/// The wait ended before the writer took it: it is skipped.
const ABANDONED: u8 = 2;
/// The wait ended while it was being written: the writer cuts its batch back out.
const LATE: u8 = 3;
/// Written (or failed) and answered.
const DONE: u8 = 4;

struct Ack {
    reply: oneshot::Sender<Result<(), FileSinkError>>,
    state: Arc<AtomicU8>,
}

struct Line {
    bytes: Vec<u8>,
    ack: Option<Ack>,
    /// Its room in the buffer, given back when the line is written or skipped.
    held: Held,
}

enum Job {
    Line(Line),
    Close,
}

#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// `-` writes to stdout.
    pub path: PathBuf,
    pub max_bytes: u64,
    pub rotate_after: Option<Duration>,
    pub keep: usize,
    /// Lines held at most.
    pub queue: usize,
    /// Bytes of lines held at most.
    pub queue_bytes: usize,
    pub fsync: Fsync,
}

pub struct FileSink {
    tx: Mutex<Option<Sender<Job>>>,
    buffer: Arc<Buffer>,
    settled: Arc<Settled>,
    stats: Arc<SinkStats>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Closed when the writer thread ends.
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

impl FileSink {
    /// Starts the writer thread. Never fails: a file that cannot be opened now is retried with
    /// every event, each failure counted.
    pub fn start(config: FileSinkConfig, stats: Arc<SinkStats>) -> FileSink {
        let (tx, rx) = channel();
        let buffer = Buffer::new(config.queue, config.queue_bytes);
        let settled = Arc::new(Settled::default());
        let (stopping, stopped) = oneshot::channel();
        let writer = Writer {
            _stopping: stopping,
            config,
            out: None,
            size: 0,
            batch_start: 0,
            dir_synced: false,
            opened: Instant::now(),
            stats: stats.clone(),
            settled: settled.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("hunch-decision-log".into())
            .spawn(move || writer.run(rx))
            .ok();
        FileSink {
            tx: Mutex::new(Some(tx)),
            buffer,
            settled,
            stats,
            thread: Mutex::new(thread),
            stopped: Mutex::new(Some(stopped)),
        }
    }

    /// Hands a line to the writer, or counts why it could not.
    fn enqueue(&self, bytes: Vec<u8>, ack: Option<Ack>) -> Result<(), FileSinkError> {
        let held = self.buffer.hold(bytes.len()).map_err(|full| {
            self.stats
                .dropped(SINK, full.cause("queue_full"), 1, full.detail());
            FileSinkError::Full(full)
        })?;
        let line = Line { bytes, ack, held };
        self.settled.accepted(1);
        let sent = match lock(&self.tx).as_ref() {
            Some(tx) => tx.send(Job::Line(line)).is_ok(),
            None => false,
        };
        if !sent {
            self.settled.settled(1);
            self.stats
                .dropped(SINK, "closed", 1, "the decision log writer has stopped");
            return Err(FileSinkError::Closed);
        }
        Ok(())
    }

    /// Queues a line (ending in `\n`) without waiting; a full queue drops it, counted.
    pub fn submit(&self, line: Vec<u8>) {
        let _ = self.enqueue(line, None);
    }

    /// Writes a line and waits, at most `timeout`, until it is written and flushed to the
    /// operating system (and synced to the disk with [`Fsync::Always`]). On `Err` the line is
    /// not in the file (see the module's note on lines written late).
    pub async fn write_required(
        &self,
        line: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), FileSinkError> {
        let state = Arc::new(AtomicU8::new(PENDING));
        let (reply, mut done) = oneshot::channel();
        self.enqueue(
            line,
            Some(Ack {
                reply,
                state: state.clone(),
            }),
        )?;
        if let Ok(answer) = tokio::time::timeout(timeout, &mut done).await {
            return answer.unwrap_or(Err(FileSinkError::Closed));
        }
        let late = FileSinkError::TimedOut(timeout);
        match state.compare_exchange(PENDING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // The writer will skip it; counted here, now, since a hung writer never would.
                self.settled.settled(1);
                self.stats.dropped(SINK, "timed_out", 1, &late.to_string());
                Err(late)
            }
            Err(CLAIMED) => {
                if state
                    .compare_exchange(CLAIMED, LATE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    Err(late)
                } else {
                    // The writer finished in the meantime: its answer is on its way.
                    done.await.unwrap_or(Err(FileSinkError::Closed))
                }
            }
            Err(_) => done.await.unwrap_or(Err(FileSinkError::Closed)),
        }
    }

    /// Stops taking lines and gives the writer `grace` to write what is queued; what it has not
    /// written by then (a hung disk) is counted as dropped, cause `shutdown`.
    pub async fn close(&self, grace: Duration) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Job::Close);
        }
        let Some(handle) = lock(&self.thread).take() else {
            return;
        };
        let stopped = lock(&self.stopped).take();
        let in_time = match stopped {
            // Resolves when the writer is dropped, that is when its thread ends. (Not a join on
            // the blocking pool: a runtime waits for those when it shuts down, hung or not.)
            Some(stopped) => tokio::time::timeout(grace, stopped).await.is_ok(),
            None => true,
        };
        if in_time {
            let _ = handle.join();
        } else {
            self.settled.lost_at_shutdown(
                &self.stats,
                SINK,
                "the decision log file did not take its queued events before shutdown",
            );
        }
    }
}

/// Lines written together, holding their room in the buffer until written.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    acks: Vec<Ack>,
    held: Vec<Held>,
    lines: u64,
}

impl Batch {
    /// Adds a line unless the request waiting for it has given up.
    fn take(&mut self, line: Line) {
        if let Some(ack) = line.ack {
            let claimed = ack
                .state
                .compare_exchange(PENDING, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if !claimed {
                return;
            }
            self.acks.push(ack);
        }
        self.bytes.extend_from_slice(&line.bytes);
        self.held.push(line.held);
        self.lines += 1;
    }
}

struct Writer {
    /// Dropped with the writer: tells [`FileSink::close`] the thread has ended.
    _stopping: oneshot::Sender<()>,
    config: FileSinkConfig,
    out: Option<File>,
    size: u64,
    /// Where the last batch began (what a failed or late batch is cut back to).
    batch_start: u64,
    /// Whether the directory entry of the open file has been synced (`Fsync::Always`).
    dir_synced: bool,
    opened: Instant,
    stats: Arc<SinkStats>,
    settled: Arc<Settled>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let Job::Line(first) = job else { return };
            // Coalesce what is already queued into one write.
            let mut batch = Batch::default();
            let mut close = false;
            let mut next = Some(first);
            while let Some(line) = next.take() {
                batch.take(line);
                if batch.bytes.len() >= MAX_COALESCED_BYTES {
                    break;
                }
                match rx.try_recv() {
                    Ok(Job::Line(l)) => next = Some(l),
                    Ok(Job::Close) => close = true,
                    Err(_) => {}
                }
            }
            if batch.lines > 0 {
                self.finish(batch);
            }
            if close {
                return;
            }
        }
    }

    /// Writes a batch, counts it, and answers the requests waiting for its lines.
    fn finish(&mut self, batch: Batch) {
        let mut result = self.write(&batch.bytes);
        let mut late = false;
        for a in &batch.acks {
            late |= a.state.swap(DONE, Ordering::AcqRel) == LATE;
        }
        if late && result.is_ok() {
            self.cut_back();
            result = Err((
                "timed_out",
                FileSinkError::Failed(
                    "written after a waiting decision's timeout; taken back out of the file".into(),
                ),
            ));
        }
        match &result {
            Ok(()) => self.stats.written(SINK, batch.lines),
            Err((cause, e)) => self.stats.dropped(SINK, cause, batch.lines, &e.to_string()),
        }
        self.settled.settled(batch.lines);
        for a in batch.acks {
            let _ = a.reply.send(result.clone().map_err(|(_, e)| e));
        }
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), (&'static str, FileSinkError)> {
        if self.config.path.as_os_str() == "-" {
            let mut out = std::io::stdout().lock();
            return out.write_all(buf).and_then(|()| out.flush()).map_err(|e| {
                (
                    "write_failed",
                    FileSinkError::Failed(format!("stdout: {e}")),
                )
            });
        }
        if self.out.is_some() && self.due(buf.len() as u64) {
            self.rotate();
        }
        if self.out.is_none() {
            self.open().map_err(|e| ("open_failed", e))?;
        }
        self.batch_start = self.size;
        let Some(file) = &mut self.out else {
            return Err(("open_failed", FileSinkError::Failed("no file".into())));
        };
        if let Err(e) = file.write_all(buf).and_then(|()| file.flush()) {
            let e = self.failed(&e);
            self.cut_back();
            // Reopen next time (the file may have been removed or the disk remounted).
            self.out = None;
            return Err(("write_failed", e));
        }
        self.size += buf.len() as u64;
        if self.config.fsync == Fsync::Always {
            if let Err(e) = self.sync() {
                let e = self.failed(&e);
                self.cut_back();
                self.out = None;
                return Err(("fsync_failed", e));
            }
            self.stats.fsynced();
        }
        Ok(())
    }

    fn failed(&self, e: &std::io::Error) -> FileSinkError {
        FileSinkError::Failed(format!("{}: {e}", self.config.path.display()))
    }

    /// Syncs the file's data, and once per opened file its directory entry.
    fn sync(&mut self) -> std::io::Result<()> {
        if let Some(file) = &self.out {
            file.sync_data()?;
        }
        if !self.dir_synced {
            if let Some(dir) = self.config.path.parent() {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                File::open(dir)?.sync_all()?;
            }
            self.dir_synced = true;
        }
        Ok(())
    }

    /// Takes the last batch back out of the file; when that fails too, the file is reopened next
    /// time (it may have been removed or the disk remounted).
    fn cut_back(&mut self) {
        let cut = self.out.as_ref().map(|file| file.set_len(self.batch_start));
        match cut {
            Some(Ok(())) => self.size = self.batch_start,
            Some(Err(e)) => {
                tracing::warn!(path = %self.config.path.display(), error = %e, "cannot take a failed batch back out of the decision log");
                self.out = None;
            }
            None => {}
        }
    }

    fn due(&self, next: u64) -> bool {
        (self.size > 0 && self.size + next > self.config.max_bytes)
            || self
                .config
                .rotate_after
                .is_some_and(|age| self.size > 0 && self.opened.elapsed() >= age)
    }

    fn open(&mut self) -> Result<(), FileSinkError> {
        let path = &self.config.path;
        let failed = |e: std::io::Error| FileSinkError::Failed(format!("{}: {e}", path.display()));
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(|e| FileSinkError::Failed(format!("cannot open {}: {e}", path.display())))?;
        let mut size = file.metadata().map_err(failed)?.len();
        if size > 0 && !ends_with_newline(&mut file) {
            // A torn last line from a crash: end it so the next event is a line of its own.
            file.write_all(b"\n").map_err(failed)?;
            size += 1;
        }
        self.out = Some(file);
        self.size = size;
        self.batch_start = size;
        self.dir_synced = false;
        self.opened = Instant::now();
        Ok(())
    }

    fn rotate(&mut self) {
        self.out = None;
        let path = &self.config.path;
        let stamp = rfc3339_ms(SystemTime::now()).replace(':', "-");
        let mut target = suffixed(path, &stamp);
        let mut n = 1;
        while target.exists() {
            target = suffixed(path, &format!("{stamp}-{n}"));
            n += 1;
        }
        if let Err(e) = std::fs::rename(path, &target) {
            tracing::warn!(path = %path.display(), error = %e, "cannot rotate the decision log; appending");
            return;
        }
        prune(path, self.config.keep);
    }
}

fn ends_with_newline(file: &mut File) -> bool {
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1)).is_ok() && file.read_exact(&mut last).is_ok() && last[0] == b'\n'
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    path.with_file_name(name)
}

/// The rotated files of `path`, oldest first (their names sort by time).
pub fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    let prefix = format!("{name}.");
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix) && n[prefix.len()..].starts_with("20"))
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

fn prune(path: &Path, keep: usize) {
    let rotated = rotated_files(path);
    let excess = rotated.len().saturating_sub(keep);
    for old in &rotated[..excess] {
        if let Err(e) = std::fs::remove_file(old) {
            tracing::warn!(path = %old.display(), error = %e, "cannot delete an old decision log");
        }
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
