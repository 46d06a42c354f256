//! Fence and promise (issue 17): a fenced node stops acking and taking puts, keeps its promise
//! across restarts over its persisted role, refuses what is below it, and in coordinator mode
//! accepts only what matches the controller's decision; the voters filter (invariant A).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb;
use hasync::node::PutStatus;
use hasync::node::coordination::{BoxFuture, Coordination, Decision, DecisionPhase};
use hasync::node::fence::PROMISE_FILE;
use hasync::node::role::RoleRequest;

use crate::support::grpc::ApiNode;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

fn grpc_addr(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

/// A master whose SYNC puts wait for one slave's ack, at most `slave_timeout`.
fn sync_master_config(dir: &std::path::Path, slave_timeout: Duration) -> hasync::config::Config {
    let mut c = node_config(dir, Role::Master);
    c.node.name = "a".into();
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    c.replication.slave_timeout = slave_timeout;
    c
}

/// A slave of `a` with its gRPC address (epoch check, registration).
fn slave_of(dir: &std::path::Path, a: &ApiNode) -> hasync::config::Config {
    let mut c = slave_node_config(dir, a.node.ha_addr().unwrap());
    c.node.name = "b".into();
    c.slave.master_grpc = grpc_addr(a);
    c
}

async fn put(n: &ApiNode, body: &str) -> hasync::node::PutOutcome {
    n.node.put(vec![msg("T", 0, body.as_bytes())]).await
}

/// Fence makes a slave stop acking: a SYNC put on its master no longer completes. After a
/// restart the promise wins over its persisted role (no slave plane); a ChangeRole at the
/// promise makes it follow only once its master's epoch reached the promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_slave_stops_acking_and_follows_no_master_below_its_promise() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(sync_master_config(ad.path(), Duration::from_millis(500))).await;
    let b = ApiNode::start(slave_of(bd.path(), &a)).await;
    wait_until(10, "B in sync", || a.node.status().in_sync_replicas == 1).await;
    let ok = put(&a, "before").await;
    assert_eq!(ok.status, PutStatus::PutOk, "{ok:?}");
    wait_until(10, "B has it", || b.node.store().max_offset() == ok.end_offset).await;

    let f = b.node.fence(1, "t1").await.unwrap();
    assert_eq!((f.promised_epoch, f.role, f.epoch), (1, Role::Slave, 0));
    assert_eq!((f.end_offset, f.last_record_epoch), (ok.end_offset, 0), "{f:?}");
    assert_eq!((f.node_name.as_str(), f.history.len()), ("b", 1));
    assert_eq!(f.data_dir_id, b.node.status().data_dir_id);
    assert!(bd.path().join(PROMISE_FILE).exists(), "the promise is written before the answer");
    let st = b.node.status();
    assert!(st.fenced && st.promised_epoch == 1 && st.master_link.is_none(), "{st:?}");
    let b_max = b.node.store().max_offset();
    let out = put(&a, "after the fence").await;
    assert!(
        matches!(out.status, PutStatus::FlushSlaveTimeout | PutStatus::SlaveNotAvailable),
        "a fenced slave acked: {out:?}"
    );
    assert_eq!(b.node.store().max_offset(), b_max, "B took no byte after the fence");

    // A restart: the promise (1) is above the persisted role's epoch (0): fenced, no plane.
    b.stop().await;
    let b = ApiNode::start(slave_of(bd.path(), &a)).await;
    assert!(b.node.fenced() && b.node.promised_epoch() == 1);
    assert!(b.node.status().master_link.is_none(), "no slave plane below the promise");
    put(&a, "while B is fenced").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.node.store().max_offset(), b_max, "B follows nothing while fenced");

    // Told to follow A at the promise, B refuses A while A's last epoch (0) is below it.
    let follow = RoleRequest::slave(1, a.node.ha_addr().unwrap().to_string(), grpc_addr(&a));
    assert_eq!(b.node.change_role(follow).await.unwrap(), (Role::Slave, 1));
    assert!(!b.node.fenced(), "a completed ChangeRole at the promise ends the fence");
    wait_until(10, "B refuses A below its promise", || {
        b.node.status().master_link.is_some_and(|l| l.epoch_check.contains("promised epoch 1"))
    })
    .await;
    assert_eq!(b.node.store().max_offset(), b_max, "nothing of A's old term taken");
    a.node.change_role(RoleRequest::master(1)).await.unwrap();
    wait_until(10, "B follows A in epoch 1", || a.node.status().in_sync_replicas == 1).await;
    let out = put(&a, "epoch 1").await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    b.stop().await;
    a.stop().await;
}

