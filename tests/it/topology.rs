//! `WatchTopology` against a real etcd: two groups of two nodes; a failover in one group
//! reaches a watcher of the other group's node and leaves the other group untouched; a watch
//! resumed from an old revision gets exactly the changes since (no snapshot); a compacted
//! revision gets a fresh snapshot flagged resync; a node cut off from etcd says so in the
//! stream and says when it is back. Without a coordinator a node streams its own group.

use std::time::{Duration, Instant};

use hasync::control::pb;
use hasync::control::pb::cluster_client::ClusterClient;
use hasync::coordinator::Coordinator as _;
use tonic::transport::Channel;

use crate::support::etcd::connect_when_ready;
use crate::support::group::Group;

type Updates = tonic::Streaming<pb::TopologyUpdate>;

async fn client(addr: std::net::SocketAddr) -> ClusterClient<Channel> {
    let ch = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    ClusterClient::new(ch)
}

async fn open(c: &mut ClusterClient<Channel>, from_revision: i64) -> Updates {
    let req = pb::WatchTopologyRequest { from_revision, sample_interval_ms: 200 };
    tokio::time::timeout(Duration::from_secs(10), c.watch_topology(req))
        .await
        .expect("WatchTopology answers")
        .expect("WatchTopology")
        .into_inner()
}

/// The next update, within `within`.
async fn next(s: &mut Updates, within: Duration) -> pb::TopologyUpdate {
    match tokio::time::timeout(within, s.message()).await {
        Ok(Ok(Some(u))) => u,
        Ok(other) => panic!("the topology stream ended: {other:?}"),
        Err(_) => panic!("no topology update within {within:?}"),
    }
}

fn kind(u: &pb::TopologyUpdate) -> pb::TopologyUpdateKind {
    u.kind()
}

fn group<'a>(u: &'a pb::TopologyUpdate, g: &str) -> Option<&'a pb::GroupStatus> {
    u.groups.iter().find(|s| s.group == g)
}

/// Reads updates until `pred` holds for one (returned with the CHANGEs seen on the way,
/// that one included), within `within`.
async fn until(
    s: &mut Updates,
    within: Duration,
    what: &str,
    pred: impl Fn(&pb::TopologyUpdate) -> bool,
) -> (pb::TopologyUpdate, Vec<pb::TopologyUpdate>) {
    let deadline = Instant::now() + within;
    let mut changes = Vec::new();
    for _ in 0..10_000 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{what}: not within {within:?}; changes seen: {changes:#?}");
        let u = next(s, left).await;
        if kind(&u) == pb::TopologyUpdateKind::Change {
            changes.push(u.clone());
        }
        if pred(&u) {
            return (u, changes);
        }
    }
    panic!("{what}: too many updates");
}

