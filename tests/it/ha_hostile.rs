//! Requests and peers that would wedge a node (issue 15): ChangeRole with an epoch of 2^53 or
//! more or with a master that is this node itself (by its own listener address, or by the data-dir
//! id its status reports), and a slave node following a raw master (as a stock Java master)
//! that sends a damaged record.

use std::net::SocketAddr;
use std::path::Path;

use hasync::config::Role;
use hasync::control::pb;
use hasync::node::PutStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::grpc::ApiNode;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::{msg, open, opts};

/// What a refused ChangeRole must leave alone: role, epoch, history, role file, fence.
#[derive(Debug, PartialEq)]
struct Before {
    role: Role,
    epoch: u64,
    history: usize,
    role_file: Option<Vec<u8>>,
    fenced: bool,
}

fn before(n: &ApiNode, dir: &Path) -> Before {
    Before {
        role: n.node.role(),
        epoch: n.node.epoch(),
        history: n.node.epoch_history().entries().len(),
        role_file: std::fs::read(dir.join(hasync::node::role::ROLE_FILE)).ok(),
        fenced: n.node.status().fenced,
    }
}

fn demote(epoch: u64, master_ha: &str, master_grpc: &str) -> pb::ChangeRoleRequest {
    pb::ChangeRoleRequest {
        role: pb::Role::Slave as i32,
        epoch,
        master_ha_address: master_ha.to_owned(),
        master_grpc_address: master_grpc.to_owned(),
        force_resync: false,
        decision_token: String::new(),
    }
}

fn promote(epoch: u64) -> pb::ChangeRoleRequest {
    pb::ChangeRoleRequest { role: pb::Role::Master as i32, epoch, ..demote(0, "", "") }
}

/// Sends `req` and expects INVALID_ARGUMENT whose message holds `says`, with nothing changed.
async fn refused(n: &ApiNode, dir: &Path, req: pb::ChangeRoleRequest, says: &str) {
    let was = before(n, dir);
    let answer = n.replication().await.change_role(req.clone()).await;
    let status = match answer {
        Ok(ok) => panic!("accepted {req:?}: {ok:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{req:?}: {status:?}");
    assert!(status.message().contains(says), "{req:?}: {:?}", status.message());
    assert_eq!(before(n, dir), was, "a refused {req:?} changed the node");
    let put = n.node.put(vec![msg("T", 0, b"still a master")]).await;
    assert_eq!(put.status, PutStatus::PutOk, "after {req:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_role_refuses_an_epoch_above_2_pow_53_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    refused(&n, dir.path(), promote(u64::MAX), "2^53").await;
    refused(&n, dir.path(), promote((1 << 53) + 1), "2^53").await;
    refused(&n, dir.path(), demote(u64::MAX, "127.0.0.1:1", ""), "2^53").await;
    // The highest epoch accepted is 2^53 - 1 (no real sequence of role changes comes near it).
    let top = (1 << 53) - 1;
    let ok = n.replication().await.change_role(promote(top)).await.unwrap().into_inner();
    assert_eq!(ok.epoch, top);
    n.stop().await;
}

/// 2^53 itself is refused: accepted, it left a node whose every higher epoch is refused as
/// "above 2^53" (the wedge the bound is there to prevent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_role_refuses_epoch_2_pow_53_itself_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    refused(&n, dir.path(), promote(1 << 53), "2^53").await;
    refused(&n, dir.path(), demote(1 << 53, "127.0.0.1:1", ""), "2^53").await;
    let ok = n.replication().await.change_role(promote(7)).await.unwrap().into_inner();
    assert_eq!(ok.epoch, 7, "a sane epoch after the refusals");
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_role_refuses_a_master_at_one_of_this_nodes_own_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let n = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    let ha = n.node.ha_addr().unwrap();
    let grpc = n.running.grpc_addr();
    let own = "this node's own";
    refused(&n, dir.path(), demote(1, &ha.to_string(), ""), own).await;
    refused(&n, dir.path(), demote(1, &format!("localhost:{}", ha.port()), ""), own).await;
    refused(&n, dir.path(), demote(1, &format!("0.0.0.0:{}", ha.port()), ""), own).await;
    refused(&n, dir.path(), demote(1, &grpc.to_string(), ""), own).await;
    refused(&n, dir.path(), demote(1, "127.0.0.1:1", &grpc.to_string()), own).await;
    n.stop().await;
}

/// A node whose HA listener is 0.0.0.0 is at every local address: 127.0.0.1, 127.0.0.2, ...
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_role_refuses_a_local_address_of_a_wildcard_listener() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = node_config(dir.path(), Role::Master);
    c.ha.listen = "0.0.0.0:0".parse().unwrap();
    let n = ApiNode::start(c).await;
    let port = n.node.ha_addr().unwrap().port();
    for ip in ["127.0.0.1", "127.0.0.2", "0.0.0.0"] {
        refused(&n, dir.path(), demote(1, &format!("{ip}:{port}"), ""), "this node's own").await;
    }
    n.stop().await;
}

