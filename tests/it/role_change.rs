//! Role changes under races and faults: a put parked between its admission and its append is
//! refused by the write fence of a demotion that truncates; a change that fails in a step
//! lands in the explicit failed state (fenced, NOT_SERVING, `GetStatus.role_change` naming the
//! step), which the exact repeat resumes and only a higher epoch supersedes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use hasync::config::Role;
use hasync::control::pb;
use hasync::node::PutStatus;
use hasync::node::role::RoleRequest;
use hasync::store::fs::{FileSystem, SimFs};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::grpc::ApiNode;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::node::TestNode;
use crate::support::{all_bytes, msg};

pub(crate) fn grpc_addr(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

/// A (master, on `fs`) and B (its slave through a proxy, then promoted at epoch 1) where A
/// holds records B never got: demoting A at epoch 1 truncates them.
pub(crate) struct Diverged {
    pub(crate) a: ApiNode,
    pub(crate) a_config: hasync::config::Config,
    pub(crate) b: ApiNode,
    /// Where A's log is cut when it follows B (B's max at its promotion).
    pub(crate) cut: u64,
    pub(crate) _proxy: Proxy,
    pub(crate) _dirs: (tempfile::TempDir, tempfile::TempDir),
}

pub(crate) async fn diverged(fs: Arc<SimFs>) -> Diverged {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a_config = node_config(ad.path(), Role::Master);
    let a = TestNode::start_with_fs(a_config.clone(), fs as Arc<dyn FileSystem>);
    let a = ApiNode::from(a.await);
    let proxy = Proxy::start(a.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let b = ApiNode::start(slave_node_config(bd.path(), proxy.addr)).await;
    for i in 0..5u8 {
        assert_eq!(a.node.put(vec![msg("T", 0, &[i; 300])]).await.status, PutStatus::PutOk);
    }
    let a_max = a.node.store().max_offset();
    wait_until(10, "B caught up", || b.node.store().max_offset() == a_max).await;
    proxy.set_mode(ProxyMode::Stall);
    for i in 0..5u8 {
        assert_eq!(a.node.put(vec![msg("T", 0, &[i; 300])]).await.status, PutStatus::PutOk);
    }
    assert_eq!(b.node.change_role(RoleRequest::master(1)).await.unwrap(), (Role::Master, 1));
    proxy.cut();
    let cut = b.node.store().max_offset();
    assert!(a.node.store().max_offset() > cut, "A holds records B never got");
    Diverged { a, a_config, b, cut, _proxy: proxy, _dirs: (ad, bd) }
}

pub(crate) fn demotion(d: &Diverged, master_grpc: String) -> RoleRequest {
    RoleRequest::slave(1, d.b.node.ha_addr().unwrap().to_string(), master_grpc)
}

pub(crate) async fn status(n: &ApiNode) -> pb::ReplicationStatus {
    n.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner()
}

async fn health(n: &ApiNode) -> ServingStatus {
    let mut h = HealthClient::new(n.channel().await);
    let service = hasync::control::REPLICATION_SERVICE.into();
    let r = h.check(HealthCheckRequest { service }).await.unwrap().into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

async fn metadata_write(n: &ApiNode) -> Result<(), tonic::Status> {
    let mut c = pb::metadata_client::MetadataClient::new(n.channel().await);
    let topic = pb::TopicConfig {
        topic_name: "Fenced".into(),
        read_queue_nums: 1,
        write_queue_nums: 1,
        perm: 6,
        topic_filter_type: "SINGLE_TAG".into(),
        topic_sys_flag: 0,
        order: false,
    };
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic) }).await.map(|_| ())
}

/// Whether a put through the gRPC API is refused (SERVICE_NOT_AVAILABLE, not stored, or
/// FAILED_PRECONDITION on a node whose role is slave).
async fn grpc_put_refused(n: &ApiNode) -> bool {
    let m = crate::support::grpc::pb_msg("T", b"while failed");
    match n.messages().await.put(pb::PutRequest { messages: vec![m] }).await {
        Ok(r) => {
            let r = r.into_inner();
            r.status == pb::PutStatus::ServiceNotAvailable as i32 && !r.stored
        }
        Err(s) => s.code() == tonic::Code::FailedPrecondition,
    }
}

