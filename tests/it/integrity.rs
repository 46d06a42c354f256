//! Store integrity (issue 15, defect 4 and 9e, 9g): damage below the checkpoint is found
//! wherever it is. A Read at a damaged record answers DATA_LOSS naming the file, the offset and
//! what failed; a batch Read returns the good records before it; the background scrub and
//! `hasync verify` report it; a clean start reads nothing past the end of the data.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasync::control::pb;
use hasync::control::pb::messages_client::MessagesClient;
use hasync::store::fs::StdFs;
use hasync::store::{CommitLog, Error, file_name};
use tonic::Code;

use crate::metrics::scrape;
use crate::support::grpc::pb_msg;
use crate::support::process::{Serve, serve_command};
use crate::support::{msg, open, opts};

const SEG: usize = 64 * 1024;

/// A `hasync serve` child (the shared [`Serve`]) with the addresses it logged at start.
struct Served {
    serve: Serve,
    grpc: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
}

impl Served {
    /// Starts `hasync serve --config CONFIG` (data in `data` beside it) and waits for its
    /// addresses.
    fn start(config: &Path) -> Self {
        let data = config.parent().unwrap().join("data");
        let serve = Serve::spawn(serve_command(config, &data));
        let (grpc, _, metrics) = serve.addresses();
        Self { serve, grpc, metrics }
    }

    fn log(&self) -> String {
        self.serve.log()
    }

    /// The gRPC URL the node logged.
    fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// SIGTERM (a clean stop) or SIGKILL (an unclean one), then waits at most 30 s for the exit.
    fn stop(mut self, sig: &str) {
        self.serve.signal(sig);
        if self.serve.wait_exit(Duration::from_secs(30)).is_none() {
            panic!("no exit 30 s after SIG{sig}:\n{}", self.log());
        }
    }
}

/// A node config: 64 KiB segments, loopback listeners on OS ports, `extra` appended.
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let config = dir.join("hasync.toml");
    let data = dir.join("data");
    std::fs::write(
        &config,
        format!(
            r#"[node]
name = "integrity"
data-dir = "{}"
[store]
segment-size = "64KiB"
max-message-size = "16KiB"
flush-interval = "50ms"
{extra}
[ha]
listen = "127.0.0.1:0"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
"#,
            data.display()
        ),
    )
    .unwrap();
    config
}

/// The body of the `i`th message put: recognisable on disk.
fn body(i: usize) -> Vec<u8> {
    format!("integrity-body-{i:05}-").repeat(40).into_bytes()
}

/// Puts `n` messages one batch of 10 at a time.
async fn put_all(url: &str, n: usize) {
    let mut c = MessagesClient::connect(url.to_owned()).await.unwrap();
    for start in (0..n).step_by(10) {
        let messages = (start..(start + 10).min(n)).map(|i| pb_msg("Orders", &body(i))).collect();
        let r = c.put(pb::PutRequest { messages }).await.unwrap().into_inner();
        assert_eq!(r.status(), pb::PutStatus::PutOk, "{r:?}");
    }
}

/// Flips one byte of the body of message `i` in segment file `seg` of `data`; returns the
/// commitlog offset of the byte.
fn flip_body_byte(data: &Path, seg: u64, i: usize) -> u64 {
    let path = data.join("commitlog").join(file_name(seg));
    let mut bytes = std::fs::read(&path).unwrap();
    let needle = body(i);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("message {i} is not in {}", path.display()));
    bytes[at + 7] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();
    seg + at as u64
}

/// Every message from `from` on, read in batches, until the read fails; returns the offsets of
/// the messages read and the error that ended the reads (bounded).
async fn read_until_error(url: &str, from: i64) -> (Vec<i64>, tonic::Status) {
    let mut c = MessagesClient::connect(url.to_owned()).await.unwrap();
    let (mut got, mut at) = (Vec::new(), from);
    for _ in 0..1000 {
        let req = pb::ReadRequest { offset: at, max_messages: 1024, ..Default::default() };
        match c.read(req).await {
            Ok(r) => {
                let r = r.into_inner();
                assert!(
                    !r.messages.is_empty() || r.next_offset != at,
                    "an empty answer with next_offset unchanged at {at}: a consumer spins"
                );
                got.extend(r.messages.iter().map(|m| m.physical_offset));
                assert!(r.next_offset < r.max_offset, "no damage found up to the end: {got:?}");
                at = r.next_offset;
            }
            Err(status) => return (got, status),
        }
    }
    panic!("1000 reads and no end");
}

