//! Fenced role switching: the failover drill (promote the slave, demote the old master with the
//! same epoch, converge byte for byte, lose no PUT_OK), and the refusals that keep data safe.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::node::role::RoleRequest;
use hasync::node::{Node, PutStatus};
use hasync::store::fs::{Damage, FileSystem, SimFs};
use hasync::store::record::{self, Decoded};
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

use crate::support::grpc::ApiNode;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

fn grpc_addr(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

/// Every record body in `log` from `from`, in order.
fn bodies_from(log: &hasync::store::CommitLog, from: u64) -> Vec<String> {
    log.records_from(from)
        .map(|r| {
            let r = r.unwrap();
            let Ok(Decoded::Message(v)) = record::decode(&r.bytes, r.offset as i64) else {
                panic!()
            };
            String::from_utf8_lossy(v.body).into_owned()
        })
        .collect()
}

fn identical(a: &hasync::store::CommitLog, b: &hasync::store::CommitLog) -> bool {
    if a.max_offset() != b.max_offset() {
        return false;
    }
    let mut at = a.min_offset().max(b.min_offset());
    while at < a.max_offset() {
        let x = a.read(at, usize::MAX).unwrap().unwrap();
        let y = b.read(at, x.len()).unwrap().unwrap();
        if x[..y.len()] != y[..] {
            return false;
        }
        at += y.len() as u64;
    }
    true
}

/// Runs one drill; returns how many bytes the old master had to truncate.
async fn drill(seed: u64) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fs = Arc::new(SimFs::new());
    let mut ac = node_config(ad.path(), Role::Master);
    ac.replication.mode = ReplicationMode::Sync;
    ac.replication.slave_timeout = Duration::from_millis(300);
    // A flushes now and then: a power loss takes its unflushed tail, not everything.
    ac.store.flush_interval = Duration::from_millis(rng.random_range(50..150));
    ac.node.fence_on_unclean_start = true;
    let a = TestNode::start_with_fs(ac.clone(), fs.clone() as Arc<dyn FileSystem>).await;
    let proxy = Proxy::start(a.ha_addr().unwrap(), ProxyMode::Pass).await;
    let b = ApiNode::start(slave_node_config(bd.path(), proxy.addr)).await;
    wait_until(10, "B in sync", || a.status().in_sync_replicas == 1).await;

    // The writer: puts to whichever node is master, never retrying an unknown outcome.
    let target: Arc<Mutex<Option<Arc<Node>>>> = Arc::new(Mutex::new(Some(Arc::clone(a.node()))));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (target, stop) = (Arc::clone(&target), Arc::clone(&stop));
        async move {
            let mut outcomes: Vec<(String, PutStatus)> = Vec::new();
            let mut id = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let Some(node) = target.lock().await.clone() else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                id += 1;
                let body = format!("w{id}");
                let out = node.put(vec![msg("Drill", 0, body.as_bytes())]).await;
                outcomes.push((body, out.status));
            }
            outcomes
        }
    });
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
    // B stalls: A holds records B never gets.
    proxy.set_mode(ProxyMode::Stall);
    tokio::time::sleep(Duration::from_millis(rng.random_range(350..700))).await;
    // A dies, losing what it had not flushed.
    *target.lock().await = None;
    a.crash().await;
    drop(a);
    proxy.cut();
    fs.power_loss(Damage::Zero, seed).unwrap();

    // Promote B with epoch 1; the writer continues on B.
    let promote = RoleRequest::master(1);
    assert_eq!(b.node.change_role(promote).await.unwrap(), (Role::Master, 1), "seed {seed}");
    b.node.set_replication_mode(ReplicationMode::Async, None).unwrap();
    *target.lock().await = Some(Arc::clone(&b.node));
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;

    // A restarts (fenced: it was master and stopped uncleanly), is demoted with epoch 1,
    // truncates what B never had and catches up.
    let a = TestNode::start_with_fs(ac, fs.clone() as Arc<dyn FileSystem>).await;
    assert!(a.fenced(), "seed {seed}: an unclean master comes back fenced");
    assert_eq!(
        a.put(vec![msg("Drill", 0, b"refused")]).await.status,
        PutStatus::ServiceNotAvailable
    );
    let a_max = a.store().max_offset();
    let b_start = b.node.epoch_history().last().start_offset;
    let demote = RoleRequest::slave(1, b.node.ha_addr().unwrap().to_string(), grpc_addr(&b));
    assert_eq!(a.change_role(demote).await.unwrap(), (Role::Slave, 1), "seed {seed}");
    let st = a.status();
    assert_eq!(st.confirm_offset, 0, "a slave has no confirm offset of its own: {st:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let outcomes = writer.await.unwrap();
    wait_until(20, "A caught up with B", || identical(a.store(), b.node.store())).await;

    // Every PUT_OK is in B's log exactly once; A's log is B's, byte for byte.
    let in_b = bodies_from(b.node.store(), b.node.store().min_offset());
    let mut count: HashMap<&str, usize> = HashMap::new();
    for body in &in_b {
        *count.entry(body.as_str()).or_default() += 1;
    }
    let ok: Vec<_> = outcomes.iter().filter(|(_, s)| *s == PutStatus::PutOk).collect();
    assert!(ok.len() > 10, "seed {seed}: the writer made progress ({} PUT_OK)", ok.len());
    for (body, _) in &ok {
        assert_eq!(
            count.get(body.as_str()),
            Some(&1),
            "seed {seed}: PUT_OK {body} must be in B exactly once"
        );
    }
    assert!(count.values().all(|&n| n == 1), "seed {seed}: no record twice");
    // Queue offsets continue across the promotion: B's Drill/0 records count up by one.
    let qos: Vec<i64> = b
        .node
        .store()
        .records_from(b.node.store().min_offset())
        .map(|r| {
            let r = r.unwrap();
            let Ok(Decoded::Message(v)) = record::decode(&r.bytes, r.offset as i64) else {
                panic!()
            };
            v.queue_offset
        })
        .collect();
    assert!(qos.windows(2).all(|w| w[1] == w[0] + 1), "seed {seed}: queue offsets not continuous");
    let common = a.store().min_offset().max(b.node.store().min_offset());
    let (ra, rb) = (bodies_from(a.store(), common), bodies_from(b.node.store(), common));
    assert!(ra == rb, "seed {seed}: A and B hold different records ({} vs {})", ra.len(), rb.len());
    assert_eq!(a.epoch_history(), b.node.epoch_history(), "seed {seed}: A adopted B's history");
    a.shutdown().await.unwrap();
    b.stop().await;
    a_max.saturating_sub(b_start)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_drill_loses_nothing_acknowledged() {
    let iterations: u64 =
        std::env::var("HASYNC_FAILOVER_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut truncated = 0;
    for seed in 1..=iterations {
        eprintln!("failover drill seed {seed}");
        truncated += drill(seed).await;
    }
    assert!(truncated > 0, "the drills never made the old master truncate a divergent tail");
}

/// A master restarted behind its slave in the same epoch: the slave refuses to follow (its
/// epoch check says why) and keeps its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_refuses_a_master_behind_it_in_the_same_epoch() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(node_config(ad.path(), Role::Master)).await;
    let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    bc.slave.master_grpc = grpc_addr(&a);
    let b = ApiNode::start(bc).await;
    for i in 0..20u8 {
        a.node.put(vec![msg("T", 0, &[i; 500])]).await;
    }
    wait_until(10, "B caught up", || b.node.store().max_offset() == a.node.store().max_offset())
        .await;
    let link = b.node.status().master_link.unwrap();
    assert!(link.epoch_check.contains("epochs agree"), "{link:?}");
    // A loses its tail (as after a power loss) and comes back in the same epoch.
    let cut = a.node.store().records_from(0).nth(10).unwrap().unwrap().offset;
    a.node.store().truncate(cut).unwrap();
    let before = crate::support::all_bytes(b.node.store());
    assert!(b.node.status().master_link.is_some(), "still following");
    // Force a reconnect of B's data plane: cut the link by restarting B's role as slave of A.
    let again = RoleRequest::slave(1, a.node.ha_addr().unwrap().to_string(), grpc_addr(&a));
    let err = b.node.change_role(again).await.unwrap_err().to_string();
    assert!(err.contains("behind this node in the same epoch"), "{err}");
    assert_eq!(crate::support::all_bytes(b.node.store()), before, "nothing overwritten");
    assert_eq!(b.node.role(), Role::Slave);
    // Its data-plane reconnects refuse too, with the reason in the status.
    a.node.put(vec![msg("T", 0, b"poke")]).await;
    b.stop().await;
    let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    bc.slave.master_grpc = grpc_addr(&a);
    let b = ApiNode::start(bc).await;
    wait_until(10, "refusal in the status", || {
        b.node.status().master_link.is_some_and(|l| l.epoch_check.contains("behind this node"))
    })
    .await;
    assert_eq!(crate::support::all_bytes(b.node.store()), before, "nothing overwritten");
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_conflicting_epochs_are_refused_and_roles_survive_restarts() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(node_config(ad.path(), Role::Master)).await;
    let promote = RoleRequest::master;
    assert_eq!(a.node.change_role(promote(2)).await.unwrap(), (Role::Master, 2));
    assert_eq!(
        a.node.change_role(promote(2)).await.unwrap(),
        (Role::Master, 2),
        "an exact repeat is accepted"
    );
    let err = a.node.change_role(promote(1)).await.unwrap_err().to_string();
    assert!(err.contains("stale epoch"), "{err}");
    let conflicting = RoleRequest::slave(2, "127.0.0.1:1", "");
    let err = a.node.change_role(conflicting).await.unwrap_err().to_string();
    assert!(err.contains("already in force"), "{err}");
    assert_eq!(a.node.epoch_history().entries().len(), 2);
    let st = a
        .replication()
        .await
        .get_status(hasync::control::pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((st.epoch, st.epoch_history_length, st.fenced), (2, 2, false));
    // The role and epoch survive a restart, over the configuration.
    let ha = a.node.ha_addr().unwrap();
    a.stop().await;
    let mut cfg = node_config(ad.path(), Role::Slave);
    cfg.slave.master_ha = ha.to_string();
    let a = ApiNode::start(cfg).await;
    assert_eq!((a.node.role(), a.node.epoch()), (Role::Master, 2));
    // A slave never accepts a put.
    let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    bc.slave.master_grpc = grpc_addr(&a);
    let b = ApiNode::start(bc).await;
    let out = b.node.put(vec![msg("T", 0, b"x")]).await;
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, false));
    wait_until(10, "B adopted A's history", || b.node.epoch_history() == a.node.epoch_history())
        .await;
    b.stop().await;
    a.stop().await;
}