/// What every failed change shows: the step and the error in `GetStatus`, puts and metadata
/// writes refused, health NOT_SERVING, another request at the same epoch refused.
async fn assert_failed_at(d: &Diverged, step: &str, error: &str) {
    let a = &d.a;
    let s = status(a).await;
    let rc = s.role_change.expect("role_change in the status");
    assert_eq!(rc.state, pb::RoleChangeState::Failed as i32, "{rc:?}");
    assert_eq!(
        (rc.failed_step.as_str(), rc.epoch, s.epoch, s.fenced),
        (step, 1, 1, true),
        "{rc:?}"
    );
    assert!(rc.error.contains(error), "{rc:?}");
    assert_eq!(rc.request.unwrap().epoch, 1);
    assert!(grpc_put_refused(a).await, "a put through the API is refused");
    let out = a.node.put(vec![msg("T", 0, b"x")]).await;
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, false), "{out:?}");
    let refused = metadata_write(a).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while health(a).await != ServingStatus::NotServing {
        assert!(tokio::time::Instant::now() < deadline, "health becomes NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = a.node.change_role(RoleRequest::master(1)).await.unwrap_err().to_string();
    assert!(other.contains("only its exact repeat"), "{other}");
    assert!(a.node.fenced(), "a refused request leaves the failed state as it was");
}

/// The exact repeat resumes the failed change: A follows B, its log is B's.
pub(crate) async fn assert_resumed(d: &Diverged, req: RoleRequest) {
    let a = &d.a;
    assert_eq!(a.node.change_role(req).await.unwrap(), (Role::Slave, 1));
    let s = status(a).await;
    assert_eq!((s.role_change, s.fenced, s.epoch), (None, false, 1));
    assert_eq!(a.node.role(), Role::Slave);
    assert_eq!(a.node.epoch_history(), d.b.node.epoch_history(), "A adopted B's history");
    let out = d.b.node.put(vec![msg("T", 0, b"after")]).await;
    assert_eq!(out.status, PutStatus::PutOk);
    let b_max = d.b.node.store().max_offset();
    wait_until(10, "A follows B", || a.node.store().max_offset() == b_max).await;
    assert_eq!(all_bytes(a.node.store()), all_bytes(d.b.node.store()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while health(a).await != ServingStatus::Serving {
        assert!(tokio::time::Instant::now() < deadline, "health becomes SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Point 1: a put admitted (master, not fenced) and parked at the store's entry while a
/// demotion fences, truncates and installs the slave role; released, it must be refused and
/// nothing may be appended after the fence. (On c0535b4 it landed on the truncated log.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_parked_before_its_append_is_refused_by_a_demotion_that_truncates() {
    let d = diverged(Arc::new(SimFs::new())).await;
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let first = AtomicBool::new(true);
    d.a.node.store().set_write_hook(Some(Arc::new(move || {
        if first.swap(false, Ordering::SeqCst) {
            parked_tx.send(()).unwrap();
            let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
        }
    })));
    let node = Arc::clone(&d.a.node);
    let rt = tokio::runtime::Handle::current();
    let racing = std::thread::spawn(move || rt.block_on(node.put(vec![msg("T", 0, b"racing")])));
    tokio::task::spawn_blocking(move || parked_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the put parked at the store's entry");
    let req = demotion(&d, grpc_addr(&d.b));
    assert_eq!(d.a.node.change_role(req).await.unwrap(), (Role::Slave, 1));
    let truncated = all_bytes(d.a.node.store());
    assert_eq!(d.a.node.store().max_offset(), d.cut);
    release_tx.send(()).unwrap();
    let out = tokio::task::spawn_blocking(move || racing.join().unwrap()).await.unwrap();
    d.a.node.store().set_write_hook(None);
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, false), "{out:?}");
    assert!(out.detail.as_deref().unwrap_or("").contains("write fence"), "{out:?}");
    assert_eq!(d.a.node.store().max_offset(), d.cut, "nothing appended after the fence");
    assert_eq!(all_bytes(d.a.node.store()), truncated, "the log is the truncated log");
    assert_eq!(truncated, all_bytes(d.b.node.store()), "and it is B's");
}

/// Runs the demotion of A to the master at `master_grpc`, which must fail at `step` with an
/// error naming `why`; returns the request, for its repeat.
pub(crate) async fn demote_failing_at(
    d: &Diverged,
    master_grpc: String,
    step: &str,
    why: &str,
) -> RoleRequest {
    let req = demotion(d, master_grpc);
    let err = d.a.node.change_role(req.clone()).await.unwrap_err().to_string();
    assert!(err.contains(&format!("failed at step \"{step}\"")), "{err}");
    assert_failed_at(d, step, why).await;
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_whose_truncate_fails_is_failed_at_truncate_and_its_repeat_resumes() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    // The truncate cuts, then its checkpoint write fails: the truncate answers the error.
    fs.fail_writes(|p| p.ends_with("checkpoint"));
    let req = demote_failing_at(&d, grpc_addr(&d.b), "truncate", "checkpoint").await;
    fs.clear_write_failures();
    assert_resumed(&d, req).await;
}

/// The truncate cuts, but the disk fails to make its zeroing durable (the segment's msync):
/// the change fails at the truncate, and its exact repeat fails too while the disk fails,
/// though the log already ends at the cut: the repeat keeps the log as it is, and its
/// checkpoint, which must come before the history that builds on the cut is stored, fails
/// while the cut is owed. Once the disk works the repeat resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_whose_cut_cannot_be_made_durable_is_not_resumed_until_it_is() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    // Only the zeroing past the cut fails (its range reaches past it; a flush of appended
    // bytes ends at or below it), so a checkpoint would work but for what the cut owes.
    let cut = d.cut as usize;
    assert!(cut < 64 * 1024, "the cut lies in the first segment");
    let first = d.a.node.store().data_dir().join("commitlog").join(hasync::store::file_name(0));
    fs.fail_flushes(move |p, _, to| p == first && to > cut);
    let req = demote_failing_at(&d, grpc_addr(&d.b), "truncate", "msync").await;
    assert_eq!(d.a.node.store().max_offset(), d.cut, "the log ends at the cut");
    let again = d.a.node.change_role(req.clone()).await.unwrap_err().to_string();
    assert!(again.contains("failed at step \"checkpoint\"") && again.contains("msync"), "{again}");
    assert_failed_at(&d, "checkpoint", "msync").await;
    fs.clear_write_failures();
    assert_resumed(&d, req).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_whose_epoch_file_write_fails_is_failed_and_survives_a_restart() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    fs.fail_writes(|p| p.ends_with("epoch"));
    let req = demote_failing_at(&d, grpc_addr(&d.b), "write epoch file", "epoch").await;
    fs.clear_write_failures();
    // A restart does not forget it: the role file says the change is pending.
    // The dirs bound first, so dropped last: after the nodes, should the test fail here.
    let Diverged { _dirs, _proxy, a, a_config, b, cut } = d;
    a.stop().await;
    let restarted = TestNode::start_with_fs(a_config.clone(), fs as Arc<dyn FileSystem>).await;
    let d = Diverged { a: ApiNode::from(restarted), a_config, b, cut, _proxy, _dirs };
    assert_failed_at(&d, "restart", "stopped before the role change").await;
    assert_resumed(&d, req).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_whose_role_file_write_fails_is_failed_and_its_repeat_resumes() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    fs.fail_writes(|p| p.ends_with("role"));
    let req = demote_failing_at(&d, grpc_addr(&d.b), "write role file", "role").await;
    fs.clear_write_failures();
    assert_resumed(&d, req).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_whose_master_becomes_unreachable_after_the_plan_is_failed_and_resumes() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    // B's gRPC through a proxy; the first write of the execution (the pending role file, right
    // after the plan fetched B's epochs) points the proxy at a closed port.
    let b_grpc = d.b.running.grpc_addr();
    let grpc = Arc::new(Proxy::start(b_grpc, ProxyMode::Pass).await);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let p = Arc::clone(&grpc);
    fs.fail_writes(move |path| {
        if path.ends_with("role") {
            p.set_upstream(closed);
            p.cut();
        }
        false
    });
    let req = demote_failing_at(
        &d,
        grpc.addr.to_string(),
        "fetch master epochs",
        "cannot reach the master",
    )
    .await;
    fs.clear_write_failures();
    grpc.set_upstream(b_grpc);
    assert_resumed(&d, req).await;
}

/// A higher epoch also ends a failed change (here: A promoted instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_epoch_supersedes_a_failed_change() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    fs.fail_writes(|p| p.ends_with("epoch"));
    let req = demotion(&d, grpc_addr(&d.b));
    d.a.node.change_role(req).await.unwrap_err();
    fs.clear_write_failures();
    assert_eq!(d.a.node.change_role(RoleRequest::master(2)).await.unwrap(), (Role::Master, 2));
    let s = status(&d.a).await;
    assert_eq!((s.role_change, s.fenced, s.epoch), (None, false, 2));
    let out = d.a.node.put(vec![msg("T", 0, b"new epoch")]).await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    metadata_write(&d.a).await.unwrap();
}

/// Point 1, a fence raised and lowered again: a put admitted in epoch 0 and parked at the
/// store's entry while a whole role change runs (a re-promotion at epoch 1, which keeps the
/// master data plane and opens appends again) must still be refused: it was admitted before
/// the fence, in an epoch that ended; it must not land in epoch 1 answered with epoch 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_parked_across_a_whole_role_change_is_refused_though_appends_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let a = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    assert!(a.node.put(vec![msg("T", 0, b"before")]).await.stored);
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let first = AtomicBool::new(true);
    a.node.store().set_write_hook(Some(Arc::new(move || {
        if first.swap(false, Ordering::SeqCst) {
            parked_tx.send(()).unwrap();
            let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
        }
    })));
    let node = Arc::clone(&a.node);
    let rt = tokio::runtime::Handle::current();
    let racing = std::thread::spawn(move || rt.block_on(node.put(vec![msg("T", 0, b"racing")])));
    tokio::task::spawn_blocking(move || parked_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the put parked at the store's entry");
    assert_eq!(a.node.change_role(RoleRequest::master(1)).await.unwrap(), (Role::Master, 1));
    let max = a.node.store().max_offset();
    assert_eq!(a.node.epoch_history().last().start_offset, max, "epoch 1 starts at the max");
    release_tx.send(()).unwrap();
    let out = tokio::task::spawn_blocking(move || racing.join().unwrap()).await.unwrap();
    a.node.store().set_write_hook(None);
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, false), "{out:?}");
    assert_eq!(a.node.store().max_offset(), max, "nothing appended after the fence");
}