/// A CRC flip in an older (sealed) segment, after a clean and then after an unclean stop: the
/// node starts, a batch Read from the first record returns every good record before the damaged
/// one and stops there, and the Read at the damaged record answers DATA_LOSS naming the file,
/// the offset and the CRC that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_in_an_older_segment_answers_data_loss_after_any_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), "");
    let data = tmp.path().join("data");
    let served = Served::start(&config);
    let url = served.url();
    put_all(&url, 200).await;
    served.stop("TERM");
    let damaged_byte = flip_body_byte(&data, 0, 20);

    for sig in ["KILL", "TERM"] {
        let served = Served::start(&config);
        let url = served.url();
        let (got, status) = read_until_error(&url, 0).await;
        assert_eq!(status.code(), Code::DataLoss, "{status:?}\n{}", served.log());
        let msg = status.message();
        let record = *got.last().unwrap() as u64;
        assert!(record < damaged_byte, "{got:?}");
        assert_eq!(got.len(), 20, "the 20 good records before the damaged one: {got:?}");
        let file = data.join("commitlog").join(file_name(0));
        assert!(msg.contains(&file.display().to_string()), "names the file: {msg}");
        assert!(msg.contains("crc"), "says what failed: {msg}");
        // The damaged record is where the good ones end.
        let mut c = MessagesClient::connect(url.clone()).await.unwrap();
        let last = c
            .read(pb::ReadRequest { offset: record as i64, max_messages: 1, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let damaged_at = last.next_offset;
        assert!(msg.contains(&format!("offset {damaged_at}")), "names the offset: {msg}");
        // A read from inside a record is still the caller's mistake, not damage.
        let inside = c
            .read(pb::ReadRequest { offset: record as i64 + 5, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(inside.code(), Code::InvalidArgument, "{inside:?}");
        served.stop(sig);
    }
}

/// 9e: a checkpoint that claims more than the segment files hold is refused naming the
/// checkpoint file itself (`<data-dir>/checkpoint`), not a path inside the commitlog directory.
#[test]
fn a_checkpoint_past_the_end_of_the_files_is_reported_under_its_own_path() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), opts(SEG));
        for _ in 0..3 {
            log.append(&[msg("T", 0, &vec![7u8; SEG / 2])]).unwrap();
        }
        log.close().unwrap();
    }
    let commitlog = dir.path().join("commitlog");
    let mut files: Vec<_> =
        std::fs::read_dir(&commitlog).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    // Only the first file is left: the checkpoint claims offsets past its end.
    for f in &files[1..] {
        std::fs::remove_file(f).unwrap();
    }
    let err = CommitLog::open(Arc::new(StdFs), dir.path(), opts(SEG)).unwrap_err();
    let Error::Corruption { file, .. } = &err else { panic!("{err}") };
    assert_eq!(file, &dir.path().join("checkpoint"), "{err}");
}

/// What lets a clean start skip the unused tail: after a clean stop no byte past the end of
/// the data is non-zero, also after a cut (a truncate) and a failed append's undo.
#[test]
fn after_a_clean_stop_nothing_past_the_end_of_the_data_is_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(hasync::store::fs::SimFs::new());
    let end = {
        let log = crate::support::open_sim(&fs, dir.path(), opts(SEG)).unwrap();
        let r = log.append(&[msg("T", 0, &[1; 3000]), msg("T", 0, &[2; 3000])]).unwrap();
        log.append(&[msg("T", 0, &[3; 9000])]).unwrap();
        log.truncate(r.records[1].offset).unwrap();
        // A put that needs two new segments (one more than a prepared spare) on a full disk
        // is undone: 70 records of about 2.1 KiB run past the rest of the first segment
        // (about 61 KiB) and the whole of the next.
        fs.set_disk_full(true);
        let big: Vec<_> = (0..70).map(|_| msg("T", 1, &[4; 2000])).collect();
        assert!(log.append(&big).is_err());
        fs.set_disk_full(false);
        log.append(&[msg("T", 0, &[5; 100])]).unwrap();
        let end = log.max_offset();
        log.close().unwrap();
        end
    };
    let mut files: Vec<_> = std::fs::read_dir(dir.path().join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let first = std::fs::read(&files[0]).unwrap();
    assert!(first[end as usize..].iter().all(|&b| b == 0), "non-zero bytes past {end}");
    for f in &files[1..] {
        assert!(std::fs::read(f).unwrap().iter().all(|&b| b == 0), "{}", f.display());
    }
}

