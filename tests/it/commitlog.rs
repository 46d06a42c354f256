//! The commitlog: appends and rolls, queue offsets, slave writes, reads, restarts, retention.

use std::time::{Duration, SystemTime};

use hasync::store::fs::SimFs;
use hasync::store::record::{self, BLANK_MAGIC, Decoded};
use hasync::store::{CommitLog, Error};

use crate::support::{all_bytes, msg, msg_size, open, opts};

const SEG: usize = 64 * 1024;

#[test]
fn append_returns_offsets_sizes_and_queue_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let r = log.append(&[msg("T", 1, b"a"), msg("T", 1, b"bb"), msg("U", 1, b"c")]).unwrap();
    let sizes: Vec<u32> = r.records.iter().map(|x| x.size).collect();
    assert_eq!(r.records[0].offset, 0);
    assert_eq!(r.records[1].offset, sizes[0] as u64);
    assert_eq!(r.end_offset, sizes.iter().map(|s| *s as u64).sum::<u64>());
    let qo: Vec<i64> = r.records.iter().map(|x| x.queue_offset).collect();
    assert_eq!(qo, vec![0, 1, 0]);
    assert_eq!(log.max_offset(), r.end_offset);
    assert_eq!(log.next_queue_offset("T", 1), 2);
    // The stored bytes decode to the same messages at their offsets.
    let recs: Vec<_> = log.records_from(0).map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 3);
    let Decoded::Message(v) = record::decode(&recs[1].bytes, recs[1].offset as i64).unwrap() else {
        panic!("not a message")
    };
    assert_eq!((v.body, v.queue_offset, v.topic), (&b"bb"[..], 1, &b"T"[..]));
}

#[test]
fn oversized_message_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let big = vec![0u8; SEG / 2 + 1];
    let err = log.append(&[msg("T", 0, b"ok"), msg("T", 0, &big)]).unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("max-message-size"), "{err}");
    assert_eq!(log.max_offset(), 0, "the batch is all-or-nothing");
    assert_eq!(log.next_queue_offset("T", 0), 0);
}

/// For every remaining size at which a record no longer fits, the file is closed with the blank
/// record and the record starts the next file.
#[test]
fn roll_with_blank_at_every_boundary_position() {
    let rec = msg_size("T", 100);
    // A filler leaves `remaining` bytes at the end of the first file; the test record needs
    // rec + 8, so every remaining in [8, rec + 8) forces a roll, and rec + 8 does not.
    for remaining in 8..=rec + 8 {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path(), opts(SEG));
        let mut used = 0;
        // Fill with records until exactly `remaining` + one filler is left.
        let filler_overhead = msg_size("T", 0);
        while SEG - used - remaining > 2 * 4096 {
            used += log.append(&[msg("T", 0, &[1u8; 4000])]).unwrap().records[0].size as usize;
        }
        let last_body = SEG - used - remaining - filler_overhead;
        log.append(&[msg("T", 0, &vec![2u8; last_body])]).unwrap();
        assert_eq!(log.max_offset() as usize, SEG - remaining);
        let r = log.append(&[msg("T", 0, &[3u8; 100])]).unwrap();
        let off = r.records[0].offset as usize;
        if remaining < rec + 8 {
            assert_eq!(off, SEG, "remaining {remaining}: record goes to the next file");
            let blank = log.read((SEG - remaining) as u64, 8).unwrap().unwrap();
            assert_eq!(i32::from_be_bytes(blank[0..4].try_into().unwrap()), remaining as i32);
            assert_eq!(i32::from_be_bytes(blank[4..8].try_into().unwrap()), BLANK_MAGIC);
        } else {
            assert_eq!(off, SEG - remaining, "remaining {remaining}: record still fits");
        }
        let n = log.records_from(0).inspect(|r| assert!(r.is_ok())).count();
        assert_eq!(n as u64, log.next_queue_offset("T", 0) as u64);
    }
}

#[test]
fn batch_across_a_roll_is_contiguous_and_published_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let batch: Vec<_> = (0..40).map(|i| msg("T", 0, &[i as u8; 3000])).collect();
    let mut rx = log.subscribe_max_offset();
    let r = log.append(&batch).unwrap();
    assert!(r.end_offset > SEG as u64, "the batch crosses into the second file");
    assert_eq!(*rx.borrow_and_update(), r.end_offset);
    let offsets: Vec<u64> = log.records_from(0).map(|x| x.unwrap().offset).collect();
    assert_eq!(offsets, r.records.iter().map(|x| x.offset).collect::<Vec<_>>());
    assert_eq!(
        r.records.iter().map(|x| x.queue_offset).collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
}

