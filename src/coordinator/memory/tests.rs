use super::*;

fn put(key: &str, value: &str, lease: Option<LeaseId>) -> Op {
    Op::Put { key: key.into(), value: value.as_bytes().to_vec(), lease }
}

fn cmp(key: &str, op: CmpOp, target: CmpTarget) -> Compare {
    Compare { key: key.into(), op, target }
}

async fn put_one(c: &MemoryCoordinator, key: &str, value: &str) -> TxnResponse {
    c.txn(Txn { success: vec![put(key, value, None)], ..Txn::default() }).await.unwrap()
}

async fn next_batch(w: &mut WatchStream) -> Result<WatchBatch, Error> {
    tokio::time::timeout(Duration::from_secs(5), w.recv())
        .await
        .expect("a watch batch in time")
        .expect("the watch stream is open")
}

#[tokio::test(start_paused = true)]
async fn revisions_start_at_one_and_each_write_raises_them_with_create_mod_and_version() {
    let c = MemoryCoordinator::new();
    assert_eq!(c.get("/a").await.unwrap(), (None, 1));
    assert_eq!(put_one(&c, "/a", "1").await.revision, 2);
    assert_eq!(put_one(&c, "/b", "x").await.revision, 3);
    assert_eq!(put_one(&c, "/a", "2").await.revision, 4);
    let (kv, rev) = c.get("/a").await.unwrap();
    let kv = kv.unwrap();
    assert_eq!(rev, 4);
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 4, 2));
    assert_eq!(kv.value, b"2");
    // A transaction that changes nothing (a read, a delete of an absent key) keeps the revision.
    let r = c
        .txn(Txn {
            success: vec![Op::Get { key: "/a".into() }, Op::Delete { key: "/none".into() }],
            ..Txn::default()
        })
        .await
        .unwrap();
    assert_eq!(r.revision, 4);
    assert_eq!(r.reads, vec![vec![kv.clone()]]);
    // Several writes of one transaction share one revision.
    let r = c
        .txn(Txn {
            success: vec![put("/c", "1", None), Op::Delete { key: "/b".into() }],
            ..Txn::default()
        })
        .await
        .unwrap();
    assert_eq!(r.revision, 5);
    let (all, rev) = c.get_prefix("/").await.unwrap();
    assert_eq!(rev, 5);
    let keys: Vec<_> = all.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/a", "/c"]);
    // Deleted and created again: a new create revision, version 1.
    put_one(&c, "/b", "again").await;
    let b = c.get("/b").await.unwrap().0.unwrap();
    assert_eq!((b.create_revision, b.version), (6, 1));
}

#[tokio::test(start_paused = true)]
async fn compares_on_an_absent_key_read_zero_and_a_value_compare_on_it_fails() {
    let c = MemoryCoordinator::new();
    for (target, op, holds) in [
        (CmpTarget::CreateRevision(0), CmpOp::Equal, true),
        (CmpTarget::ModRevision(0), CmpOp::Equal, true),
        (CmpTarget::Version(0), CmpOp::Equal, true),
        (CmpTarget::Version(1), CmpOp::Less, true),
        (CmpTarget::Value(Vec::new()), CmpOp::Equal, false),
        (CmpTarget::Value(b"x".to_vec()), CmpOp::NotEqual, false),
    ] {
        let r = c
            .txn(Txn { compares: vec![cmp("/k", op, target.clone())], ..Txn::default() })
            .await
            .unwrap();
        assert_eq!(r.succeeded, holds, "{op:?} {target:?}");
    }
    put_one(&c, "/k", "v").await;
    let txn = |target| Txn {
        compares: vec![cmp("/k", CmpOp::Equal, target)],
        success: vec![Op::Get { key: "/k".into() }],
        failure: vec![Op::GetPrefix { prefix: "/".into() }],
    };
    let r = c.txn(txn(CmpTarget::Value(b"v".to_vec()))).await.unwrap();
    assert!(r.succeeded);
    let r = c.txn(txn(CmpTarget::CreateRevision(0))).await.unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.reads.len(), 1, "the failure branch's read");
}

