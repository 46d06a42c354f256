//! Readiness follows the coordinator's view, and the pod's role label follows the state record
//! (issue 17): two nodes in coordinator mode on an in-memory engine (no controller: the test
//! writes the state record), each labelling its pod through a fake API server.
//!
//! - Before a state record exists, an in-sync slave is not ready.
//! - The state names n1 master: n1 (SYNC, its slave in sync) and n2 (following) are ready,
//!   their pods are labelled master and slave.
//! - n2 cut off from the engine: its lease is not renewed, it is not ready although still in
//!   sync; healed, it is ready again.
//! - The state names n2 at the next epoch: n1 is fenced, not ready, labelled slave; n2 (not
//!   yet pointed at anything at that epoch) is not ready either.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasync::app::StartOptions;
use hasync::config::{Config, ReplicationMode, Role};
use hasync::coordinator::keys::Keys;
use hasync::coordinator::memory::MemoryCoordinator;
use hasync::coordinator::records::{self, GroupState, Mode, Phase, Voter};
use hasync::coordinator::{Coordinator, Op, Txn};
use hasync::node::role::RoleRequest;
use hasync::store::fs::StdFs;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::metrics::scrape;
use crate::support::ha::node_config;
use crate::support::kube::FakeApiServer;
use crate::support::node::TestNode;

const READY: &str = "hasync.v1.Replication";

async fn health(node: &TestNode) -> ServingStatus {
    let ch = tonic::transport::Channel::from_shared(node.url()).unwrap().connect().await.unwrap();
    let r = HealthClient::new(ch).check(HealthCheckRequest { service: READY.into() }).await;
    ServingStatus::try_from(r.unwrap().into_inner().status).unwrap()
}

