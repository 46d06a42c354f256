//! The gRPC control plane (tonic): translates protobuf <-> node calls, maps errors to gRPC
//! status codes in one place, and holds no state of its own. Standard health and server
//! reflection (v1 and v1alpha) ride along so grpcurl-style tools and Kubernetes probes work.
//! The Cluster service (the operator interface of automatic failover) delegates to what the
//! controller implements ([`ClusterApi`]).

mod auth;
pub mod client;
pub mod cluster;
pub mod coalesce;
mod conn;
pub(crate) mod convert;
mod error;
mod health;
pub mod json;
mod messages;
mod metadata;
pub(crate) mod metadata_wire;
pub(crate) mod pem;
pub mod put_stream;
pub(crate) mod remote;
mod replication;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use auth::{AuthLayer, LogRefusalsLayer};
pub use cluster::{ClusterApi, ClusterError, ClusterFuture};
pub use error::{MASTER_GRPC_KEY, master_grpc_of};
pub use health::{CoordinatorReadiness, DISK_SERVICE, REPLICATION_SERVICE};
pub use pem::PemError;

use crate::node::Node;

/// Code generated from `proto/hasync/v1/*.proto` by build.rs.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("hasync.v1");

    /// Encoded file descriptor set of `hasync.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hasync_descriptor");
}

/// The server's TLS identity from `grpc.tls-cert-file` / `grpc.tls-key-file` (None: plaintext);
/// a file that cannot be read or holds no PEM block of its kind is refused, naming it.
fn server_tls(
    cfg: &crate::config::GrpcConfig,
) -> Result<Option<tonic::transport::ServerTlsConfig>, PemError> {
    if cfg.tls_cert_file.as_os_str().is_empty() {
        return Ok(None);
    }
    let cert = pem::read("grpc.tls-cert-file", &cfg.tls_cert_file, pem::PemKind::Certificate)?;
    let key = pem::read("grpc.tls-key-file", &cfg.tls_key_file, pem::PemKind::PrivateKey)?;
    Ok(Some(
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key)),
    ))
}

/// Checks the TLS files that are set (`grpc.tls-cert-file`, `grpc.tls-key-file`,
/// `slave.master-grpc-ca-file`) the way TLS will read them: at start, before the node opens
/// anything (a slave with a bad CA file would fail every metadata pull).
pub(crate) fn check_tls_files(config: &crate::config::Config) -> Result<(), PemError> {
    server_tls(&config.grpc)?;
    let ca = &config.slave.master_grpc_ca_file;
    if ca.as_os_str().is_empty() {
        return Ok(());
    }
    pem::read("slave.master-grpc-ca-file", ca, pem::PemKind::Certificate).map(drop)
}

/// A server builder with TLS on when configured; errors name both files and their keys.
fn server_builder(cfg: &crate::config::GrpcConfig) -> std::io::Result<tonic::transport::Server> {
    let builder = tonic::transport::Server::builder();
    let invalid = |text: String| std::io::Error::new(std::io::ErrorKind::InvalidData, text);
    let Some(tls) = server_tls(cfg).map_err(|e| invalid(chain(&e)))? else {
        return Ok(builder);
    };
    builder.tls_config(tls).map_err(|e| {
        invalid(format!(
            "TLS setup with grpc.tls-cert-file {} and grpc.tls-key-file {}: {}",
            cfg.tls_cert_file.display(),
            cfg.tls_key_file.display(),
            chain(&e)
        ))
    })
}

/// The error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The gRPC connection limit of this process (the key, or the fd budget when lower).
fn connection_limit(config: &crate::config::Config) -> conn::Limit {
    let reserve = conn::fd_reserve(config.ha.max_connections);
    let nofile = conn::nofile_limit();
    let limit = conn::limit(config.grpc.max_connections, nofile, reserve);
    if limit.reason == "fd_budget" {
        tracing::warn!(
            max_connections = config.grpc.max_connections,
            open_files_limit = nofile,
            reserved = reserve,
            limit = limit.max,
            "gRPC connections limited below grpc.max-connections by the open-files limit \
             (RLIMIT_NOFILE) less the descriptors kept for the store and the HA data plane"
        );
    }
    limit
}

