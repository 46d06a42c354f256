//! Races between the store's writers and its readers (issue 14, points 3 and 4): a Read never
//! shows bytes a truncate is rewriting, and a segment file being created never holds up reads,
//! status calls or puts that do not need it.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb;
use hasync::node::PutStatus;
use hasync::node::role::RoleRequest;
use hasync::store::fs::{FileSystem, SimFs};
use hasync::store::record::{self, Decoded};

use crate::support::grpc::ApiNode;
use crate::support::ha::{node_config, slave_node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

/// How long a call that must not wait on the file system may take (loose: a loaded machine).
const BOUND: Duration = Duration::from_secs(5);

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f).await.unwrap_or_else(|_| panic!("{what} did not complete"))
}

fn grpc_addr(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

// The request gains fields (issue 14, point 6) that this test leaves at their defaults.
#[allow(clippy::needless_update)]
fn read_req(offset: u64) -> pb::ReadRequest {
    pb::ReadRequest {
        offset: offset as i64,
        max_bytes: 16 << 20,
        max_messages: 1024,
        ..Default::default()
    }
}

/// Every record of `log` from `from`: (offset, body).
fn records(log: &hasync::store::CommitLog, from: u64) -> Vec<(i64, Vec<u8>)> {
    log.records_from(from)
        .map(|r| {
            let r = r.unwrap();
            let Ok(Decoded::Message(v)) = record::decode(&r.bytes, r.offset as i64) else {
                panic!("record at {} does not decode", r.offset)
            };
            (r.offset as i64, v.body.to_vec())
        })
        .collect()
}

fn is_prefix(read: &[(i64, Vec<u8>)], log: &[(i64, Vec<u8>)]) -> bool {
    read.len() <= log.len() && read.iter().zip(log).all(|(a, b)| a == b)
}

/// Releases the paused creations when the test ends, also when it fails, so that no thread
/// stays blocked in the file system; and, as a watchdog, after `BOUND * 4` even if the test is
/// still waiting: when every async worker is blocked, no tokio timeout can fire.
struct Resume {
    fs: Arc<SimFs>,
    fired: Arc<AtomicBool>,
    _done: std::sync::mpsc::Sender<()>,
}

impl Resume {
    fn new(fs: Arc<SimFs>) -> Self {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let fired = Arc::new(AtomicBool::new(false));
        let (f, fired2) = (Arc::clone(&fs), Arc::clone(&fired));
        std::thread::spawn(move || {
            if wait.recv_timeout(BOUND * 4) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                fired2.store(true, Ordering::SeqCst);
                f.resume_creates();
            }
        });
        Self { fs, fired, _done: done }
    }

    /// Fails the test when the watchdog had to release the file system.
    fn check(&self, what: &str) {
        assert!(!self.fired.load(Ordering::SeqCst), "{what} waited on a file being created");
    }
}

impl Drop for Resume {
    fn drop(&mut self) {
        self.fs.resume_creates();
    }
}

/// A commitlog segment file other than the first (`00000000000000000000`), under any name.
fn later_segment(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    path.parent().is_some_and(|p| p.ends_with("commitlog")) && !name.starts_with(&"0".repeat(20))
}

/// The store thread is held while it creates the next segment file: a put that does not roll,
/// a gRPC Read and GetStatus complete meanwhile; a put that rolls waits for the file, and even
/// then Read and GetStatus complete (no lock they need is held across the file system).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_being_created_holds_up_no_read_status_or_put() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let resume = Resume::new(Arc::clone(&fs));
    fs.pause_creates(later_segment);
    let mut c = node_config(dir.path(), Role::Master);
    c.replication.mode = ReplicationMode::Async;
    let a = ApiNode::from(TestNode::start_with_fs(c, fs.clone() as Arc<dyn FileSystem>).await);
    assert_eq!(a.node.put(vec![msg("T", 0, &[1; 1000])]).await.status, PutStatus::PutOk);
    let held = fs.wait_for_held_create(Duration::from_secs(10));
    assert!(held.is_some(), "the store thread prepares the next segment");

    let put = bounded("a put that needs no new file", a.node.put(vec![msg("T", 0, &[2; 1000])]));
    assert_eq!(put.await.status, PutStatus::PutOk);
    resume.check("a put that needs no new file");
    let (mut msgs, mut repl) = (a.messages().await, a.replication().await);
    let r = bounded("Read", msgs.read(read_req(0))).await.unwrap().into_inner();
    assert_eq!(r.messages.len(), 2);
    bounded("GetStatus", repl.get_status(pb::GetStatusRequest {})).await.unwrap();
    resume.check("Read or GetStatus");

    // A put that fills the segment and rolls: the next file is not ready yet.
    let room = a.node.store().segment_size() - a.node.store().max_offset();
    let big = vec![3u8; (room as usize).saturating_sub(500).min(15_000)];
    let fill = (room as usize / (big.len() + 200)).max(1);
    let rolling = tokio::spawn({
        let node = Arc::clone(&a.node);
        async move {
            let mut last = PutStatus::PutOk;
            for _ in 0..=fill {
                last = node.put(vec![msg("T", 0, &big)]).await.status;
            }
            last
        }
    });
    // Whatever the rolling put is doing now, reads and status calls go on.
    for _ in 0..3 {
        bounded("Read during a roll", msgs.read(read_req(0))).await.unwrap();
        bounded("GetStatus during a roll", repl.get_status(pb::GetStatusRequest {})).await.unwrap();
    }
    resume.check("Read or GetStatus during a roll");
    fs.resume_creates();
    let status = bounded("the rolling put once the file exists", rolling).await.unwrap();
    assert_eq!(status, PutStatus::PutOk);
    assert!(a.node.store().max_offset() > a.node.store().segment_size(), "it rolled");
    let n = records(a.node.store(), 0).len();
    assert_eq!(n, 3 + fill, "every put is in the log");
    a.stop().await;
}

