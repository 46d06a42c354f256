//! The coordinator against a real etcd (Debian's etcd-server, 3.4) and, where the behaviour
//! is the engine's, the same suite against the in-memory backend: lease expiry, CAS, prefix
//! compares and deletes, watch replay, compaction, the campaign's hand-over; then what only a real cluster has: losing a
//! member, a watch on a member without a leader, a client cut off by a proxy, auth, TLS with
//! client certificates.

use std::sync::Arc;
use std::time::Duration;

use hasync::coordinator::campaign::{campaign, leader};
use hasync::coordinator::etcd::pb::{authpb, etcdserverpb as rpc};
use hasync::coordinator::etcd::{EtcdCoordinator, EtcdOptions};
use hasync::coordinator::memory::MemoryCoordinator;
use hasync::coordinator::{
    CmpOp, CmpTarget, Compare, Coordinator, Error, LeaseId, Op, Revision, Txn, TxnResponse,
    WatchBatch, WatchEvent, WatchStream,
};
use tokio::time::Instant;

use crate::support::etcd::{EtcdCluster, EtcdProxy, connect_when_ready, tls_files};

type Coord = Arc<dyn Coordinator>;

const SECS: Duration = Duration::from_secs(1);

fn put(key: &str, value: &str, lease: Option<LeaseId>) -> Op {
    Op::Put { key: key.into(), value: value.as_bytes().to_vec(), lease }
}

async fn put_one(c: &dyn Coordinator, key: &str, value: &str) -> TxnResponse {
    let txn = Txn { success: vec![put(key, value, None)], ..Txn::default() };
    c.txn(txn).await.unwrap_or_else(|e| panic!("put {key}: {e}"))
}

/// The next batch of a watch within `within`.
async fn next_batch(w: &mut WatchStream, within: Duration) -> Result<WatchBatch, Error> {
    tokio::time::timeout(within, w.recv())
        .await
        .unwrap_or_else(|_| panic!("no watch batch within {within:?}"))
        .expect("the watch stream is open")
}

fn event_revision(e: &WatchEvent) -> Revision {
    match e {
        WatchEvent::Put(kv) => kv.mod_revision,
        WatchEvent::Delete { mod_revision, .. } => *mod_revision,
    }
}

/// A lease that is not kept alive expires, its key is deleted, a watch sees the delete, and
/// its keep-alive is then LeaseNotFound. Concurrent keep-alives each get their own answer.
async fn lease_expiry_deletes_its_keys_and_the_watch_sees_it(c: Coord, p: &str) {
    let lease = c.grant(SECS).await.unwrap();
    assert!(lease.ttl >= SECS, "{lease:?}");
    let key = format!("{p}member");
    let r = c.txn(Txn { success: vec![put(&key, "up", Some(lease.id))], ..Txn::default() });
    let r = r.await.unwrap();
    assert_eq!(c.get(&key).await.unwrap().0.unwrap().lease, lease.id);
    let mut w = c.watch(p, r.revision + 1).await.unwrap();
    let (a, b, d) =
        tokio::join!(c.keep_alive(lease.id), c.keep_alive(lease.id), c.keep_alive(lease.id));
    for ttl in [a, b, d] {
        assert!(ttl.unwrap() > Duration::ZERO);
    }
    let renewed = Instant::now();
    let b = next_batch(&mut w, lease.ttl + Duration::from_secs(5)).await.unwrap();
    assert!(renewed.elapsed() + Duration::from_millis(200) >= lease.ttl, "{:?}", renewed.elapsed());
    assert_eq!(b.events.len(), 1, "{b:?}");
    assert!(matches!(&b.events[0], WatchEvent::Delete { key: k, .. } if *k == key), "{b:?}");
    assert_eq!(c.get(&key).await.unwrap().0, None);
    assert!(
        matches!(c.keep_alive(lease.id).await, Err(Error::LeaseNotFound(id)) if id == lease.id)
    );
    c.revoke(lease.id).await.expect("revoking a lease that is gone is not an error");
}

