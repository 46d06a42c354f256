//! The gRPC control plane end to end: every RPC through the generated tonic client against real
//! nodes on 127.0.0.1.

use std::time::Duration;

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb::{self, PutRequest, PutStatus};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::grpc::*;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};

fn put_req(msgs: Vec<pb::Message>) -> PutRequest {
    PutRequest { messages: msgs }
}

async fn health(node: &ApiNode, service: &str) -> ServingStatus {
    let mut h = HealthClient::new(node.channel().await);
    let r = h.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

async fn master(dir: &std::path::Path, mode: ReplicationMode) -> ApiNode {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = mode;
    ApiNode::start(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_moves_as_data_replicates() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    let mut rm = m.replication().await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    let mut msgs = m.messages().await;
    let out = msgs
        .put(put_req(vec![pb_msg("T", b"one"), pb_msg("T", b"two")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.status(), PutStatus::PutOk, "{out:?}");
    assert!(out.stored);
    assert_eq!(out.results.len(), 2);
    assert_eq!((out.results[0].queue_offset, out.results[1].queue_offset), (0, 1));
    assert_eq!(out.results[1].offset, out.results[0].offset + out.results[0].size as i64);
    let st = rm.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.role(), pb::Role::Master);
    assert_eq!(st.mode(), pb::ReplicationMode::Sync);
    assert_eq!(st.max_offset, out.end_offset);
    assert_eq!(st.confirm_offset, out.end_offset);
    assert_eq!(st.in_sync_replicas, 1);
    assert_eq!(st.slaves.len(), 1);
    let sl = &st.slaves[0];
    assert_eq!(
        (sl.ack_offset, sl.lag_bytes, sl.lag_millis, sl.in_sync),
        (out.end_offset, 0, 0, true)
    );
    assert!(sl.last_ack_unix_ms > 0 && sl.connected_since_unix_ms > 0);
    assert!(st.master_link.is_none());
    let ss = s.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(ss.role(), pb::Role::Slave);
    assert_eq!(ss.max_offset, out.end_offset);
    let link = ss.master_link.unwrap();
    assert!(link.connected && link.last_error.is_empty());
    assert!(link.epoch_check.contains("classic mode"), "no master gRPC: {}", link.epoch_check);
    assert_eq!((st.epoch, st.epoch_history_length), (0, 1));
    assert_eq!(link.address, m.node.ha_addr().unwrap().to_string());
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_status_streams_and_stops() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let mut rm = m.replication().await;
    let mut stream =
        rm.watch_status(pb::WatchStatusRequest { interval_ms: 1 }).await.unwrap().into_inner();
    let mut msgs = m.messages().await;
    let started = std::time::Instant::now();
    let first = stream.next().await.unwrap().unwrap();
    msgs.put(put_req(vec![pb_msg("T", b"x")])).await.unwrap();
    let mut last = first.clone();
    for _ in 0..3 {
        last = stream.next().await.unwrap().unwrap();
    }
    assert!(started.elapsed() >= Duration::from_millis(250), "interval raised to 100 ms");
    assert!(last.max_offset > first.max_offset, "the stream shows the put");
    assert!(last.time_unix_ms > first.time_unix_ms);
    // The server stopping ends the stream cleanly.
    m.stop().await;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the stream ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_changes_what_put_does() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Sync).await;
    let mut rm = m.replication().await;
    let mut msgs = m.messages().await;
    let out = msgs.put(put_req(vec![pb_msg("T", b"x")])).await.unwrap().into_inner();
    assert_eq!(out.status(), PutStatus::SlaveNotAvailable);
    assert!(out.stored && out.detail.contains("in sync"), "{out:?}");
    let r = rm
        .set_replication_mode(pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Async as i32,
            sync_ack_replicas: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.mode(), r.sync_ack_replicas), (pb::ReplicationMode::Async, 1));
    let out = msgs.put(put_req(vec![pb_msg("T", b"y")])).await.unwrap().into_inner();
    assert_eq!(out.status(), PutStatus::PutOk);
    let r = rm
        .set_replication_mode(pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: Some(2),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.mode(), r.sync_ack_replicas), (pb::ReplicationMode::Sync, 2));
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_refuses_put_and_mode_naming_its_master() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Async).await;
    let ha = m.node.ha_addr().unwrap().to_string();
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    let e = s.messages().await.put(put_req(vec![pb_msg("T", b"x")])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains(&ha), "{}", e.message());
    let e = s
        .replication()
        .await
        .set_replication_mode(pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains(&ha), "{}", e.message());
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_on_and_off() {
    let md = tempfile::tempdir().unwrap();
    let mut c = node_config(md.path(), Role::Master);
    c.grpc.token = "s3cret".into();
    let m = ApiNode::start(c).await;
    let mut msgs = m.messages().await;
    let e = msgs.put(put_req(vec![pb_msg("T", b"x")])).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("Bearer"), "{}", e.message());
    let e = msgs.put(with_token(put_req(vec![pb_msg("T", b"x")]), "wrong")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(m.node.store().max_offset(), 0, "refused calls write nothing");
    let ok = msgs
        .put(with_token(put_req(vec![pb_msg("T", b"x")]), "s3cret"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.status(), PutStatus::PutOk);
    let mut rm = m.replication().await;
    let e = rm
        .set_replication_mode(pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // Reads stay open; so do health and reflection.
    rm.get_status(pb::GetStatusRequest {}).await.unwrap();
    msgs.read(pb::ReadRequest { offset: 0, max_bytes: 0, max_messages: 0, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(health(&m, "").await, ServingStatus::Serving);
    m.stop().await;

    // token-for-reads closes reads too.
    let md = tempfile::tempdir().unwrap();
    let mut c = node_config(md.path(), Role::Master);
    c.grpc.token = "s3cret".into();
    c.grpc.token_for_reads = true;
    let m = ApiNode::start(c).await;
    let mut rm = m.replication().await;
    assert_eq!(
        rm.get_status(pb::GetStatusRequest {}).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    rm.get_status(with_token(pb::GetStatusRequest {}, "s3cret")).await.unwrap();
    assert_eq!(health(&m, "").await, ServingStatus::Serving);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_documented_code_and_changes_nothing() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let mut msgs = m.messages().await;
    let mut rm = m.replication().await;
    let first = msgs.put(put_req(vec![pb_msg("T", b"first")])).await.unwrap().into_inner();
    let before = m.node.store().max_offset();
    let mut neg = pb_msg("T", b"x");
    neg.queue_id = -1;
    let mut bad_prop = pb_msg("T", b"x");
    bad_prop.properties.insert("a\u{1}b".into(), "v".into());
    let cases: Vec<(Vec<pb::Message>, &str)> = vec![
        (vec![], "no messages"),
        (vec![pb_msg("", b"x")], "empty topic"),
        (vec![pb_msg("T", b"ok"), pb_msg("T", &vec![0u8; 16 * 1024 + 1])], "max-message-size"),
        (vec![neg], "negative"),
        (vec![bad_prop], "message 0"),
        (vec![pb_msg(&"t".repeat(256), b"x")], "topic"),
        ((0..1025).map(|_| pb_msg("T", b"x")).collect(), "max-messages-per-put"),
    ];
    for (batch, want) in cases {
        let e = msgs.put(put_req(batch)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
    }
    assert_eq!(m.node.store().max_offset(), before, "nothing written");
    let e = rm
        .set_replication_mode(pb::SetReplicationModeRequest { mode: 0, sync_ack_replicas: None })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = rm
        .set_replication_mode(pb::SetReplicationModeRequest { mode: 1, sync_ack_replicas: Some(0) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(m.node.replication().mode, ReplicationMode::Async, "unchanged");
    for (offset, code) in [
        (-1, Code::OutOfRange),
        (before as i64 + 1, Code::OutOfRange),
        (first.results[0].offset + 3, Code::InvalidArgument),
    ] {
        let e = msgs
            .read(pb::ReadRequest { offset, max_bytes: 0, max_messages: 0, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "offset {offset}: {e:?}");
        assert!(e.message().contains("valid range"), "{}", e.message());
    }
    let e = rm.change_role(pb::ChangeRoleRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "unspecified role");
    let stale =
        pb::ChangeRoleRequest { role: pb::Role::Master as i32, epoch: 0, ..Default::default() };
    let e = rm.change_role(stale).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "epoch 0 is in force: {e:?}");
    let no_master =
        pb::ChangeRoleRequest { role: pb::Role::Slave as i32, epoch: 1, ..Default::default() };
    let e = rm.change_role(no_master).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "a slave needs a master: {e:?}");
    let h = rm.get_epoch_history(pb::GetEpochHistoryRequest {}).await.unwrap().into_inner();
    assert_eq!(h.entries, vec![pb::EpochEntry { epoch: 0, start_offset: 0, ..Default::default() }]);
    assert_eq!(m.node.role(), Role::Master, "refused changes change nothing");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_returns_decoded_records_from_master_and_slave() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = node_config(md.path(), Role::Master);
    c.ha.empty_slave_start = hasync::config::EmptySlaveStart::Earliest;
    let m = ApiNode::start(c).await;
    let mut msgs = m.messages().await;
    let batch: Vec<_> =
        (0..40).map(|i| pb_msg("ReadTopic", format!("body-{i}").repeat(100).as_bytes())).collect();
    let out = msgs.put(put_req(batch)).await.unwrap().into_inner();
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    wait_until(10, "slave caught up", || {
        s.node.store().max_offset() == m.node.store().max_offset()
    })
    .await;
    for node in [&m, &s] {
        let mut c = node.messages().await;
        let mut at = 0;
        let mut seen = Vec::new();
        while at < out.end_offset {
            let r = c
                .read(pb::ReadRequest {
                    offset: at,
                    max_bytes: 8 * 1024,
                    max_messages: 7,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!r.messages.is_empty() && r.messages.len() <= 7);
            seen.extend(r.messages);
            at = r.next_offset;
        }
        assert_eq!(at, out.end_offset);
        assert_eq!(seen.len(), 40);
        for (i, msg) in seen.iter().enumerate() {
            assert_eq!(msg.physical_offset, out.results[i].offset);
            assert_eq!(msg.queue_offset, i as i64);
            assert_eq!(msg.body, format!("body-{i}").repeat(100).as_bytes());
            assert_eq!(
                (msg.topic.as_str(), msg.tags.as_str(), msg.keys.as_str(), msg.flag),
                ("ReadTopic", "TagA", "k1 k2", 7)
            );
            assert_eq!(msg.properties.get("color").map(String::as_str), Some("blue"));
        }
        let end = c
            .read(pb::ReadRequest {
                offset: out.end_offset,
                max_bytes: 0,
                max_messages: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(end.messages.is_empty());
        assert_eq!(end.next_offset, out.end_offset);
    }
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flips_with_start_shutdown_and_in_sync_replicas() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    assert_eq!(health(&m, "").await, ServingStatus::Serving);
    let svc = hasync::control::REPLICATION_SERVICE;
    // SYNC with no slave: cannot answer PUT_OK.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(health(&m, svc).await, ServingStatus::NotServing);
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while health(&m, svc).await != ServingStatus::Serving
        || health(&s, svc).await != ServingStatus::Serving
    {
        assert!(std::time::Instant::now() < deadline, "master and slave become SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The slave goes away: the master loses its in-sync replica.
    proxy.cut();
    proxy.set_mode(ProxyMode::Stall);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while health(&m, svc).await != ServingStatus::NotServing {
        assert!(std::time::Instant::now() < deadline, "master becomes NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
    // Shutdown: NOT_SERVING first.
    m.running.app().set_not_serving().await;
    assert_eq!(health(&m, "").await, ServingStatus::NotServing);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_client_went_away_still_completes() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    proxy.set_mode(ProxyMode::Stall);
    let mut msgs = m.messages().await;
    let mut req = tonic::Request::new(put_req(vec![pb_msg("T", b"deadline")]));
    req.set_timeout(Duration::from_millis(300));
    let e = msgs.put(req).await.unwrap_err();
    // tonic's client reports its own deadline as CANCELLED "Timeout expired".
    assert!(matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled), "{e:?}");
    assert!(m.node.store().max_offset() > 0, "the put was stored");
    // The waiter completes on the node (FLUSH_SLAVE_TIMEOUT after 2 s), nothing hangs.
    wait_until(10, "waiter completed", || m.node.status().pending_sync_puts == 0).await;
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let mut c = ServerReflectionClient::new(m.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream =
        c.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let resp = stream.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("{resp:?}")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "hasync.v1.Replication",
        "hasync.v1.Messages",
        "hasync.v1.Cluster",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_service_of_a_node_without_a_coordinator_says_so() {
    use hasync::control::pb::cluster_client::ClusterClient;
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let mut c = ClusterClient::new(m.channel().await);
    let e = c.get_cluster_status(pb::GetClusterStatusRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), hasync::control::cluster::NO_COORDINATOR);
    let s = pb::SwitchoverRequest { group: "g1".into(), ..Default::default() };
    assert_eq!(c.switchover(s).await.unwrap_err().code(), Code::FailedPrecondition);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_grpc_port() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let md = tempfile::tempdir().unwrap();
    let (c, cert) = tls_master_config(md.path(), &["localhost"]);
    let cert_pem = std::fs::read_to_string(&cert).unwrap();
    c.validate().unwrap();
    let m = ApiNode::start(c).await;
    let addr = m.url.trim_start_matches("http://").to_owned();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert_pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut rm = pb::replication_client::ReplicationClient::new(channel);
    let st = rm.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.role(), pb::Role::Master);
    // A plaintext client cannot talk to it.
    let plain = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await;
    if let Ok(ch) = plain {
        let r = pb::replication_client::ReplicationClient::new(ch)
            .get_status(pb::GetStatusRequest {})
            .await;
        assert!(r.is_err(), "plaintext call succeeded against a TLS port");
    }
    m.stop().await;
}

/// A slave follows a master whose gRPC port has TLS on: the epoch check before connecting and
/// the metadata pull both go over TLS, verified with `slave.master-grpc-ca-file`. Without the
/// CA file the same slave cannot check epochs (and so never connects its data plane).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_follows_a_tls_master_with_its_ca_file() {
    let (md, sd, plain) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (c, cert) = tls_master_config(md.path(), &["127.0.0.1", "localhost"]);
    let m = ApiNode::start(c).await;
    let grpc = m.running.grpc_addr().to_string();
    m.node.metadata().upsert_topic(crate::support::topic_config("OverTls", 4)).unwrap();
    for i in 0..5u8 {
        let out = m.node.put(vec![crate::support::msg("T", 0, &[i; 300])]).await;
        assert_eq!(out.status, hasync::node::PutStatus::PutOk);
    }
    let ha = m.node.ha_addr().unwrap();

    let mut sc = slave_node_config(sd.path(), ha);
    sc.slave.master_grpc = grpc.clone();
    sc.slave.master_grpc_ca_file = cert;
    let s = ApiNode::start(sc).await;
    wait_until(10, "the slave caught up over a TLS-checked link", || {
        s.node.store().max_offset() == m.node.store().max_offset()
    })
    .await;
    let link = s.node.status().master_link.unwrap();
    assert!(link.epoch_check.contains("epochs agree"), "{link:?}");
    wait_until(10, "the metadata pulled over TLS", || {
        let (_, t) = s.node.metadata().snapshot(hasync::metadata::Table::Topics);
        matches!(t, hasync::metadata::TableData::Topics(t) if t.contains_key("OverTls"))
    })
    .await;
    let pull = s.node.status().metadata_pull.unwrap();
    assert!(pull.last_error.is_none() && pull.pulls_ok >= 1, "{pull:?}");

    // The same slave without the CA file talks plaintext to a TLS port: no epoch check passes,
    // so its data plane never connects.
    let mut pc = slave_node_config(plain.path(), ha);
    pc.slave.master_grpc = grpc.clone();
    let p = ApiNode::start(pc).await;
    // Plaintext to a TLS port fails in the handshake or in the call: either way "unreachable".
    wait_until(10, "the failed epoch check reported", || {
        p.node.status().master_link.is_some_and(|l| {
            l.epoch_check.contains("cannot reach the master") && l.epoch_check.contains(&grpc)
        })
    })
    .await;
    assert!(!p.node.status().master_link.unwrap().connected);
    assert_eq!(p.node.store().max_offset(), 0);
    p.stop().await;
    s.stop().await;
    m.stop().await;
}

fn change_role(role: pb::Role, epoch: u64, master_ha: &str) -> pb::ChangeRoleRequest {
    pb::ChangeRoleRequest {
        role: role as i32,
        epoch,
        master_ha_address: master_ha.to_owned(),
        master_grpc_address: String::new(),
        force_resync: false,
        decision_token: String::new(),
    }
}

/// The gRPC code of each kind of refusal is pinned: a stale epoch and "not the master" are
/// FAILED_PRECONDITION, a bad argument INVALID_ARGUMENT; and a node configured as master that
/// was demoted names the master it follows now, not the (empty) configured one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_have_their_codes_and_name_the_live_master() {
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ApiNode::start(node_config(ad.path(), Role::Master)).await;
    let b = ApiNode::start(node_config(bd.path(), Role::Master)).await;
    let b_ha = b.node.ha_addr().unwrap().to_string();
    let mut ra = a.replication().await;

    let bad = ra.change_role(change_role(pb::Role::Slave, 1, " ")).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("master_ha_address"), "{bad:?}");

    // A follows B (classic mode: no epoch check), configured as a master with no master.
    ra.change_role(change_role(pb::Role::Slave, 2, &b_ha)).await.unwrap();
    let stale = ra.change_role(change_role(pb::Role::Master, 1, "")).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains("stale epoch 1: this node is at epoch 2"), "{stale:?}");

    let put = a.messages().await.put(put_req(vec![pb_msg("T", b"x")])).await.unwrap_err();
    assert_eq!(put.code(), Code::FailedPrecondition, "{put:?}");
    assert!(put.message().contains(&b_ha), "names the live master {b_ha}: {put:?}");
    assert!(put.message().contains("a put needs the master"), "{put:?}");
    let mode = ra
        .set_replication_mode(pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: None,
        })
        .await
        .unwrap_err();
    assert_eq!(mode.code(), Code::FailedPrecondition, "{mode:?}");
    assert!(mode.message().contains(&b_ha), "names the live master {b_ha}: {mode:?}");
    a.stop().await;
    b.stop().await;
}

/// A slave's refusal of a write names its master's gRPC address three ways (message, the
/// `hasync-master-grpc` metadata, the status details), so clients can follow it; without
/// `slave.master-grpc` (classic mode) there is nothing to follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_refusal_names_its_masters_grpc_address() {
    use hasync::control::pb::metadata_client::MetadataClient;
    let (md, sd, cd) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Async).await;
    let grpc = m.running.grpc_addr().to_string();
    let ha = m.node.ha_addr().unwrap();
    let mut sc = slave_node_config(sd.path(), ha);
    sc.slave.master_grpc = grpc.clone();
    let s = ApiNode::start(sc).await;
    let put = || PutRequest { messages: vec![pb_msg("T", b"x")] };
    let e = s.messages().await.put(put()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&grpc) && e.message().contains(&ha.to_string()), "{e:?}");
    assert_eq!(e.metadata().get(hasync::control::MASTER_GRPC_KEY).unwrap(), grpc.as_str());
    assert_eq!(hasync::control::master_grpc_of(&e).as_deref(), Some(grpc.as_str()));
    let topic = pb::TopicConfig {
        topic_name: "T".into(),
        read_queue_nums: 1,
        write_queue_nums: 1,
        perm: 6,
        ..Default::default()
    };
    let e = MetadataClient::new(s.channel().await)
        .upsert_topic(pb::UpsertTopicRequest { topic: Some(topic) })
        .await
        .unwrap_err();
    assert_eq!(hasync::control::master_grpc_of(&e).as_deref(), Some(grpc.as_str()), "{e:?}");

    let c = ApiNode::start(slave_node_config(cd.path(), ha)).await;
    let e = c.messages().await.put(put()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.metadata().get(hasync::control::MASTER_GRPC_KEY).is_none(), "{e:?}");
    assert_eq!(hasync::control::master_grpc_of(&e), None);
    c.stop().await;
    s.stop().await;
    m.stop().await;
}