/// Reads the log from `from` over and over through gRPC until `stop`, and once after it;
/// returns every result (bounded in count and time).
async fn read_loop(node: &ApiNode, from: u64, stop: Arc<AtomicBool>) -> Vec<Vec<(i64, Vec<u8>)>> {
    let mut c = node.messages().await;
    let started = Instant::now();
    let mut out = Vec::new();
    // One more read after `stop`: at least one sees the final log.
    let mut last = false;
    while !last && out.len() < 20_000 && started.elapsed() < BOUND * 6 {
        last = stop.load(Ordering::SeqCst);
        match c.read(read_req(from)).await {
            Ok(r) => out.push(
                r.into_inner()
                    .messages
                    .into_iter()
                    .map(|m| (m.physical_offset, m.body.to_vec()))
                    .collect(),
            ),
            // Out of range for a moment while the log is cut below `from`: not a result.
            Err(s) if s.code() == tonic::Code::OutOfRange => {}
            Err(s) => panic!("Read failed: {s:?}"),
        }
        tokio::task::yield_now().await;
    }
    out
}

/// A master demoted by a newer epoch truncates its divergent tail while readers read it through
/// gRPC: every read is a prefix of the log before the cut or of the log after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_during_a_demotion_truncate_see_the_old_or_the_new_log() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut ac = node_config(ad.path(), Role::Master);
    ac.replication.mode = ReplicationMode::Async;
    let a = ApiNode::start(ac).await;
    let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    bc.slave.master_grpc = grpc_addr(&a);
    bc.replication.mode = ReplicationMode::Async;
    let b = ApiNode::start(bc).await;
    for i in 0..20u32 {
        a.node.put(vec![msg("T", 0, format!("common-{i}").as_bytes())]).await;
    }
    let common = a.node.store().max_offset();
    wait_until(10, "B caught up", || b.node.store().max_offset() == common).await;

    // B becomes master in epoch 1 and writes its own records; A goes on in epoch 0.
    assert_eq!(b.node.change_role(RoleRequest::master(1)).await.unwrap(), (Role::Master, 1));
    for i in 0..50u32 {
        b.node.put(vec![msg("T", 0, format!("b-{i}").repeat(50).as_bytes())]).await;
    }
    for i in 0..150u32 {
        a.node.put(vec![msg("T", 0, format!("a-{i}").repeat(300).as_bytes())]).await;
    }
    let before = records(a.node.store(), 0);
    assert!(a.node.store().max_offset() > 3 * a.node.store().segment_size(), "a long tail");

    let stop = Arc::new(AtomicBool::new(false));
    let a = Arc::new(a);
    let readers: Vec<_> = [0, common, common]
        .into_iter()
        .map(|from| {
            let (a, stop) = (Arc::clone(&a), Arc::clone(&stop));
            tokio::spawn(async move { (from, read_loop(&a, from, stop).await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let demote = RoleRequest::slave(1, b.node.ha_addr().unwrap().to_string(), grpc_addr(&b));
    assert_eq!(a.node.change_role(demote).await.unwrap(), (Role::Slave, 1));
    let b_max = b.node.store().max_offset();
    wait_until(20, "A caught up with B", || a.node.store().max_offset() == b_max).await;
    stop.store(true, Ordering::SeqCst);

    let after = records(a.node.store(), 0);
    assert_eq!(after, records(b.node.store(), 0), "A holds B's log");
    let (mut reads, mut old, mut new) = (0, 0, 0);
    for reader in readers {
        let (from, results) = reader.await.unwrap();
        let skip = |log: &[(i64, Vec<u8>)]| -> Vec<(i64, Vec<u8>)> {
            log.iter().filter(|(o, _)| *o >= from as i64).cloned().collect()
        };
        let (before, after) = (skip(&before), skip(&after));
        for r in &results {
            let (p_old, p_new) = (is_prefix(r, &before), is_prefix(r, &after));
            assert!(p_old || p_new, "a read from {from} is a prefix of neither log: {r:?}");
            old += usize::from(p_old && !p_new);
            new += usize::from(p_new && !p_old);
        }
        reads += results.len();
    }
    eprintln!("{reads} reads: {old} of the old log only, {new} of the new log only");
    assert!(old > 0 && new > 0, "reads ran before and after the cut ({old} old, {new} new)");
    Arc::try_unwrap(a).ok().expect("the readers are done").stop().await;
    b.stop().await;
}

/// The store thread leaves the next segment prepared under its final name; after a clean stop
/// and after a crash the reopened store takes it as the spare: no data lost, no corruption, and
/// the next roll uses it.
#[test]
fn a_prepared_spare_under_its_final_name_is_the_spare_after_a_restart() {
    use crate::support::{open, opts};
    let dir = tempfile::tempdir().unwrap();
    let seg = 64 * 1024;
    let spare = dir.path().join("commitlog").join(hasync::store::file_name(seg as u64));
    for clean in [true, false] {
        let log = open(dir.path(), opts(seg));
        log.append(&[msg("T", 0, &[5; 1000])]).unwrap();
        let started = Instant::now();
        while !spare.exists() && started.elapsed() < BOUND {
            log.request_flush(log.max_offset() + 1);
            std::thread::yield_now();
        }
        assert!(spare.exists(), "the store thread prepares the next segment");
        let max = log.max_offset();
        if clean {
            log.close().unwrap();
        }
        drop(log);
        let log = open(dir.path(), opts(seg));
        let r = log.recovery_report();
        assert_eq!((r.max_offset, r.truncated_from), (max, None), "clean {clean}: {r:?}");
        assert!(r.removed_files.is_empty() && !r.repaired, "{r:?}");
        assert!(spare.exists(), "kept as the spare");
        log.close().unwrap();
    }
    // The next roll moves the spare in.
    let log = open(dir.path(), opts(seg));
    while log.max_offset() < seg as u64 {
        log.append(&[msg("T", 0, &[6; 10_000])]).unwrap();
    }
    assert_eq!(log.file_at(seg as u64).unwrap().from_offset(), seg as u64);
    let n = log.records_from(0).count();
    assert!(n >= 3 && log.records_from(0).all(|r| r.is_ok()));
    log.close().unwrap();
}

/// A metadata write holds its table while it writes and fsyncs the file; GetStatus and the
/// health check (every 200 ms from an orchestrator) read the tables' versions and must not wait
/// for it on an async worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_metadata_write_in_flight_holds_up_no_status_or_health_call() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let resume = Resume::new(Arc::clone(&fs));
    let c = node_config(dir.path(), Role::Master);
    let a = ApiNode::from(TestNode::start_with_fs(c, fs.clone() as Arc<dyn FileSystem>).await);
    fs.pause_creates(|p| p.to_string_lossy().contains("topics.json"));
    let writing = tokio::task::spawn_blocking({
        let node = Arc::clone(&a.node);
        move || node.metadata().upsert_topic(crate::support::topic_config("Paused", 4))
    });
    let held = fs.wait_for_held_create(Duration::from_secs(10));
    assert!(held.is_some(), "the topic write is held in the file system");

    let mut repl = a.replication().await;
    let status = bounded("GetStatus", repl.get_status(pb::GetStatusRequest {})).await.unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(a.channel().await);
    let req = tonic_health::pb::HealthCheckRequest { service: String::new() };
    bounded("the health check", h.check(req)).await.unwrap();
    resume.check("GetStatus or the health check");
    fs.resume_creates();
    let version = bounded("the topic write", writing).await.unwrap().unwrap();
    let after = repl.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    let topics = |s: &pb::ReplicationStatus| {
        let sync = s.metadata_sync.as_ref().unwrap();
        sync.versions.iter().find(|v| v.table == pb::MetadataTable::Topics as i32).cloned()
    };
    let (before, after) = (topics(status.get_ref()), topics(&after));
    assert_ne!(before, after, "the status shows the new version once the write is done");
    assert_eq!(after.and_then(|v| v.version).map(|v| v.counter), Some(version.counter));
    a.stop().await;
}

/// A roll wakes the store thread to prepare the next segment at once, not at its next
/// `store.flush-interval`: a writer that fills segments quickly finds the next one ready
/// instead of creating it itself on its (async) caller's thread.
#[test]
fn a_roll_has_the_store_thread_prepare_the_next_segment_at_once() {
    use crate::support::{open, opts};
    let dir = tempfile::tempdir().unwrap();
    let seg = 64 * 1024;
    let mut o = opts(seg);
    o.flush_interval = Duration::from_secs(3600);
    let log = open(dir.path(), o);
    let name = |n: u64| dir.path().join("commitlog").join(hasync::store::file_name(n * seg as u64));
    // Fill the first segment and roll into the second (ready or created by the writer).
    let batch: Vec<_> = (0..70).map(|i| msg("T", 0, &[i as u8; 1000])).collect();
    log.append(&batch).unwrap();
    assert!(log.max_offset() > seg as u64, "rolled into the second segment");
    let started = Instant::now();
    while !name(2).exists() && started.elapsed() < BOUND {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(name(2).exists(), "the third segment is prepared without waiting an hour");
}
