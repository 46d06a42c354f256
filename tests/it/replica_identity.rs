//! Who counts as one replica for SYNC acks (issue 14, point 5): a slave that reconnects while
//! its old connection is not yet reaped must not count twice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::node::{Node, PutOutcome, PutStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::ha::{node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

/// A master node in SYNC mode waiting for `k` slave acks, with the default replica identity.
async fn master(dir: &std::path::Path, k: u32) -> TestNode {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = k;
    c.replication.slave_timeout = Duration::from_secs(1);
    TestNode::start(c).await
}

/// A raw HA peer from `ip` that reports `report` (as a stock Java slave would, unregistered).
async fn raw_peer(ip: &str, master: SocketAddr, report: u64) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let mut c = sock.connect(master).await.unwrap();
    c.write_all(&(report as i64).to_be_bytes()).await.unwrap();
    c
}

/// Reads frames until a data frame arrives (within 5 s), then acks its end; the end acked, or
/// `None` when the master closed the connection.
async fn ack_next_frame(c: &mut TcpStream) -> Option<u64> {
    let read = async {
        loop {
            let mut h = [0u8; 12];
            c.read_exact(&mut h).await.ok()?;
            let offset = u64::from_be_bytes(h[..8].try_into().unwrap());
            let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as usize;
            if size == 0 {
                continue; // a heartbeat
            }
            let mut body = vec![0u8; size];
            c.read_exact(&mut body).await.ok()?;
            let end = offset + size as u64;
            c.write_all(&(end as i64).to_be_bytes()).await.ok()?;
            return Some(end);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.ok().flatten()
}

async fn put1(node: &Node, body: &[u8]) -> PutOutcome {
    node.put(vec![msg("T", 0, body)]).await
}

/// The defect: with k = 2, one slave that reconnected while its old connection is still open
/// (not reaped yet) acks on both; the two connections must count as one replica, so the put is
/// not PUT_OK (only one slave holds it). Under `replica-identity = "connection"` (the default
/// before issue 14) it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_slave_with_its_old_connection_open_counts_once() {
    let md = tempfile::tempdir().unwrap();
    let m = Arc::new(master(md.path(), 2).await);
    let ha = m.ha_addr().unwrap();
    let end = put1(&m, b"before").await.end_offset; // SLAVE_NOT_AVAILABLE, stored
    // Each first report is in (the master lists the connection) before the next step, so the
    // old connection is the older one and the master has seen both when the put starts.
    let listed = |c: &TcpStream| {
        let (m, at) = (Arc::clone(&m), c.local_addr().unwrap());
        move || m.status().slaves.iter().any(|r| r.address == at && r.ack_offset == end)
    };
    let mut old = raw_peer("127.0.0.1", ha, end).await;
    wait_until(5, "the old connection's first report", listed(&old)).await;
    let mut new = raw_peer("127.0.0.1", ha, end).await;
    wait_until(5, "the new connection's first report", listed(&new)).await;
    let put = tokio::spawn({
        let m = Arc::clone(&m);
        async move { put1(&m, b"one slave holds this").await }
    });
    let (a, b) = tokio::join!(ack_next_frame(&mut old), ack_next_frame(&mut new));
    let out = put.await.unwrap();
    assert_ne!(
        out.status,
        PutStatus::PutOk,
        "one slave (two connections from 127.0.0.1, acks {a:?} and {b:?}) counted twice: {out:?}"
    );
    assert!(m.status().confirm_offset < out.end_offset, "never confirmed by one slave");
    wait_until(5, "one replica", || m.status().slaves.len() == 1).await;
}

/// Two hasync slaves on one host register their data-dir ids: two replicas (k = 2 is met), each
/// shown with its identity and node name; each slave's link shows what it was mapped to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_slaves_on_one_host_are_two_replicas_shown_by_identity() {
    let (md, s1d, s2d) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), 2).await;
    let mut slaves = Vec::new();
    for (i, dir) in [&s1d, &s2d].into_iter().enumerate() {
        let mut c = crate::support::ha::slave_node_config(dir.path(), m.ha_addr().unwrap());
        c.slave.master_grpc = m.grpc_addr().to_string();
        c.node.name = format!("slave-{i}");
        slaves.push(TestNode::start(c).await);
    }
    wait_until(10, "two registered replicas", || {
        let st = m.status();
        st.slaves.len() == 2 && st.slaves.iter().all(|r| r.identity.starts_with("data-dir "))
    })
    .await;
    assert_eq!(put1(&m, b"both").await.status, PutStatus::PutOk);
    let st = m.status();
    for s in &slaves {
        let own = s.status();
        assert_eq!(own.data_dir_id.len(), 32, "{own:?}");
        let r = st.slaves.iter().find(|r| r.identity == format!("data-dir {}", own.data_dir_id));
        assert_eq!(r.map(|r| r.node_name.clone()), Some(own.node_name.clone()), "{st:?}");
        let link = own.master_link.unwrap();
        assert!(link.registration.contains(&own.data_dir_id), "{link:?}");
    }
    for n in slaves.iter().chain([&m]) {
        n.shutdown().await.unwrap();
    }
}

