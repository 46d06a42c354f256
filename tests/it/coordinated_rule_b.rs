//! Rule B against a real etcd (issue 17): the group's master changes k, removes a member that
//! is gone, refuses what the rule forbids, degrades (only where allowed) and restores; and the
//! lease gauge falls while the coordinator is unreachable.

use std::time::{Duration, Instant};

use hasync::control::ClusterApi;
use hasync::control::pb;
use hasync::controller::cluster_api::ClusterView;
use hasync::coordinator::records::Mode;
use hasync::node::PutStatus;

use crate::metrics::scrape;
use crate::support::group::Group;
use crate::support::msg;

fn view(g: &Group) -> ClusterView {
    ClusterView::new(std::sync::Arc::clone(&g.engine), g.keys.clone())
}

async fn change(g: &Group, remove: &str, k: Option<u32>) -> pb::ChangeGroupOutcome {
    let req = pb::ChangeGroupRequest {
        group: g.group.clone(),
        remove_member: remove.to_owned(),
        k,
        mode: 0,
        timeout_ms: 20_000,
    };
    view(g).change_group(req).await.expect("an outcome")
}

/// Waits (bounded) until the state record satisfies `pred`.
async fn wait_state(
    g: &Group,
    what: &str,
    within: Duration,
    pred: impl Fn(&hasync::coordinator::records::GroupState) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let s = g.state().await;
        if s.as_ref().is_some_and(&pred) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_master_changes_k_and_removes_a_gone_member_in_rule_b_order() {
    let mut g = Group::start(3).await;
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    wait_state(&g, "all three in V", Duration::from_secs(20), |s| s.voters.len() == 3).await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;

    // Raise k: applied, caught up, then published.
    let o = change(&g, "", Some(2)).await;
    assert!(o.done, "{o:?}");
    assert_eq!((o.k, o.master.as_str()), (2, "n1"));
    assert_eq!(g.state().await.unwrap().k, 2);
    assert_eq!(g.node("n1").node().replication().sync_ack_replicas, 2);
    g.wait_put_ok("n1", Duration::from_secs(10)).await;

    // What the rule refuses changes nothing, and says why.
    let o = change(&g, "", Some(3)).await;
    assert!(!o.done && o.refusal.as_deref().unwrap_or("").contains("k = 3"), "{o:?}");
    let o = change(&g, "n1", None).await;
    assert!(!o.done && o.refusal.as_deref().unwrap_or("").contains("master"), "{o:?}");
    let o = change(&g, "n3", None).await;
    assert!(!o.done && o.refusal.as_deref().unwrap_or("").contains("live"), "{o:?}");
    let o = change(&g, "", Some(0)).await;
    assert!(!o.done && o.refusal.as_deref().unwrap_or("").contains("degrad"), "{o:?}");
    let s = g.state().await.unwrap();
    assert_eq!((s.k, s.voters.len()), (2, 3), "{s:?}");

    // n3 goes for good: k = 2 cannot survive its removal, so lower k first (published, then
    // applied), then remove it once its record expired.
    g.crash("n3").await;
    let o = change(&g, "", Some(1)).await;
    assert!(o.done, "{o:?}");
    assert_eq!(g.node("n1").node().replication().sync_ack_replicas, 1);
    let member = g.keys.member("g1", "n3");
    let deadline = Instant::now() + Duration::from_secs(15);
    while g.engine.get(&member).await.unwrap().0.is_some() {
        assert!(Instant::now() < deadline, "n3's member record did not expire");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let o = change(&g, "n3", None).await;
    assert!(o.done, "{o:?}");
    assert_eq!(o.voters, vec!["n1".to_owned(), "n2".to_owned()]);
    let s = g.state().await.unwrap();
    assert!(!s.is_voter("n3") && s.k == 1 && s.mode == Mode::Sync, "{s:?}");
    let put = g.node("n1").node().put(vec![msg("t", 0, b"after")]).await;
    assert_eq!(put.status, PutStatus::PutOk, "{:?}", put.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_allowed_to_degrade_does_so_without_its_slave_and_recovers() {
    let mut g = Group::start_with(2, |c| c.coordinator.allow_degrade = true).await;
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    wait_state(&g, "both in V", Duration::from_secs(20), |s| s.voters.len() == 2 && s.k == 1).await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;

    g.crash("n2").await;
    wait_state(&g, "degraded to k = 0", Duration::from_secs(20), |s| s.k == 0).await;
    g.wait_put_ok("n1", Duration::from_secs(5)).await;
    let st = view(&g).status(Some("g1")).await.unwrap();
    let group = &st.groups[0];
    assert!(!group.failover_possible, "{group:?}");
    assert_eq!(group.blocked_reason.as_deref(), Some("sync_degraded"), "{group:?}");
    // The gauges follow at the agent's next round.
    let m = scrape_until(&g, "hasync_coordinator_sync_degraded", 1.0).await;
    assert_eq!(m.value("hasync_coordinator_required_acks", &[]), 0.0);

    g.restart("n2").await;
    wait_state(&g, "k raised back to 1", Duration::from_secs(30), |s| s.k == 1).await;
    let r = g.node("n1").node().replication();
    assert_eq!((r.mode, r.sync_ack_replicas), (hasync::config::ReplicationMode::Sync, 1));
    g.wait_put_ok("n1", Duration::from_secs(10)).await;
    let m = scrape_until(&g, "hasync_coordinator_sync_degraded", 0.0).await;
    assert_eq!(m.value("hasync_coordinator_required_acks", &[]), 1.0);
}

/// Scrapes n1 until `name` reads `value` (bounded).
async fn scrape_until(g: &Group, name: &str, value: f64) -> crate::metrics::Scrape {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = scrape(g.node("n1").metrics_addr()).await;
        let now = m.value(name, &[]);
        if now == value {
            return m;
        }
        assert!(Instant::now() < deadline, "{name} is {now}, not {value}, after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lease gauge is the time left now: cut off from etcd, it falls to 0 within the TTL
/// (it used to keep the value of the last renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lease_gauge_falls_while_etcd_is_unreachable() {
    let g = Group::start(2).await;
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    let addr = g.node("n2").metrics_addr();
    let name = "hasync_coordinator_lease_remaining_seconds";
    let before = scrape(addr).await.value(name, &[]);
    assert!(before > 1.0, "a fresh lease: {before}");
    g.member("n2").proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let left = scrape(addr).await.value(name, &[]);
        if left < 0.5 {
            break;
        }
        assert!(Instant::now() < deadline, "the gauge still says {left} s after the cut");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    g.member("n2").proxy.heal();
}

/// A static pair moves to the coordinator one node at a time, master first, and back, slaves
/// first (docs/failover.md, "Bootstrap, etcd restores, and moving to the coordinator and
/// back"): the group bootstraps with the static master as its master at its epoch, nothing
/// PUT_OK is lost either way, and each step ends serving SYNC puts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_pair_moves_to_the_coordinator_and_back_one_node_at_a_time() {
    use hasync::config::Role;
    use hasync::coordinator::Coordinator;
    use hasync::coordinator::keys::Keys;

    use crate::support::etcd::{EtcdCluster, connect_when_ready};
    use crate::support::group::coordinated;
    use crate::support::ha::node_config;
    use crate::support::node::TestNode;

    async fn put_ok(node: &TestNode, n: usize, tag: &str) -> Vec<(u64, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut acked = Vec::new();
        while acked.len() < n {
            assert!(Instant::now() < deadline, "{tag}: {} of {n} PUT_OK in 20 s", acked.len());
            let body = format!("{tag}-{}", acked.len()).into_bytes();
            let out = node.node().put(vec![msg("t", 0, &body)]).await;
            if out.status == PutStatus::PutOk {
                acked.push((out.records[0].offset, body));
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        acked
    }
    async fn caught_up(slave: &TestNode, master: &TestNode, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while slave.node().store().max_offset() < master.node().store().max_offset() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    fn holds(node: &TestNode, name: &str, records: &[(u64, Vec<u8>)]) {
        for (offset, body) in records {
            let bytes = node.node().store().read(*offset, 64 * 1024).unwrap();
            let bytes = bytes.unwrap_or_else(|| panic!("{name}: nothing at {offset}: lost"));
            let d = hasync::store::record::decode(&bytes, *offset as i64).unwrap();
            let hasync::store::record::Decoded::Message(m) = d else { panic!("blank") };
            assert_eq!(m.body, &body[..], "{name}: another record at {offset}");
        }
    }
    let etcd = EtcdCluster::start(1);
    let endpoints = etcd.endpoints();
    let engine = connect_when_ready(etcd.options(Duration::from_secs(2)), 20).await;
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c1 = node_config(d1.path(), Role::Master);
    c1.node.name = "n1".into();
    c1.replication.mode = hasync::config::ReplicationMode::Sync;
    c1.replication.sync_ack_replicas = 1;
    let n1 = TestNode::start(c1.clone()).await;
    // Fixed addresses from now on: the slave follows n1 across n1's restarts.
    c1.ha.listen = n1.app().ha_addr().unwrap();
    c1.grpc.listen = n1.grpc_addr();
    let mut c2 = node_config(d2.path(), Role::Slave);
    c2.node.name = "n2".into();
    c2.slave.master_ha = c1.ha.listen.to_string();
    c2.slave.master_grpc = c1.grpc.listen.to_string();
    let n2 = TestNode::start(c2.clone()).await;
    let mut acked = put_ok(&n1, 20, "static").await;
    let epoch = n1.node().epoch();

    // The master first: it bootstraps the group as its master, at its epoch.
    n1.shutdown().await.unwrap();
    drop(n1);
    let coord1 = coordinated(c1.clone(), "n1", &endpoints);
    let n1 = TestNode::start(coord1.clone()).await;
    let keys = Keys::new("/hasync/v1/", crate::support::group::CLUSTER);
    let state_of = || async {
        let (kv, _) = engine.get(&keys.state("g1")).await.unwrap();
        kv.map(|kv| {
            hasync::coordinator::records::decode::<hasync::coordinator::records::GroupState>(
                &kv.key, &kv.value,
            )
            .unwrap()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        if let Some(s) = state_of().await
            && s.master.as_deref() == Some("n1")
        {
            break s;
        }
        assert!(Instant::now() < deadline, "no bootstrap with n1 master: {:?}", state_of().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(s.epoch >= epoch, "the group's epoch {} is below the pair's {epoch}", s.epoch);
    // Then the slave.
    n2.shutdown().await.unwrap();
    drop(n2);
    let coord2 = coordinated(c2.clone(), "n2", &endpoints);
    let n2 = TestNode::start(coord2).await;
    acked.extend(put_ok(&n1, 20, "coordinated").await);
    holds(&n1, "n1", &acked);
    caught_up(&n2, &n1, "n2 did not catch up under the coordinator").await;
    holds(&n2, "n2", &acked);

    // Back: pause, then the slave, then the master, without [coordinator].
    let view = ClusterView::new(std::sync::Arc::new(engine), keys);
    assert!(view.pause(None).await.unwrap().paused);
    n2.shutdown().await.unwrap();
    drop(n2);
    let n2 = TestNode::start(c2.clone()).await;
    n1.shutdown().await.unwrap();
    drop(n1);
    let n1 = TestNode::start(c1.clone()).await;
    assert_eq!(n1.node().role(), Role::Master);
    acked.extend(put_ok(&n1, 20, "static-again").await);
    holds(&n1, "n1", &acked);
    caught_up(&n2, &n1, "n2 did not catch up as a static slave again").await;
    holds(&n2, "n2", &acked);
    n2.shutdown().await.unwrap();
    n1.shutdown().await.unwrap();
}

/// Waits `for_` and fails if the state record leaves `pred` meanwhile.
async fn state_stays(
    g: &Group,
    what: &str,
    for_: Duration,
    pred: impl Fn(&hasync::coordinator::records::GroupState) -> bool,
) {
    let until = Instant::now() + for_;
    while Instant::now() < until {
        let s = g.state().await;
        assert!(s.as_ref().is_some_and(&pred), "{what}: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A degraded group's master restarted while its slave is still gone runs the published
/// k = 0 (its own `sync-ack-replicas` says 1) and does not publish k = 1: that would claim
/// every PUT_OK of the degrade on two members while only it holds them. Once the slave is back
/// and holds the log, the raise to 1 runs by rule B. (It used to "catch up" the state to its
/// own k at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_degraded_master_restarted_without_its_slave_stays_degraded_until_it_returns() {
    let mut g = Group::start_with(2, |c| c.coordinator.allow_degrade = true).await;
    g.pin_addresses("n1");
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    wait_state(&g, "both in V", Duration::from_secs(20), |s| s.voters.len() == 2 && s.k == 1).await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    g.crash("n2").await;
    wait_state(&g, "degraded to k = 0", Duration::from_secs(20), |s| s.k == 0).await;

    // Every state record from here until n2 returns is sampled: a k = 1 published for a
    // moment (and lowered again by the next degrade, one TTL later) is what this catches.
    let sampled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let sampler = {
        let (engine, key, seen) =
            (std::sync::Arc::clone(&g.engine), g.keys.state("g1"), std::sync::Arc::clone(&sampled));
        tokio::spawn(async move {
            for _ in 0..2_000 {
                if let Ok((Some(kv), _)) = engine.get(&key).await {
                    let s: hasync::coordinator::records::GroupState =
                        hasync::coordinator::records::decode(&key, &kv.value).unwrap();
                    seen.fetch_max(s.k, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    g.crash("n1").await;
    g.restart("n1").await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    state_stays(&g, "k stays 0 while n2 is gone", Duration::from_secs(4), |s| {
        s.k == 0 && s.master.as_deref() == Some("n1")
    })
    .await;
    sampler.abort();
    let seen = sampled.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(seen, 0, "a k = {seen} was published while n1 alone held the degraded puts");
    let r = g.node("n1").node().replication();
    assert_eq!(r.mode, hasync::config::ReplicationMode::Async, "the published k = 0 runs");

    g.restart("n2").await;
    g.wait_put_ok("n1", Duration::from_secs(10)).await;
    wait_state(&g, "k raised back to 1", Duration::from_secs(30), |s| s.k == 1).await;
    let r = g.node("n1").node().replication();
    assert_eq!((r.mode, r.sync_ack_replicas), (hasync::config::ReplicationMode::Sync, 1));
    g.wait_put_ok("n1", Duration::from_secs(10)).await;
}

/// The group's k starts at the nodes' `sync-ack-replicas` (2) once V allows it, raised by rule
/// B as members join; an operator's lower k is the group's from then on: a restarted master
/// whose own settings say 2 runs the published 1 and does not publish 2 (it used to, with no
/// wait for the watermark: PUT_OKs made under k = 1 would have counted as on three members).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_lower_k_survives_a_master_restart() {
    let mut g = Group::start_with(3, |c| c.replication.sync_ack_replicas = 2).await;
    g.pin_addresses("n1");
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    wait_state(&g, "k raised to 2 as V grew", Duration::from_secs(30), |s| {
        s.voters.len() == 3 && s.k == 2 && s.wanted_k == Some(2)
    })
    .await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    let o = change(&g, "", Some(1)).await;
    assert!(o.done, "{o:?}");
    wait_state(&g, "k = 1 wanted", Duration::from_secs(5), |s| s.wanted_k == Some(1)).await;

    let before = g.state().await.unwrap();
    g.crash("n1").await;
    g.restart("n1").await;
    let s = g.wait_stable_master(None, Duration::from_secs(30)).await;
    // The same master and term: what runs is the restarted node's choice, not a decision's.
    assert_eq!((s.master.as_deref(), s.epoch), (Some("n1"), before.epoch), "{s:?}");
    let master = s.master.clone().unwrap();
    g.wait_put_ok(&master, Duration::from_secs(20)).await;
    state_stays(&g, "the operator's k = 1 stays", Duration::from_secs(3), |s| {
        s.k == 1 && s.wanted_k == Some(1)
    })
    .await;
    let s = g.state().await.unwrap();
    let master = s.master.unwrap();
    assert_eq!(g.node(&master).node().replication().sync_ack_replicas, 1, "{master} runs k = 1");
}

/// A change request left behind past its expiry changes nothing when a master takes it, and
/// one that cannot be read is answered under its id, naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_or_unreadable_change_request_is_answered_and_changes_nothing() {
    use hasync::coordinator::Txn;
    use hasync::coordinator::records::{self, ChangeOutcome, ChangeRequest};

    let g = Group::start(3).await;
    g.wait_stable_master(None, Duration::from_secs(20)).await;
    wait_state(&g, "all three in V", Duration::from_secs(20), |s| s.voters.len() == 3).await;
    let before = g.state().await.unwrap();
    let outcome = |id: &'static str| {
        let key = g.keys.change_outcome("g1");
        let engine = std::sync::Arc::clone(&g.engine);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let (Some(kv), _) = engine.get(&key).await.unwrap() {
                    let o: ChangeOutcome = records::decode(&key, &kv.value).unwrap();
                    if o.id == id {
                        return o;
                    }
                }
                assert!(Instant::now() < deadline, "no outcome for {id}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let now = hasync::coordinator::unix_ms();
    let old = ChangeRequest {
        id: "expired-1".into(),
        remove_member: None,
        k: Some(2),
        mode: None,
        time_unix_ms: now - 60_000,
        expires_unix_ms: Some(now - 40_000),
    };
    let key = g.keys.change("g1");
    assert!(
        g.engine.txn(Txn::create_only(&key, records::encode(&old), None)).await.unwrap().succeeded
    );
    let o = outcome("expired-1").await;
    assert!(!o.done && o.refusal.as_deref().unwrap_or("").contains("expired"), "{o:?}");

    let garbage = br#"{"id":"garbled-1","k":"two"}"#.to_vec();
    assert!(g.engine.txn(Txn::create_only(&key, garbage, None)).await.unwrap().succeeded);
    let o = outcome("garbled-1").await;
    assert!(
        !o.done && o.refusal.as_deref().unwrap_or("").contains("not a change request"),
        "{o:?}"
    );
    let after = g.state().await.unwrap();
    assert_eq!((after.k, after.voters.len()), (before.k, before.voters.len()), "nothing changed");
    assert!(g.engine.get(&key).await.unwrap().0.is_none(), "answered requests are deleted");
}

/// A strict SYNC group runs at least the k it aims for: two nodes configured with
/// `sync-ack-replicas = 2` publish k = 1 (|V| - 1) but take no PUT_OK with one ack; the
/// operator's `--k 1` (the published k already) changes only what the group aims for, and
/// puts are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_strict_group_runs_the_k_it_aims_for_until_the_operator_lowers_it() {
    let g = Group::start_with(2, |c| c.replication.sync_ack_replicas = 2).await;
    wait_state(&g, "both in V", Duration::from_secs(20), |s| {
        s.voters.len() == 2 && s.k == 1 && s.wanted_k == Some(2)
    })
    .await;
    let put = g.node("n1").node().put(vec![crate::support::msg("t", 0, b"two acks")]).await;
    assert_eq!(put.status, PutStatus::SlaveNotAvailable, "{:?}", put.detail);
    assert_eq!(g.node("n1").node().replication().sync_ack_replicas, 2);

    let o = change(&g, "", Some(1)).await;
    assert!(o.done, "{o:?}");
    let s = g.state().await.unwrap();
    assert_eq!((s.k, s.wanted_k), (1, Some(1)), "{s:?}");
    g.wait_put_ok("n1", Duration::from_secs(10)).await;
    assert_eq!(g.node("n1").node().replication().sync_ack_replicas, 1);
}