#[tokio::test(start_paused = true)]
async fn a_cas_on_mod_revision_wins_once_of_two_racers() {
    let c = MemoryCoordinator::new();
    let rev = put_one(&c, "/state", "0").await.revision;
    let racer = |c: MemoryCoordinator, v: &'static str| async move {
        c.txn(Txn {
            compares: vec![cmp("/state", CmpOp::Equal, CmpTarget::ModRevision(rev))],
            success: vec![put("/state", v, None)],
            ..Txn::default()
        })
        .await
        .unwrap()
        .succeeded
    };
    let (a, b) = tokio::join!(racer(c.clone(), "a"), racer(c.new_client(), "b"));
    assert!(a ^ b, "exactly one wins: {a} {b}");
}

#[tokio::test(start_paused = true)]
async fn a_branch_writing_one_key_twice_or_a_put_on_a_missing_lease_is_refused_whole() {
    let c = MemoryCoordinator::new();
    let e = c
        .txn(Txn { success: vec![put("/a", "1", None), put("/a", "2", None)], ..Txn::default() })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Refused { call: "txn", .. }), "{e}");
    let e = c
        .txn(Txn {
            success: vec![put("/a", "1", None), put("/b", "1", Some(77))],
            ..Txn::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LeaseNotFound(77)), "{e}");
    assert_eq!(c.get("/a").await.unwrap(), (None, 1), "nothing of it was applied");
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_deletes_its_keys_and_the_watch_sees_the_delete() {
    let c = MemoryCoordinator::new();
    let lease = c.grant(Duration::from_millis(2500)).await.unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(3), "whole seconds, rounded up");
    let r = c
        .txn(Txn {
            success: vec![put("/g/leader", "n1", Some(lease.id)), put("/g/other", "x", None)],
            ..Txn::default()
        })
        .await
        .unwrap();
    assert_eq!(c.get("/g/leader").await.unwrap().0.unwrap().lease, lease.id);
    let mut w = c.watch("/g/", r.revision + 1).await.unwrap();
    // Keep-alives hold it past its first TTL.
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.keep_alive(lease.id).await.unwrap(), Duration::from_secs(3));
    }
    assert!(c.get("/g/leader").await.unwrap().0.is_some());
    // Then it expires on the virtual clock: one revision deletes its key, the other stays.
    tokio::time::advance(Duration::from_secs(3)).await;
    let b = next_batch(&mut w).await.unwrap();
    assert_eq!(
        b.events,
        vec![WatchEvent::Delete { key: "/g/leader".into(), mod_revision: r.revision + 1 }]
    );
    assert_eq!(c.get("/g/leader").await.unwrap(), (None, r.revision + 1));
    assert!(c.get("/g/other").await.unwrap().0.is_some());
    assert!(
        matches!(c.keep_alive(lease.id).await, Err(Error::LeaseNotFound(id)) if id == lease.id)
    );
    // A put on the expired lease is refused; a revoke of it is not an error.
    let e = c
        .txn(Txn { success: vec![put("/g/leader", "n2", Some(lease.id))], ..Txn::default() })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LeaseNotFound(_)), "{e}");
    c.revoke(lease.id).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_call_right_after_the_clock_passes_the_ttl_sees_the_expiry() {
    let c = MemoryCoordinator::new();
    let lease = c.grant(Duration::from_secs(1)).await.unwrap();
    c.txn(Txn { success: vec![put("/k", "v", Some(lease.id))], ..Txn::default() }).await.unwrap();
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(c.get("/k").await.unwrap().0.is_some());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(c.get("/k").await.unwrap().0.is_none());
}