/// The resident size of this process's mapping of `path`, from /proc/self/smaps: the pages
/// touched through it.
fn mapped_rss_bytes(path: &Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .expect("this test reads /proc/self/smaps (Linux) to count the pages a mapping touched");
    let name = path.display().to_string();
    let mut rss = None;
    let mut inside = false;
    for line in smaps.lines() {
        let is_header = line.split_whitespace().next().is_some_and(|f| f.contains('-'))
            && !line.ends_with("kB");
        if is_header {
            inside = line.ends_with(&name);
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap();
            rss = Some(rss.unwrap_or(0) + kb * 1024);
        }
    }
    rss.unwrap_or_else(|| panic!("{name} is not mapped by this process"))
}

/// 9g: a clean start whose last segment holds a few records does not read the unused rest of
/// it: the pages touched through the store's mapping of that file stay a small part of it.
#[test]
fn a_clean_start_does_not_read_the_unused_tail_of_the_last_segment() {
    const BIG: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), opts(BIG));
        log.append(&[msg("T", 0, b"one"), msg("T", 0, b"two"), msg("T", 1, b"three")]).unwrap();
        log.close().unwrap();
    }
    let last = dir.path().join("commitlog").join(file_name(0));
    let log = open(dir.path(), opts(BIG));
    assert!(log.recovery_report().clean);
    assert_eq!(log.records_from(0).count(), 3);
    let touched = mapped_rss_bytes(&last);
    assert!(
        touched < (BIG / 16) as u64,
        "a clean start touched {touched} bytes of the {BIG}-byte last segment"
    );
    log.close().unwrap();
}

/// `hasync verify` on `data`: exit status and stdout.
fn verify(data: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(assert_cmd::cargo::cargo_bin("hasync"))
        .args(["verify", "--data-dir"])
        .arg(data)
        .output()
        .expect("run hasync verify");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// `hasync verify` on a stopped node's data dir: each segment checked with its records, exit 0
/// when intact; after a CRC flip in an older segment, the damage with file, offset and what
/// failed, and a non-zero exit; the same after an unclean stop. It changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hasync_verify_lists_every_segment_and_every_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), "");
    let data = tmp.path().join("data");
    let served = Served::start(&config);
    put_all(&served.url(), 200).await;
    served.stop("TERM");

    let (code, out, err) = verify(&data);
    assert_eq!(code, Some(0), "{out}{err}");
    let segments: Vec<_> = out.lines().filter(|l| l.starts_with("segment ")).collect();
    assert!(segments.len() >= 3, "one line per segment: {out}");
    assert!(out.contains(&format!("{}: ", data.join("commitlog").join(file_name(0)).display())));
    assert!(out.contains("200 record(s)") && out.contains("no damage found"), "{out}");

    let damaged_byte = flip_body_byte(&data, SEG as u64, 90);
    let before = std::fs::read(data.join("commitlog").join(file_name(SEG as u64))).unwrap();
    let (code, out, err) = verify(&data);
    assert_eq!(code, Some(1), "{out}{err}");
    let file = data.join("commitlog").join(file_name(SEG as u64));
    let line = out
        .lines()
        .find(|l| l.starts_with("damage: "))
        .unwrap_or_else(|| panic!("no damage line: {out}"));
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(line.contains("crc"), "{line}");
    let offset: u64 =
        line.split("at offset ").nth(1).unwrap().split(':').next().unwrap().parse().unwrap();
    assert!(offset < damaged_byte && damaged_byte - offset < 2000, "{offset} vs {damaged_byte}");
    assert!(err.contains("error: 1 damaged"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "verify changes nothing");

    // After an unclean stop (the abort marker left), the same damage is found.
    let served = Served::start(&config);
    served.url();
    served.stop("KILL");
    let (code, out, _) = verify(&data);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("last stop unclean") && out.contains(&format!("at offset {offset}")),
        "{out}"
    );
    let (code, _, err) = verify(&tmp.path().join("nothing-here"));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not a data directory"), "{err}");
}

