//! The tests of `file.rs`.

use super::*;

const WAIT: Duration = Duration::from_secs(10);

fn config(path: &Path) -> FileSinkConfig {
    FileSinkConfig {
        path: path.to_path_buf(),
        max_bytes: 1 << 20,
        rotate_after: None,
        keep: 2,
        queue: 64,
        queue_bytes: 1 << 20,
        fsync: Fsync::Off,
    }
}

fn sink(config: FileSinkConfig) -> (FileSink, Arc<SinkStats>) {
    let stats = Arc::new(SinkStats::default());
    (FileSink::start(config, stats.clone()), stats)
}

/// A "disk" that hangs: a FIFO nobody reads, opened for reading and writing so the open
/// succeeds; a write larger than the pipe's capacity never returns.
fn hung_disk(dir: &Path) -> PathBuf {
    let path = dir.join("hung.ndjson");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    path
}

/// Bigger than any pipe's default capacity.
fn blocking_line() -> Vec<u8> {
    let mut line = vec![b' '; 300_000];
    line.push(b'\n');
    line
}

#[tokio::test]
async fn lines_are_appended_after_a_torn_tail_and_rotated_with_retention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.ndjson");
    std::fs::write(&path, b"{\"a\":1}\n{\"torn\":").unwrap();
    let (s, stats) = sink(FileSinkConfig {
        max_bytes: 40,
        ..config(&path)
    });
    s.write_required(b"{\"b\":2}\n".to_vec(), WAIT)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, "{\"a\":1}\n{\"torn\":\n{\"b\":2}\n");
    for i in 0..6 {
        s.write_required(format!("{{\"n\":{i:020}}}\n").into_bytes(), WAIT)
            .await
            .unwrap();
    }
    s.close(WAIT).await;
    assert_eq!(stats.written_count("file"), 7);
    let rotated = rotated_files(&path);
    assert_eq!(rotated.len(), 2, "{rotated:?}");
    assert!(std::fs::read_to_string(&path).unwrap().ends_with("}\n"));
}

#[tokio::test]
async fn an_unwritable_path_fails_required_writes_and_counts_drops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("d.ndjson");
    let (s, stats) = sink(config(&path));
    let e = s.write_required(b"{}\n".to_vec(), WAIT).await.unwrap_err();
    assert!(matches!(e, FileSinkError::Failed(_)), "{e:?}");
    s.submit(b"{}\n".to_vec());
    s.close(WAIT).await;
    assert_eq!(stats.dropped_for("file", "open_failed"), 2);
    assert_eq!(stats.written_count("file"), 0);
    // After close nothing is taken, and that is counted too.
    s.submit(b"{}\n".to_vec());
    assert_eq!(stats.dropped_for("file", "closed"), 1);
}

#[tokio::test]
async fn a_hung_disk_times_a_required_write_out_instead_of_waiting_forever() {
    let dir = tempfile::tempdir().unwrap();
    let (s, stats) = sink(config(&hung_disk(dir.path())));
    let timeout = Duration::from_millis(200);
    // The writer takes this one and hangs in `write`.
    let hung = s.write_required(blocking_line(), timeout).await;
    assert_eq!(hung, Err(FileSinkError::TimedOut(timeout)));
    // This one waits behind it, is abandoned at its timeout, and counted at once.
    let queued = s.write_required(b"{}\n".to_vec(), timeout).await;
    assert_eq!(queued, Err(FileSinkError::TimedOut(timeout)));
    assert_eq!(stats.dropped_for("file", "timed_out"), 1);
    // Shutdown does not wait for the disk beyond its grace, and counts what it lost.
    s.close(Duration::from_millis(200)).await;
    assert_eq!(stats.dropped_for("file", "shutdown"), 1);
    assert_eq!(stats.written_count("file"), 0);
}

#[tokio::test]
async fn the_queue_is_bounded_in_bytes_not_only_in_events() {
    let dir = tempfile::tempdir().unwrap();
    let (s, stats) = sink(FileSinkConfig {
        queue: 1000,
        queue_bytes: 400_000,
        ..config(&hung_disk(dir.path()))
    });
    // 300 kB held while the writer hangs on it, then 90 kB queued: 390 kB of 400 kB.
    s.submit(blocking_line());
    s.submit(vec![b'x'; 90_000]);
    // 20 kB more does not fit; a small line still does.
    s.submit(vec![b'y'; 20_000]);
    s.submit(b"{}\n".to_vec());
    assert_eq!(stats.dropped_for("file", "queue_full"), 1);
    // Larger than the whole queue: never taken, told apart.
    s.submit(vec![b'z'; 500_000]);
    assert_eq!(stats.dropped_for("file", "too_large"), 1);
    s.close(Duration::from_millis(200)).await;
    assert_eq!(stats.dropped_for("file", "shutdown"), 3);
}

#[tokio::test]
async fn fsync_always_syncs_before_a_required_write_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    for (fsync, expected) in [(Fsync::Off, 0), (Fsync::Always, 2)] {
        let path = dir.path().join(format!("{}.ndjson", fsync.as_str()));
        let (s, stats) = sink(FileSinkConfig {
            fsync,
            ..config(&path)
        });
        for _ in 0..2 {
            s.write_required(b"{}\n".to_vec(), WAIT).await.unwrap();
        }
        // Counted before the acknowledgement, so already here.
        assert_eq!(stats.fsync_count(), expected, "{fsync:?}");
        s.close(WAIT).await;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n{}\n");
    }
}