#[tokio::test(start_paused = true)]
async fn revoke_deletes_the_keys_of_a_lease_in_one_revision() {
    let c = MemoryCoordinator::new();
    let lease = c.grant(Duration::from_secs(10)).await.unwrap();
    c.txn(Txn {
        success: vec![put("/a", "1", Some(lease.id)), put("/b", "1", Some(lease.id))],
        ..Txn::default()
    })
    .await
    .unwrap();
    // A key put again without the lease leaves it.
    put_one(&c, "/b", "2").await;
    let mut w = c.watch("/", 0).await.unwrap();
    c.revoke(lease.id).await.unwrap();
    let b = next_batch(&mut w).await.unwrap();
    assert_eq!(b.events, vec![WatchEvent::Delete { key: "/a".into(), mod_revision: 4 }]);
    assert_eq!(c.get("/b").await.unwrap().0.unwrap().value, b"2");
    assert!(matches!(c.keep_alive(lease.id).await, Err(Error::LeaseNotFound(_))));
}

#[tokio::test(start_paused = true)]
async fn a_watch_from_an_old_revision_replays_and_one_below_the_compaction_is_compacted() {
    let c = MemoryCoordinator::new();
    for i in 0..5 {
        put_one(&c, &format!("/w/{i}"), "v").await; // revisions 2..=6
    }
    put_one(&c, "/other", "v").await; // 7, outside the prefix
    let mut w = c.watch("/w/", 3).await.unwrap();
    let b = next_batch(&mut w).await.unwrap();
    let revs: Vec<_> = b
        .events
        .iter()
        .map(|e| match e {
            WatchEvent::Put(kv) => kv.mod_revision,
            WatchEvent::Delete { mod_revision, .. } => *mod_revision,
        })
        .collect();
    assert_eq!(revs, [3, 4, 5, 6]);
    assert_eq!(b.revision, 7);
    // Live changes follow.
    put_one(&c, "/w/0", "again").await;
    let b = next_batch(&mut w).await.unwrap();
    assert!(matches!(&b.events[..], [WatchEvent::Put(kv)] if kv.version == 2));

    c.compact(5).unwrap();
    assert!(matches!(c.compact(4), Err(Error::Compacted { .. })));
    assert!(matches!(c.compact(100), Err(Error::Refused { call: "compact", .. })));
    let mut w = c.watch("/w/", 4).await.unwrap();
    match next_batch(&mut w).await {
        Err(Error::Compacted { requested: 4, compact_revision: 5 }) => {}
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(w.recv().await.is_none(), "the watch ends after the error");
    // From the compact revision itself still replays.
    let mut w = c.watch("/w/", 5).await.unwrap();
    assert_eq!(next_batch(&mut w).await.unwrap().events.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_client_cut_off_fails_every_call_and_its_watch_while_its_lease_still_expires() {
    let store = MemoryCoordinator::new();
    let node = store.new_client();
    let lease = node.grant(Duration::from_secs(2)).await.unwrap();
    node.txn(Txn { success: vec![put("/m/n1", "up", Some(lease.id))], ..Txn::default() })
        .await
        .unwrap();
    let mut w = node.watch("/m/", 0).await.unwrap();
    let mut seen_by_other = store.watch("/m/", 0).await.unwrap();
    node.set_unavailable(true);
    assert!(matches!(next_batch(&mut w).await, Err(Error::Unavailable { .. })));
    assert!(matches!(node.keep_alive(lease.id).await, Err(Error::Unavailable { .. })));
    assert!(matches!(node.get("/m/n1").await, Err(Error::Unavailable { .. })));
    assert!(matches!(node.txn(Txn::default()).await, Err(Error::Unavailable { .. })));
    assert!(matches!(node.watch("/", 0).await, Err(Error::Unavailable { .. })));
    assert!(matches!(node.compact(1), Err(Error::Unavailable { .. })));
    // The other client is unaffected and sees the cut-off node's lease expire.
    tokio::time::advance(Duration::from_secs(2)).await;
    let b = next_batch(&mut seen_by_other).await.unwrap();
    assert!(matches!(&b.events[..], [WatchEvent::Delete { key, .. }] if key == "/m/n1"));
    node.set_unavailable(false);
    assert!(matches!(node.keep_alive(lease.id).await, Err(Error::LeaseNotFound(_))));
    assert_eq!(node.get("/m/n1").await.unwrap().0, None);
}
