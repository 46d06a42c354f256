//! Replica identity on a real master with raw peers (`ha.replica-identity = "registered"`):
//! registrations before and after the first report, replacement, refused name claims, and
//! unregistered (Java-style) connections.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::ReplicaIdentity;
use crate::ha::identity::Claim;
use crate::ha::master::RegisterError;
use crate::ha::status::{CloseReason, ReplicaStatus};
use crate::ha::test_peers::*;

fn claim(id: &str, name: &str) -> Claim {
    Claim { data_dir_id: id.into(), node_name: name.into() }
}

/// A connection from `ip`, not reported yet.
async fn connect_from(ip: &str, master: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    sock.connect(master).await.unwrap()
}

async fn report(c: &mut TcpStream, offset: u64) {
    c.write_all(&(offset as i64).to_be_bytes()).await.unwrap();
}

fn replica_at(m: &MasterNode, c: &TcpStream) -> Option<ReplicaStatus> {
    let local = c.local_addr().unwrap();
    m.master.replicas().into_iter().find(|r| r.address == local)
}

async fn master() -> (tempfile::TempDir, MasterNode, u64) {
    let md = tempfile::tempdir().unwrap();
    let o = master_opts();
    assert_eq!(o.replica_identity, ReplicaIdentity::Registered, "the default");
    let m = MasterNode::start(md.path(), o).await;
    let end = put(&m.store, 3, 100);
    (md, m, end)
}