async fn wait_health(node: &TestNode, want: ServingStatus, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let got = health(node).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {got:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn coordinated(mut c: Config, name: &str, api: &FakeApiServer, pod: &str) -> Config {
    c.node.name = name.into();
    c.coordinator.endpoints = vec!["127.0.0.1:2379".into()]; // unused: the engine is in memory
    c.coordinator.cluster = "c1".into();
    c.coordinator.group = "g1".into();
    c.coordinator.ttl = Duration::from_secs(2);
    c.coordinator.renew_interval = Duration::from_millis(300);
    c.coordinator.controller = false;
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    c.kubernetes = api.kubernetes_config(pod);
    c
}

async fn start(config: Config, engine: &MemoryCoordinator) -> TestNode {
    let coordinator: Arc<dyn Coordinator> = Arc::new(engine.clone());
    let opts = StartOptions { coordinator: Some(coordinator), ..StartOptions::default() };
    TestNode::try_start_with(config, Arc::new(StdFs), opts).await.expect("start")
}

async fn write_state(engine: &MemoryCoordinator, state: &GroupState) {
    let key = Keys::new("/hasync/v1/", "c1").state("g1");
    let put = Op::Put { key, value: records::encode(state), lease: None };
    let r = engine.txn(Txn { compares: vec![], success: vec![put], failure: vec![] }).await;
    assert!(r.unwrap().succeeded);
}

fn state(epoch: u64, master: &str, voters: Vec<Voter>) -> GroupState {
    GroupState {
        token: format!("t{epoch}"),
        epoch_revision: 1,
        last_decision: "test".into(),
        controller: "test".into(),
        ..GroupState::stable(epoch, Some(master), voters, 1, Mode::Sync)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_the_role_label_follow_the_coordinators_view() {
    let api = FakeApiServer::start("brokers", "tok").await;
    let store = MemoryCoordinator::new();
    let (e1, e2) = (store.new_client(), store.new_client());
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let n1 =
        start(coordinated(node_config(d1.path(), Role::Master), "n1", &api, "hasync-0"), &e1).await;
    let mut c2 = coordinated(node_config(d2.path(), Role::Slave), "n2", &api, "hasync-1");
    c2.slave.master_ha = n1.app().ha_addr().expect("master HA").to_string();
    c2.slave.master_grpc = n1.grpc_addr().to_string();
    let n2 = start(c2, &e2).await;

    // In sync with its master, but no state record yet: not ready, and no label set.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !n2.node().status().master_link.is_some_and(|l| l.connected) {
        assert!(Instant::now() < deadline, "n2 never connected: {:?}", n2.node().status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(health(&n2).await, ServingStatus::NotServing, "ready without a state record");
    assert!(api.seen().is_empty(), "labelled without a state record: {:#?}", api.seen());

    let epoch = n1.node().status().epoch;
    let voters = [&n1, &n2]
        .iter()
        .zip(["n1", "n2"])
        .map(|(n, name)| Voter { name: name.into(), data_dir_id: n.node().status().data_dir_id })
        .collect::<Vec<_>>();
    write_state(&store, &state(epoch, "n1", voters.clone())).await;
    wait_health(&n1, ServingStatus::Serving, Duration::from_secs(15), "n1, master of the state")
        .await;
    wait_health(&n2, ServingStatus::Serving, Duration::from_secs(15), "n2, following").await;
    api.wait_until(Duration::from_secs(10), |_| {
        api.last_label("hasync-0").as_deref() == Some("master")
            && api.last_label("hasync-1").as_deref() == Some("slave")
    })
    .await;
    for r in api.seen() {
        assert_eq!((r.method.as_str(), r.header("authorization")), ("PATCH", Some("Bearer tok")));
        assert!(r.path.starts_with("/api/v1/namespaces/brokers/pods/hasync-"), "{}", r.path);
    }

    // n2 cut off from the engine: its lease runs out (TTL 2s) while its HA link stays up.
    e2.set_unavailable(true);
    wait_health(&n2, ServingStatus::NotServing, Duration::from_secs(6), "n2 without its lease")
        .await;
    assert!(n2.node().status().master_link.is_some_and(|l| l.connected), "the link stayed up");
    e2.set_unavailable(false);
    wait_health(&n2, ServingStatus::Serving, Duration::from_secs(10), "n2 with a new lease").await;

    // The state names n2 at the next epoch: n1 is no longer the group's master.
    write_state(&store, &state(epoch + 1, "n2", voters)).await;
    wait_health(&n1, ServingStatus::NotServing, Duration::from_secs(10), "n1, not the master")
        .await;
    wait_health(&n2, ServingStatus::NotServing, Duration::from_secs(10), "n2, behind the epoch")
        .await;
    api.wait_until(Duration::from_secs(10), |_| {
        api.last_label("hasync-0").as_deref() == Some("slave")
    })
    .await;
    assert!(n1.node().status().fenced, "n1 takes no puts: {:?}", n1.node().status());
    n2.shutdown().await.unwrap();
    n1.shutdown().await.unwrap();
}

/// An ASYNC master cut off from the engine fences itself once no renewal was acknowledged
/// within the TTL less two renewals: its failed rounds check the fence too (before, only a
/// round whose renewal succeeded did, so a master that lost the engine kept taking puts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_master_cut_off_from_the_engine_fences_itself() {
    let api = FakeApiServer::start("brokers", "tok").await;
    let store = MemoryCoordinator::new();
    let (n1, e1, _d1, _) = async_master(&api, &store).await;
    e1.set_unavailable(true);
    // TTL 2 s, renewals every 300 ms: fenced 1.4 s after the last acknowledged renewal.
    let cut = Instant::now();
    while !n1.node().fenced() {
        assert!(cut.elapsed() < Duration::from_secs(6), "n1 still takes puts without its lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cut.elapsed() >= Duration::from_millis(900), "fenced too early: {:?}", cut.elapsed());
    n1.shutdown().await.unwrap();
}

/// n1, an ASYNC master in coordinator mode on an engine client of its own, taking puts once
/// the state record (returned) names it master at its epoch.
async fn async_master(
    api: &FakeApiServer,
    store: &MemoryCoordinator,
) -> (TestNode, MemoryCoordinator, tempfile::TempDir, GroupState) {
    let e1 = store.new_client();
    let d1 = tempfile::tempdir().unwrap();
    let mut c1 = coordinated(node_config(d1.path(), Role::Master), "n1", api, "hasync-0");
    c1.replication.mode = ReplicationMode::Async;
    let n1 = start(c1, &e1).await;
    let epoch = n1.node().status().epoch;
    let voter = Voter { name: "n1".into(), data_dir_id: n1.node().status().data_dir_id };
    let async_state = GroupState { mode: Mode::Async, k: 0, ..state(epoch, "n1", vec![voter]) };
    write_state(store, &async_state).await;
    wait_fenced(&n1, false, Duration::from_secs(15), "n1 never took puts").await;
    (n1, e1, d1, async_state)
}

async fn wait_fenced(node: &TestNode, fenced: bool, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while node.node().fenced() != fenced {
        assert!(Instant::now() < deadline, "{what}: {:?}", node.node().status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A master that fenced itself at one epoch is fenced at that epoch only: made master again
/// at a later epoch, it is fenced when the state record stops naming it (a decision starts)
/// and takes puts again when the record names it once more (the decision ended without a
/// change). Before, the self-fence was remembered for good, so that master stayed fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_fence_holds_at_its_own_epoch_only() {
    let api = FakeApiServer::start("brokers", "tok").await;
    let store = MemoryCoordinator::new();
    let (n1, e1, _d1, first) = async_master(&api, &store).await;
    let epoch = first.epoch;
    let at = |epoch| GroupState { token: format!("t{epoch}"), epoch, ..first.clone() };
    e1.set_unavailable(true);
    wait_fenced(&n1, true, Duration::from_secs(6), "n1 did not fence itself").await;
    e1.set_unavailable(false);
    // The self-fence holds at its epoch: the record naming n1 there does not reopen it, in
    // the rounds after n1 has a lease again (each round reads the record after its renewal).
    let lease = "hasync_coordinator_lease_remaining_seconds";
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape(n1.metrics_addr()).await.value(lease, &[]) < 1.0 {
        assert!(Instant::now() < deadline, "n1 has no lease again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await; // three more rounds
    assert!(n1.node().fenced(), "a self-fenced master reopened at the same epoch");

    // A role change (the controller's, here by hand) makes n1 master at the next epoch.
    let next = epoch + 1;
    let promoting =
        GroupState { phase: Phase::Promoting, chosen: Some("n1".into()), k: 1, ..at(next) };
    write_state(&store, &promoting).await;
    let req = RoleRequest { decision_token: promoting.token.clone(), ..RoleRequest::master(next) };
    assert_eq!(n1.node().change_role(req).await.unwrap(), (Role::Master, next));
    write_state(&store, &at(next)).await;
    wait_fenced(&n1, false, Duration::from_secs(10), "n1 after its role change").await;
    // A decision starts: the record no longer names a stable master, and n1 stops taking puts.
    write_state(&store, &GroupState { phase: Phase::Fencing, ..at(next) }).await;
    wait_fenced(&n1, true, Duration::from_secs(10), "n1 during the decision").await;
    // It ends without a change: n1 is the master of the record again, and takes puts.
    write_state(&store, &at(next)).await;
    wait_fenced(&n1, false, Duration::from_secs(10), "n1 once the record names it again").await;
    n1.shutdown().await.unwrap();
}