/// A metadata write whose gRPC call is cancelled (the client gave up) while its file write is
/// still running keeps the role change back until the write ends: the change never passes its
/// fence with a metadata write in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_metadata_write_whose_call_is_cancelled_still_holds_the_role_change_back() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let c = node_config(dir.path(), Role::Master);
    let a = ApiNode::from(TestNode::start_with_fs(c, fs.clone() as Arc<dyn FileSystem>).await);
    fs.pause_creates(|p| p.to_string_lossy().contains("topics.json"));
    let mut client = pb::metadata_client::MetadataClient::new(a.channel().await);
    let topic = pb::TopicConfig {
        topic_name: "Held".into(),
        read_queue_nums: 4,
        write_queue_nums: 4,
        perm: 6,
        topic_filter_type: "SINGLE_TAG".into(),
        ..Default::default()
    };
    let mut req = tonic::Request::new(pb::UpsertTopicRequest { topic: Some(topic) });
    req.set_timeout(Duration::from_millis(300));
    let call = tokio::spawn(async move { client.upsert_topic(req).await });
    let held = tokio::task::spawn_blocking({
        let fs = Arc::clone(&fs);
        move || fs.wait_for_held_create(Duration::from_secs(10))
    });
    assert!(held.await.unwrap().is_some(), "the topic write is held in the file system");
    let gave_up = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap().unwrap();
    assert!(gave_up.is_err(), "the client gave up: {gave_up:?}");

    let change = tokio::spawn({
        let node = Arc::clone(&a.node);
        async move { node.change_role(RoleRequest::master(1)).await }
    });
    // Bounded: the change must still wait while the write is held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waited = !change.is_finished();
    fs.resume_creates();
    let done = tokio::time::timeout(Duration::from_secs(10), change).await.unwrap().unwrap();
    assert!(waited, "the role change passed its fence while a metadata write was in flight");
    assert_eq!(done.unwrap(), (Role::Master, 1));
    assert!(a.node.metadata().snapshot(hasync::metadata::Table::Topics).0.counter > 0);
    a.stop().await;
}