/// A change as the client takes it: its revision and its groups, without what depends on
/// when it was sent (lease ages).
fn shape(u: &pb::TopologyUpdate) -> (i64, Vec<pb::GroupStatus>) {
    let mut groups = u.groups.clone();
    for g in &mut groups {
        for m in &mut g.members {
            m.lease_age_ms = 0;
        }
    }
    groups.sort_by(|a, b| a.group.cmp(&b.group));
    (u.revision, groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_reaches_a_watcher_and_a_resumed_watch_gets_exactly_the_changes_since() {
    let mut a = Group::start(2).await;
    let mut b = a.another_with("g2", 2, |_| {}).await;
    let a0 = a.wait_stable_master(None, Duration::from_secs(20)).await;
    let b0 = b.wait_stable_master(None, Duration::from_secs(20)).await;
    a.wait_put_ok("n1", Duration::from_secs(20)).await;
    let mut c = client(b.node("g2-n1").grpc_addr()).await;

    // The snapshot: both groups, their masters and members.
    let mut live = open(&mut c, 0).await;
    let snap = next(&mut live, Duration::from_secs(10)).await;
    assert_eq!(kind(&snap), pb::TopologyUpdateKind::Snapshot, "{snap:?}");
    assert!(!snap.resync && snap.coordinator_connected && snap.revision > 0, "{snap:?}");
    assert_eq!(snap.node, "g2-n1");
    let g1 = group(&snap, "g1").expect("g1 in the snapshot");
    let g2 = group(&snap, "g2").expect("g2 in the snapshot");
    assert_eq!((g1.master.as_deref(), g1.epoch), (Some("n1"), a0.epoch), "{g1:?}");
    assert_eq!((g2.master.as_deref(), g2.epoch), (Some("g2-n1"), b0.epoch), "{g2:?}");
    assert_eq!(g1.members.len(), 2, "{g1:?}");
    let m1 = g1.members.iter().find(|m| m.name == "n1").unwrap();
    assert!(m1.live && m1.role() == pb::Role::Master, "{m1:?}");
    let r0 = snap.revision;
    // g2 takes writes: its master publishes its confirm offset into its state record as it
    // moves, which is not a change of what g2 is.
    for _ in 0..5 {
        b.wait_put_ok("g2-n1", Duration::from_secs(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // g1's master dies: the watcher of a g2 node sees g1's new master, and only g1 changes.
    let (promoted_tx, promoted_rx) = tokio::sync::oneshot::channel::<Instant>();
    let engine = std::sync::Arc::clone(&a.engine);
    let state_key = a.keys.state("g1");
    // An independent watch of g1's state record: when etcd has the promotion.
    let observer = tokio::spawn(async move {
        let mut w = engine.watch(&state_key, r0 + 1).await.unwrap();
        while let Some(Ok(batch)) = w.recv().await {
            for ev in batch.events {
                if let hasync::coordinator::WatchEvent::Put(kv) = ev {
                    let s: hasync::coordinator::records::GroupState =
                        serde_json::from_slice(&kv.value).unwrap();
                    if s.master.as_deref() == Some("n2")
                        && s.phase == hasync::coordinator::records::Phase::Stable
                    {
                        let _ = promoted_tx.send(Instant::now());
                        return;
                    }
                }
            }
        }
    });
    a.crash("n1").await;
    let promoted = |u: &pb::TopologyUpdate| {
        kind(u) == pb::TopologyUpdateKind::Change
            && group(u, "g1").is_some_and(|g| {
                g.master.as_deref() == Some("n2") && g.phase() == pb::GroupPhase::Stable
            })
    };
    let (seen, changes) =
        until(&mut live, Duration::from_secs(40), "g1's new master", promoted).await;
    let arrived = Instant::now();
    let at = tokio::time::timeout(Duration::from_secs(5), promoted_rx).await.unwrap().unwrap();
    observer.abort();
    println!(
        "the promotion reached the watcher {:?} after etcd had it (revision {})",
        arrived.saturating_duration_since(at),
        seen.revision
    );
    let g1 = group(&seen, "g1").unwrap();
    assert!(g1.epoch > a0.epoch, "{g1:?}");
    assert!(!g1.recent_decisions.is_empty(), "the failover's decision is in the update: {g1:?}");
    assert_eq!(g1.recent_decisions[0].epoch, g1.epoch, "{g1:?}");
    assert!(
        changes.iter().all(|u| group(u, "g2").is_none()),
        "g2 was untouched, yet a change named it: {changes:#?}"
    );
    let revs: Vec<i64> = changes.iter().map(|u| u.revision).collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]) && revs[0] > r0, "{revs:?}");
    let b1 = b.state().await.unwrap();
    assert_eq!((b1.epoch, b1.master.as_deref()), (b0.epoch, Some("g2-n1")), "g2 untouched");
    // Offsets arrive sampled: n2 holds the puts n1 took.
    let mut sampled = open(&mut c, 0).await;
    let (u, _) = until(&mut sampled, Duration::from_secs(10), "n2's offsets", |u| {
        group(u, "g1").is_some_and(|g| g.members.iter().any(|m| m.name == "n2" && m.max_offset > 0))
    })
    .await;
    drop((u, sampled));
    println!("resuming from {r0}");

    // A watch resumed from r0: no snapshot, exactly the changes the live watch saw.
    let mut resumed = open(&mut c, r0).await;
    let last = seen.revision;
    let (_, replayed) = until(&mut resumed, Duration::from_secs(10), "the replay", |u| {
        assert_ne!(kind(u), pb::TopologyUpdateKind::Snapshot, "a resume sent a snapshot: {u:?}");
        u.revision >= last
    })
    .await;
    let want: Vec<_> = changes.iter().map(shape).collect();
    let got: Vec<_> = replayed.iter().filter(|u| u.revision <= last).map(shape).collect();
    assert_eq!(got.len(), want.len(), "the resumed watch's changes differ from the live watch's");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "a resumed change differs from the live one");
    }
    let g1 = group(replayed.last().unwrap(), "g1").unwrap();
    assert_eq!((g1.master.as_deref(), g1.phase()), (Some("n2"), pb::GroupPhase::Stable));

    println!("compacting");
    // Compacted past r0: a fresh snapshot, flagged.
    let etcd = connect_when_ready(a.etcd.options(Duration::from_secs(2)), 5).await;
    let (_, now) = etcd.get("/").await.unwrap();
    etcd.compact(now).await.unwrap();
    let mut fresh = open(&mut c, r0).await;
    let u = next(&mut fresh, Duration::from_secs(10)).await;
    assert_eq!(kind(&u), pb::TopologyUpdateKind::Snapshot, "{u:?}");
    assert!(u.resync && u.resync_reason.contains("compacted"), "{u:?}");
    assert_eq!(group(&u, "g1").unwrap().master.as_deref(), Some("n2"), "{u:?}");
    drop((resumed, fresh));

    println!("cutting");
    // A node cut off from etcd says so, then says when it is back.
    let mut c2 = client(b.node("g2-n2").grpc_addr()).await;
    let mut cut = open(&mut c2, 0).await;
    assert_eq!(
        kind(&next(&mut cut, Duration::from_secs(10)).await),
        pb::TopologyUpdateKind::Snapshot
    );
    b.member("g2-n2").proxy.cut();
    let (lost, _) = until(&mut cut, Duration::from_secs(15), "COORDINATOR_LOST", |u| {
        kind(u) == pb::TopologyUpdateKind::CoordinatorLost
    })
    .await;
    assert!(!lost.coordinator_connected && !lost.coordinator_error.is_empty(), "{lost:?}");
    println!("lost: {}", lost.coordinator_error);
    b.member("g2-n2").proxy.heal();
    let (back, _) = until(&mut cut, Duration::from_secs(20), "COORDINATOR_RESTORED", |u| {
        kind(u) == pb::TopologyUpdateKind::CoordinatorRestored
    })
    .await;
    assert!(back.coordinator_connected, "{back:?}");
    println!("restored");
    b.crash("g2-n1").await;
    a.crash("n2").await;
}

