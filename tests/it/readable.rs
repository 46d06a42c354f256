//! Issue 14, point 6: reads show only what a failover cannot cut. A SYNC master serves up to
//! its confirm offset, a SYNC slave up to the master's confirm offset as it last learned it,
//! an ASYNC node up to its max offset; `include_unconfirmed` reads everything.

use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb::{self, PutStatus};
use hasync::node::role::RoleRequest;

use crate::support::grpc::{ApiNode, pb_msg};
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};

fn put_req(bodies: &[&[u8]]) -> pb::PutRequest {
    pb::PutRequest { messages: bodies.iter().map(|b| pb_msg("R", b)).collect() }
}

fn read_req(offset: i64) -> pb::ReadRequest {
    pb::ReadRequest { offset, ..Default::default() }
}

async fn read(node: &ApiNode, req: pb::ReadRequest) -> pb::ReadResponse {
    node.messages().await.read(req).await.unwrap().into_inner()
}

fn bodies(r: &pb::ReadResponse) -> Vec<Vec<u8>> {
    r.messages.iter().map(|m| m.body.to_vec()).collect()
}

fn sync_master_config(dir: &std::path::Path, k: u32) -> hasync::config::Config {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = k;
    c.replication.slave_timeout = Duration::from_millis(300);
    c
}

