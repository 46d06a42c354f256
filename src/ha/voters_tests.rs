//! Voters (issue 17, invariant A): with a voter set, only the acks of replicas in it count for
//! SYNC puts, the confirm offset and the in-sync count, at the one owner of the rule (the
//! replica table); on a real master, a replica counts only when its own registration named a
//! voter's data-dir id.

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::ha::group_transfer::{Admission, SyncWaiters, TransferStatus, TransferWait};
use crate::ha::identity::Claim;
use crate::ha::progress::{AckTable, StreamStart};
use crate::ha::test_peers::*;

const GAP: u64 = 1 << 30;

fn poll_now(wait: &mut TransferWait) -> Option<TransferStatus> {
    match Pin::new(wait).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(status) => Some(status),
        Poll::Pending => None,
    }
}

fn expect_wait(admission: Admission) -> TransferWait {
    match admission {
        Admission::Wait(wait) => wait,
        other => panic!("expected to wait, got {other:?}"),
    }
}

fn ids(v: &[u64]) -> Option<BTreeSet<u64>> {
    Some(v.iter().copied().collect())
}

#[test]
fn only_voters_count_for_steps_holds_in_sync_and_the_confirm_offset() {
    let now = Instant::now();
    let mut t = AckTable::new();
    t.connect(1, 100, now);
    t.connect(2, 900, now);
    assert_eq!(t.steps(1), [(0, 900)], "without a voter set every replica counts");
    t.set_voters(ids(&[1]));
    assert_eq!(t.steps(1), [(0, 100)], "replica 2 is not a voter");
    assert!(t.steps(2).is_empty(), "only one voter");
    assert!(!t.holds(1, &(0..900)) && t.holds(1, &(0..100)));
    assert_eq!(t.in_sync_count(900, 1000), 1);
    assert_eq!(t.observe_watermark(1), Some(100));
    assert_eq!(t.confirm_offset(), 100, "the confirm offset rises by voters only");
    let shown: Vec<(u64, bool)> = t.replicas().map(|r| (r.id, r.voter)).collect();
    assert_eq!(shown, [(1, true), (2, false)], "a non-voter is kept and shown");
    t.mark_voter(2, true);
    assert_eq!(t.observe_watermark(1), Some(900));
    t.set_voters(Some(BTreeSet::new()));
    assert!(t.steps(1).is_empty() && t.in_sync_count(900, 1000) == 0, "an empty set: none");
    t.set_voters(None);
    t.mark_voter(1, false);
    assert!(t.counts(1), "without a voter set a mark changes nothing");
}

#[tokio::test(start_paused = true)]
async fn a_non_voter_acks_but_the_put_waits_until_the_voters_contain_it() {
    let waiters = SyncWaiters::new(1);
    let address: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    waiters.set_voters(ids(&[]));
    let start = |report| StreamStart { address, report, start: report };
    waiters.on_stream_start(1, start(0), true).unwrap();
    waiters.on_stream_start(2, start(0), false).unwrap();
    let admit = |w: &SyncWaiters| w.admit(0..100, 1, Duration::from_secs(5), 100, GAP);
    let mut wait = expect_wait(admit(&waiters));
    waiters.on_ack_sent(2, 100, 100).unwrap();
    assert_eq!(poll_now(&mut wait), None, "a non-voter's ack completes nothing");
    assert_eq!(waiters.confirm_offset(), 0);
    waiters.set_voters(ids(&[1, 2]));
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk), "once V holds it, it counts");
    assert_eq!(waiters.confirm_offset(), 100);
    // With only non-voters in sync a SYNC put does not wait at all.
    waiters.set_voters(ids(&[]));
    let refused = waiters.admit(100..200, 1, Duration::from_secs(5), 200, GAP);
    assert!(matches!(refused, Admission::Rejected(TransferStatus::SlaveNotAvailable)));
    // A new entry is marked in the step that creates it: a reconnect as a non-voter of an id
    // that was a voter does not count.
    waiters.set_voters(ids(&[2]));
    waiters.on_stream_start(2, start(100), false).unwrap();
    assert!(!waiters.read_table(|t| t.counts(2)), "marked a non-voter");
}