/// A fenced master stops its data plane (a waiting SYNC put ends SERVICE_NOT_AVAILABLE,
/// outcome unknown, as at a shutdown) and refuses puts, naming the promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_master_ends_waiting_puts_and_refuses_new_ones() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(sync_master_config(ad.path(), Duration::from_secs(30))).await;
    let proxy = Proxy::start(a.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let mut bc = slave_of(bd.path(), &a);
    bc.slave.master_ha = proxy.addr.to_string();
    let b = ApiNode::start(bc).await;
    wait_until(10, "B in sync", || a.node.status().in_sync_replicas == 1).await;
    proxy.set_mode(ProxyMode::Stall);
    let node = Arc::clone(&a.node);
    let waiting = tokio::spawn(async move { node.put(vec![msg("T", 0, b"waits")]).await });
    wait_until(10, "the put waits", || a.node.status().pending_sync_puts == 1).await;

    let f = a.node.fence(1, "").await.unwrap();
    assert_eq!((f.role, f.promised_epoch), (Role::Master, 1));
    assert_eq!(f.end_offset, a.node.store().max_offset(), "the waiting put's record counts");
    let out = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, true), "{out:?}");
    let refused = put(&a, "refused").await;
    assert_eq!((refused.status, refused.stored), (PutStatus::ServiceNotAvailable, false));
    assert!(refused.detail.as_deref().unwrap_or("").contains("promised epoch 1"), "{refused:?}");
    assert!(a.node.ha_addr().is_none(), "no master data plane");
    assert_eq!(a.node.status().slaves.len(), 0);
    b.stop().await;
    a.stop().await;
}

