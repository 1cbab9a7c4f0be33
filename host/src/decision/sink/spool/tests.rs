//! The spool's tests: appends, acknowledgements, recovery from torn and corrupt tails.

use super::format::CURSOR;
use super::*;

fn config(dir: &Path, max_bytes: u64) -> SpoolConfig {
    SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes,
        fsync: Fsync::Off,
    }
}

fn open(dir: &Path) -> (Arc<Spool>, SpoolWriter, SpoolReader, Recovered) {
    Spool::open(config(dir, 1 << 20)).unwrap()
}

fn event(i: usize) -> Vec<u8> {
    format!("{{\"decision_id\":\"d{i}\"}}").into_bytes()
}

fn append(writer: &mut SpoolWriter, range: std::ops::Range<usize>) {
    for i in range {
        writer.append(&event(i)).unwrap();
    }
    writer.commit().unwrap();
}

fn ids(batch: &Batch) -> Vec<String> {
    batch
        .events
        .iter()
        .map(|e| String::from_utf8(e.clone()).unwrap())
        .collect()
}

#[test]
fn a_spool_directory_is_held_by_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path());
    // A second open (another process's, to the lock) is refused while the first holds it.
    let err = Spool::open(config(dir.path(), 1 << 20)).unwrap_err();
    assert!(matches!(err, SpoolError::InUse(_)), "{err}");
    drop(first);
    let _again = open(dir.path());
}

#[test]
fn appended_events_are_read_back_in_order_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, mut writer, mut reader, recovered) = open(dir.path());
    assert_eq!(recovered, Recovered::default());
    writer.append(&event(0)).unwrap();
    assert!(
        reader.read_batch(1 << 20).unwrap().events.is_empty(),
        "an uncommitted append was read"
    );
    writer.commit().unwrap();
    append(&mut writer, 1..5);
    assert_eq!(spool.pending().0, 5);
    let batch = reader.read_batch(1 << 20).unwrap();
    assert_eq!(
        ids(&batch),
        (0..5)
            .map(|i| String::from_utf8(event(i)).unwrap())
            .collect::<Vec<_>>()
    );
    reader.ack(&batch).unwrap();
    assert_eq!(spool.pending(), (0, 0));
    assert!(reader.read_batch(1 << 20).unwrap().events.is_empty());
}

#[test]
fn a_batch_stops_at_its_json_size_but_takes_at_least_one_event() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut writer, mut reader, _) = open(dir.path());
    append(&mut writer, 0..4);
    let one = event(0).len() + 1;
    assert_eq!(reader.read_batch(1).unwrap().events.len(), 1);
    assert_eq!(reader.read_batch(1 + 2 * one).unwrap().events.len(), 2);
    assert_eq!(reader.read_batch(1 << 20).unwrap().events.len(), 1);
}

#[test]
fn unacknowledged_events_are_read_again_after_a_crash_and_acknowledged_ones_never() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_, mut writer, mut reader, _) = open(dir.path());
        append(&mut writer, 0..3);
        let sent = reader.read_batch(1 + 2 * (event(0).len() + 1)).unwrap();
        assert_eq!(sent.events.len(), 2);
        reader.ack(&sent).unwrap();
        append(&mut writer, 3..5);
        // Read but never acknowledged (the POST was in flight), then the process dies.
        assert_eq!(reader.read_batch(1 << 20).unwrap().events.len(), 3);
    }
    let (spool, mut writer, mut reader, recovered) = open(dir.path());
    assert_eq!(recovered.events, 3);
    assert_eq!(spool.pending().0, 3);
    append(&mut writer, 5..6);
    let again = reader.read_batch(1 << 20).unwrap();
    let expected: Vec<String> = (2..6)
        .map(|i| String::from_utf8(event(i)).unwrap())
        .collect();
    assert_eq!(ids(&again), expected);
    reader.ack(&again).unwrap();
    drop((spool, writer, reader));
    let (spool, _, mut reader, recovered) = open(dir.path());
    assert_eq!(recovered.events, 0);
    assert_eq!(spool.pending(), (0, 0));
    assert!(reader.read_batch(1 << 20).unwrap().events.is_empty());
}

#[test]
fn a_torn_last_append_is_cut_off_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_, mut writer, _, _) = open(dir.path());
        append(&mut writer, 0..2);
    }
    // A crash in the middle of the next append: its header and half its payload.
    let newest = *segment_ids(dir.path()).unwrap().last().unwrap();
    let path = segment_path(dir.path(), newest);
    let whole = std::fs::metadata(&path).unwrap().len();
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    let torn = event(2);
    file.write_all(&(torn.len() as u32).to_le_bytes()).unwrap();
    file.write_all(&crc32fast::hash(&torn).to_le_bytes())
        .unwrap();
    file.write_all(&torn[..5]).unwrap();
    drop(file);
    let (_, mut writer, mut reader, recovered) = open(dir.path());
    assert_eq!(recovered.events, 2);
    assert_eq!(recovered.torn_bytes, HEADER + 5);
    assert_eq!(recovered.corrupt_segments, 0);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    append(&mut writer, 3..4);
    let batch = reader.read_batch(1 << 20).unwrap();
    assert_eq!(batch.events, [event(0), event(1), event(3)]);
    assert_eq!(batch.corrupt, 0);
}