/// The background scrub, on by default: a CRC flip in a sealed segment is found without any
/// read, reported in GetStatus (file, offset, what failed) and in the `hasync_scrub_*` metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrub_reports_damage_in_a_sealed_segment_in_status_and_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), "scrub-rate = \"64MiB\"");
    let data = tmp.path().join("data");
    let served = Served::start(&config);
    put_all(&served.url(), 200).await;
    served.stop("TERM");
    flip_body_byte(&data, 0, 33);

    let served = Served::start(&config);
    let url = served.url();
    let metrics = served.metrics;
    let mut c = pb::replication_client::ReplicationClient::connect(url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrub = loop {
        let s = c.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
        let scrub = s.scrub.expect("ReplicationStatus.scrub is set");
        if scrub.passes >= 1 {
            break scrub;
        }
        assert!(Instant::now() < deadline, "no scrub pass in 30 s: {scrub:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(scrub.rate_bytes_per_sec, 64 << 20);
    assert_eq!(scrub.damaged_segments, 1, "{scrub:?}");
    assert!(scrub.segments_checked >= 2, "every sealed segment: {scrub:?}");
    let d = &scrub.damage[0];
    assert_eq!(d.file, data.join("commitlog").join(file_name(0)).display().to_string());
    assert!(d.reason.contains("crc"), "{d:?}");
    assert!(d.offset > 0 && (d.offset as usize) < SEG, "{d:?}");

    let m = scrape(metrics).await;
    assert_eq!(m.value("hasync_scrub_damaged_segments", &[]), 1.0);
    assert!(m.value("hasync_scrub_passes_total", &[]) >= 1.0);
    assert!(m.value("hasync_scrub_checked_segments_total", &[]) >= 2.0);
    assert!(m.value("hasync_scrub_checked_bytes_total", &[]) >= SEG as f64);
    assert_eq!(m.value("hasync_scrub_rate_bytes_per_second", &[]), (64 << 20) as f64);
    assert!(m.value("hasync_scrub_last_pass_timestamp_seconds", &[]) > 1.0e9);
    served.stop("TERM");
}

/// One scrub pass over a store: every sealed segment checked, the damaged one reported once
/// with its file, offset and reason; the last (unsealed) file is not the scrub's; the default
/// configuration scrubs at a low rate.
#[test]
fn a_scrub_pass_checks_every_sealed_segment_and_names_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let o = || hasync::store::StoreOptions { scrub_rate: 0, ..opts(SEG) };
    {
        let log = open(dir.path(), o());
        for i in 0..100 {
            log.append(&[msg("T", 0, &body(i).repeat(3))]).unwrap();
        }
        assert!(log.max_offset() > 3 * SEG as u64, "{}", log.max_offset());
        log.close().unwrap();
    }
    let damaged = flip_body_byte(dir.path(), SEG as u64, 35);
    let log = open(dir.path(), o());
    assert_eq!(log.scrub_status().rate_bytes_per_sec, 0);
    let pass = log.scrub_now();
    let sealed = log.max_offset() / SEG as u64;
    assert_eq!(pass.segments, sealed, "{pass:?}");
    assert_eq!(pass.damage.len(), 1, "{pass:?}");
    let d = &pass.damage[0];
    assert_eq!(d.file, dir.path().join("commitlog").join(file_name(SEG as u64)));
    assert!(d.offset < damaged && damaged - d.offset < 2000 && d.reason.contains("crc"), "{d}");
    let status = log.scrub_status();
    assert_eq!((status.passes, status.damaged_segments), (1, 1), "{status:?}");
    assert_eq!(status.damage, pass.damage);
    // The records of the other segments read as before; the damaged one answers with its
    // damage, and a read inside a record is told apart.
    assert!(
        matches!(log.unreadable_at(d.offset), Some(hasync::store::Unreadable::Damaged(x)) if x == *d)
    );
    assert!(matches!(
        log.unreadable_at(d.offset + 3),
        Some(hasync::store::Unreadable::NotARecordStart { record_start }) if record_start == d.offset
    ));
    // The scrub reads with plain reads: nothing of the sealed segments it checked is mapped
    // into the process (it holds no slice a truncate would wait for).
    let third = dir.path().join("commitlog").join(file_name(2 * SEG as u64));
    assert!(mapped_rss_bytes(&third) < SEG as u64 / 4, "{}", mapped_rss_bytes(&third));
    // A cut at the damaged record: it and the segments past it are gone, the segment cut is
    // no longer sealed; the damage goes with the cut and none is made up.
    log.truncate(d.offset).unwrap();
    let pass = log.scrub_now();
    assert_eq!((pass.segments, pass.damage.len()), (1, 0), "{pass:?}");
    assert_eq!(log.scrub_status().damaged_segments, 0);
    log.close().unwrap();
    assert!(hasync::store::StoreOptions::default().scrub_rate > 0, "on by default");
}

/// Damage in the first record of a segment: a batch Read from the previous segment returns its
/// records and stops before the end-of-file blank; the next Read crosses the blank and answers
/// DATA_LOSS naming the damaged record at the start of the next segment (not the blank).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_at_the_start_of_a_segment_is_reported_past_the_blank() {
    use crate::support::grpc::ApiNode;
    use crate::support::ha::node_config;
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(dir.path(), hasync::config::Role::Master);
    let n = ApiNode::start(config.clone()).await;
    put_all(&n.url, 100).await;
    n.stop().await;
    let path = dir.path().join("commitlog").join(file_name(SEG as u64));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[300] ^= 0x01; // inside the body of the segment's first record
    std::fs::write(&path, bytes).unwrap();

    let n = ApiNode::start(config).await;
    let (got, status) = read_until_error(&n.url, 0).await;
    assert!(!got.is_empty() && got.iter().all(|&o| (o as usize) < SEG), "{got:?}");
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    let msg = status.message();
    assert!(msg.contains(&format!("at offset {SEG}:")), "{msg}");
    assert!(msg.contains(&path.display().to_string()) && msg.contains("crc"), "{msg}");
    n.stop().await;
}