/// An iterator made before a truncate never reads the rewritten log at offsets of the old one:
/// a demotion cuts a tail and the new master's bytes land where other records started.
#[test]
fn an_iterator_made_before_a_truncate_ends_rather_than_read_the_new_log_at_old_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let old: Vec<_> = (0..10).map(|i| msg("T", 0, &[i as u8; 100])).collect();
    let r = log.append(&old).unwrap();
    let cut = r.records[2].offset;
    let mut it = log.records_from(0);
    let first_three: Vec<_> = it.by_ref().take(3).map(|r| r.unwrap().offset).collect();
    assert_eq!(first_three.len(), 3);
    log.truncate(cut).unwrap();
    // New records of another size: the old record starts now fall inside them.
    let new: Vec<_> = (0..10).map(|i| msg("T", 0, &[100 + i as u8; 333])).collect();
    log.append(&new).unwrap();
    for rest in it {
        let rest = rest.expect("no record read at an old offset in the new log");
        let same = log.records_from(rest.offset).next().map(|r| r.unwrap().bytes);
        assert_eq!(Some(rest.bytes), same, "a record of the final log at {}", rest.offset);
    }
}

#[test]
fn reads_across_files_never_cross_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let batch: Vec<_> = (0..50).map(|i| msg("T", 0, &[i as u8; 3000])).collect();
    log.append(&batch).unwrap();
    let chunk = log.read(SEG as u64 - 100, usize::MAX).unwrap().unwrap();
    assert_eq!(chunk.len(), 100, "a read stops at the end of its file");
    let next = log.read(SEG as u64, 1000).unwrap().unwrap();
    assert_eq!(next.len(), 1000);
    assert_eq!(all_bytes(&log).len() as u64, log.max_offset());
    assert!(log.read(log.max_offset(), 10).unwrap().is_none());
    assert!(matches!(log.read(log.max_offset() + 1, 10), Err(Error::OutOfRange { .. })));
}

#[test]
fn queue_offsets_continue_across_clean_and_unclean_restarts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), opts(SEG));
        log.append(&[msg("T", 0, b"1"), msg("T", 0, b"2"), msg("T", 5, b"3")]).unwrap();
        log.close().unwrap();
    }
    {
        let log = open(dir.path(), opts(SEG));
        assert!(log.recovery_report().clean);
        assert_eq!(log.recovery_report().scanned_records, 0, "a clean stop needs no scan");
        let r = log.append(&[msg("T", 0, b"4")]).unwrap();
        assert_eq!(r.records[0].queue_offset, 2);
        // Dropped without close: an unclean stop (the page cache keeps the bytes).
    }
    let log = open(dir.path(), opts(SEG));
    assert!(!log.recovery_report().clean);
    let r = log.append(&[msg("T", 0, b"5"), msg("T", 5, b"6")]).unwrap();
    assert_eq!(r.records[0].queue_offset, 3);
    assert_eq!(r.records[1].queue_offset, 1);
}

#[test]
fn append_at_into_an_empty_store_starts_at_a_segment_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let err = log.append_at(SEG as u64 + 1, b"abc").unwrap_err();
    assert!(matches!(err, Error::NotSegmentAligned { .. }), "{err}");
    assert!(log.is_empty(), "nothing written");
    // A heartbeat-sized write never creates a file.
    log.append_at(3 * SEG as u64, b"").unwrap();
    assert!(log.is_empty());
    assert_eq!(log.append_at(3 * SEG as u64, b"abc").unwrap(), 3 * SEG as u64 + 3);
    assert_eq!(log.min_offset(), 3 * SEG as u64);
    assert_eq!(log.max_offset(), 3 * SEG as u64 + 3);
}

#[test]
fn append_at_refuses_a_wrong_offset_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    log.append_at(0, b"abcdef").unwrap();
    let err = log.append_at(4, b"xx").unwrap_err();
    match &err {
        Error::OffsetMismatch { expected, given } => assert_eq!((*expected, *given), (6, 4)),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains('6') && err.to_string().contains('4'));
    assert!(log.append_at(7, b"xx").is_err());
    assert_eq!(all_bytes(&log), b"abcdef");
}

