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
    let m = scrape(g.node("n1").metrics_addr()).await;
    assert_eq!(m.value("hasync_coordinator_sync_degraded", &[]), 1.0);
    assert_eq!(m.value("hasync_coordinator_required_acks", &[]), 0.0);

    g.restart("n2").await;
    wait_state(&g, "k raised back to 1", Duration::from_secs(30), |s| s.k == 1).await;
    let r = g.node("n1").node().replication();
    assert_eq!((r.mode, r.sync_ack_replicas), (hasync::config::ReplicationMode::Sync, 1));
    g.wait_put_ok("n1", Duration::from_secs(10)).await;
    let m = scrape(g.node("n1").metrics_addr()).await;
    assert_eq!(m.value("hasync_coordinator_sync_degraded", &[]), 0.0);
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