#[tokio::test]
async fn without_a_coordinator_a_node_streams_its_own_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::support::ha::node_config(dir.path(), hasync::config::Role::Master);
    cfg.node.name = "solo".into();
    let node = crate::support::node::TestNode::start(cfg).await;
    let mut c = client(node.grpc_addr()).await;
    let mut s = open(&mut c, 0).await;
    let u = next(&mut s, Duration::from_secs(5)).await;
    assert_eq!(kind(&u), pb::TopologyUpdateKind::Snapshot, "{u:?}");
    assert_eq!((u.revision, u.node.as_str(), u.groups.len()), (0, "solo", 1), "{u:?}");
    let g = &u.groups[0];
    assert_eq!((g.group.as_str(), g.master.as_deref()), ("solo", Some("solo")), "{g:?}");
    assert!(!g.failover_possible && g.blocked_reason.as_deref() == Some("no_coordinator"));
    // A resume has nothing to resume from: a snapshot flagged resync.
    let mut r = open(&mut c, 42).await;
    let u = next(&mut r, Duration::from_secs(5)).await;
    assert!(u.resync && kind(&u) == pb::TopologyUpdateKind::Snapshot, "{u:?}");
    let bad = pb::WatchTopologyRequest { from_revision: 0, sample_interval_ms: 5 };
    let e = c.watch_topology(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("sample_interval_ms"), "{e:?}");
    node.shutdown().await.unwrap();
}