#[test]
fn append_at_across_a_boundary_is_a_segment_mismatch_and_a_full_file_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    log.append_at(0, &vec![1u8; SEG - 10]).unwrap();
    let err = log.append_at(SEG as u64 - 10, &[2u8; 11]).unwrap_err();
    assert!(matches!(err, Error::CrossesSegment { segment_end, .. } if segment_end == SEG as u64));
    assert!(err.to_string().contains("segment-size"), "{err}");
    assert_eq!(log.max_offset(), SEG as u64 - 10, "nothing written");
    // Exactly filling the file is fine; the next write creates the next file.
    log.append_at(SEG as u64 - 10, &[2u8; 10]).unwrap();
    assert_eq!(log.file_at(SEG as u64 - 1).unwrap().from_offset(), 0);
    assert!(log.file_at(SEG as u64).is_none());
    log.append_at(SEG as u64, b"next").unwrap();
    assert_eq!(log.file_at(SEG as u64).unwrap().from_offset(), SEG as u64);
    assert_eq!(log.max_offset(), SEG as u64 + 4);
}

/// A slave writing the master's bytes in arbitrary cuts ends with identical bytes and the same
/// queue offsets, and its max offset may sit mid-record.
#[test]
fn slave_copy_is_byte_identical_with_the_same_queue_offsets() {
    let mdir = tempfile::tempdir().unwrap();
    let sdir = tempfile::tempdir().unwrap();
    let master = open(mdir.path(), opts(SEG));
    let slave = open(sdir.path(), opts(SEG));
    let batch: Vec<_> =
        (0..60).map(|i| msg("T", i % 3, &vec![i as u8; 1000 + i as usize * 37])).collect();
    master.append(&batch).unwrap();
    let mut at = 0u64;
    let mut cut = 1usize;
    while at < master.max_offset() {
        let chunk = master.read(at, cut).unwrap().unwrap();
        slave.append_at(at, &chunk).unwrap();
        at += chunk.len() as u64;
        cut = cut * 7 % 5003 + 1;
        assert_eq!(slave.max_offset(), at);
    }
    assert_eq!(all_bytes(&slave), all_bytes(&master));
    assert_eq!(slave.queue_offsets(), master.queue_offsets());
    assert_eq!(slave.dispatched_offset(), master.max_offset());
    assert!(slave.dispatch_error().is_none());
}

#[test]
fn slave_restart_drops_only_a_partial_last_record() {
    let mdir = tempfile::tempdir().unwrap();
    let sdir = tempfile::tempdir().unwrap();
    let master = open(mdir.path(), opts(SEG));
    let r = master.append(&[msg("T", 0, b"one"), msg("T", 0, b"two")]).unwrap();
    let mid = r.records[1].offset + 10;
    {
        let slave = open(sdir.path(), opts(SEG));
        slave.append_at(0, &master.read(0, mid as usize).unwrap().unwrap()).unwrap();
        assert_eq!(slave.max_offset(), mid);
        slave.close().unwrap();
    }
    let slave = open(sdir.path(), opts(SEG));
    assert_eq!(slave.max_offset(), r.records[1].offset);
    assert_eq!(slave.next_queue_offset("T", 0), 1);
}

#[tokio::test]
async fn sync_flush_waits_for_durability() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(SEG);
    o.flush_interval = Duration::from_secs(3600);
    let log = open(dir.path(), o);
    let r = log.append(&[msg("T", 0, b"durable")]).unwrap();
    assert!(log.flushed_offset() < r.end_offset);
    log.wait_flushed(r.end_offset).await.unwrap();
    assert!(log.flushed_offset() >= r.end_offset);
}

#[test]
fn retention_deletes_only_old_whole_files_never_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(SEG);
    o.file_reserved_time = Duration::from_secs(3600);
    let log = open(dir.path(), o);
    let batch: Vec<_> = (0..70).map(|i| msg("T", 0, &[i as u8; 3000])).collect();
    log.append(&batch).unwrap();
    let files = 1 + (log.max_offset() / SEG as u64);
    assert_eq!(files, 4);
    let now = SystemTime::now();
    assert!(log.run_retention(now).unwrap().is_empty(), "nothing is old yet");
    let removed = log.run_retention(now + Duration::from_secs(7200)).unwrap();
    assert_eq!(removed.len(), 3, "every file but the one being written");
    assert_eq!(log.min_offset(), 3 * SEG as u64);
    assert!(log.read(0, 10).is_err());
    assert!(log.read(3 * SEG as u64, 10).unwrap().is_some());
}

