//! Issue 14, point 8: what the fault harness's checker needs. A put answers the epoch it was
//! admitted in; the epoch history names the master that opened each epoch.

use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb::{self, PutStatus};
use hasync::node::PutStatus as NodePutStatus;
use hasync::node::role::RoleRequest;

use crate::support::grpc::{ApiNode, pb_msg};
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::msg;

fn put_req(body: &[u8]) -> pb::PutRequest {
    pb::PutRequest { messages: vec![pb_msg("C", body)] }
}

fn grpc_of(n: &ApiNode) -> String {
    n.url.trim_start_matches("http://").to_owned()
}

async fn history(n: &ApiNode) -> Vec<(u64, String)> {
    let mut r = n.replication().await;
    let h = r.get_epoch_history(pb::GetEpochHistoryRequest {}).await.unwrap().into_inner();
    h.entries.into_iter().map(|e| (e.epoch, e.master_name)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_answers_the_epoch_it_was_admitted_in() {
    let md = tempfile::tempdir().unwrap();
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut msgs = m.messages().await;
    let out = msgs.put(put_req(b"in epoch 0")).await.unwrap().into_inner();
    assert_eq!((out.status(), out.epoch), (PutStatus::PutOk, 0));
    m.node.change_role(RoleRequest::master(2)).await.unwrap();
    let out = msgs.put(put_req(b"in epoch 2")).await.unwrap().into_inner();
    assert_eq!((out.status(), out.epoch), (PutStatus::PutOk, 2));
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_a_role_change_cuts_keeps_the_epoch_it_was_admitted_in() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.slave_timeout = Duration::from_secs(60);
    let m = ApiNode::start(c).await;
    m.node.change_role(RoleRequest::master(2)).await.unwrap();
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    proxy.set_mode(ProxyMode::Stall);
    let node = std::sync::Arc::clone(&m.node);
    let waiting = tokio::spawn(async move { node.put(vec![msg("C", 0, b"cut")]).await });
    wait_until(10, "the put waits for an ack", || m.node.status().pending_sync_puts == 1).await;
    m.node.change_role(RoleRequest::slave(5, "127.0.0.1:1", "")).await.unwrap();
    let out = waiting.await.unwrap();
    assert_eq!((out.status, out.stored, out.epoch), (NodePutStatus::ServiceNotAvailable, true, 2));
    assert_eq!(m.node.epoch(), 5);
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epoch_history_names_the_master_that_opened_each_epoch() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut ac = node_config(ad.path(), Role::Master);
    ac.node.name = "node-a".into();
    let a = ApiNode::start(ac).await;
    let mut bc = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    bc.node.name = "node-b".into();
    bc.slave.master_grpc = grpc_of(&a);
    let b = ApiNode::start(bc).await;
    a.messages().await.put(put_req(b"before")).await.unwrap();
    let end = a.node.store().max_offset();
    wait_until(10, "B caught up", || b.node.store().max_offset() == end).await;

    // B takes over in epoch 1; A follows it and adopts its history, names included.
    b.node.change_role(RoleRequest::master(1)).await.unwrap();
    let demote_a = RoleRequest::slave(1, b.node.ha_addr().unwrap().to_string(), grpc_of(&b));
    a.node.change_role(demote_a).await.unwrap();
    let after_1 = vec![(0, String::new()), (1, "node-b".to_owned())];
    assert_eq!(history(&b).await, after_1);
    assert_eq!(history(&a).await, after_1);

    // And back: A in epoch 2, B follows.
    a.node.change_role(RoleRequest::master(2)).await.unwrap();
    let demote_b = RoleRequest::slave(2, a.node.ha_addr().unwrap().to_string(), grpc_of(&a));
    b.node.change_role(demote_b).await.unwrap();
    let after_2 = vec![(0, String::new()), (1, "node-b".to_owned()), (2, "node-a".to_owned())];
    assert_eq!(history(&a).await, after_2);
    assert_eq!(history(&b).await, after_2);
    b.stop().await;
    a.stop().await;
}
