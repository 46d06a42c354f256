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
    let mut old = raw_peer("127.0.0.1", ha, end).await;
    let mut new = raw_peer("127.0.0.1", ha, end).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // both first reports are in
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