/// A store on `fs` holding twenty 3000-byte records, and its bytes.
fn twenty_records_on(fs: &std::sync::Arc<SimFs>, dir: &std::path::Path) -> (CommitLog, Vec<u8>) {
    let log = crate::support::open_sim(fs, dir, opts(SEG)).unwrap();
    let batch: Vec<_> = (0..20).map(|i| msg("T", 0, &[i as u8; 3000])).collect();
    log.append(&batch).unwrap();
    let before = all_bytes(&log);
    (log, before)
}

/// Thirty more: a batch that needs two new files.
fn thirty_more() -> Vec<hasync::store::record::Message> {
    (0..30).map(|i| msg("T", 0, &[i as u8; 3000])).collect()
}

#[test]
fn disk_full_refuses_the_put_and_harms_nothing_written() {
    let (dir, fs) = (tempfile::tempdir().unwrap(), std::sync::Arc::new(SimFs::new()));
    let (log, before) = twenty_records_on(&fs, dir.path());
    fs.set_disk_full(true);
    // This batch needs two new files (the store thread may have allocated the first ahead of
    // time): refused whole, and every part already written is undone.
    let more = thirty_more();
    let err = log.append(&more).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(all_bytes(&log), before);
    assert_eq!(log.next_queue_offset("T", 0), 20);
    fs.set_disk_full(false);
    let r = log.append(&more).unwrap();
    assert_eq!(r.records[0].queue_offset, 20);
    assert_eq!(log.records_from(0).count(), 50);
}

/// A reader (a master writer sending a frame, a gRPC Read) holds a slice of the file a failed
/// append must undo: the undo cuts only bytes never published, which no slice covers, so it does
/// not wait for the reader, and nothing of the failed batch stays in the log.
#[test]
fn a_failed_append_is_undone_at_once_while_a_reader_holds_a_slice_of_its_file() {
    let (dir, fs) = (tempfile::tempdir().unwrap(), std::sync::Arc::new(SimFs::new()));
    let (log, before) = twenty_records_on(&fs, dir.path());
    let held = log.read(0, 4096).unwrap().expect("a slice of the first file");
    fs.set_disk_full(true);
    let more = thirty_more();
    let started = std::time::Instant::now();
    let err = log.append(&more).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "the undo waited for the reader");
    assert_eq!(all_bytes(&log), before, "nothing of the failed batch stays");
    fs.set_disk_full(false);
    let r = log.append(&more).unwrap();
    assert_eq!(r.records[0].queue_offset, 20);
    assert_eq!(log.records_from(0).count(), 50);
    assert_eq!(&held[..], &before[..4096], "the reader's slice never changed");
}

#[test]
fn retention_frees_a_disk_fuller_than_the_ratio_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(SEG);
    o.disk_max_used_ratio = 1e-9; // any real disk is fuller than this
    let log = open(dir.path(), o);
    let batch: Vec<_> = (0..70).map(|i| msg("T", 0, &[i as u8; 3000])).collect();
    log.append(&batch).unwrap();
    let removed = log.run_retention(SystemTime::now()).unwrap();
    let names: Vec<String> =
        removed.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, (0..3).map(|i| hasync::store::file_name(i * SEG as u64)).collect::<Vec<_>>());
    assert_eq!(log.min_offset(), 3 * SEG as u64, "the file being written stays");
}

#[test]
fn truncate_at_a_record_boundary_rebuilds_queue_offsets_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    let batch: Vec<_> = (0..60).map(|i| msg("T", i % 3, &[i as u8; 3000])).collect();
    let r = log.append(&batch).unwrap();
    log.checkpoint_blocking().unwrap();
    let cut = r.records[25].offset;
    assert!(log.truncate(cut + 1).is_err(), "not a record boundary");
    assert_eq!(log.max_offset(), r.end_offset, "a refused cut changes nothing");
    log.truncate(cut).unwrap();
    assert_eq!(log.max_offset(), cut);
    assert_eq!(log.records_from(0).count(), 25);
    assert_eq!((log.next_queue_offset("T", 0), log.next_queue_offset("T", 1)), (9, 8));
    let a = log.append(&[msg("T", 1, b"after")]).unwrap();
    assert_eq!((a.records[0].offset, a.records[0].queue_offset), (cut, 8));
    drop(log);
    let log = open(dir.path(), opts(SEG));
    assert_eq!(log.max_offset(), a.end_offset);
    assert_eq!(log.records_from(0).count(), 26);
    log.wipe().unwrap();
    assert!(log.is_empty() && log.max_offset() == 0 && log.next_queue_offset("T", 0) == 0);
}