/// How long a stop waits for open calls to end by themselves before it closes their
/// connections (and again before it gives up on the server task).
const STOP_DRAIN: Duration = Duration::from_secs(5);

/// The running control plane.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    addr: SocketAddr,
    health: health::Health,
    cancel: CancellationToken,
    /// Cancelled when the server task ends, for whatever reason.
    ended: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    connections: conn::ConnTrackLayer,
}

impl ControlPlane {
    /// Serves the API for `node` on `listener` until [`ControlPlane::stop`]; the Cluster
    /// service delegates to `cluster` (None: a node without a coordinator, every Cluster call
    /// answers FAILED_PRECONDITION). In coordinator mode, replication health is SERVING only
    /// while `readiness` agrees (see `health`).
    pub(crate) async fn start(
        node: Arc<Node>,
        listener: TcpListener,
        cluster: Option<Arc<dyn ClusterApi>>,
        readiness: Option<CoordinatorReadiness>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let cfg = node.config().grpc.clone();
        let max_request = cfg.max_request_size.0 as usize;
        let cancel = CancellationToken::new();
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let health =
            health::Health::start(Arc::clone(&node), reporter, readiness, cancel.child_token())
                .await;
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
            cancel.child_token(),
        ))
        .max_decoding_message_size(max_request);
        let builder = server_builder(&cfg)?;
        let timeouts = conn::Timeouts { handshake: cfg.handshake_timeout, idle: cfg.idle_timeout };
        let (incoming, track) = conn::Incoming::new(
            listener,
            connection_limit(node.config()),
            timeouts,
            node.metrics().grpc_connections(),
        );
        let metadata = pb::metadata_server::MetadataServer::new(metadata::MetadataService::new(
            Arc::clone(&node),
        ))
        .max_decoding_message_size(max_request);
        let cluster = pb::cluster_server::ClusterServer::new(cluster::ClusterService::new(
            cluster,
            Some(Arc::clone(&node)),
            cancel.child_token(),
        ))
        .max_decoding_message_size(max_request);
        let router = builder
            .max_concurrent_streams(cfg.max_concurrent_streams)
            .http2_keepalive_interval(Some(cfg.keepalive_interval))
            .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
            .layer(track.clone())
            .layer(LogRefusalsLayer)
            .layer(AuthLayer::new(&cfg.token, cfg.token_for_reads))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(replication)
            .add_service(messages)
            .add_service(metadata)
            .add_service(cluster);
        let stop = cancel.clone();
        let ended = CancellationToken::new();
        let end = ended.clone();
        let task = tokio::spawn(async move {
            let _ended = end.drop_guard();
            router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await
        });
        tracing::info!(grpc_listen = %addr, "control plane listening");
        Ok(Self { addr, health, cancel, ended, task, connections: track })
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

    /// Stops serving: open streams end, the listener closes. Calls get [`STOP_DRAIN`] to end
    /// by themselves (a PutStream answers what it began); past it every connection is closed,
    /// so a client that stopped reading its answers cannot hold the stop.
    pub(crate) async fn stop(mut self) {
        self.health.set_not_serving().await;
        self.cancel.cancel();
        self.connections.close_unused();
        let ended = match tokio::time::timeout(STOP_DRAIN, &mut self.task).await {
            Ok(ended) => ended,
            Err(_) => {
                tracing::warn!(
                    waited = ?STOP_DRAIN,
                    "gRPC calls still open at the stop (a client not reading its answers?): \
                     closing their connections"
                );
                self.connections.close_all();
                match tokio::time::timeout(STOP_DRAIN, &mut self.task).await {
                    Ok(ended) => ended,
                    Err(_) => {
                        tracing::warn!(
                            "the gRPC server did not end after its connections were closed \
                             for reading and writing: no longer waited for; such a connection \
                             ends with its client or HTTP/2 keepalive"
                        );
                        self.task.abort();
                        return;
                    }
                }
            }
        };
        match ended {
            Ok(Err(e)) => tracing::warn!(error = %e, "control plane stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "control plane task failed"),
            Ok(Ok(())) => {}
        }
    }
}
