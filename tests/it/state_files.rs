//! The small state files (checkpoint, epoch history, role) at the node level: files in the
//! format before the common one still load and are rewritten in it, and a state-file write
//! that fails (through the file-system seam) is an error with a server-side gRPC code that
//! leaves the old file in place.

use std::path::Path;
use std::sync::Arc;

use hasync::config::Role;
use hasync::node::epoch::EPOCH_FILE;
use hasync::node::role::{ROLE_FILE, RoleRequest};
use hasync::store::checkpoint::CHECKPOINT_FILE;
use hasync::store::fs::{FileSystem, SimFs};

use crate::support::ha::node_config;
use crate::support::node::TestNode;

const HEADER: &[u8] = b"hasync-state ";

/// Writes `<dir>/epoch` as builds before the common format did: `(epoch, start)` entries.
fn write_legacy_epoch_file(dir: &Path, entries: &[(u64, u64)]) {
    let entries: Vec<String> =
        entries.iter().map(|(e, s)| format!(r#"{{"epoch":{e},"start_offset":{s}}}"#)).collect();
    let entries = format!("[{}]", entries.join(","));
    let crc = crc32fast::hash(entries.as_bytes());
    let epoch = format!(r#"{{"format_version":1,"crc32":{crc},"entries":{entries}}}"#);
    std::fs::write(dir.join(EPOCH_FILE), epoch).unwrap();
}

async fn start(dir: &Path, fs: &Arc<SimFs>) -> TestNode {
    let config = node_config(dir, Role::Master);
    TestNode::start_with_fs(config, Arc::clone(fs) as Arc<dyn FileSystem>).await
}

#[tokio::test]
async fn a_node_with_files_in_the_old_format_starts_and_rewrites_them_in_the_common_one() {
    let dir = tempfile::tempdir().unwrap();
    // The epoch and role files as builds before the common format wrote them.
    write_legacy_epoch_file(dir.path(), &[(0, 0), (3, 0)]);
    let role =
        r#"{"role":"master","epoch":3,"master_ha":"","master_grpc":"","force_resync":false}"#;
    std::fs::write(dir.path().join(ROLE_FILE), role).unwrap();
    let fs = Arc::new(SimFs::new());
    let node = start(dir.path(), &fs).await;
    assert_eq!(
        (node.role(), node.epoch(), node.epoch_history().last().epoch),
        (Role::Master, 3, 3)
    );
    node.change_role(RoleRequest::master(4)).await.unwrap();
    node.shutdown().await.unwrap();
    drop(node);
    for file in [EPOCH_FILE, ROLE_FILE, CHECKPOINT_FILE] {
        let bytes = std::fs::read(dir.path().join(file)).unwrap();
        assert!(bytes.starts_with(HEADER), "{file}: {}", String::from_utf8_lossy(&bytes));
    }
    let node = start(dir.path(), &fs).await;
    assert_eq!((node.epoch(), node.epoch_history().last().epoch), (4, 4));
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_epoch_or_role_write_is_internal_and_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let node = start(dir.path(), &fs).await;
    node.change_role(RoleRequest::master(1)).await.unwrap();
    let (epoch_path, role_path) = (dir.path().join(EPOCH_FILE), dir.path().join(ROLE_FILE));
    let epoch_before = std::fs::read(&epoch_path).unwrap();

    // Issue 14: a write that fails after the plan was accepted fails the change in its step
    // (the node is then at the new epoch, fenced, until the exact repeat or a higher epoch).
    let failed_in = |err: &hasync::node::Error| match err {
        hasync::node::Error::RoleChangeFailed { source, .. } => Some(source.to_string()),
        _ => None,
    };
    let failing = epoch_path.clone();
    fs.fail_writes(move |p| p == failing);
    let err = node.change_role(RoleRequest::master(2)).await.unwrap_err();
    assert!(matches!(&err, hasync::node::Error::RoleChangeFailed { step: "write epoch file", .. }));
    assert!(failed_in(&err).is_some_and(|e| e.contains("epoch")), "{err:?}");
    assert!(err.to_string().contains(&epoch_path.display().to_string()), "{err}");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert_eq!(std::fs::read(&epoch_path).unwrap(), epoch_before);
    assert_eq!((node.epoch(), node.epoch_history().last().epoch), (2, 1));

    let role_before = std::fs::read(&role_path).unwrap();
    let failing = role_path.clone();
    fs.fail_writes(move |p| p == failing);
    let err = node.change_role(RoleRequest::master(3)).await.unwrap_err();
    assert!(matches!(&err, hasync::node::Error::RoleChangeFailed { step: "write role file", .. }));
    assert!(failed_in(&err).is_some_and(|e| e.contains("role")), "{err:?}");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert_eq!(std::fs::read(&role_path).unwrap(), role_before);

    fs.clear_write_failures();
    node.change_role(RoleRequest::master(4)).await.unwrap();
    assert_eq!(node.epoch(), 4);
    node.shutdown().await.unwrap();
}

/// The same disk error seen by an operator: `ChangeRole` over gRPC answers INTERNAL (not
/// UNAVAILABLE, which the CLI reports as "unreachable"; not FAILED_PRECONDITION, "your request
/// was wrong").
#[tokio::test]
async fn a_disk_error_during_change_role_is_internal_over_grpc() {
    use hasync::control::pb;
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let node = start(dir.path(), &fs).await;
    let mut client = pb::replication_client::ReplicationClient::connect(node.url()).await.unwrap();
    let req = |epoch| pb::ChangeRoleRequest {
        role: pb::Role::Master as i32,
        epoch,
        ..Default::default()
    };
    client.change_role(req(1)).await.unwrap();
    let failing = dir.path().join(EPOCH_FILE);
    fs.fail_writes(move |p| p == failing);
    let status = client.change_role(req(2)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert!(status.message().contains(EPOCH_FILE), "names the file: {status:?}");
    fs.clear_write_failures();
    client.change_role(req(3)).await.unwrap();
    node.shutdown().await.unwrap();
}

/// A promotion that cannot start a new epoch (the log ends below the start of the history's
/// last epoch: a slave that adopted a history it never caught up with) is refused before
/// anything stops: the node is still a slave following its master. (It used to stop the slave
/// plane first and be refused after, leaving a slave with no data plane.)
#[tokio::test]
async fn a_promotion_the_log_cannot_carry_is_refused_before_anything_stops() {
    let dir = tempfile::tempdir().unwrap();
    write_legacy_epoch_file(dir.path(), &[(0, 0), (1, 5000)]);
    let config = crate::support::ha::slave_node_config(dir.path(), "127.0.0.1:1".parse().unwrap());
    let node = TestNode::start_with_fs(config, Arc::new(SimFs::new()) as Arc<dyn FileSystem>).await;
    assert!(node.status().master_link.is_some());
    let err = node.change_role(RoleRequest::master(2)).await.unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("does not follow epoch 1 at 5000"), "{status:?}");
    let s = node.status();
    assert_eq!((s.role, s.epoch), (Role::Slave, 1));
    assert!(s.master_link.is_some(), "the slave plane still runs");
    node.shutdown().await.unwrap();
}

/// A crash (kill -9, in process) stops the store's own thread too: the crashed node writes
/// nothing more into its data directory, even while something still holds it, and a node
/// started again on that directory runs beside it. Before, the crashed node's store thread
/// went on writing a checkpoint every flush interval, and with the restarted node's writes the
/// two collided on the checkpoint's temporary file: `quickstart --cluster` saw the restarted
/// master's role change fail "write .../checkpoint: No such file or directory".
#[tokio::test]
async fn a_crashed_node_writes_nothing_more_into_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = TestNode::start(node_config(dir.path(), Role::Master)).await;
    let put = first.put(vec![crate::support::msg("T", 0, b"before the crash")]).await;
    assert_eq!(put.status, hasync::node::PutStatus::PutOk, "{put:?}");
    let held = Arc::clone(first.node());
    first.crash().await;
    let checkpoint = dir.path().join(CHECKPOINT_FILE);
    let _ = std::fs::remove_file(&checkpoint);
    // node_config flushes every 50 ms: eight intervals.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(!checkpoint.exists(), "the crashed node wrote a checkpoint after its crash");

    let second = TestNode::start(node_config(dir.path(), Role::Master)).await;
    let put = second.put(vec![crate::support::msg("T", 0, b"after the restart")]).await;
    assert_eq!(put.status, hasync::node::PutStatus::PutOk, "{put:?}");
    second.change_role(RoleRequest::master(1)).await.unwrap();
    second.shutdown().await.unwrap();
    assert!(checkpoint.exists(), "the restarted node's clean stop left no checkpoint");
    drop(held);
}
