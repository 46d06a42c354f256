//! The background scrub against retention, truncate and wipe: segments removed while a (slow)
//! scrub pass is under way give their space back at once and are not reported as damage.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use hasync::store::{StoreOptions, file_name};

use crate::support::tmpfs::Tmpfs;
use crate::support::{msg, open, opts};

const SEG: usize = 64 * 1024;

/// Far enough in the future that every segment is past `file-reserved-time`.
fn far_future() -> SystemTime {
    SystemTime::now() + Duration::from_secs(10 * 365 * 86400)
}

/// Fills a store in `dir` (segments of `seg` bytes) until at least `sealed` segments are full
/// and one more is being written.
fn fill(dir: &Path, seg: usize, sealed: u64) {
    let log = open(dir, StoreOptions { scrub_rate: 0, warm_segments: false, ..opts(seg) });
    let mut i = 0u32;
    while log.max_offset() < sealed * seg as u64 + 100 {
        log.append(&[msg("T", 0, &format!("scrub-body-{i:06}-").repeat(60).into_bytes())]).unwrap();
        i += 1;
    }
    log.close().unwrap();
}

fn segment(dir: &Path, seg: usize, n: u64) -> PathBuf {
    dir.join("commitlog").join(file_name(n * seg as u64))
}

/// Whether this process has `path` open as a file descriptor.
fn has_open_fd(path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target == path || target.to_string_lossy() == format!("{} (deleted)", path.display())
        })
    })
}

/// Lines of /proc/self/maps that map a deleted file of `dir`'s commitlog.
fn deleted_mappings(dir: &Path) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps is readable");
    let commitlog = dir.join("commitlog").display().to_string();
    maps.lines()
        .filter(|l| l.contains(&commitlog) && l.ends_with("(deleted)"))
        .map(String::from)
        .collect()
}

/// Waits (bounded) until the scrub thread has `first` open: a pass is under way on it.
fn wait_scrub_reading(first: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !has_open_fd(first) {
        assert!(Instant::now() < deadline, "the scrub never opened {}", first.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Retention that removes segments while a scrub pass is under way: the files the pass has not
/// reached yet are gone, which is not damage (no "read failed: No such file or directory", no
/// `hasync_scrub_damaged_segments`, whose alert is critical).
#[test]
fn retention_during_a_scrub_pass_is_not_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), SEG, 4);
    // One segment per second: the pass is still on the first segment when retention runs.
    let log = open(dir.path(), StoreOptions { scrub_rate: SEG as u64, ..opts(SEG) });
    wait_scrub_reading(&segment(dir.path(), SEG, 0));
    let removed = log.run_retention(far_future()).unwrap();
    assert!(removed.len() >= 3, "retention removed the old segments: {removed:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.scrub_status().passes == 0 {
        assert!(Instant::now() < deadline, "no scrub pass in 30 s: {:?}", log.scrub_status());
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = log.scrub_status();
    assert_eq!(
        status.damaged_segments, 0,
        "segments retention removed reported as damage: {status:?}"
    );
    log.close().unwrap();
}

/// Segments retention removes while the (slow) scrub is on the first one: none of them stays
/// mapped or open once retention returns, so their space is free when retention looks at the
/// disk again.
#[test]
fn segments_retention_removes_during_a_scrub_pass_release_their_space() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), SEG, 4);
    // 1 KiB/s: the scrub stays on the first segment for about a minute.
    let log = open(dir.path(), StoreOptions { scrub_rate: 1024, ..opts(SEG) });
    wait_scrub_reading(&segment(dir.path(), SEG, 0));
    let removed = log.run_retention(far_future()).unwrap();
    assert!(removed.len() >= 3, "retention removed the old segments: {removed:?}");
    let mapped = deleted_mappings(dir.path());
    let open_fds: Vec<_> = removed.iter().filter(|p| has_open_fd(p)).collect();
    log.close().unwrap();
    assert!(
        mapped.is_empty(),
        "removed segments still mapped (their space not freed): {mapped:#?}"
    );
    assert!(open_fds.is_empty(), "removed segments still open: {open_fds:?}");
}

