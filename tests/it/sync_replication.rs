//! SYNC and ASYNC replication through the node's put path, with real slaves on loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasync::config::{AckMode, ReplicationMode, Role};
use hasync::node::{Node, PutOutcome, PutStatus};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::ha::*;
use crate::support::msg;
use crate::support::node::TestNode;

async fn master_node(dir: &std::path::Path, mode: ReplicationMode, k: u32) -> TestNode {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = mode;
    c.replication.sync_ack_replicas = k;
    TestNode::start(c).await
}

async fn slave_node(dir: &std::path::Path, master: std::net::SocketAddr) -> TestNode {
    TestNode::start(slave_node_config(dir, master)).await
}

async fn put1(node: &Node, body: &[u8]) -> PutOutcome {
    node.put(vec![msg("T", 0, body)]).await
}

/// The put's records, read back from `store`.
fn stored_bytes(store: &hasync::store::CommitLog, out: &PutOutcome) -> Vec<u8> {
    let start = out.records[0].offset;
    let mut v = Vec::new();
    let mut at = start;
    while at < out.end_offset {
        let b = store.read(at, (out.end_offset - at) as usize).unwrap().unwrap();
        at += b.len() as u64;
        v.extend_from_slice(&b);
    }
    v
}

async fn wait_connected(master: &Node, n: usize) {
    let max = master.store().max_offset();
    wait_until(10, "slaves connected and in sync", || {
        master.status().in_sync_replicas >= n
            && master.status().slaves.iter().all(|s| s.ack_offset >= max)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_ok_only_after_the_slave_holds_the_bytes() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_node(md.path(), ReplicationMode::Sync, 1).await;
    let s = slave_node(sd.path(), m.ha_addr().unwrap()).await;
    wait_connected(&m, 1).await;
    for i in 0..20u8 {
        let out = put1(&m, &[i; 700]).await;
        assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
        assert!(out.stored);
        // At PUT_OK the slave already holds the record, byte-identical.
        assert!(s.store().max_offset() >= out.end_offset);
        assert_eq!(stored_bytes(s.store(), &out), stored_bytes(m.store(), &out));
    }
    assert_eq!(m.status().confirm_offset, m.store().max_offset());
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_slave_gives_flush_slave_timeout_with_the_record_stored() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_node(md.path(), ReplicationMode::Sync, 1).await;
    let proxy = Proxy::start(m.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = slave_node(sd.path(), proxy.addr).await;
    wait_connected(&m, 1).await;
    proxy.set_mode(ProxyMode::Stall);
    let started = Instant::now();
    let out = put1(&m, b"stalled").await;
    let waited = started.elapsed();
    assert_eq!(out.status, PutStatus::FlushSlaveTimeout, "{out:?}");
    assert!(waited >= Duration::from_millis(1900), "waited only {waited:?}");
    assert!(out.stored && out.detail.as_deref().unwrap().contains("not received"));
    assert!(m.store().read(out.records[0].offset, 10).unwrap().is_some(), "on the master");
    assert!(s.store().max_offset() < out.end_offset, "never reached the slave");
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slave_gives_slave_not_available_at_once() {
    let md = tempfile::tempdir().unwrap();
    let m = master_node(md.path(), ReplicationMode::Sync, 1).await;
    let started = Instant::now();
    let out = put1(&m, b"alone").await;
    assert_eq!(out.status, PutStatus::SlaveNotAvailable, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "did not wait for the 2 s timeout");
    assert!(out.stored, "the record is on the master");
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_too_far_behind_gives_slave_not_available() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Async;
    c.replication.max_gap_not_in_sync = hasync::config::units::ByteSize::kib(4);
    let m = TestNode::start(c).await;
    let proxy = Proxy::start(m.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = slave_node(sd.path(), proxy.addr).await;
    wait_connected(&m, 1).await;
    proxy.set_mode(ProxyMode::Stall);
    for _ in 0..10 {
        assert_eq!(put1(&m, &[1; 1000]).await.status, PutStatus::PutOk);
    }
    m.set_replication_mode(ReplicationMode::Sync, None).unwrap();
    let started = Instant::now();
    let out = put1(&m, b"behind").await;
    assert_eq!(out.status, PutStatus::SlaveNotAvailable, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(m.status().in_sync_replicas, 0);
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_with_one_of_two_slaves_stalled_times_out() {
    let (md, s1d, s2d) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_node(md.path(), ReplicationMode::Sync, 2).await;
    // Two unregistered (classic-mode) slaves from one IP are one replica: the proxied one comes
    // from another address.
    let from = Some("127.0.0.2".parse().unwrap());
    let proxy = Proxy::start_from(m.ha_addr().unwrap(), ProxyMode::Pass, from).await;
    let s1 = slave_node(s1d.path(), m.ha_addr().unwrap()).await;
    let s2 = slave_node(s2d.path(), proxy.addr).await;
    wait_connected(&m, 2).await;
    assert_eq!(put1(&m, b"both").await.status, PutStatus::PutOk);
    proxy.set_mode(ProxyMode::Stall);
    let out = put1(&m, b"one stalled").await;
    assert_eq!(out.status, PutStatus::FlushSlaveTimeout, "{out:?}");
    assert!(s1.store().max_offset() >= out.end_offset, "the live slave has it");
    // With k = 1 the same situation is fine.
    m.set_replication_mode(ReplicationMode::Sync, Some(1)).unwrap();
    assert_eq!(put1(&m, b"k1").await.status, PutStatus::PutOk);
    for n in [&s1, &s2, &m] {
        n.shutdown().await.unwrap();
    }
}

/// Garbage and fake acks on the HA port never make a put PUT_OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_ha_port_never_turns_a_put_into_put_ok() {
    let md = tempfile::tempdir().unwrap();
    let m = master_node(md.path(), ReplicationMode::Sync, 1).await;
    let ha = m.ha_addr().unwrap();
    let first = put1(&m, b"first").await; // SLAVE_NOT_AVAILABLE, but stored
    let end = first.end_offset as i64;
    let mut conns = Vec::new();
    for bytes in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        (-1i64).to_be_bytes().to_vec(),
        (end + 4096).to_be_bytes().to_vec(),
    ] {
        let mut c = TcpStream::connect(ha).await.unwrap();
        c.write_all(&bytes).await.unwrap();
        conns.push(c);
    }
    // A "slave" that starts at the end, then acks far beyond what it was sent while a put
    // waits.
    let m = Arc::new(m);
    let mut liar = TcpStream::connect(ha).await.unwrap();
    liar.write_all(&end.to_be_bytes()).await.unwrap();
    wait_until(5, "the liar is a replica", || m.status().slaves.len() == 1).await;
    let put = tokio::spawn({
        let m = Arc::clone(&m);
        async move { put1(&m, b"must not be PUT_OK").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    liar.write_all(&(end + 1_000_000).to_be_bytes()).await.unwrap();
    let out = put.await.unwrap();
    assert!(
        matches!(out.status, PutStatus::FlushSlaveTimeout | PutStatus::SlaveNotAvailable),
        "{out:?}"
    );
    assert!(m.status().confirm_offset < out.end_offset, "the fake ack never counted");
    wait_until(5, "the liar is closed", || m.status().slaves.is_empty()).await;
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_never_waits() {
    let md = tempfile::tempdir().unwrap();
    let m = master_node(md.path(), ReplicationMode::Async, 1).await;
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(put1(&m, b"async").await.status, PutStatus::PutOk);
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_mode_flushed_means_two_durable_copies() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_node(md.path(), ReplicationMode::Sync, 1).await;
    let mut c = slave_node_config(sd.path(), m.ha_addr().unwrap());
    c.slave.ack_mode = AckMode::Flushed;
    c.store.flush_interval = Duration::from_secs(3600); // only flushes the slave asks for
    let s = TestNode::start(c).await;
    wait_connected(&m, 1).await;
    for i in 0..10u8 {
        let out = put1(&m, &[i; 500]).await;
        assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
        assert!(
            s.store().flushed_offset() >= out.end_offset,
            "acked only once flushed on the slave"
        );
    }
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

/// Writers keep putting while the mode flips SYNC -> ASYNC -> SYNC: nothing hangs, nothing is
/// lost, and every SYNC PUT_OK record is on the slave byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_switch_under_concurrent_load() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = Arc::new(master_node(md.path(), ReplicationMode::Sync, 1).await);
    let s = slave_node(sd.path(), m.ha_addr().unwrap()).await;
    wait_connected(&m, 1).await;
    let stop = Instant::now() + Duration::from_millis(1500);
    let mut writers = Vec::new();
    for w in 0..8u8 {
        let m = Arc::clone(&m);
        writers.push(tokio::spawn(async move {
            let mut outs = Vec::new();
            while Instant::now() < stop {
                let mode = m.replication().mode;
                let out = tokio::time::timeout(Duration::from_secs(5), put1(&m, &[w; 300]))
                    .await
                    .expect("a put hung");
                outs.push((mode, out));
            }
            outs
        }));
    }
    for mode in [
        ReplicationMode::Async,
        ReplicationMode::Sync,
        ReplicationMode::Async,
        ReplicationMode::Sync,
    ] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        m.set_replication_mode(mode, None).unwrap();
    }
    let mut outs = Vec::new();
    for w in writers {
        outs.extend(w.await.unwrap());
    }
    assert!(outs.len() > 50);
    assert!(
        outs.iter().all(|(_, o)| o.status == PutStatus::PutOk),
        "{:?}",
        outs.iter().find(|(_, o)| o.status != PutStatus::PutOk)
    );
    let sync_ok: Vec<_> = outs.iter().filter(|(mode, _)| *mode == ReplicationMode::Sync).collect();
    assert!(!sync_ok.is_empty());
    wait_until(10, "slave caught up", || s.store().max_offset() == m.store().max_offset()).await;
    for (_, o) in &outs {
        assert_eq!(stored_bytes(s.store(), o), stored_bytes(m.store(), o));
    }
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_completes_waiting_puts_with_service_not_available() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.slave_timeout = Duration::from_secs(30);
    let m = Arc::new(TestNode::start(c).await);
    let proxy = Proxy::start(m.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = slave_node(sd.path(), proxy.addr).await;
    wait_connected(&m, 1).await;
    proxy.set_mode(ProxyMode::Stall);
    let waiting = tokio::spawn({
        let m = Arc::clone(&m);
        async move { put1(&m, b"waiting").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    m.shutdown().await.unwrap();
    let out = waiting.await.unwrap();
    assert_eq!(out.status, PutStatus::ServiceNotAvailable, "{out:?}");
    assert!(out.detail.as_deref().unwrap().contains("outcome unknown"));
    assert!(started.elapsed() < Duration::from_secs(10));
    let after = put1(&m, b"after").await;
    assert_eq!((after.status, after.stored), (PutStatus::ServiceNotAvailable, false));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_refuses_puts_and_mode_changes() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_node(md.path(), ReplicationMode::Async, 1).await;
    let s = slave_node(sd.path(), m.ha_addr().unwrap()).await;
    let out = put1(&s, b"x").await;
    assert_eq!((out.status, out.stored), (PutStatus::ServiceNotAvailable, false));
    assert!(out.detail.unwrap().contains("slave"));
    assert!(s.set_replication_mode(ReplicationMode::Sync, None).is_err());
    assert!(m.set_replication_mode(ReplicationMode::Sync, Some(0)).is_err(), "k >= 1");
    s.shutdown().await.unwrap();
    m.shutdown().await.unwrap();
}