/// Point 7: a master that was away long enough for the old policy (5 s doubling to 60 s) to wait
/// 40 s before its next attempt has its slave back within a loose bound once it listens again,
/// with the default backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_has_its_slave_back_within_seconds() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mc = node_config(md.path(), Role::Master);
    let m = TestNode::start(mc.clone()).await;
    let ha = m.ha_addr().unwrap();
    let mut sc = crate::support::ha::slave_node_config(sd.path(), ha);
    let defaults = hasync::config::Config::default().slave;
    (sc.slave.reconnect_backoff, sc.slave.reconnect_backoff_max) =
        (defaults.reconnect_backoff, defaults.reconnect_backoff_max);
    let s = TestNode::start(sc).await;
    wait_until(10, "following", || s.status().master_link.is_some_and(|l| l.connected)).await;
    m.shutdown().await.unwrap();
    drop(m);
    let before = s.status().master_link.unwrap().reconnects;
    // Four failed attempts: the old policy then waited 40 s more.
    wait_until(60, "four failed attempts", || {
        s.status().master_link.is_some_and(|l| l.reconnects >= before + 4 && !l.connected)
    })
    .await;
    let mut mc = mc;
    mc.ha.listen = ha;
    let m = TestNode::start(mc).await;
    let accepting = std::time::Instant::now();
    let end = m.put(vec![msg("T", 0, b"after the restart")]).await.end_offset;
    wait_until(15, "the slave streams again", || s.store().max_offset() >= end).await;
    eprintln!("master accepting again -> slave streaming: {:?}", accepting.elapsed());
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

/// `RegisterReplica` refuses what it cannot keep or show: an empty, huge or control-character
/// node name (it is held per connection, shown in the status and a metric label, and compared
/// for the name rule, so an empty one would collide with every other empty one), an empty
/// data-dir id and an address that is not ip:port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_replica_refuses_bad_input_with_its_codes() {
    use hasync::control::pb;
    use tonic::Code;
    let dir = tempfile::tempdir().unwrap();
    let m = crate::support::grpc::ApiNode::start(node_config(dir.path(), Role::Master)).await;
    let req = |id: &str, name: &str, addr: &str| pb::RegisterReplicaRequest {
        data_dir_id: id.into(),
        node_name: name.into(),
        ha_local_address: addr.into(),
    };
    let mut api = m.replication().await;
    let ok = api.register_replica(req("aa", "s1", "127.0.0.1:40000")).await.unwrap().into_inner();
    assert_eq!((ok.identity.as_str(), ok.matched), ("data-dir aa", false));
    let huge = "n".repeat(1 << 20);
    for (name, addr) in
        [(huge.as_str(), "127.0.0.1:1"), ("", "127.0.0.1:2"), ("a\nb", "127.0.0.1:3"), ("s", "x")]
    {
        let err = api.register_replica(req("bb", name, addr)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{:.80}: {err:?}", name);
    }
    let err = api.register_replica(req("", "s2", "127.0.0.1:4")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    m.stop().await;
}
