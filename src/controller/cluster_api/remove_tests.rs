//! RemoveGroup against the in-memory engine: refused naming the live members and the leader
//! key, done once their lease expired (every key of the group gone, another group left
//! alone), NOT_FOUND and INVALID_ARGUMENT, and the race with a node that starts between the
//! read and the delete (refused, nothing deleted).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::coordinator::keys::Keys;
use crate::coordinator::memory::MemoryCoordinator;
use crate::coordinator::{Coordinator, Error, Lease, LeaseId, Revision, TxnResponse, WatchStream};

/// What the engine does right before a transaction that deletes a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Before {
    /// Nothing.
    Nothing,
    /// The first time, a node named `late` joins the group (its member record).
    JoinOnce,
    /// Every time, the state record is rewritten (a controller busy with the group).
    TouchAlways,
}

#[derive(Debug)]
struct Engine {
    inner: MemoryCoordinator,
    before: Before,
    deletes: AtomicUsize,
}

fn keys() -> Keys {
    Keys::new("/hasync/v1/", "c1")
}

async fn put(c: &dyn Coordinator, key: String, value: &[u8], lease: Option<LeaseId>) -> Revision {
    let op = Op::Put { key, value: value.to_vec(), lease };
    c.txn(Txn { success: vec![op], ..Txn::default() }).await.unwrap().revision
}

#[async_trait::async_trait]
impl Coordinator for Engine {
    async fn grant(&self, ttl: Duration) -> Result<Lease, Error> {
        self.inner.grant(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, Error> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke(&self, lease: LeaseId) -> Result<(), Error> {
        self.inner.revoke(lease).await
    }
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), Error> {
        self.inner.get(key).await
    }
    async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), Error> {
        self.inner.get_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        if txn.success.iter().any(|op| matches!(op, Op::DeletePrefix { .. })) {
            let n = self.deletes.fetch_add(1, Ordering::SeqCst);
            let k = keys();
            match self.before {
                Before::Nothing => {}
                Before::JoinOnce if n == 0 => {
                    put(&self.inner, k.member("g1", "late"), b"{}", None).await;
                }
                Before::JoinOnce => {}
                Before::TouchAlways => {
                    put(&self.inner, k.state("g1"), format!("{n}").as_bytes(), None).await;
                }
            }
        }
        self.inner.txn(txn).await
    }
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error> {
        self.inner.watch(prefix, from).await
    }
}

/// A cluster of two groups: g1 with a state, history, name claims, and the live records of
/// n1 (master, leader key) and n2 under one lease; g2 with a state record.
async fn cluster(before: Before) -> (Arc<Engine>, ClusterView, LeaseId) {
    let engine =
        Arc::new(Engine { inner: MemoryCoordinator::new(), before, deletes: AtomicUsize::new(0) });
    let k = keys();
    let lease = engine.grant(Duration::from_secs(30)).await.unwrap().id;
    let c: &dyn Coordinator = &*engine;
    put(c, k.state("g1"), b"{}", None).await;
    put(c, k.history_of("g1", 1), b"{}", None).await;
    put(c, k.state("g2"), b"{}", None).await;
    for n in ["n1", "n2"] {
        put(c, k.name_claim("g1", n), b"dir", None).await;
        put(c, k.member("g1", n), b"{}", Some(lease)).await;
    }
    let leader = records::encode(&LeaderRecord { name: "n1".into(), epoch: 1 });
    put(c, k.leader("g1"), &leader, Some(lease)).await;
    let view = ClusterView::new(engine.clone(), k);
    (engine, view, lease)
}

#[tokio::test(start_paused = true)]
async fn a_group_with_live_members_is_refused_naming_them_and_removed_once_they_are_gone() {
    let (engine, view, lease) = cluster(Before::Nothing).await;
    let e = view.remove("g1").await.unwrap_err();
    let ClusterError::FailedPrecondition(why) = &e else { panic!("{e:?}") };
    assert!(why.contains("live members: n1, n2"), "{why}");
    assert!(why.contains("leader key is held by n1 (epoch 1)"), "{why}");
    assert_eq!(engine.deletes.load(Ordering::SeqCst), 0, "nothing was tried");
    // The members' lease expires (they were stopped).
    engine.revoke(lease).await.unwrap();
    let done = view.remove(" g1 ").await.unwrap();
    assert_eq!((done.group.as_str(), done.removed_keys), ("g1", 4), "state, history, 2 claims");
    let (left, _) = engine.get_prefix(&keys().group("g1")).await.unwrap();
    assert!(left.is_empty(), "every key of g1 is gone: {left:?}");
    let (g2, _) = engine.get_prefix(&keys().group("g2")).await.unwrap();
    assert_eq!(g2.len(), 1, "g2 is left alone");
    assert!(matches!(view.remove("g1").await, Err(ClusterError::NotFound(_))));
}

#[tokio::test(start_paused = true)]
async fn unknown_and_malformed_groups_are_not_found_and_invalid() {
    let (_, view, _) = cluster(Before::Nothing).await;
    assert!(matches!(view.remove("g9").await, Err(ClusterError::NotFound(_))));
    for bad in ["", "a/b", "g1/members"] {
        let e = view.remove(bad).await.unwrap_err();
        assert!(matches!(e, ClusterError::InvalidArgument(_)), "{bad:?}: {e:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_that_starts_between_the_read_and_the_delete_makes_it_refused_not_half_done() {
    let (engine, view, lease) = cluster(Before::JoinOnce).await;
    engine.revoke(lease).await.unwrap();
    let before = engine.get_prefix(&keys().group("g1")).await.unwrap().0.len();
    let e = view.remove("g1").await.unwrap_err();
    let ClusterError::FailedPrecondition(why) = &e else { panic!("{e:?}") };
    assert!(why.contains("live members: late"), "{why}");
    let (left, _) = engine.get_prefix(&keys().group("g1")).await.unwrap();
    assert_eq!(left.len(), before + 1, "nothing deleted, the newcomer's record kept: {left:?}");
}

#[tokio::test(start_paused = true)]
async fn records_that_keep_changing_abort_after_a_bounded_number_of_attempts() {
    let (engine, view, lease) = cluster(Before::TouchAlways).await;
    engine.revoke(lease).await.unwrap();
    let e = view.remove("g1").await.unwrap_err();
    assert!(matches!(e, ClusterError::Conflict(_)), "{e:?}");
    assert_eq!(engine.deletes.load(Ordering::SeqCst), REMOVE_ATTEMPTS);
    let (left, _) = engine.get_prefix(&keys().group("g1")).await.unwrap();
    assert_eq!(left.len(), 4, "nothing deleted");
}
