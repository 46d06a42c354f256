//! The gRPC control plane (tonic): translates protobuf <-> node calls, maps errors to gRPC
//! status codes in one place, and holds no state of its own. Standard health and server
//! reflection (v1 and v1alpha) ride along so grpcurl-style tools and Kubernetes probes work.

mod auth;
pub mod client;
mod convert;
mod error;
mod health;
mod messages;
mod metadata;
pub(crate) mod metadata_wire;
pub(crate) mod remote;
mod replication;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use auth::{AuthLayer, LogRefusalsLayer};
pub use health::{DISK_SERVICE, REPLICATION_SERVICE};

use crate::node::Node;

/// Code generated from `proto/hasync/v1/*.proto` by build.rs.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("hasync.v1");

    /// Encoded file descriptor set of `hasync.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hasync_descriptor");
}

/// The server's TLS identity from `grpc.tls-cert-file` / `grpc.tls-key-file` (None: plaintext).
fn server_tls(
    cfg: &crate::config::GrpcConfig,
) -> std::io::Result<Option<tonic::transport::ServerTlsConfig>> {
    if cfg.tls_cert_file.as_os_str().is_empty() {
        return Ok(None);
    }
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot read {what} {}: {e}", p.display()))
        })
    };
    let cert = read(&cfg.tls_cert_file, "grpc.tls-cert-file")?;
    let key = read(&cfg.tls_key_file, "grpc.tls-key-file")?;
    Ok(Some(
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key)),
    ))
}

/// The running control plane.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    addr: SocketAddr,
    health: health::Health,
    cancel: CancellationToken,
    /// Cancelled when the server task ends, for whatever reason.
    ended: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ControlPlane {
    /// Serves the API for `node` on `listener` until [`ControlPlane::stop`].
    pub(crate) async fn start(node: Arc<Node>, listener: TcpListener) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let cfg = node.config().grpc.clone();
        let max_request = cfg.max_request_size.0 as usize;
        let cancel = CancellationToken::new();
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let health = health::Health::start(Arc::clone(&node), reporter, cancel.child_token()).await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(std::io::Error::other)?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(std::io::Error::other)?;
        let replication = pb::replication_server::ReplicationServer::new(
            replication::ReplicationService::new(Arc::clone(&node), cancel.child_token()),
        )
        .max_decoding_message_size(max_request);
        let messages = pb::messages_server::MessagesServer::new(messages::MessagesService::new(
            Arc::clone(&node),
            addr,
        ))
        .max_decoding_message_size(max_request);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = server_tls(&cfg)? {
            builder = builder.tls_config(tls).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS setup: {e}"))
            })?;
        }
        let metadata = pb::metadata_server::MetadataServer::new(metadata::MetadataService::new(
            Arc::clone(&node),
        ))
        .max_decoding_message_size(max_request);
        let router = builder
            .max_concurrent_streams(cfg.max_concurrent_streams)
            .layer(LogRefusalsLayer)
            .layer(AuthLayer::new(&cfg.token, cfg.token_for_reads))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(replication)
            .add_service(messages)
            .add_service(metadata);
        // TCP_NODELAY: small unary calls must not wait on Nagle and delayed ACKs.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let stop = cancel.clone();
        let ended = CancellationToken::new();
        let end = ended.clone();
        let task = tokio::spawn(async move {
            let _ended = end.drop_guard();
            router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await
        });
        tracing::info!(grpc_listen = %addr, "control plane listening");
        Ok(Self { addr, health, cancel, ended, task })
    }

    /// The bound address (OS-assigned port resolved).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A token cancelled when the server stopped, by [`ControlPlane::stop`] or by failing.
    pub(crate) fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Health goes NOT_SERVING (the first step of a graceful shutdown).
    pub(crate) async fn set_not_serving(&self) {
        self.health.set_not_serving().await;
    }

    /// Stops serving: open streams end, the listener closes.
    pub(crate) async fn stop(self) {
        self.health.set_not_serving().await;
        self.cancel.cancel();
        match self.task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "control plane stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "control plane task failed"),
            Ok(Ok(())) => {}
        }
    }
}