/// The slave's path passes the same fence: an `append_at` parked at the store's entry while
/// the fence goes up is refused when it goes on, and nothing of it lands; `set_writes` itself
/// waits for a write that holds the writer lock.
#[test]
fn a_replicated_write_parked_while_the_fence_goes_up_is_refused() {
    use hasync::store::Writes;
    use std::sync::{Arc, Mutex, mpsc};
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), opts(SEG));
    log.set_writes(Writes::Replicated);
    log.append_at(0, b"kept").unwrap();
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    log.set_write_hook(Some(Arc::new(move || {
        let _ = parked_tx.send(());
        let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
    })));
    std::thread::scope(|s| {
        let racing = s.spawn(|| log.append_at(4, b"late"));
        parked_rx.recv_timeout(Duration::from_secs(10)).expect("the write is parked");
        log.set_writes(Writes::Fenced);
        release_tx.send(()).unwrap();
        let err = racing.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Fenced), "{err}");
    });
    log.set_write_hook(None);
    assert_eq!(log.max_offset(), 4, "nothing appended after the fence");
    assert_eq!(all_bytes(&log), b"kept");
    assert!(matches!(log.append(&[msg("T", 0, b"put")]).unwrap_err(), Error::Fenced));
    log.set_writes(Writes::Replicated);
    assert_eq!(log.append_at(4, b"next").unwrap(), 8, "open again for the slave's path");
}

/// The nice values of this process's threads named `name` (from /proc/self/task/*/stat).
fn thread_nices(name: &str) -> Vec<i64> {
    let mut nices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the name's closing parenthesis: the state is field 3, nice field 19.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
        if comm.trim_end() == name
            && let Some(nice) = after.split_whitespace().nth(16).and_then(|n| n.parse().ok())
        {
            nices.push(nice);
        }
    }
    nices
}

/// Waits (at most 10 s) until some thread named `name` runs at `nice`.
fn some_thread_at(name: &str, nice: i64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if thread_nices(name).contains(&nice) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// This thread's nice value (the test process's, which the store's threads start from).
fn own_nice() -> i64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after.split_whitespace().nth(16).unwrap().parse().unwrap()
}

/// Opens a store with `o`, appends, and waits until its store thread flushed (it sets its
/// priority before its first flush).
fn open_and_flush(dir: &std::path::Path, o: hasync::store::StoreOptions) -> CommitLog {
    let log = open(dir, o);
    let end = log.append(&[msg("T", 0, b"a")]).unwrap().end_offset;
    log.request_flush(end);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while log.flushed_offset() < end {
        assert!(std::time::Instant::now() < deadline, "the store thread did not flush");
        std::thread::sleep(Duration::from_millis(5));
    }
    log
}

#[test]
fn background_threads_run_below_the_process_priority_except_a_store_thread_puts_wait_for() {
    // Nice offsets no other test's store uses, so that these threads are told apart.
    let below = |by: i64| (own_nice() + by).min(19);
    let with = |nice: u8| hasync::store::StoreOptions {
        background_nice: nice,
        scrub_rate: 1 << 20,
        ..opts(SEG)
    };
    let dir = tempfile::tempdir().unwrap();
    let log = open_and_flush(dir.path(), with(7));
    assert!(some_thread_at("hasync-store", below(7)), "{:?}", thread_nices("hasync-store"));
    assert!(some_thread_at("hasync-scrub", below(7)), "{:?}", thread_nices("hasync-scrub"));
    drop(log);

    // Under sync flush puts wait for the store thread, and a master's SYNC puts for a slave's
    // when its acks wait for its flushes: it keeps the process's priority, the scrub does not.
    for (nice, o) in [
        (6, hasync::store::StoreOptions { flush: hasync::store::FlushPolicy::Sync, ..with(6) }),
        (5, hasync::store::StoreOptions { acks_wait_for_flushes: true, ..with(5) }),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let _log = open_and_flush(dir.path(), o);
        assert!(some_thread_at("hasync-scrub", below(nice)), "{:?}", thread_nices("hasync-scrub"));
        let store = thread_nices("hasync-store");
        assert!(!store.contains(&below(nice)), "nice {nice}: {store:?}");
    }
}