/// A slave keeps the HA port it was given, so that its promotion serves on it: nobody can take
/// the port while it is a slave (before, a slave freed it at start and its promotion bound it
/// again, failing with "address in use" when another process had taken it meanwhile). What
/// connects to it while the node is a slave is closed at once, counted as `not_master`; a
/// demotion and a second promotion keep the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_keeps_its_ha_port_and_its_promotion_serves_on_it() {
    use tokio::io::AsyncReadExt as _;
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(node_config(ad.path(), Role::Master)).await;
    let a_ha = a.node.ha_addr().unwrap();
    let b = ApiNode::start(slave_node_config(bd.path(), a_ha)).await;
    assert_eq!(b.node.ha_addr(), None, "a slave serves no slaves");
    let held = b.node.ha_port_held().expect("the slave holds the HA port it was given");
    let squatter = std::net::TcpListener::bind(held);
    assert!(squatter.is_err(), "another process took the slave's HA port {held}");

    let closed_at_once = async || {
        let mut peer = tokio::net::TcpStream::connect(held).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), peer.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed at once: {read:?}");
    };
    closed_at_once().await;
    let metrics = b.running.metrics_addr();
    let closed = async || {
        let s = crate::metrics::scrape(metrics).await;
        s.get("hasync_ha_connections_closed_total", &[("reason", "not_master")])
    };
    assert_eq!(closed().await, Some(1.0));

    assert_eq!(b.node.change_role(RoleRequest::master(1)).await.unwrap(), (Role::Master, 1));
    assert_eq!(b.node.ha_addr(), Some(held), "the promotion serves on the held port");
    let demote = RoleRequest::slave(2, a_ha.to_string(), String::new());
    assert_eq!(a.node.change_role(RoleRequest::master(2)).await.unwrap(), (Role::Master, 2));
    assert_eq!(b.node.change_role(demote).await.unwrap(), (Role::Slave, 2));
    assert_eq!(b.node.ha_port_held(), Some(held), "kept across the demotion");
    assert_eq!(b.node.change_role(RoleRequest::master(3)).await.unwrap(), (Role::Master, 3));
    assert_eq!(b.node.ha_addr(), Some(held));
    // Fenced (no data plane at all): still held, and what connects is still closed at once
    // rather than left in a backlog nobody accepts from.
    b.node.fence(4, "t4").await.unwrap();
    assert_eq!((b.node.ha_addr(), b.node.ha_port_held()), (None, Some(held)));
    closed_at_once().await;
    assert_eq!(closed().await, Some(2.0));
    assert_eq!(b.node.change_role(RoleRequest::master(4)).await.unwrap(), (Role::Master, 4));
    assert_eq!(b.node.ha_addr(), Some(held), "served again after the fence");
    b.running.shutdown().await.unwrap();
    assert_eq!(b.node.ha_port_held(), None, "released when the node stops");
    let rebound = std::net::TcpListener::bind(held);
    assert!(rebound.is_ok(), "the port is free after the stop: {rebound:?}");
}