/// Two clients CAS one key on the mod revision they read: exactly one wins.
async fn a_cas_on_mod_revision_wins_once_of_two_racers(c1: Coord, c2: Coord, p: &str) {
    let key = format!("{p}state");
    let rev = put_one(&*c1, &key, "0").await.revision;
    let cas = |c: Coord, v: &'static str| {
        let key = key.clone();
        async move {
            let txn = Txn {
                compares: vec![Compare {
                    key: key.clone(),
                    op: CmpOp::Equal,
                    target: CmpTarget::ModRevision(rev),
                }],
                success: vec![put(&key, v, None)],
                failure: vec![Op::Get { key: key.clone() }],
            };
            c.txn(txn).await.unwrap()
        }
    };
    let (a, b) = tokio::join!(cas(Arc::clone(&c1), "a"), cas(Arc::clone(&c2), "b"));
    assert!(a.succeeded ^ b.succeeded, "exactly one wins: {a:?} {b:?}");
    let (winner, loser) = if a.succeeded { (a, b) } else { (b, a) };
    let seen = &loser.reads[0][0];
    assert_eq!(seen.mod_revision, winner.revision, "the loser reads the winner's write");
    // A create-only compare on a present key fails; on an absent one it holds.
    let create = |k: &str| Txn {
        compares: vec![Compare {
            key: k.into(),
            op: CmpOp::Equal,
            target: CmpTarget::CreateRevision(0),
        }],
        success: vec![put(k, "new", None)],
        failure: Vec::new(),
    };
    assert!(!c1.txn(create(&key)).await.unwrap().succeeded);
    assert!(c1.txn(create(&format!("{p}absent"))).await.unwrap().succeeded);
}

/// A watch from an old revision replays every change since, in order, then follows.
async fn a_watch_from_an_old_revision_replays(c: Coord, p: &str) {
    let first = put_one(&*c, &format!("{p}a"), "1").await.revision;
    let second = put_one(&*c, &format!("{p}b"), "1").await.revision;
    let third = put_one(&*c, &format!("{p}a"), "2").await.revision;
    let del = Txn { success: vec![Op::Delete { key: format!("{p}b") }], ..Txn::default() };
    let last = c.txn(del).await.unwrap().revision;
    let mut w = c.watch(p, first).await.unwrap();
    let mut events = Vec::new();
    while events.len() < 4 {
        events.extend(next_batch(&mut w, Duration::from_secs(5)).await.unwrap().events);
    }
    // Other tests write elsewhere meanwhile: only this prefix's changes come, in order.
    let revs: Vec<_> = events.iter().map(event_revision).collect();
    assert_eq!(revs, [first, second, third, last], "{events:?}");
    assert!(matches!(&events[2], WatchEvent::Put(kv) if kv.version == 2 && kv.value == b"2"));
    assert!(matches!(&events[3], WatchEvent::Delete { key, .. } if *key == format!("{p}b")));
    // Then it follows live changes.
    let next = put_one(&*c, &format!("{p}c"), "1").await.revision;
    let b = next_batch(&mut w, Duration::from_secs(5)).await.unwrap();
    assert_eq!(b.events.iter().map(event_revision).collect::<Vec<_>>(), [next]);
}

/// The leader of a campaign that stops renewing its lease hands over to the next campaigner,
/// whose leadership has a higher fencing revision.
async fn a_campaign_hands_over_when_the_leaders_lease_expires(c1: Coord, c2: Coord, p: &str) {
    let key = format!("{p}controller");
    let l1 = c1.grant(SECS).await.unwrap();
    let l2 = c2.grant(Duration::from_secs(30)).await.unwrap();
    let first = campaign(&*c1, &key, b"c1", l1.id).await.unwrap();
    let second = tokio::spawn({
        let (c2, key) = (Arc::clone(&c2), key.clone());
        async move { campaign(&*c2, &key, b"c2", l2.id).await }
    });
    let second = tokio::time::timeout(l1.ttl + Duration::from_secs(5), second)
        .await
        .expect("the second campaigner leads once the first's lease expired")
        .unwrap()
        .unwrap();
    assert!(second.revision > first.revision, "{first:?} {second:?}");
    assert_eq!(leader(&*c1, &key).await.unwrap(), Some((b"c2".to_vec(), second.revision)));
    assert!(!first.holds(&*c1).await.unwrap());
    c2.revoke(l2.id).await.unwrap();
    assert_eq!(leader(&*c1, &key).await.unwrap(), None, "revoking the lease ends the leadership");
}