/// A ChangeRole whose client goes away mid-way still runs to its end on the node: a demotion
/// towards a master whose API never answers fences puts while it waits, then is refused and
/// unfences them. (When the change ran inside the call, the client's deadline dropped it
/// between the two steps and the node stayed fenced: every put refused until the next
/// ChangeRole.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_role_whose_client_gives_up_does_not_leave_the_node_fenced() {
    use hasync::control::pb;
    let dir = tempfile::tempdir().unwrap();
    let a = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    // A "master" whose gRPC port accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut req = tonic::Request::new(pb::ChangeRoleRequest {
        role: pb::Role::Slave as i32,
        epoch: 1,
        master_ha_address: "127.0.0.1:1".into(),
        master_grpc_address: silent_addr.to_string(),
        force_resync: false,
        decision_token: String::new(),
    });
    req.set_timeout(Duration::from_millis(300));
    let gave_up = a.replication().await.change_role(req).await.unwrap_err();
    assert!(
        matches!(gave_up.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled),
        "{gave_up:?}"
    );
    assert!(a.node.fenced(), "puts are fenced while the new master's history is awaited");
    wait_until(30, "the refused demotion unfenced puts", || !a.node.fenced()).await;
    assert_eq!((a.node.role(), a.node.epoch()), (Role::Master, 0), "nothing else changed");
    let out = a.node.put(vec![msg("T", 0, b"after")]).await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    hold.abort();
    a.stop().await;
}

