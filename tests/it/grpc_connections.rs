//! The gRPC port's connections are bounded and time out: `grpc.max-connections` (one more is
//! closed at accept), `grpc.handshake-timeout` (bare TCP that never speaks), `grpc.idle-timeout`
//! (no open call), while a connection with a long stream (WatchStatus) keeps it.

use std::time::{Duration, Instant};

use hasync::config::Role;
use hasync::control::pb;
use hasync::control::pb::replication_client::ReplicationClient;
use tokio::io::AsyncReadExt as _;
use tonic::transport::Channel;

use crate::support::ha::node_config;
use crate::support::node::TestNode;
use crate::support::process::metric;

async fn channel(node: &TestNode) -> ReplicationClient<Channel> {
    ReplicationClient::new(Channel::from_shared(node.url()).unwrap().connect().await.unwrap())
}

/// Reads from a raw connection until the server closes it (EOF or reset), at most `secs`.
async fn closed_by_server(s: &mut tokio::net::TcpStream, secs: u64) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // Server bytes (an HTTP/2 preface or a GOAWAY): keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

/// Waits (bounded) until the metric reaches `at_least`.
async fn wait_metric(node: &TestNode, name: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = metric(node.metrics_addr(), name).await.unwrap_or(-1.0);
        if v >= at_least {
            return v;
        }
        assert!(Instant::now() < deadline, "{name} = {v}, expected at least {at_least}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_beyond_max_connections_is_closed_at_accept() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = node_config(dir.path(), Role::Master);
    c.grpc.max_connections = 3;
    let node = TestNode::start(c).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut cl = channel(&node).await;
        cl.get_status(pb::GetStatusRequest {}).await.unwrap();
        clients.push(cl);
    }
    let mut extra = tokio::net::TcpStream::connect(node.grpc_addr()).await.unwrap();
    assert!(closed_by_server(&mut extra, 10).await, "the 4th connection was not closed");
    let refused = wait_metric(&node, "hasync_grpc_connections_refused_total", 1.0).await;
    assert_eq!(refused, 1.0);
    for cl in &mut clients {
        cl.get_status(pb::GetStatusRequest {}).await.expect("the first three still work");
    }
    // A slot that frees is taken again.
    drop(clients.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(node.metrics_addr(), "hasync_grpc_connections").await != Some(2.0) {
        assert!(Instant::now() < deadline, "the dropped connection is still counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    channel(&node).await.get_status(pb::GetStatusRequest {}).await.unwrap();
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_while_a_stream_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = node_config(dir.path(), Role::Master);
    c.grpc.handshake_timeout = Duration::from_millis(500);
    c.grpc.idle_timeout = Duration::from_secs(1);
    let node = TestNode::start(c).await;

    // Bare TCP that never speaks.
    let mut bare = tokio::net::TcpStream::connect(node.grpc_addr()).await.unwrap();
    assert!(closed_by_server(&mut bare, 10).await, "a silent connection stayed open");
    wait_metric(&node, "hasync_grpc_connections_closed_total", 1.0).await;

    // A stream open for several idle timeouts keeps its connection.
    let mut watcher = channel(&node).await;
    let mut stream = watcher
        .watch_status(pb::WatchStatusRequest { interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    // An HTTP/2 connection whose one call ended is closed once idle.
    let mut unary = channel(&node).await;
    unary.get_status(pb::GetStatusRequest {}).await.unwrap();
    wait_metric(&node, "hasync_grpc_connections_closed_total", 2.0).await;
    // Three idle timeouts of messages on the stream.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
        assert!(matches!(next, Ok(Ok(Some(_)))), "the watch stream ended: {next:?}");
    }
    let closed = metric(node.metrics_addr(), "hasync_grpc_connections_closed_total").await;
    assert_eq!(closed, Some(2.0), "only the silent and the idle connection were closed");
    // The client reconnects on its next call.
    unary.get_status(pb::GetStatusRequest {}).await.unwrap();
    node.shutdown().await.unwrap();
}