#[test]
fn a_record_that_does_not_check_is_never_sent_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_, mut writer, _, _) = open(dir.path());
        append(&mut writer, 0..3);
    }
    // A second start: the first segment is an older one now (the newest is empty).
    drop(open(dir.path()));
    // The second record's payload flipped by the disk.
    let first = *segment_ids(dir.path()).unwrap().first().unwrap();
    let path = segment_path(dir.path(), first);
    let mut bytes = std::fs::read(&path).unwrap();
    let second = (HEADER as usize + event(0).len()) + HEADER as usize;
    bytes[second + 2] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let (_, _, mut reader, recovered) = open(dir.path());
    assert_eq!(recovered.corrupt_segments, 1);
    assert_eq!(recovered.events, 1);
    let batch = reader.read_batch(1 << 20).unwrap();
    assert_eq!(batch.events, [event(0)]);
}

#[test]
fn the_bound_counts_unacknowledged_bytes_and_acknowledging_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let size = HEADER + event(0).len() as u64;
    let (spool, mut writer, mut reader, _) = Spool::open(config(dir.path(), 3 * size)).unwrap();
    append(&mut writer, 0..3);
    assert_eq!(
        writer.append(&event(3)),
        Err(SpoolError::Full(3 * size)),
        "a fourth event fits in a bound of three"
    );
    assert_eq!(
        writer.append(&[b'x'; 100]).unwrap_err().cause(),
        "too_large"
    );
    assert_eq!(spool.pending(), (3, 3 * size));
    let batch = reader.read_batch(1).unwrap();
    reader.ack(&batch).unwrap();
    append(&mut writer, 3..4);
    assert_eq!(spool.pending(), (3, 3 * size));
}

#[test]
fn sent_segments_are_deleted_and_the_cursor_follows_across_them() {
    let dir = tempfile::tempdir().unwrap();
    // A small bound makes small segments: 40 events span several.
    let (_, mut writer, mut reader, _) = Spool::open(config(dir.path(), 8 << 10)).unwrap();
    let big = |i: usize| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(150)).into_bytes();
    for i in 0..40 {
        writer.append(&big(i)).unwrap();
        writer.commit().unwrap();
    }
    assert!(segment_ids(dir.path()).unwrap().len() > 1);
    let mut got = Vec::new();
    loop {
        let batch = reader.read_batch(1000).unwrap();
        if batch.events.is_empty() {
            break;
        }
        reader.ack(&batch).unwrap();
        got.extend(batch.events);
    }
    assert_eq!(got, (0..40).map(big).collect::<Vec<_>>());
    assert_eq!(
        segment_ids(dir.path()).unwrap().len(),
        1,
        "sent segments stay"
    );
    let cursor = read_cursor(dir.path()).unwrap().unwrap();
    assert_eq!(cursor, reader.acked);
    drop((writer, reader));
    let (spool, _, _, recovered) = Spool::open(config(dir.path(), 8 << 10)).unwrap();
    assert_eq!((recovered.events, spool.pending()), (0, (0, 0)));
}

#[test]
fn an_unreadable_cursor_sends_everything_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_, mut writer, mut reader, _) = open(dir.path());
        append(&mut writer, 0..2);
        let batch = reader.read_batch(1 << 20).unwrap();
        reader.ack(&batch).unwrap();
        append(&mut writer, 2..3);
    }
    std::fs::write(dir.path().join(CURSOR), "garbage").unwrap();
    let (_, _, mut reader, recovered) = open(dir.path());
    // Losing the cursor sends what was sent again (at-least-once), never skips.
    assert_eq!(recovered.events, 3);
    assert_eq!(
        reader.read_batch(1 << 20).unwrap().events,
        [event(0), event(1), event(2)]
    );
}

#[test]
fn a_cursor_inside_a_record_sends_its_segment_again_and_cuts_nothing_off() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_, mut writer, _, _) = open(dir.path());
        append(&mut writer, 0..3);
    }
    std::fs::write(dir.path().join(CURSOR), "0 13\n").unwrap();
    let (_, _, mut reader, recovered) = open(dir.path());
    assert_eq!((recovered.events, recovered.torn_bytes), (3, 0));
    assert_eq!(
        reader.read_batch(1 << 20).unwrap().events,
        [event(0), event(1), event(2)]
    );
}

#[test]
fn with_fsync_always_appends_and_acknowledgements_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut writer, mut reader, _) = Spool::open(SpoolConfig {
        fsync: Fsync::Always,
        ..config(dir.path(), 1 << 20)
    })
    .unwrap();
    append(&mut writer, 0..3);
    let batch = reader.read_batch(1 << 20).unwrap();
    assert_eq!(batch.events.len(), 3);
    reader.ack(&batch).unwrap();
    assert_eq!(read_cursor(dir.path()).unwrap(), Some(batch.end));
}