/// A master whose SYNC puts wait for one slave's ack.
async fn sync_master(dir: &std::path::Path) -> ApiNode {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    ApiNode::start(c).await
}

/// A master promoted to a new epoch while it runs (a crashed master that came back fenced and
/// is now the best candidate: the fault harness's `repromoted-master-*` scenarios) starts a new
/// term: a slave that followed it in the old epoch reconnects and adopts the new history before
/// any byte of the new epoch counts as its ack. Before, the old HA connection carried on: the
/// slave acked new-epoch bytes filed under the old epoch (a SYNC put answered PUT_OK on that
/// ack), and cut them at its next epoch check ("truncated ... bytes the master never had"), so
/// the PUT_OK record was gone from the slave when the master died next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_promoted_to_a_new_epoch_makes_its_slave_adopt_it_before_acking() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = sync_master(ad.path()).await;
    let slave_config = || {
        let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
        bc.slave.master_grpc = grpc_addr(&a);
        bc
    };
    let b = ApiNode::start(slave_config()).await;
    wait_until(10, "B follows A", || a.node.status().in_sync_replicas == 1).await;
    for i in 0..10u8 {
        assert_eq!(a.node.put(vec![msg("T", 0, &[i; 300])]).await.status, PutStatus::PutOk);
    }
    let link = b.node.status().master_link.unwrap();
    assert!(link.epoch_check.contains("master epoch 0"), "{link:?}");

    a.node.change_role(RoleRequest::master(1)).await.unwrap();
    wait_until(10, "B follows A in epoch 1", || a.node.status().in_sync_replicas == 1).await;
    let out = a.node.put(vec![msg("T", 0, b"acked in epoch 1")]).await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    let last = b.node.epoch_history().last();
    assert_eq!(
        last.epoch,
        1,
        "the slave acked a put of epoch 1 with the history {:?}",
        b.node.epoch_history().entries()
    );

    // B reconnects (a restart): its epoch check must keep everything it acked.
    b.stop().await;
    let b = ApiNode::start(slave_config()).await;
    wait_until(10, "B connected again", || {
        b.node.status().master_link.is_some_and(|l| l.connected && !l.epoch_check.is_empty())
    })
    .await;
    let link = b.node.status().master_link.unwrap();
    assert!(link.epoch_check.contains("agree"), "B cut what it acked: {link:?}");
    assert!(b.node.store().max_offset() >= out.end_offset, "{link:?}");
    b.stop().await;
    a.stop().await;
}