/// A prefix compare holds while no key under the prefix was created or changed since the
/// revision (an empty prefix too; a key deleted since is not seen), and a prefix delete takes
/// every key under the prefix in one operation, leaving the keys beside it.
async fn a_prefix_compare_sees_creations_and_changes_and_a_prefix_delete_takes_all(
    c: Coord,
    p: &str,
) {
    let g = format!("{p}g/");
    let empty = c.get(&format!("{p}none")).await.unwrap().1;
    let gone = |rev| Txn {
        compares: vec![Compare::prefix_unchanged_since(&g, rev)],
        success: vec![Op::DeletePrefix { prefix: g.clone() }],
        failure: vec![Op::GetPrefix { prefix: g.clone() }],
    };
    let probe = |rev| Txn { success: vec![], ..gone(rev) };
    assert!(c.txn(probe(empty)).await.unwrap().succeeded, "an empty prefix is unchanged");
    put_one(&*c, &format!("{p}g/a"), "1").await;
    let read = put_one(&*c, &format!("{p}g/b"), "1").await.revision;
    put_one(&*c, &format!("{p}gx"), "beside").await;
    put_one(&*c, &format!("{p}g/d"), "1").await;
    let del = Txn { success: vec![Op::Delete { key: format!("{p}g/d") }], ..Txn::default() };
    c.txn(del).await.unwrap();
    assert!(c.txn(probe(read)).await.unwrap().succeeded, "a key created and deleted since: gone");
    put_one(&*c, &format!("{p}g/c"), "new").await;
    let r = c.txn(gone(read)).await.unwrap();
    assert!(!r.succeeded, "a key created since the read fails the compare");
    assert_eq!(r.reads[0].len(), 3, "nothing deleted: {:?}", r.reads);
    put_one(&*c, &format!("{p}g/c"), "changed").await;
    let now = c.get(&format!("{p}none")).await.unwrap().1;
    put_one(&*c, &format!("{p}g/a"), "2").await;
    assert!(!c.txn(probe(now)).await.unwrap().succeeded, "a key changed since fails it");
    let now = c.get(&format!("{p}none")).await.unwrap().1;
    let r = c.txn(gone(now)).await.unwrap();
    assert!(r.succeeded);
    assert!(c.get_prefix(&g).await.unwrap().0.is_empty(), "every key under the prefix is gone");
    let (beside, _) = c.get(&format!("{p}gx")).await.unwrap();
    assert_eq!(beside.unwrap().value, b"beside", "a key beside the prefix stays");
}

/// The behaviours every backend shares, each under its own prefix, concurrently.
async fn engine_suite(c1: Coord, c2: Coord, root: &str) {
    let [l, c, w, e, d] = ["l", "c", "w", "e", "d"].map(|t| format!("{root}{t}/"));
    tokio::join!(
        lease_expiry_deletes_its_keys_and_the_watch_sees_it(Arc::clone(&c1), &l),
        a_prefix_compare_sees_creations_and_changes_and_a_prefix_delete_takes_all(
            Arc::clone(&c1),
            &d
        ),
        a_cas_on_mod_revision_wins_once_of_two_racers(Arc::clone(&c1), Arc::clone(&c2), &c),
        a_watch_from_an_old_revision_replays(Arc::clone(&c2), &w),
        a_campaign_hands_over_when_the_leaders_lease_expires(c1, c2, &e),
    );
}

