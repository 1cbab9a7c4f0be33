//! The NDJSON file sink: one writer thread owns the file; requests hand it lines through a
//! bounded queue and never wait for the disk (unless the log is required, when a request waits
//! for its own line to be written and flushed).
//!
//! Crash safety: a line is written with one `write` call on a file opened for appending, so a
//! crash can tear at most the line being written; on reopening, a torn tail is closed with a
//! newline so the next event starts a line of its own. Readers skip lines that do not parse.
//!
//! Rotation: when the next write would pass `max_bytes`, or the file has been open for
//! `rotate_after`, it is renamed `PATH.<UTC time>` and a new one started; only the newest `keep`
//! rotated files are kept.

use super::SinkStats;
use crate::decision::event::rfc3339_ms;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

const SINK: &str = "file";
/// Lines written in one `write` at most (when many are queued).
const MAX_COALESCED_BYTES: usize = 1 << 20;

/// Why a required event was not written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the decision log could not be written: {0}")]
pub struct FileSinkError(pub String);

type Ack = oneshot::Sender<Result<(), FileSinkError>>;

enum Job {
    Line(Vec<u8>, Option<Ack>),
    Close,
}

#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// `-` writes to stdout.
    pub path: PathBuf,
    pub max_bytes: u64,
    pub rotate_after: Option<Duration>,
    pub keep: usize,
    pub queue: usize,
}

