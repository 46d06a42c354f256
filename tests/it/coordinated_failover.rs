//! Automatic failover against a real etcd (issue 17): nodes in coordinator mode, their member
//! agents and controllers, promotion after the master is killed, no PUT_OK record lost.

use std::time::Duration;

use hasync::config::Role;
use hasync::node::PutStatus;
use hasync::store::record;

use crate::support::group::Group;
use crate::support::msg;

/// Every PUT_OK body, with the offset its record was appended at.
async fn put_ok_records(g: &Group, on: &str, n: usize, tag: &str) -> Vec<(u64, Vec<u8>)> {
    let mut acked = Vec::new();
    for i in 0..n {
        let body = format!("{tag}-{i}").into_bytes();
        let out = g.node(on).node().put(vec![msg("t", 0, &body)]).await;
        if out.status == PutStatus::PutOk {
            acked.push((out.records[0].offset, body));
        }
    }
    acked
}

/// Each record is on `name` at its offset with its body.
fn holds_all(g: &Group, name: &str, records: &[(u64, Vec<u8>)]) {
    let store = g.node(name).node().store();
    for (offset, body) in records {
        let bytes = store
            .read(*offset, 64 * 1024)
            .unwrap_or_else(|e| panic!("{name}: read at {offset}: {e}"))
            .unwrap_or_else(|| panic!("{name} holds nothing at {offset}: a PUT_OK record is lost"));
        let d = record::decode(&bytes, *offset as i64)
            .unwrap_or_else(|e| panic!("{name}: no record at {offset}: {e}"));
        let record::Decoded::Message(m) = d else { panic!("{name}: a blank at {offset}") };
        assert_eq!(m.body, &body[..], "{name}: another record at {offset}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_is_replaced_and_no_put_ok_record_is_lost() {
    let mut g = Group::start(3).await;
    let first = g.wait_stable_master(None, Duration::from_secs(20)).await;
    assert_eq!(first.master.as_deref(), Some("n1"));
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    let acked = put_ok_records(&g, "n1", 200, "before").await;
    assert!(acked.len() >= 150, "only {} of 200 puts answered PUT_OK", acked.len());

    g.crash("n1").await;
    let state = g.wait_stable_master(Some("n1"), Duration::from_secs(30)).await;
    let new = state.master.clone().unwrap();
    assert!(state.epoch > first.epoch, "the failover opened a new epoch: {state:?}");
    holds_all(&g, &new, &acked);
    g.wait_put_ok(&new, Duration::from_secs(20)).await;
    let after = put_ok_records(&g, &new, 50, "after").await;
    assert!(!after.is_empty(), "the new master takes puts");

    // The history says why.
    let (kvs, _) = g.engine.get_prefix(&g.keys.history("g1")).await.unwrap();
    let last: hasync::coordinator::records::HistoryRecord =
        hasync::coordinator::records::decode("h", &kvs.last().unwrap().value).unwrap();
    assert_eq!(last.new_master.as_deref(), Some(new.as_str()));
    assert!(last.candidates.iter().any(|c| c.chosen && c.name == new), "{last:?}");

    // The old master comes back: fenced at start, pointed at the new master, it follows.
    g.restart("n1").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = g.node("n1").node().status();
        if s.role == Role::Slave && s.epoch == state.epoch {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "n1 did not rejoin as a slave: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let put = g.node("n1").node().put(vec![msg("t", 0, b"x")]).await;
    assert_ne!(put.status, PutStatus::PutOk, "the old master takes no puts");
}

/// A master alive but cut off from etcd: its lease expires, but its slaves still get its frames,
/// so the pre-vote blocks the failover (`master_alive`, in the state record), and the master,
/// SYNC, keeps serving on its voters' acks. Healed, it takes its lease and leader key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_cut_off_from_etcd_only_is_not_failed_over() {
    let g = Group::start(3).await;
    let first = g.wait_stable_master(None, Duration::from_secs(20)).await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    g.member("n1").proxy.cut();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let blocked = loop {
        let s = g.state().await.unwrap();
        if s.blocked_reason.is_some() || s.epoch != first.epoch {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "nothing happened after the cut: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(blocked.blocked_reason.as_deref(), Some("master_alive"), "{blocked:?}");
    assert_eq!((blocked.epoch, blocked.master.as_deref()), (first.epoch, Some("n1")));
    let acked = put_ok_records(&g, "n1", 20, "cut").await;
    assert!(!acked.is_empty(), "a SYNC master cut off from etcd keeps serving on voter acks");
    // Still no promotion a few lease lengths later.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = g.state().await.unwrap();
    assert_eq!((s.epoch, s.master.as_deref()), (first.epoch, Some("n1")), "{s:?}");
    g.member("n1").proxy.heal();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = g.state().await.unwrap();
        if s.blocked_reason.is_none() {
            assert_eq!((s.epoch, s.master.as_deref()), (first.epoch, Some("n1")));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the block did not clear: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holds_all(&g, "n1", &acked);
}

/// After a switchover the old master lives on as a slave and keeps its lease; the new master
/// must still take the group's leader key (found by the chaos harness: the key kept naming the
/// old master at its old epoch for as long as that node ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_key_follows_a_switchover() {
    use hasync::coordinator::records::{self, DecisionKind, LeaderRecord, OperatorRequest};
    use hasync::coordinator::{Op, Txn};

    let g = Group::start(3).await;
    let first = g.wait_stable_master(None, Duration::from_secs(20)).await;
    g.wait_put_ok("n1", Duration::from_secs(20)).await;
    let request = OperatorRequest {
        id: "r-leader-key".into(),
        kind: DecisionKind::Switchover,
        to: Some("n2".into()),
        accept_data_loss: false,
        time_unix_ms: hasync::coordinator::unix_ms(),
    };
    g.engine
        .txn(Txn {
            compares: vec![],
            success: vec![Op::Put {
                key: g.keys.request("g1"),
                value: records::encode(&request),
                lease: None,
            }],
            failure: vec![],
        })
        .await
        .unwrap();
    let state = g.wait_stable_master(Some("n1"), Duration::from_secs(30)).await;
    assert_eq!(state.master.as_deref(), Some("n2"), "{state:?}");
    assert!(state.epoch > first.epoch);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (kv, _) = g.engine.get(&g.keys.leader("g1")).await.unwrap();
        let leader = kv.map(|kv| records::decode::<LeaderRecord>(&kv.key, &kv.value).unwrap());
        if leader.as_ref().is_some_and(|l| l.name == "n2" && l.epoch == state.epoch) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the leader key does not name the new master n2 at epoch {}: {leader:?}",
            state.epoch
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the old master is a live slave all along
    assert_eq!(g.node("n1").node().status().role, Role::Slave);
}