/// Through a proxy its addresses differ, but the master's status reports this node's own
/// data-dir id: refused, naming the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_role_refuses_a_master_that_reports_this_nodes_data_dir_id() {
    let dir = tempfile::tempdir().unwrap();
    let n = ApiNode::start(node_config(dir.path(), Role::Master)).await;
    let grpc_proxy = Proxy::start(n.running.grpc_addr(), ProxyMode::Pass).await;
    let ha_proxy = Proxy::start(n.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let id = n.node.status().data_dir_id;
    let req = demote(1, &ha_proxy.addr.to_string(), &grpc_proxy.addr.to_string());
    refused(&n, dir.path(), req, &id).await;
    n.stop().await;
}

/// A raw master (the wire bytes only, as a stock Java master) serving a segment whose second
/// record has a flipped body byte; the frame ends inside it.
async fn raw_java_master(bytes: Vec<u8>, split: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let bytes = bytes.clone();
            tokio::spawn(async move {
                let mut report = [0u8; 8];
                if c.read_exact(&mut report).await.is_err() {
                    return;
                }
                // From the reported offset on, as a master does.
                let from = (i64::from_be_bytes(report).max(0) as usize).min(bytes.len());
                let cuts = if from < split { vec![from, split] } else { vec![from] };
                let ends = cuts.iter().skip(1).copied().chain([bytes.len()]);
                for (offset, end) in cuts.iter().copied().zip(ends) {
                    let body = &bytes[offset..end];
                    let mut frame = (offset as i64).to_be_bytes().to_vec();
                    frame.extend_from_slice(&(body.len() as i32).to_be_bytes());
                    frame.extend_from_slice(body);
                    if c.write_all(&frame).await.is_err() {
                        return;
                    }
                }
                let _ = c.read_to_end(&mut Vec::new()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_node_refuses_a_damaged_record_from_a_java_master_and_reports_it() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = open(md.path(), opts(64 * 1024));
    let r = src.append(&[msg("T", 0, &[1; 900]), msg("T", 0, &[2; 900]), msg("T", 0, &[3; 900])]);
    let r = r.unwrap();
    let damaged = r.records[1].offset;
    let mut bytes = src.read(0, usize::MAX).unwrap().unwrap().to_vec();
    bytes[damaged as usize + 400] ^= 0x01;
    let master = raw_java_master(bytes, damaged as usize + 50).await;
    let s = ApiNode::start(slave_node_config(sd.path(), master)).await;
    let mut client = s.replication().await;
    let mut link = None;
    wait_until(10, "the slave reports the damaged record", || {
        link = s.node.status().master_link;
        link.as_ref()
            .is_some_and(|l| l.last_error.as_deref().is_some_and(|e| e.contains("damaged")))
    })
    .await;
    let status = client.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    let wire = status.master_link.expect("a master link");
    let says = format!("damaged record at offset {damaged} from master {master}");
    assert!(wire.damaged_record.contains(&says), "{wire:?}");
    assert!(wire.last_error.contains(&says), "{wire:?}");
    assert_eq!(s.node.store().dispatched_offset(), damaged, "the good record is kept");
    assert!(s.node.store().max_offset() < r.records[2].offset, "nothing damaged stored");
    s.stop().await;
}