pub struct FileSink {
    tx: SyncSender<Job>,
    stats: Arc<SinkStats>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl FileSink {
    /// Starts the writer thread. Never fails: a file that cannot be opened now is retried with
    /// every event, each failure counted.
    pub fn start(config: FileSinkConfig, stats: Arc<SinkStats>) -> FileSink {
        let (tx, rx) = sync_channel(config.queue.max(1));
        let writer = Writer {
            config,
            out: None,
            size: 0,
            opened: Instant::now(),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("hunch-decision-log".into())
            .spawn(move || writer.run(rx))
            .ok();
        FileSink {
            tx,
            stats,
            thread: Mutex::new(thread),
        }
    }

    /// Queues a line (ending in `\n`) without waiting; a full queue drops it, counted.
    pub fn submit(&self, line: Vec<u8>) {
        match self.tx.try_send(Job::Line(line, None)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.stats.dropped(
                SINK,
                "queue_full",
                1,
                "the decision log file is not keeping up",
            ),
            Err(TrySendError::Disconnected(_)) => {
                self.stats
                    .dropped(SINK, "closed", 1, "the decision log writer has stopped")
            }
        }
    }

    /// Writes a line and waits until it is written and flushed to the operating system.
    pub async fn write_flushed(&self, line: Vec<u8>) -> Result<(), FileSinkError> {
        let (ack, done) = oneshot::channel();
        let refused = match self.tx.try_send(Job::Line(line, Some(ack))) {
            Ok(()) => None,
            Err(TrySendError::Full(_)) => Some(("queue_full", "the decision log queue is full")),
            Err(TrySendError::Disconnected(_)) => {
                Some(("closed", "the decision log writer has stopped"))
            }
        };
        if let Some((cause, message)) = refused {
            self.stats.dropped(SINK, cause, 1, message);
            return Err(FileSinkError(message.into()));
        }
        done.await
            .unwrap_or_else(|_| Err(FileSinkError("the decision log writer has stopped".into())))
    }

    /// Writes what is queued and stops the writer.
    pub fn close(&self) {
        // A blocking send: the writer drains the queue, then sees Close.
        let _ = self.tx.send(Job::Close);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

struct Writer {
    config: FileSinkConfig,
    out: Option<File>,
    size: u64,
    opened: Instant,
    stats: Arc<SinkStats>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let Job::Line(first, ack) = job else { return };
            // Coalesce what is already queued into one write.
            let mut buf = first;
            let mut acks: Vec<Ack> = ack.into_iter().collect();
            let mut lines = 1u64;
            let mut close = false;
            while buf.len() < MAX_COALESCED_BYTES {
                match rx.try_recv() {
                    Ok(Job::Line(l, a)) => {
                        buf.extend_from_slice(&l);
                        acks.extend(a);
                        lines += 1;
                    }
                    Ok(Job::Close) => {
                        close = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let result = self.write(&buf);
            match &result {
                Ok(()) => self.stats.written(SINK, lines),
                Err((cause, e)) => self.stats.dropped(SINK, cause, lines, &e.0),
            }
            for a in acks {
                let _ = a.send(result.clone().map_err(|(_, e)| e));
            }
            if close {
                return;
            }
        }
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), (&'static str, FileSinkError)> {
        if self.config.path.as_os_str() == "-" {
            let mut out = std::io::stdout().lock();
            return out
                .write_all(buf)
                .and_then(|()| out.flush())
                .map_err(|e| ("write_failed", FileSinkError(format!("stdout: {e}"))));
        }
        if self.out.is_some() && self.due(buf.len() as u64) {
            self.rotate();
        }
        if self.out.is_none() {
            self.open().map_err(|e| ("open_failed", e))?;
        }
        let Some(file) = &mut self.out else {
            return Err(("open_failed", FileSinkError("no file".into())));
        };
        match file.write_all(buf).and_then(|()| file.flush()) {
            Ok(()) => {
                self.size += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Reopen next time (the file may have been removed or the disk remounted).
                self.out = None;
                Err((
                    "write_failed",
                    FileSinkError(format!("{}: {e}", self.config.path.display())),
                ))
            }
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
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(|e| FileSinkError(format!("cannot open {}: {e}", path.display())))?;
        let mut size = file
            .metadata()
            .map_err(|e| FileSinkError(format!("{}: {e}", path.display())))?
            .len();
        if size > 0 && !ends_with_newline(&mut file) {
            // A torn last line from a crash: end it so the next event is a line of its own.
            file.write_all(b"\n")
                .map_err(|e| FileSinkError(format!("{}: {e}", path.display())))?;
            size += 1;
        }
        self.out = Some(file);
        self.size = size;
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
mod tests {
    use super::*;

    fn sink(path: &Path, max_bytes: u64, keep: usize) -> (FileSink, Arc<SinkStats>) {
        let stats = Arc::new(SinkStats::default());
        let s = FileSink::start(
            FileSinkConfig {
                path: path.to_path_buf(),
                max_bytes,
                rotate_after: None,
                keep,
                queue: 64,
            },
            stats.clone(),
        );
        (s, stats)
    }

    #[tokio::test]
    async fn lines_are_appended_after_a_torn_tail_and_rotated_with_retention() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.ndjson");
        std::fs::write(&path, b"{\"a\":1}\n{\"torn\":").unwrap();
        let (s, stats) = sink(&path, 40, 2);
        s.write_flushed(b"{\"b\":2}\n".to_vec()).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"torn\":\n{\"b\":2}\n");
        for i in 0..6 {
            s.write_flushed(format!("{{\"n\":{i:020}}}\n").into_bytes())
                .await
                .unwrap();
        }
        s.close();
        assert_eq!(stats.written_count("file"), 7);
        let rotated = rotated_files(&path);
        assert_eq!(rotated.len(), 2, "{rotated:?}");
        assert!(std::fs::read_to_string(&path).unwrap().ends_with("}\n"));
    }

    #[tokio::test]
    async fn an_unwritable_path_fails_required_writes_and_counts_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("d.ndjson");
        let (s, stats) = sink(&path, 1 << 20, 2);
        assert!(s.write_flushed(b"{}\n".to_vec()).await.is_err());
        s.submit(b"{}\n".to_vec());
        s.close();
        assert_eq!(stats.dropped_count("file"), 2);
        assert_eq!(stats.written_count("file"), 0);
    }
}