fn grpc_of(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

/// With k = 2 and the one slave `s` connected to `m`: puts two records, which `s` then holds
/// and nobody confirmed (SLAVE_NOT_AVAILABLE); returns their end.
async fn replicated_unconfirmed(m: &ApiNode, s: &ApiNode) -> u64 {
    wait_until(10, "slave connected", || m.node.status().slaves.len() == 1).await;
    let out = m.messages().await.put(put_req(&[b"x", b"y"])).await.unwrap().into_inner();
    assert_eq!(out.status(), PutStatus::SlaveNotAvailable, "{out:?}");
    let end = out.end_offset as u64;
    wait_until(10, "slave holds the records", || s.node.store().max_offset() == end).await;
    end
}

/// A SYNC master with one slave behind a proxy, in sync.
async fn sync_pair(md: &std::path::Path, sd: &std::path::Path) -> (ApiNode, ApiNode, Proxy) {
    let m = ApiNode::start(sync_master_config(md, 1)).await;
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd, proxy.addr)).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    (m, s, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_master_serves_only_what_k_slaves_acked() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, proxy) = sync_pair(md.path(), sd.path()).await;
    let mut msgs = m.messages().await;
    let a = msgs.put(put_req(&[b"acked"])).await.unwrap().into_inner();
    assert_eq!(a.status(), PutStatus::PutOk, "{a:?}");

    proxy.set_mode(ProxyMode::Stall);
    let b = msgs.put(put_req(&[b"not acked"])).await.unwrap().into_inner();
    assert_eq!(b.status(), PutStatus::FlushSlaveTimeout, "{b:?}");
    assert!(b.stored);
    let b_at = b.results[0].offset;

    // From the unconfirmed record: nothing, and the next offset stays where it was.
    let r = read(&m, read_req(b_at)).await;
    assert!(r.messages.is_empty(), "an unconfirmed record was served: {r:?}");
    assert_eq!(r.next_offset, b_at);
    assert_eq!(r.max_offset, b.end_offset, "the stored range still shows it");
    // From the start: the confirmed record only.
    let r = read(&m, read_req(0)).await;
    assert_eq!(bodies(&r), [b"acked".to_vec()]);
    assert_eq!(r.next_offset, a.end_offset);
    let st = m.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!((st.readable_offset, st.max_offset), (a.end_offset, b.end_offset));
    // A tool that must see everything asks for it.
    let all = pb::ReadRequest { include_unconfirmed: true, ..read_req(0) };
    let r = read(&m, all).await;
    assert_eq!(bodies(&r), [b"acked".to_vec(), b"not acked".to_vec()]);
    assert_eq!(r.next_offset, b.end_offset);

    // Once the slave acks it, it is served.
    proxy.set_mode(ProxyMode::Pass);
    wait_until(10, "slave acked the second put", || {
        m.node.status().confirm_offset >= b.end_offset as u64
    })
    .await;
    let r = read(&m, read_req(b_at)).await;
    assert_eq!(bodies(&r), [b"not acked".to_vec()]);
    assert_eq!(r.next_offset, b.end_offset);
    assert_eq!(m.node.status().readable_offset, b.end_offset as u64);
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_master_serves_up_to_its_max_offset() {
    let md = tempfile::tempdir().unwrap();
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let out = m.messages().await.put(put_req(&[b"one", b"two"])).await.unwrap().into_inner();
    assert_eq!(out.status(), PutStatus::PutOk);
    let r = read(&m, read_req(0)).await;
    assert_eq!(bodies(&r), [b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(r.next_offset, out.end_offset);
    let st = m.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!((st.readable_offset, st.confirm_offset), (out.end_offset, 0));
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sync_master_is_readable_at_once_up_to_its_persisted_confirm_offset() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, proxy) = sync_pair(md.path(), sd.path()).await;
    let mut msgs = m.messages().await;
    let a = msgs.put(put_req(&[b"a1", b"a2"])).await.unwrap().into_inner();
    assert_eq!(a.status(), PutStatus::PutOk, "{a:?}");
    proxy.set_mode(ProxyMode::Stall);
    let b = msgs.put(put_req(&[b"b"])).await.unwrap().into_inner();
    assert_eq!(b.status(), PutStatus::FlushSlaveTimeout, "{b:?}");
    s.stop().await;
    m.stop().await;
    drop(proxy);

    // Alone (no slave to ack anything), at once.
    let m = ApiNode::start(sync_master_config(md.path(), 1)).await;
    let r = read(&m, read_req(0)).await;
    assert_eq!(bodies(&r), [b"a1".to_vec(), b"a2".to_vec()], "{r:?}");
    assert_eq!(r.next_offset, a.end_offset);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_slave_serves_up_to_the_confirm_offset_it_learned_from_its_master() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut mc = sync_master_config(md.path(), 2);
    mc.ha.empty_slave_start = hasync::config::EmptySlaveStart::Earliest;
    let m = ApiNode::start(mc).await;
    // The slave keeps its default (ASYNC) mode: its readable end follows its master's mode.
    let mut sc = slave_node_config(sd.path(), m.node.ha_addr().unwrap());
    assert_eq!(sc.replication.mode, ReplicationMode::Async);
    sc.slave.master_grpc = grpc_of(&m);
    sc.metadata.sync_interval = Duration::from_millis(50);
    let s = ApiNode::start(sc).await;
    let end = replicated_unconfirmed(&m, &s).await;
    wait_until(10, "slave pulled from its master", || {
        s.node.status().metadata_pull.is_some_and(|p| p.pulls_ok >= 2)
    })
    .await;
    let r = read(&s, read_req(0)).await;
    assert!(r.messages.is_empty(), "the slave served what its master never confirmed: {r:?}");
    assert_eq!(r.next_offset, 0);

    // k = 1: the one slave's ack confirms them; the slave learns it and serves them.
    m.node.set_replication_mode(ReplicationMode::Sync, Some(1)).unwrap();
    wait_until(10, "master confirmed", || m.node.status().confirm_offset == end).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = read(&s, read_req(0)).await;
        if !r.messages.is_empty() {
            assert_eq!(bodies(&r), [b"x".to_vec(), b"y".to_vec()]);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slave never learned the confirm");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.node.readable_offset(), end);

    // Promoted (SYNC, no slave of its own), it starts at the confirm offset it learned.
    m.stop().await;
    s.node.change_role(RoleRequest::master(1)).await.unwrap();
    assert_eq!(s.node.readable_offset(), end);
    assert_eq!(s.node.status().confirm_offset, end);
    assert_eq!(bodies(&read(&s, read_req(0)).await), [b"x".to_vec(), b"y".to_vec()]);
    s.stop().await;
}

/// A promoted SYNC node holding records its old master never confirmed does not serve them:
/// its readable end starts at the confirm offset it knew and rises only by acks of its own term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_sync_node_serves_its_unconfirmed_tail_only_once_its_own_slave_acks_it() {
    let (md, sd, s2d) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut mc = sync_master_config(md.path(), 2);
    mc.ha.empty_slave_start = hasync::config::EmptySlaveStart::Earliest;
    let m = ApiNode::start(mc).await;
    let mut sc = sync_master_config(sd.path(), 1);
    sc.node.role = Role::Slave;
    sc.slave.master_ha = m.node.ha_addr().unwrap().to_string();
    sc.ha.empty_slave_start = hasync::config::EmptySlaveStart::Earliest;
    let s = ApiNode::start(sc).await;
    let end = replicated_unconfirmed(&m, &s).await;
    m.stop().await;

    s.node.change_role(RoleRequest::master(1)).await.unwrap();
    assert_eq!(s.node.readable_offset(), 0, "nothing of the old term was confirmed");
    let r = read(&s, read_req(0)).await;
    assert!(r.messages.is_empty(), "served a tail a failover may still cut: {r:?}");
    assert_eq!(r.next_offset, 0);

    // A slave of its own acks the tail in this term: now it is served.
    let mut s2c = slave_node_config(s2d.path(), s.node.ha_addr().unwrap());
    s2c.ha.empty_slave_start = hasync::config::EmptySlaveStart::Earliest;
    let s2 = ApiNode::start(s2c).await;
    wait_until(10, "acked in the new term", || s.node.readable_offset() == end).await;
    assert_eq!(bodies(&read(&s, read_req(0)).await), [b"x".to_vec(), b"y".to_vec()]);
    s2.stop().await;
    s.stop().await;
}
