//! The HA data plane through the app, with a fault proxy between a master node and its slave
//! that re-splits, stalls or cuts the stream. (The data plane's tests with raw peers and its own
//! options are unit tests in `src/ha/replication_tests.rs`.)

use hasync::config::{EmptySlaveStart, Role};
use hasync::node::{Node, PutStatus};

use crate::support::all_bytes;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

/// A master node in `dir` that starts an empty slave at the earliest offset.
async fn master_from_earliest(dir: &std::path::Path) -> TestNode {
    let mut c = node_config(dir, Role::Master);
    c.ha.empty_slave_start = EmptySlaveStart::Earliest;
    TestNode::start(c).await
}

/// Puts `n` messages with bodies of `body` bytes through the node.
async fn put(node: &Node, n: usize, body: usize) {
    let batch = (0..n).map(|i| msg("T", (i % 4) as i32, &vec![i as u8; body])).collect();
    let out = node.put(batch).await;
    assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
}

/// Whether the slave holds exactly the master's bytes (both start at 0 here).
fn identical(master: &Node, slave: &Node) {
    assert_eq!(slave.store().max_offset(), master.store().max_offset(), "max offsets");
    assert_eq!(all_bytes(slave.store()), all_bytes(master.store()), "bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_packets_one_byte_and_random_splits() {
    for mode in [ProxyMode::OneByte, ProxyMode::Random] {
        let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let m = master_from_earliest(md.path()).await;
        put(&m, 30, if mode == ProxyMode::OneByte { 300 } else { 2000 }).await;
        let proxy = Proxy::start(m.ha_addr().unwrap(), mode).await;
        let s = TestNode::start(slave_node_config(sd.path(), proxy.addr)).await;
        wait_until(30, "slave catches up through the proxy", || {
            s.store().max_offset() == m.store().max_offset()
        })
        .await;
        identical(&m, &s);
        let link = s.status().master_link.expect("a slave has a master link");
        assert!(link.last_error.is_none(), "{link:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slave_survives_a_master_restart() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master_from_earliest(md.path()).await;
    put(&m, 40, 2000).await;
    let proxy = Proxy::start(m.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = TestNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(20, "caught up", || s.store().max_offset() == m.store().max_offset()).await;
    m.shutdown().await.unwrap();
    drop(m);
    proxy.cut();
    let m = master_from_earliest(md.path()).await;
    put(&m, 40, 2000).await; // written while the slave cannot reach the master's data plane
    proxy.set_upstream(m.ha_addr().unwrap());
    wait_until(20, "caught up after the restart", || {
        s.store().max_offset() == m.store().max_offset()
    })
    .await;
    identical(&m, &s);
    assert!(s.status().master_link.unwrap().reconnects >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_link_is_closed_and_reconnected() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = TestNode::start(node_config(md.path(), Role::Master)).await;
    let proxy = Proxy::start(m.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = TestNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(5, "connected", || s.status().master_link.unwrap().connected).await;
    proxy.set_mode(ProxyMode::Stall);
    wait_until(10, "housekeeping closed the link", || {
        s.status()
            .master_link
            .unwrap()
            .last_error
            .is_some_and(|e| e.contains("no bytes from the master"))
    })
    .await;
    proxy.set_mode(ProxyMode::Pass);
    put(&m, 3, 100).await;
    wait_until(10, "replicating again", || s.store().max_offset() == m.store().max_offset()).await;
    assert!(s.status().master_link.unwrap().reconnects >= 1);
}