/// The coordinator agent fences a master's writes on what it saw a moment ago (another master
/// in the state record, an ASYNC lease past its margin). A role change that made the node a
/// slave in between keeps its slave plane and its replicated writes; the same fence on a node
/// still the master at that epoch fences it and stops its plane, the port still held.
#[tokio::test]
async fn a_master_fence_decided_before_a_demotion_leaves_the_slave_replicating() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(node_config(ad.path(), Role::Master)).await;
    let b = ApiNode::start(node_config(bd.path(), Role::Master)).await;
    let a_ha = a.node.ha_addr().unwrap();
    let decided_at = b.node.epoch();
    let next = decided_at.max(a.node.epoch()) + 1;
    assert_eq!(a.node.change_role(RoleRequest::master(next)).await.unwrap(), (Role::Master, next));
    let demote = RoleRequest::slave(next, a_ha.to_string(), String::new());
    assert_eq!(b.node.change_role(demote).await.unwrap(), (Role::Slave, next));

    assert!(!b.node.fence_master_writes(Some(decided_at)).await, "nothing to fence on a slave");
    assert!(!b.node.fenced(), "the slave's replicated writes stay open");
    assert_eq!(b.node.role(), Role::Slave);
    assert_eq!(a.node.put(vec![msg("T", 0, &[7; 300])]).await.status, PutStatus::PutOk);
    let a_max = a.node.store().max_offset();
    wait_until(10, "the slave still replicates", || b.node.store().max_offset() == a_max).await;

    // The same decision on the node that is still the master at that epoch.
    assert!(a.node.fence_master_writes(Some(next)).await, "a master's puts are fenced");
    assert!(a.node.fenced());
    assert_eq!(
        a.node.put(vec![msg("T", 0, &[8; 300])]).await.status,
        PutStatus::ServiceNotAvailable
    );
    assert_eq!((a.node.ha_addr(), a.node.ha_port_held()), (None, Some(a_ha)), "plane stopped");
}