/// A slave's checked write of a damaged record that arrives in two frames (the first ends inside
/// it, as frames cut records anywhere): the part from the first frame was stored and published,
/// so the refusal of the second cuts back to the damaged record's start. Nothing of it stays
/// stored, published or acked (max offset and flushed offset are its start, where a Read
/// answers nothing), and the intact record from a repaired master then joins nothing old.
#[test]
fn a_refused_damaged_record_leaves_nothing_of_it_stored_on_the_slave() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = || hasync::store::StoreOptions { scrub_rate: 0, ..opts(SEG) };
    let master = open(md.path(), o());
    for i in 0..3u8 {
        master.append(&[msg("T", 0, &[b'a' + i; 1000])]).unwrap();
    }
    let size = master.max_offset() / 3;
    let intact = master.read(0, usize::MAX).unwrap().unwrap().to_vec();
    let mut bytes = intact.clone();
    bytes[(size + size / 2) as usize] ^= 0x40;
    let slave = open(sd.path(), o());
    let split = size as usize + 100;
    assert_eq!(slave.append_at_checked(0, &bytes[..split]).unwrap(), split as u64);
    slave.flush_blocking().unwrap();
    let refused = slave.append_at_checked(split as u64, &bytes[split..]);
    assert!(
        matches!(refused, Err(Error::DamagedRecord { offset, .. }) if offset == size),
        "{refused:?}"
    );
    assert_eq!(slave.dispatched_offset(), size);
    let mut reader = slave.records_from(size);
    assert!(reader.next().is_none(), "nothing to read at the damaged record's start");
    assert_eq!(
        slave.max_offset(),
        size,
        "{} bytes of the refused damaged record stay stored and published (acked; a Read at {size} \
         answers nothing with max_offset beyond it)",
        slave.max_offset() - size
    );
    assert!(slave.flushed_offset() <= size, "flushed (acked) {}", slave.flushed_offset());
    // The repaired master sends the record again from its start: the slave holds the
    // master's bytes exactly.
    let end = slave.append_at_checked(size, &intact[size as usize..]).unwrap();
    assert_eq!(end, master.max_offset());
    assert_eq!(slave.read(0, usize::MAX).unwrap().unwrap().to_vec(), intact);
    slave.close().unwrap();
    master.close().unwrap();
}

/// `hasync verify` on a directory without a checkpoint (a node killed before its first one,
/// or a lost checkpoint file) whose last file is the prepared spare (all zero: the store
/// thread makes the next segment ahead under its final name): the spare is not the file being
/// written, the one before it is, and neither is damage (a start adopts the spare and loses
/// nothing).
#[test]
fn verify_without_a_checkpoint_does_not_call_the_spare_s_predecessor_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let o = || hasync::store::StoreOptions { scrub_rate: 0, ..opts(SEG) };
    let log = open(dir.path(), o());
    let mut i = 0u32;
    while log.max_offset() < SEG as u64 + 100 {
        log.append(&[msg("T", 0, &format!("body-{i:06}-").repeat(60).into_bytes())]).unwrap();
        i += 1;
    }
    let spare = dir.path().join("commitlog").join(file_name(2 * SEG as u64));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !spare.exists() {
        assert!(Instant::now() < deadline, "no spare segment prepared in 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let max = log.max_offset();
    log.close().unwrap();
    std::fs::remove_file(dir.path().join(hasync::store::checkpoint::CHECKPOINT_FILE)).unwrap();
    let report = hasync::store::verify::verify_data_dir(dir.path(), |_| {}).unwrap();
    let log = open(dir.path(), o());
    assert_eq!(log.max_offset(), max, "a start keeps every record");
    log.close().unwrap();
    assert!(
        report.damage.is_empty(),
        "verify reports damage a start does not see: {:?}",
        report.damage
    );
    assert_eq!(report.segments.len(), 3, "the spare is listed: {:?}", report.segments);
}