/// The same for the files a truncate cuts away and a wipe (`force_resync`) removes while the
/// scrub is on the first segment: nothing removed stays mapped or open.
#[test]
fn a_truncate_and_a_wipe_during_a_scrub_pass_release_the_removed_segments() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), SEG, 4);
    let log = open(dir.path(), StoreOptions { scrub_rate: 1024, ..opts(SEG) });
    let first = segment(dir.path(), SEG, 0);
    wait_scrub_reading(&first);
    // A cut at the start of the third segment removes every later one.
    log.truncate(2 * SEG as u64).unwrap();
    // (The store thread may prepare a new, empty, third segment at once.)
    let cut_away: Vec<_> = (2..=4).map(|n| segment(dir.path(), SEG, n)).collect();
    assert!(cut_away[1..].iter().all(|p| !p.exists()), "truncate removed the later segments");
    let mapped = deleted_mappings(dir.path());
    let open_fds: Vec<_> = cut_away.iter().filter(|p| has_open_fd(p)).collect();
    assert!(mapped.is_empty(), "segments the truncate removed still mapped: {mapped:#?}");
    assert!(open_fds.is_empty(), "segments the truncate removed still open: {open_fds:?}");
    // The scrub goes on with the first segment, which the cut kept.
    assert!(has_open_fd(&first), "the scrub still reads {}", first.display());
    log.wipe().unwrap();
    assert!(!first.exists(), "the wipe removed the first segment");
    let mapped = deleted_mappings(dir.path());
    let still_open = has_open_fd(&first);
    log.close().unwrap();
    assert!(mapped.is_empty(), "segments the wipe removed still mapped: {mapped:#?}");
    assert!(!still_open, "the segment the scrub read stays open after the wipe");
}

/// Blocks used and available (for a non-root user) on the file system of `dir`.
fn blocks(dir: &Path) -> (f64, f64) {
    let out = Command::new("stat").args(["-f", "-c", "%b %f %a"]).arg(dir).output();
    let out = String::from_utf8(out.expect("run stat -f").stdout).unwrap();
    let v: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0] - v[1], v[2])
}

/// Disk-ratio retention while a scrub pass is under way: the disk is about two and a half
/// segments fuller than `disk-max-used-ratio`, so retention removes three of the oldest
/// segments, not every one but the last (which it would if removed segments kept their space
/// while the scrub holds them).
#[test]
fn disk_ratio_retention_during_a_scrub_pass_removes_only_what_it_needs() {
    const BIG: usize = 256 * 1024;
    let fs = Tmpfs::mount("8m");
    let dir = fs.path().join("data");
    fill(&dir, BIG, 12);
    let (used, avail) = blocks(&dir);
    let block = 4096.0;
    let ratio = (used - 2.5 * BIG as f64 / block) / (used + avail);
    let o = StoreOptions { scrub_rate: 1024, disk_max_used_ratio: ratio, ..opts(BIG) };
    let log = open(&dir, o);
    let files_before = std::fs::read_dir(dir.join("commitlog")).unwrap().count();
    wait_scrub_reading(&segment(&dir, BIG, 0));
    let removed = log.run_retention(SystemTime::now()).unwrap();
    log.close().unwrap();
    assert!(
        (3..=4).contains(&removed.len()),
        "disk-ratio retention removed {} of {files_before} files to free about 2.5 segments: \
         {removed:#?}",
        removed.len()
    );
}

/// A damaged TOTALSIZE field that claims more than the largest record the store takes
/// (`store.max-message-size` plus the header, topic and properties) is damage named so, found
/// without reading the claimed megabytes whole: the scrub and `hasync verify` read in chunks.
#[test]
fn a_size_field_claiming_more_than_the_largest_record_is_damage() {
    const BIG: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let o = || StoreOptions { scrub_rate: 0, warm_segments: false, ..opts(BIG) };
    let log = open(dir.path(), o());
    let mut i = 0u32;
    while log.max_offset() < BIG as u64 + 100 {
        let body = format!("size-body-{i:06}-").repeat(4000).into_bytes();
        log.append(&[msg("T", 0, &body)]).unwrap();
        i += 1;
    }
    log.close().unwrap();
    // The third record of the first segment claims 5 MiB more than it holds.
    let path = segment(dir.path(), BIG, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut at = 0usize;
    for _ in 0..2 {
        at += i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    let size = i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let claimed = size + (5 << 20);
    bytes[at..at + 4].copy_from_slice(&claimed.to_be_bytes());
    std::fs::write(&path, bytes).unwrap();

    let report = hasync::store::verify::verify_data_dir(dir.path(), |_| {}).unwrap();
    let d = report.damage.first().expect("verify finds the damage");
    assert_eq!((d.file.as_path(), d.offset), (path.as_path(), at as u64), "{d}");
    assert!(d.reason.contains("largest record"), "{d}");
    let log = open(dir.path(), o());
    let pass = log.scrub_now();
    log.close().unwrap();
    let d = pass.damage.first().expect("the scrub finds the damage");
    assert_eq!((d.file.as_path(), d.offset), (path.as_path(), at as u64), "{d}");
    assert!(d.reason.contains("largest record") && d.reason.contains(&claimed.to_string()), "{d}");
}