async fn connect_from(ip: &str, master: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    sock.connect(master).await.unwrap()
}

/// Reports `offset`, then acks every data frame's end as it arrives, until the connection ends.
fn follow(mut c: TcpStream, offset: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        c.write_all(&(offset as i64).to_be_bytes()).await.unwrap();
        loop {
            let mut h = [0u8; 12];
            if c.read_exact(&mut h).await.is_err() {
                return;
            }
            let at = u64::from_be_bytes(h[..8].try_into().unwrap());
            let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as usize;
            let mut body = vec![0u8; size];
            if c.read_exact(&mut body).await.is_err() {
                return;
            }
            if size > 0 && c.write_all(&((at + size as u64) as i64).to_be_bytes()).await.is_err() {
                return;
            }
        }
    })
}

fn claim(id: &str, name: &str) -> Claim {
    Claim { data_dir_id: id.into(), node_name: name.into() }
}

/// On a real master: a registered replica outside V acks and the put keeps waiting; V with its
/// data-dir id completes it. An unregistered connection never counts, V or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_counts_only_replicas_registered_with_a_voters_data_dir_id() {
    let md = tempfile::tempdir().unwrap();
    let m = MasterNode::start(md.path(), master_opts()).await;
    let end = put(&m.store, 3, 100);
    let voter: HashSet<String> = ["aa20".to_owned()].into();
    m.master.set_voters(Some(voter));
    // A voter that registered and then stalls (never acks), so the put is admitted and waits.
    let stalled = connect_from("127.0.0.2", m.addr).await;
    m.master.register(stalled.local_addr().unwrap(), claim("aa20", "a")).unwrap();
    let mut stalled = stalled;
    stalled.write_all(&(end as i64).to_be_bytes()).await.unwrap();
    // A registered replica outside V, and a Java-style one without a registration.
    let outside = connect_from("127.0.0.3", m.addr).await;
    m.master.register(outside.local_addr().unwrap(), claim("bb20", "b")).unwrap();
    let outside = follow(outside, end);
    let java = follow(connect_from("127.0.0.4", m.addr).await, end);
    wait_until(5, "three replicas", || m.master.replicas().len() == 3).await;
    let voters: Vec<(String, bool)> =
        m.master.replicas().into_iter().map(|r| (r.identity, r.voter)).collect();
    assert!(voters.contains(&("data-dir aa20".into(), true)), "{voters:?}");
    assert!(voters.contains(&("data-dir bb20".into(), false)), "{voters:?}");
    assert!(voters.contains(&("ip 127.0.0.4".into(), false)), "{voters:?}");

    let new_end = put(&m.store, 1, 50);
    let mut wait =
        expect_wait(m.waiters.admit(end..new_end, 1, Duration::from_secs(30), new_end, GAP));
    let acked = |m: &MasterNode| {
        m.master.replicas().iter().filter(|r| !r.voter && r.ack_offset == new_end).count() == 2
    };
    wait_until(5, "both non-voters acked", || acked(&m)).await;
    assert_eq!(poll_now(&mut wait), None, "acks outside V complete nothing");
    // V now names bb20 (the stalled voter is left out): its ack, already in, completes the put.
    m.master.set_voters(Some(["bb20".to_owned()].into()));
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk));
    // A connection from bb20's IP without its own registration counts as bb20 by its IP
    // (it replaces the registered one), and so not for acks.
    let by_ip = follow(connect_from("127.0.0.3", m.addr).await, new_end);
    let shown = |m: &MasterNode| {
        m.master.replicas().into_iter().find(|r| r.identity == "data-dir bb20 (by IP)")
    };
    wait_until(5, "the by-IP connection streams", || shown(&m).is_some()).await;
    assert!(!shown(&m).unwrap().voter, "{:?}", shown(&m));
    // An IP identity never counts, whatever V holds.
    m.master.set_voters(Some(["ip 127.0.0.4".to_owned(), "127.0.0.4".to_owned()].into()));
    let java_counts = m.master.replicas().iter().any(|r| r.identity.starts_with("ip ") && r.voter);
    assert!(!java_counts);
    for t in [outside, java, by_ip] {
        t.abort();
    }
}