/// Reads frames until a data frame, then acks its end.
async fn ack_next_frame(c: &mut TcpStream) -> u64 {
    let read = async {
        loop {
            let mut h = [0u8; 12];
            c.read_exact(&mut h).await.unwrap();
            let offset = u64::from_be_bytes(h[..8].try_into().unwrap());
            let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as usize;
            if size == 0 {
                continue;
            }
            let mut body = vec![0u8; size];
            c.read_exact(&mut body).await.unwrap();
            let end = offset + size as u64;
            c.write_all(&(end as i64).to_be_bytes()).await.unwrap();
            return end;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.expect("a data frame")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_before_the_first_report_names_the_connection() {
    let (_d, m, end) = master().await;
    let mut c = connect_from("127.0.0.2", m.addr).await;
    let r = m.master.register(c.local_addr().unwrap(), claim("aa01", "b")).unwrap();
    assert_eq!((r.identity.as_str(), r.replica_id, r.matched), ("data-dir aa01", None, false));
    report(&mut c, end).await;
    wait_until(5, "streaming", || replica_at(&m, &c).is_some()).await;
    let st = replica_at(&m, &c).unwrap();
    assert_eq!((st.identity.as_str(), st.node_name.as_str()), ("data-dir aa01", "b"));
}

/// The race the other way round: the first report, then the registration. The connection
/// moves to its identity and its acks keep counting there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_after_the_first_report_moves_the_connection_to_its_identity() {
    let (_d, m, end) = master().await;
    let mut c = connect_from("127.0.0.2", m.addr).await;
    report(&mut c, end).await;
    wait_until(5, "streaming", || replica_at(&m, &c).is_some()).await;
    assert_eq!(replica_at(&m, &c).unwrap().identity, "ip 127.0.0.2", "unregistered so far");
    let r = m.master.register(c.local_addr().unwrap(), claim("aa02", "b")).unwrap();
    assert!(r.matched && r.identity == "data-dir aa02", "{r:?}");
    let st = replica_at(&m, &c).unwrap();
    assert_eq!((st.identity.as_str(), Some(st.id)), ("data-dir aa02", r.replica_id));
    assert_eq!(st.ack_offset, end, "the entry moved with its progress");
    let new_end = put(&m.store, 1, 50);
    assert_eq!(ack_next_frame(&mut c).await, new_end);
    wait_until(5, "the ack counts", || replica_at(&m, &c).is_some_and(|r| r.ack_offset == new_end))
        .await;
    assert_eq!(m.master.replicas().len(), 1);
    assert!(m.master.closed().is_empty(), "{:?}", m.master.closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_connection_of_an_identity_replaces_the_older_at_once() {
    let (_d, m, end) = master().await;
    let mut old = connect_from("127.0.0.2", m.addr).await;
    m.master.register(old.local_addr().unwrap(), claim("aa03", "b")).unwrap();
    report(&mut old, end).await;
    wait_until(5, "streaming", || replica_at(&m, &old).is_some()).await;
    // The slave moved to another address and reconnected; the old connection is not reaped.
    let mut new = connect_from("127.0.0.3", m.addr).await;
    m.master.register(new.local_addr().unwrap(), claim("aa03", "b")).unwrap();
    report(&mut new, end).await;
    wait_until(5, "replaced", || m.master.closed().get(&CloseReason::Replaced) == Some(&1)).await;
    let reps = m.master.replicas();
    assert_eq!(reps.len(), 1, "{reps:?}");
    assert_eq!(reps[0].address, new.local_addr().unwrap());
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), old.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the old connection is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_claim_of_a_name_with_another_data_dir_is_refused() {
    let (_d, m, end) = master().await;
    let mut a = connect_from("127.0.0.2", m.addr).await;
    m.master.register(a.local_addr().unwrap(), claim("aa04", "b")).unwrap();
    report(&mut a, end).await;
    wait_until(5, "streaming", || replica_at(&m, &a).is_some()).await;
    let mut b = connect_from("127.0.0.3", m.addr).await;
    let err = m.master.register(b.local_addr().unwrap(), claim("bb04", "b")).unwrap_err();
    let RegisterError::NameTaken { live, claimed, .. } = &err;
    assert_eq!((live.as_str(), claimed.as_str()), ("aa04", "bb04"));
    let text = err.to_string();
    assert!(text.contains("aa04") && text.contains("bb04") && text.contains("\"b\""), "{text}");
    // Not a replacement: the refused one falls back to its IP.
    report(&mut b, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    assert_eq!(replica_at(&m, &b).unwrap().identity, "ip 127.0.0.3");
    assert_eq!(replica_at(&m, &a).unwrap().identity, "data-dir aa04");
}

/// The same rule when both claims are held before either connection's first report: the
/// second to start streaming does not take the name; it falls back to its IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_held_claims_of_one_name_with_other_data_dirs_do_not_both_go_live() {
    let (_d, m, end) = master().await;
    let mut a = connect_from("127.0.0.2", m.addr).await;
    let mut b = connect_from("127.0.0.3", m.addr).await;
    m.master.register(a.local_addr().unwrap(), claim("aa05", "b")).unwrap();
    m.master.register(b.local_addr().unwrap(), claim("bb05", "b")).unwrap();
    report(&mut a, end).await;
    wait_until(5, "a streams", || replica_at(&m, &a).is_some()).await;
    report(&mut b, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    assert_eq!(replica_at(&m, &a).unwrap().identity, "data-dir aa05");
    assert_eq!(replica_at(&m, &b).unwrap().identity, "ip 127.0.0.3", "the name is taken");
}

/// Stock Java slaves never register: one replica per IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_connections_are_identified_by_their_ip() {
    let (_d, m, end) = master().await;
    let mut a = connect_from("127.0.0.4", m.addr).await;
    report(&mut a, end).await;
    let mut b = connect_from("127.0.0.5", m.addr).await;
    report(&mut b, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    assert_eq!(replica_at(&m, &a).unwrap().identity, "ip 127.0.0.4");
    assert_eq!(replica_at(&m, &a).unwrap().node_name, "");
    let mut a2 = connect_from("127.0.0.4", m.addr).await;
    report(&mut a2, end).await;
    wait_until(5, "replaced", || m.master.closed().get(&CloseReason::Replaced) == Some(&1)).await;
    assert_eq!(m.master.replicas().len(), 2);
    assert!(replica_at(&m, &a2).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_connection_from_a_registered_ip_counts_as_that_identity() {
    let (_d, m, end) = master().await;
    let mut registered = connect_from("127.0.0.6", m.addr).await;
    m.master.register(registered.local_addr().unwrap(), claim("aa06", "b")).unwrap();
    report(&mut registered, end).await;
    wait_until(5, "streaming", || replica_at(&m, &registered).is_some()).await;
    // Its registration failed this time: still the same replica, not a second one.
    let mut again = connect_from("127.0.0.6", m.addr).await;
    report(&mut again, end).await;
    wait_until(5, "replaced", || m.master.closed().get(&CloseReason::Replaced) == Some(&1)).await;
    let reps = m.master.replicas();
    assert_eq!(reps.len(), 1, "{reps:?}");
    assert_eq!(
        (reps[0].identity.as_str(), reps[0].node_name.as_str()),
        ("data-dir aa06 (by IP)", "b")
    );
}

/// Upstream's rule, only on request: every connection counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_identity_connection_counts_every_connection() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.replica_identity = ReplicaIdentity::Connection;
    let m = MasterNode::start(md.path(), o).await;
    let end = put(&m.store, 3, 100);
    let mut a = connect_from("127.0.0.7", m.addr).await;
    m.master.register(a.local_addr().unwrap(), claim("aa07", "b")).unwrap();
    report(&mut a, end).await;
    let mut b = connect_from("127.0.0.7", m.addr).await;
    report(&mut b, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    let st = replica_at(&m, &a).unwrap();
    assert!(st.identity.starts_with("connection ") && st.node_name == "b", "{st:?}");
}

/// A master listening on a dual-stack `[::]` socket sees an IPv4 slave as `::ffff:a.b.c.d`,
/// while the slave registers the IPv4 local address of its connection: the registration must
/// still match, before and after the first report, or every hasync slave falls back to its IP
/// (two on one host then count as one replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_matches_an_ipv4_slave_on_a_dual_stack_listener() {
    use std::sync::Arc;
    let md = tempfile::tempdir().unwrap();
    let store = store_in(md.path(), SEG);
    let end = put(&store, 3, 100);
    let listener = tokio::net::TcpListener::bind("[::]:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let waiters = Arc::new(crate::ha::group_transfer::SyncWaiters::new(1));
    let counters = crate::metrics::HaCounters::default();
    let master = crate::ha::master::Master::new(store, master_opts(), waiters, counters);
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&master).run(Arc::new(listener), cancel.clone()));
    let at: SocketAddr = ([127, 0, 0, 1], port).into();
    let (mut before, mut after) =
        (connect_from("127.0.0.1", at).await, connect_from("127.0.0.2", at).await);
    let r = master.register(before.local_addr().unwrap(), claim("aa10", "b1")).unwrap();
    assert!(!r.matched, "{r:?}");
    report(&mut before, end).await;
    report(&mut after, end).await;
    wait_until(5, "both streaming", || master.replicas().len() == 2).await;
    let r = master.register(after.local_addr().unwrap(), claim("aa11", "b2")).unwrap();
    assert!(r.matched, "the streaming connection was not found: {r:?}");
    let mut ids: Vec<String> = master.replicas().into_iter().map(|r| r.identity).collect();
    ids.sort();
    assert_eq!(ids, ["data-dir aa10", "data-dir aa11"], "{:?}", master.replicas());
    cancel.cancel();
    task.await.unwrap();
}