/// Compaction: a watch from below the compact revision gets Compacted, naming it.
async fn a_watch_below_the_compaction_is_compacted(c: Coord, compacted_at: Revision, p: &str) {
    let mut w = c.watch(p, compacted_at - 1).await.unwrap();
    match next_batch(&mut w, Duration::from_secs(5)).await {
        Err(Error::Compacted { compact_revision, .. }) => {
            assert_eq!(compact_revision, compacted_at)
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(w.recv().await.is_none(), "the watch ends after the error");
    // From the compact revision itself it still replays.
    let mut w = c.watch(p, compacted_at).await.unwrap();
    assert!(!next_batch(&mut w, Duration::from_secs(5)).await.unwrap().events.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_semantics_hold_on_a_real_etcd() {
    let etcd = EtcdCluster::start(1);
    let c1: Coord = Arc::new(connect_when_ready(etcd.options(Duration::from_secs(2)), 20).await);
    let c2: Coord = Arc::new(connect_when_ready(etcd.options(Duration::from_secs(2)), 5).await);
    // A fresh etcd is at revision 1, and a read of an absent key says so.
    assert_eq!(c1.get("/t/none").await.unwrap(), (None, 1));
    engine_suite(Arc::clone(&c1), Arc::clone(&c2), "/t/").await;

    let etcd1 = EtcdCoordinator::connect(etcd.options(Duration::from_secs(2))).await.unwrap();
    for i in 0..3 {
        put_one(&*c1, &format!("/k/{i}"), "v").await;
    }
    let at = put_one(&*c1, "/k/3", "v").await.revision;
    etcd1.compact(at).await.unwrap();
    a_watch_below_the_compaction_is_compacted(Arc::clone(&c1), at, "/k/").await;
}

#[tokio::test]
async fn the_engine_semantics_hold_on_the_memory_backend() {
    let m = MemoryCoordinator::new();
    let c1: Coord = Arc::new(m.clone());
    let c2: Coord = Arc::new(m.new_client());
    assert_eq!(c1.get("/t/none").await.unwrap(), (None, 1));
    engine_suite(Arc::clone(&c1), c2, "/t/").await;
    for i in 0..3 {
        put_one(&*c1, &format!("/k/{i}"), "v").await;
    }
    let at = put_one(&*c1, "/k/3", "v").await.revision;
    m.compact(at).unwrap();
    a_watch_below_the_compaction_is_compacted(c1, at, "/k/").await;
}

/// Retries `f` on Unavailable until it succeeds or `secs` pass.
async fn until_available<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e @ Error::Unavailable { .. }) => {
                assert!(Instant::now() < deadline, "{what}: still unavailable after {secs}s: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_survives_losing_a_member_and_reads_stay_linearizable() {
    let mut etcd = EtcdCluster::start(3);
    let opts = etcd.options(Duration::from_secs(2));
    let c = connect_when_ready(opts.clone(), 30).await;
    let written = put_one(&c, "/3/k", "before").await;
    // Another client that talks to member 2 only.
    let other = EtcdOptions { endpoints: vec![etcd.endpoints()[2].clone()], ..opts.clone() };
    let other = connect_when_ready(other, 10).await;
    assert_eq!(other.get("/3/k").await.unwrap().0.unwrap().mod_revision, written.revision);

    // The member the client talks to (the first endpoint) dies.
    etcd.kill(0);
    let after = until_available(20, "a write after losing member 0", || async {
        c.txn(Txn { success: vec![put("/3/k", "after", None)], ..Txn::default() }).await
    })
    .await;
    // A write one client saw acknowledged is seen by a read through another member at once.
    let (kv, rev) = other.get("/3/k").await.unwrap();
    assert_eq!(kv.unwrap().value, b"after");
    assert!(rev >= after.revision);
    let w = put_one(&other, "/3/k", "from-2").await;
    let (kv, _) = c.get("/3/k").await.unwrap();
    assert_eq!(kv.unwrap().mod_revision, w.revision, "the read follows the other client's write");
    // Leases and keep-alives work on the two members left.
    let lease = c.grant(SECS).await.unwrap();
    assert!(c.keep_alive(lease.id).await.unwrap() > Duration::ZERO);
    c.revoke(lease.id).await.unwrap();
}

/// A watch on a member that lost its leader (the two others died) ends with an error instead
/// of staying open and silent (etcd's require-leader), so a reader of the watch (the
/// controller's cache of the groups) knows that it is no longer told about changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_member_without_a_leader_ends() {
    let mut etcd = EtcdCluster::start(3);
    let opts = etcd.options(Duration::from_secs(2));
    let only_2 = EtcdOptions { endpoints: vec![etcd.endpoints()[2].clone()], ..opts };
    let c = connect_when_ready(only_2, 30).await;
    let written = put_one(&c, "/w/k", "1").await;
    let mut w = c.watch("/w/", written.revision).await.unwrap();
    let b = next_batch(&mut w, Duration::from_secs(5)).await.unwrap();
    assert_eq!(b.events.len(), 1, "{b:?}");
    etcd.kill(0);
    etcd.kill(1);
    // etcd ends such streams after a few election timeouts (2 s each in the tests).
    let ended = tokio::time::timeout(Duration::from_secs(30), w.recv())
        .await
        .expect("the watch did not end within 30 s of its member losing the leader");
    assert!(matches!(ended, None | Some(Err(_))), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_by_the_proxy_fails_within_the_timeout_and_heal_restores_it() {
    let etcd = EtcdCluster::start(1);
    let proxy = EtcdProxy::start(etcd.members[0].client).await;
    let timeout = Duration::from_secs(1);
    let direct = connect_when_ready(etcd.options(timeout), 20).await;
    let cut_off = EtcdOptions { endpoints: vec![proxy.addr.to_string()], ..etcd.options(timeout) };
    let node = connect_when_ready(cut_off, 5).await;
    let lease = node.grant(SECS).await.unwrap();
    let r = node
        .txn(Txn { success: vec![put("/p/n1", "up", Some(lease.id))], ..Txn::default() })
        .await
        .unwrap();
    let mut node_watch = node.watch("/p/", r.revision + 1).await.unwrap();
    let mut direct_watch = direct.watch("/p/", r.revision + 1).await.unwrap();

    proxy.cut();
    let e = next_batch(&mut node_watch, Duration::from_secs(3)).await;
    assert!(matches!(e, Err(Error::Unavailable { .. })), "the cut-off watch ends: {e:?}");
    let started = Instant::now();
    let e = node.get("/p/n1").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    assert!(started.elapsed() < timeout + Duration::from_millis(700), "{:?}", started.elapsed());
    let e = node.keep_alive(lease.id).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    let e = node.txn(Txn { success: vec![put("/p/x", "1", None)], ..Txn::default() }).await;
    assert!(matches!(e, Err(Error::Unavailable { .. })), "{e:?}");
    // Cut off, the node's lease runs out: the others see its key go.
    let b = next_batch(&mut direct_watch, lease.ttl + Duration::from_secs(5)).await.unwrap();
    assert!(matches!(&b.events[..], [WatchEvent::Delete { key, .. }] if key == "/p/n1"), "{b:?}");

    proxy.heal();
    let (kv, _) = until_available(10, "a read after the heal", || node.get("/p/n1")).await;
    assert_eq!(kv, None);
    assert!(matches!(node.keep_alive(lease.id).await, Err(Error::LeaseNotFound(_))));
    assert!(node.watch("/p/", 0).await.is_ok());
}

/// Sets etcd's auth up through its v3 API (no etcdctl here): root, and a user `hasync` whose
/// role may read and write `/hasync/`; then enables auth.
async fn enable_auth(endpoint: &str) {
    let mut auth = rpc::auth_client::AuthClient::connect(format!("http://{endpoint}"))
        .await
        .expect("connect to etcd's Auth service");
    let user = |name: &str, password: &str| rpc::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
    };
    auth.user_add(user("root", "root-pw")).await.expect("add root");
    let grant = |user: &str, role: &str| rpc::AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    };
    auth.user_grant_role(grant("root", "root")).await.expect("grant root the root role");
    auth.role_add(rpc::AuthRoleAddRequest { name: "hasync".into() }).await.expect("add a role");
    let perm = authpb::Permission {
        perm_type: authpb::permission::Type::Readwrite as i32,
        key: b"/hasync/".to_vec(),
        range_end: b"/hasync0".to_vec(),
    };
    let grant_perm =
        rpc::AuthRoleGrantPermissionRequest { name: "hasync".into(), perm: Some(perm) };
    auth.role_grant_permission(grant_perm).await.expect("grant /hasync/ to the role");
    auth.user_add(user("hasync", "right")).await.expect("add the user");
    auth.user_grant_role(grant("hasync", "hasync")).await.expect("grant the role");
    auth.auth_enable(rpc::AuthEnableRequest {}).await.expect("enable auth");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refuses_a_wrong_password_and_a_right_one_works_across_token_expiry() {
    // Tokens live 1 s unused: the client must authenticate again.
    let etcd = EtcdCluster::start_with(1, None, &["--auth-token-ttl", "1"]);
    let timeout = Duration::from_secs(2);
    drop(connect_when_ready(etcd.options(timeout), 20).await);
    enable_auth(&etcd.endpoints()[0]).await;
    let as_user = |user: &str, password: &str| EtcdOptions {
        user: Some((user.into(), password.into())),
        ..etcd.options(timeout)
    };
    match EtcdCoordinator::connect(as_user("hasync", "wrong")).await {
        Err(Error::Auth(m)) => {
            assert!(m.contains("authentication failed") && m.contains("user hasync"), "{m}")
        }
        other => panic!("expected Error::Auth, got {other:?}"),
    }
    assert!(matches!(EtcdCoordinator::connect(as_user("nobody", "x")).await, Err(Error::Auth(_))));
    let plain = EtcdCoordinator::connect(etcd.options(timeout)).await.unwrap();
    assert!(matches!(plain.get("/hasync/k").await, Err(Error::Auth(_))), "no user, no reads");

    let c = EtcdCoordinator::connect(as_user("hasync", "right")).await.unwrap();
    put_one(&c, "/hasync/k", "v").await;
    assert_eq!(c.get("/hasync/k").await.unwrap().0.unwrap().value, b"v");
    let e = c.get("/other").await.unwrap_err();
    assert!(matches!(&e, Error::Auth(m) if m.contains("permission denied")), "{e}");
    let mut w = c.watch("/hasync/", 0).await.unwrap();
    // The token expires unused; the next calls authenticate again (a watch's creation
    // first: etcd answers it "permission denied" rather than "invalid token").
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut w2 = c.watch("/hasync/", 0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let lease = c.grant(SECS).await.unwrap();
    put_one(&c, "/hasync/k", "v2").await;
    assert!(c.keep_alive(lease.id).await.is_ok());
    let b = next_batch(&mut w, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(&b.events[..], [WatchEvent::Put(kv)] if kv.value == b"v2"), "{b:?}");
    assert_eq!(next_batch(&mut w2, Duration::from_secs(5)).await.unwrap(), b);
    c.revoke(lease.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_connects_and_without_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = tls_files(dir.path());
    let etcd = EtcdCluster::start_with(1, Some(&server), &[]);
    assert!(etcd.is_tls());
    let timeout = Duration::from_secs(2);
    let opts = EtcdOptions { tls: Some(client.clone()), ..etcd.options(timeout) };
    let c = connect_when_ready(opts.clone(), 20).await;
    put_one(&c, "/tls/k", "v").await;
    assert_eq!(c.get("/tls/k").await.unwrap().0.unwrap().value, b"v");
    let lease = c.grant(SECS).await.unwrap();
    assert!(c.keep_alive(lease.id).await.is_ok());
    assert!(c.endpoints().starts_with("https://"), "{}", c.endpoints());

    let no_cert = EtcdOptions {
        tls: Some(hasync::coordinator::etcd::EtcdTls { cert_file: None, key_file: None, ..client }),
        ..opts
    };
    let e = EtcdCoordinator::connect(no_cert).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
}
