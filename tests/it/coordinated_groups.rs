//! A cluster's groups against a real etcd (issue 18): a group is added by starting nodes with
//! its name and removed by `hasync cluster remove-group`, which refuses while the group has
//! a live member, and once its nodes are gone deletes its records without touching another
//! group; the controller forgets it and does not bring it back.

use std::time::{Duration, Instant};

use crate::support::group::Group;
use crate::support::process::metric;

/// `hasync <args>` as a process: (exit code, stdout, stderr).
async fn hasync(args: &[&str]) -> (Option<i32>, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"))
            .args(&args)
            .output()
            .expect("run hasync")
    })
    .await
    .unwrap();
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), so.into_owned(), se.into_owned())
}

/// The groups `hasync cluster status --json` lists.
async fn listed(url: &str) -> Vec<String> {
    let (code, out, err) = hasync(&["cluster", "status", "--json", "--grpc", url]).await;
    assert_eq!(code, Some(0), "cluster status: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let groups = v["groups"].as_array().cloned().unwrap_or_default();
    groups.iter().filter_map(|g| g["group"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remove_group_refuses_a_group_with_live_members_and_removes_it_once_they_are_gone() {
    let a = Group::start(1).await;
    let mut b = a.another_with("g2", 2, |_| {}).await;
    let a0 = a.wait_stable_master(None, Duration::from_secs(20)).await;
    let b0 = b.wait_stable_master(None, Duration::from_secs(20)).await;
    // Formed at bootstrap when both members registered first: the leader key follows in
    // g2-n1's next round (the refusal below names it).
    b.wait_leader_key("g2-n1", b0.epoch, Duration::from_secs(10)).await;
    let url = a.node("n1").url();
    let (code, out, err) =
        hasync(&["cluster", "remove-group", "--group", "g2", "--grpc", &url]).await;
    assert_eq!(code, Some(4), "refused while live: {out}{err}");
    assert!(err.contains("FAILED_PRECONDITION") && err.contains("g2-n1, g2-n2"), "{err}");
    assert!(err.contains("leader key is held by g2-n1"), "{err}");
    assert_eq!(listed(&url).await, ["g1", "g2"], "nothing was removed");

    // Its nodes die; their leases expire (3 s).
    b.crash("g2-n1").await;
    b.crash("g2-n2").await;
    let members = b.keys.members("g2");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !b.engine.get_prefix(&members).await.unwrap().0.is_empty() {
        assert!(Instant::now() < deadline, "the g2 members' leases did not expire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = b.keys.leader("g2");
    while b.engine.get(&leader).await.unwrap().0.is_some() {
        assert!(Instant::now() < deadline, "the g2 leader key did not expire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // n1's controller (the one left) finds g2's failover blocked: nobody to fence.
    let metrics = a.node("n1").metrics_addr();
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(metrics, "hasync_promotion_blocked").await.unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "no blocked failover of g2 in n1's controller");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (code, out, err) =
        hasync(&["cluster", "remove-group", "--group", "g2", "--grpc", &url]).await;
    assert_eq!(code, Some(0), "removed once no member is live: {out}{err}");
    assert!(out.starts_with("group g2 removed: "), "{out}");
    assert_eq!(listed(&url).await, ["g1"], "cluster status no longer lists g2");
    let (code, _, err) =
        hasync(&["cluster", "remove-group", "--group", "g2", "--grpc", &url]).await;
    assert_eq!(code, Some(4), "a group with no records is NOT_FOUND: {err}");
    assert!(err.contains("NOT_FOUND"), "{err}");

    // The controller forgets g2 (no blocked failover left) and does not bring it back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(metrics, "hasync_promotion_blocked").await.unwrap_or(1.0) > 0.0 {
        assert!(Instant::now() < deadline, "n1's controller still counts g2 as blocked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (left, _) = b.engine.get_prefix(&b.keys.group("g2")).await.unwrap();
    assert!(left.is_empty(), "g2 came back: {left:?}");
    // g1 is untouched: the same epoch and master, its member live.
    let s = a.state().await.unwrap();
    assert_eq!((s.epoch, s.master.as_deref()), (a0.epoch, Some("n1")), "{s:?}");
    assert!(a.engine.get(&a.keys.member("g1", "n1")).await.unwrap().0.is_some());
}