/// A slave whose epoch check fetched the master's history just before the master opened a new
/// epoch (the answer still in flight while the master restarted its data plane) must not follow
/// the new term with the old history: at the session's first bytes it reads the master's epoch
/// again and reconnects. Before, the slave connected to the new plane with the stale history and
/// acked bytes of the new epoch filed under the old one (the fault harness's
/// `repromoted-master-blip` lost PUT_OK records this way after the plane-restart fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_check_answered_before_a_new_epoch_does_not_vouch_for_its_term() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = sync_master(ad.path()).await;
    let ha = Proxy::start(a.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let grpc = Proxy::start(a.running.grpc_addr(), ProxyMode::Pass).await;
    let mut bc = slave_node_config(bd.path(), ha.addr);
    bc.slave.master_grpc = grpc.addr.to_string();
    let b = ApiNode::start(bc).await;
    wait_until(10, "B follows A", || a.node.status().in_sync_replicas == 1).await;
    assert_eq!(a.node.put(vec![msg("T", 0, b"epoch 0")]).await.status, PutStatus::PutOk);

    // B's next check asks A (still at epoch 0); the answer is held while A opens epoch 1.
    grpc.set_mode(ProxyMode::StallReplies);
    ha.cut();
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.node.change_role(RoleRequest::master(1)).await.unwrap();
    grpc.set_mode(ProxyMode::Pass);
    wait_until(10, "B follows A in epoch 1", || a.node.status().in_sync_replicas == 1).await;
    // The replica may count as in sync during the stale session that the probe is about to end
    // (a put then answers SLAVE_NOT_AVAILABLE or times out: nothing acked); every PUT_OK,
    // though, must come from a slave holding epoch 1.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = a.node.put(vec![msg("T", 0, b"acked in epoch 1")]).await;
        if out.status == PutStatus::PutOk {
            assert_eq!(
                b.node.epoch_history().last().epoch,
                1,
                "the slave acked a put of epoch 1 with the history {:?} ({:?})",
                b.node.epoch_history().entries(),
                b.node.status().master_link
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no PUT_OK in epoch 1: {out:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.stop().await;
    a.stop().await;
}