/// A repeat at the promised epoch answers the same and changes nothing; a lower epoch is
/// refused naming the promise; the promise survives a restart over the persisted role; a
/// ChangeRole below it is refused, one at it ends the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_is_idempotent_and_survives_a_restart_until_a_change_role_at_the_promise() {
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(dir.path(), Role::Master);
    let a = ApiNode::start(config.clone()).await;
    let mut end = 0;
    for i in 0..3 {
        end = put(&a, &format!("m{i}")).await.end_offset;
    }
    let first = a.node.fence(3, "t3").await.unwrap();
    assert_eq!((first.promised_epoch, first.end_offset, first.last_record_epoch), (3, end, 0));
    let file = dir.path().join(PROMISE_FILE);
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes.starts_with(b"hasync-state promise v1 "));
    assert_eq!(a.node.fence(3, "t3").await.unwrap(), first, "a repeat answers the same");
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "and writes nothing");

    let mut r = a.replication().await;
    let below = r
        .fence(pb::FenceRequest { epoch: 2, token: String::new(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(below.code(), tonic::Code::FailedPrecondition, "{below:?}");
    assert!(below.message().contains("below this node's promised epoch 3"), "{below:?}");
    let zero = r
        .fence(pb::FenceRequest { epoch: 0, token: String::new(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(zero.code(), tonic::Code::InvalidArgument, "{zero:?}");
    let wire = r
        .fence(pb::FenceRequest { epoch: 3, token: "t3".into(), ..Default::default() })
        .await
        .unwrap();
    let wire = wire.into_inner();
    assert_eq!((wire.promised_epoch, wire.end_offset, wire.role), (3, end as i64, 1));
    assert_eq!((wire.history.len(), wire.data_dir_id), (1, first.data_dir_id.clone()));

    // The promise wins over the persisted role: back fenced, without a master plane.
    a.stop().await;
    let a = ApiNode::start(config.clone()).await;
    assert!(a.node.fenced() && a.node.ha_addr().is_none());
    let st = a.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap();
    let st = st.into_inner();
    assert!(st.fenced && st.promised_epoch == 3, "{st:?}");
    assert_eq!(put(&a, "x").await.status, PutStatus::ServiceNotAvailable);
    assert_eq!(a.node.fence(3, "t3").await.unwrap(), first, "the same answer after a restart");

    let err = a.node.change_role(RoleRequest::master(2)).await.unwrap_err().to_string();
    assert!(err.contains("below this node's promised epoch 3"), "{err}");
    let classic = RoleRequest::slave(3, "127.0.0.1:1", "");
    let err = a.node.change_role(classic).await.unwrap_err().to_string();
    assert!(err.contains("gRPC address"), "{err}");
    assert!(a.node.fenced() && a.node.epoch() == 0, "refusals change nothing");
    assert_eq!(a.node.change_role(RoleRequest::master(3)).await.unwrap(), (Role::Master, 3));
    assert!(!a.node.fenced());
    assert_eq!(put(&a, "after").await.status, PutStatus::PutOk);
    // A repeat of the fence now answers the node's state and fences nothing.
    let repeat = a.node.fence(3, "t3").await.unwrap();
    assert_eq!((repeat.role, repeat.epoch, a.node.fenced()), (Role::Master, 3, false));
    assert_eq!(repeat.last_record_epoch, 3, "the last record is of epoch 3");
    a.stop().await;
    let a = ApiNode::start(config).await;
    assert!(!a.node.fenced(), "the change at the promise is the role now");
    assert_eq!(put(&a, "after restart").await.status, PutStatus::PutOk);
    a.stop().await;
}

/// A decision the test sets.
#[derive(Debug)]
struct FakeCoordinator(Mutex<Result<Option<Decision>, String>>);

impl FakeCoordinator {
    fn set(&self, d: Result<Option<Decision>, String>) {
        *self.0.lock().unwrap() = d;
    }
}

impl Coordination for FakeCoordinator {
    fn decision(&self) -> BoxFuture<'_, Result<Option<Decision>, String>> {
        let d = self.0.lock().unwrap().clone();
        Box::pin(async move { d })
    }
}

fn decision(phase: DecisionPhase, chosen: Option<&str>, voters: &[(&str, &str)]) -> Decision {
    Decision {
        epoch: 5,
        token: "t5".into(),
        phase,
        chosen: chosen.map(str::to_owned),
        master: None,
        voters: voters.iter().map(|(n, id)| ((*n).to_owned(), (*id).to_owned())).collect(),
        k: 1,
        sync: true,
    }
}

/// In coordinator mode a Fence and a ChangeRole must match the decision (an old runbook's
/// request is refused naming what differs), and SetReplicationMode is the controller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_mode_refuses_what_does_not_match_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let coord = Arc::new(FakeCoordinator(Mutex::new(Ok(None))));
    let mut config = node_config(dir.path(), Role::Master);
    config.node.name = "a".into();
    let a = ApiNode::from(TestNode::start_coordinated(config, coord.clone()).await);
    let mut r = a.replication().await;
    let mode = pb::SetReplicationModeRequest {
        mode: pb::ReplicationMode::Async as i32,
        sync_ack_replicas: None,
    };
    let err = r.set_replication_mode(mode).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().starts_with("coordinator mode: the replication mode and k"), "{err}");
    assert!(err.message().contains("hasync cluster change"), "{err}");
    let err = a.node.fence(5, "t5").await.unwrap_err().to_string();
    assert!(err.contains("refused: coordinator mode, there is no decision"), "{err}");

    coord.set(Ok(Some(decision(DecisionPhase::Fencing, None, &[]))));
    let err = r
        .fence(pb::FenceRequest { epoch: 5, token: "old".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("token \"old\" is not the decision's \"t5\""), "{err:?}");
    let err = a.node.fence(4, "t5").await.unwrap_err().to_string();
    assert!(err.contains("epoch 4 is not the decision's 5"), "{err}");
    assert_eq!(a.node.promised_epoch(), 0, "refused fences promise nothing");
    a.node.fence(5, "t5").await.unwrap();

    // An old runbook's ChangeRole (no token), and one for a member the decision did not choose.
    coord.set(Ok(Some(decision(DecisionPhase::Promoting, Some("b"), &[]))));
    let err = a.node.change_role(RoleRequest::master(5)).await.unwrap_err().to_string();
    assert!(err.starts_with("refused: coordinator mode, "), "{err}");
    assert!(err.contains("decision_token \"\" is not the decision's \"t5\""), "{err}");
    let mut promote = RoleRequest::master(5);
    promote.decision_token = "t5".into();
    let err = a.node.change_role(promote.clone()).await.unwrap_err().to_string();
    assert!(err.contains("chosen member (\"b\"), not this node (\"a\")"), "{err}");
    assert!(a.node.fenced() && a.node.epoch() == 0, "refusals change nothing");

    let a_id = a.node.status().data_dir_id;
    let voters = [("a", a_id.as_str()), ("b", "0123456789abcdef0123456789abcdef")];
    coord.set(Ok(Some(decision(DecisionPhase::Promoting, Some("a"), &voters))));
    let req = pb::ChangeRoleRequest {
        role: pb::Role::Master as i32,
        epoch: 5,
        decision_token: "t5".into(),
        ..Default::default()
    };
    assert_eq!(r.change_role(req).await.unwrap().into_inner().epoch, 5);
    let st = a.node.status();
    assert!(!st.fenced && st.voters_set && st.voters == ["a", "b"], "{st:?}");
    assert_eq!(st.sync_ack_replicas, 1, "the decision's k");
    // Configured ASYNC, promoted in a SYNC group: SYNC from its first put (it used to keep
    // its own ASYNC until the agent's next round, answering PUT_OK with no ack meanwhile).
    assert_eq!(st.mode, hasync::config::ReplicationMode::Sync, "the group's mode");
    // A decision that cannot be read refuses.
    coord.set(Err("etcd: connection refused".into()));
    let err = a.node.change_role(promote).await.unwrap_err().to_string();
    assert!(err.contains("could not be read: etcd: connection refused"), "{err}");
    a.stop().await;
}

/// Invariant A at the node: in coordinator mode a SYNC put counts only a registered replica of
/// V (none before V is known); `None` brings back the rule without a coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_voters_acks_complete_a_sync_put() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let coord = Arc::new(FakeCoordinator(Mutex::new(Ok(None))));
    let config = sync_master_config(ad.path(), Duration::from_millis(300));
    let a = ApiNode::from(TestNode::start_coordinated(config, coord).await);
    let b = ApiNode::start(slave_of(bd.path(), &a)).await;
    let registered = |a: &ApiNode| {
        let st = a.node.status();
        st.slaves.len() == 1 && st.slaves[0].identity.starts_with("data-dir ")
    };
    wait_until(10, "B registered", || registered(&a)).await;
    let st = a.node.status();
    assert!(st.voters_set && st.voters.is_empty() && !st.slaves[0].voter, "{st:?}");
    assert_eq!(st.in_sync_replicas, 0, "no voter known yet: no ack counts");
    assert_eq!(put(&a, "no voters").await.status, PutStatus::SlaveNotAvailable);

    let b_id = b.node.status().data_dir_id;
    a.node.set_voters(Some(vec![("b".into(), b_id.clone())]));
    wait_until(10, "B counts", || a.node.status().in_sync_replicas == 1).await;
    let out = put(&a, "B votes").await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    assert_eq!(a.node.status().voters, ["b"]);
    // V without B (the master's own id in it never counts).
    let a_id = a.node.status().data_dir_id;
    a.node.set_voters(Some(vec![("a".into(), a_id)]));
    assert_eq!(a.node.status().in_sync_replicas, 0);
    assert_eq!(put(&a, "only the master").await.status, PutStatus::SlaveNotAvailable);
    a.node.set_voters(None);
    let st = a.node.status();
    assert!(!st.voters_set && st.slaves[0].voter && st.in_sync_replicas == 1, "{st:?}");
    assert_eq!(put(&a, "no voter set").await.status, PutStatus::PutOk);
    b.stop().await;
    a.stop().await;
}
