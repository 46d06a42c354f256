//! The client subcommands (`status`, `mode`, `put`, `read`, `health`, `cluster` ...): thin
//! clients of the gRPC control plane. This module holds what they share: the connection flags
//! (`--grpc` / `HASYNC_GRPC`, `--token` / `HASYNC_TOKEN`, timeouts, TLS with `--ca-cert` /
//! `HASYNC_CA_CERT` for `https://` addresses), the bearer-token interceptor, one deadline per
//! call, and the mapping of every failure to one line and a documented exit code
//! ([`EXIT_CODES`]) that scripts can rely on.
//!
//! A write refused by a non-master that names its master's gRPC address (`hasync-master-grpc`)
//! is followed there once, with the same flags ([`Client::call_on_master`]).
//!
//! Nothing here holds node state: each command connects, calls, prints and exits.

pub(crate) mod cluster;
mod cluster_remove;
pub(crate) mod cluster_view;
mod failure;
pub mod format;
pub(crate) mod health;
pub(crate) mod metadata;
pub(crate) mod mode;
pub mod put;
pub(crate) mod read;
pub(crate) mod role;
pub(crate) mod status;
mod status_json;
mod tail;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tonic::{Response, Status};

pub use self::failure::EXIT_CODES;
pub(crate) use self::failure::{Failure, FailureKind, code_name, kind_of};
pub(crate) use crate::control::client::AuthChannel;
use crate::control::client::{ClientError, ClientOptions, GrpcClient};
use crate::control::pb::messages_client::MessagesClient;
use crate::control::pb::replication_client::ReplicationClient;

/// The gRPC address used when neither `--grpc` nor `HASYNC_GRPC` is given.
pub(crate) const DEFAULT_GRPC: &str = "127.0.0.1:10920";

/// The flags every client subcommand takes: where the node is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The node's gRPC address: host:port or http://host:port.
    #[arg(long = "grpc", env = "HASYNC_GRPC", value_name = "ADDR", default_value = DEFAULT_GRPC)]
    pub(crate) grpc: String,
    /// Bearer token for nodes with grpc.token set (sent as `authorization: Bearer TOKEN`).
    #[arg(long, env = "HASYNC_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// How long connecting may take.
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = crate::config::units::parse_duration)]
    pub(crate) connect_timeout: Duration,
    /// How long one call may take (a SYNC put waits up to replication.slave-timeout).
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::config::units::parse_duration)]
    pub(crate) timeout: Duration,
    /// PEM certificate of the node (or of its CA) to verify a TLS node (--grpc https://...).
    #[arg(long, env = "HASYNC_CA_CERT", value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Name to verify in the node's TLS certificate; default: the host of --grpc.
    #[arg(long, value_name = "NAME")]
    pub(crate) tls_domain: Option<String>,
}

impl Connection {
    /// Flags for `addr` with no token and the default timeouts.
    pub(crate) fn to(addr: impl Into<String>) -> Self {
        Self {
            grpc: addr.into(),
            token: None,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            ca_cert: None,
            tls_domain: None,
        }
    }

    /// The shared client builder's options. The CLI bounds each call itself (`--timeout`), and
    /// only an `https://` address turns TLS on (`--ca-cert` alone does not).
    fn options(&self) -> ClientOptions {
        ClientOptions {
            address: self.grpc.clone(),
            token: self.token.clone().unwrap_or_default(),
            connect_timeout: self.connect_timeout,
            request_timeout: None,
            ca_file: self.ca_cert.clone(),
            tls_domain: self.tls_domain.clone(),
        }
    }
}

/// The URL of an address given as `host:port`, `http://host:port` or `https://host:port`.
pub(crate) fn grpc_url(addr: &str) -> Result<String, Failure> {
    crate::control::client::grpc_url(addr, false).map_err(|e| failure_of(&e))
}

/// The CLI's words and exit code for a client that could not be built or connected.
fn failure_of(e: &ClientError) -> Failure {
    let usage = |m: String| Failure::new(FailureKind::Usage, m);
    match e {
        ClientError::BadAddress { .. } => usage(format!("--grpc {e}")),
        ClientError::NoCaFile { url } => usage(format!(
            "--grpc {url}: TLS needs --ca-cert FILE (or HASYNC_CA_CERT): the PEM certificate of \
             the node or of the CA that signed it"
        )),
        ClientError::CaFile { path, source } => {
            usage(format!("--ca-cert {}: cannot read: {source}", path.display()))
        }
        ClientError::Unreachable { .. } => Failure::new(FailureKind::Unreachable, e.to_string()),
        _ => usage(e.to_string()),
    }
}

/// A connected client of one node.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    inner: GrpcClient,
    timeout: Duration,
    /// The flags it was made with (a followed master is reached with the same ones).
    conn: Connection,
    /// Whether a refusal was followed to the master already (only once per command).
    followed: bool,
}

impl Client {
    /// Connects (eagerly, so an unreachable node fails here with exit code 3).
    pub(crate) async fn connect(conn: &Connection) -> Result<Self, Failure> {
        let mut opts = conn.options();
        // Only the scheme picks TLS on the command line: keep `host:port` plaintext.
        opts.address = grpc_url(&conn.grpc)?;
        let inner = GrpcClient::connect(&opts).await.map_err(|e| failure_of(&e))?;
        Ok(Self { inner, timeout: conn.timeout, conn: conn.clone(), followed: false })
    }

    /// Runs the write `what` (a put, a metadata write) where it can land: when this node
    /// refuses it as a non-master naming its master's gRPC address, and `follow` is set and no
    /// refusal was followed yet, prints that it follows, connects to that master with the same
    /// flags (a bare `host:port` keeps `https` when this node was reached over TLS), becomes
    /// that client and runs the call once more there.
    pub(crate) async fn call_on_master<T, F, Fut>(
        &mut self,
        what: &str,
        follow: bool,
        mut call: F,
    ) -> Result<T, Failure>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let status = match tokio::time::timeout(self.timeout, call(self.clone())).await {
            Ok(Ok(r)) => return Ok(r.into_inner()),
            Ok(Err(status)) => status,
            Err(_) => return Err(self.no_answer(what)),
        };
        let master = crate::control::master_grpc_of(&status).filter(|_| follow && !self.followed);
        let Some(master) = master else { return Err(self.failure(what, &status)) };
        let mut conn = self.conn.clone();
        let tls = self.url().starts_with("https://");
        conn.grpc =
            if tls && !master.contains("://") { format!("https://{master}") } else { master };
        let next = Client::connect(&conn).await?;
        println!(
            "{} is not the master ({what} refused): following its master at {}",
            self.url(),
            next.url()
        );
        *self = Client { followed: true, ..next };
        self.call(what, call(self.clone())).await
    }

    /// How long one call may take (`--timeout`).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The node's URL (`http://host:port`).
    pub(crate) fn url(&self) -> &str {
        self.inner.url()
    }

    /// Whether a token is sent.
    pub(crate) fn has_token(&self) -> bool {
        self.inner.has_token()
    }

    /// A `hasync.v1.Replication` client.
    pub(crate) fn replication(&self) -> ReplicationClient<AuthChannel> {
        self.inner.replication()
    }

    /// A `hasync.v1.Messages` client.
    pub(crate) fn messages(&self) -> MessagesClient<AuthChannel> {
        self.inner.messages()
    }

    /// A `hasync.v1.Metadata` client.
    pub(crate) fn metadata(
        &self,
    ) -> crate::control::pb::metadata_client::MetadataClient<AuthChannel> {
        self.inner.metadata()
    }

    /// A `grpc.health.v1.Health` client.
    pub(crate) fn health(&self) -> tonic_health::pb::health_client::HealthClient<AuthChannel> {
        self.inner.health()
    }

    /// Runs one unary call named `what` under `--timeout`, mapping its failure.
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(self.no_answer(what)),
            Ok(Err(status)) => Err(self.failure(what, &status)),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }

    /// The failure of `what` that got no answer within `--timeout`.
    pub(crate) fn no_answer(&self, what: &str) -> Failure {
        Failure::new(
            FailureKind::Unreachable,
            format!("{what} on {}: no answer within {:?} (--timeout)", self.url(), self.timeout),
        )
    }

    /// A `hasync.v1.Cluster` client.
    pub(crate) fn cluster(&self) -> crate::control::pb::cluster_client::ClusterClient<AuthChannel> {
        self.inner.cluster()
    }

    /// The failure for a gRPC status answered to `what`: kind, code name and message.
    pub(crate) fn failure(&self, what: &str, status: &Status) -> Failure {
        let kind = if crate::control::client::connection_failed(status) {
            FailureKind::Unreachable
        } else {
            kind_of(status.code())
        };
        let hint = match (kind, self.has_token()) {
            (FailureKind::Unauthenticated, false) => " (give --token or set HASYNC_TOKEN)",
            (FailureKind::Unauthenticated, true) => " (the token given was refused)",
            _ => "",
        };
        let message = if status.message().is_empty() {
            status.code().description().to_owned()
        } else {
            status.message().to_owned()
        };
        Failure::new(
            kind,
            format!("{what} on {}: {}: {message}{hint}", self.url(), code_name(status.code())),
        )
    }
}

/// Runs a client command on a small single-threaded runtime.
/// Follows the server stream of `what` until Ctrl-C (success), printing each message with
/// `print`; a stream the node ends or fails is a failure. `print` failing (a closed stdout,
/// `| head`) ends it quietly.
pub(crate) async fn follow<T>(
    client: &Client,
    what: &str,
    mut stream: tonic::Streaming<T>,
    mut print: impl FnMut(T) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        let item = tokio::select! {
            _ = &mut stop => return Ok(()),
            item = stream.message() => item,
        };
        let msg = match item {
            Ok(None) => {
                return Err(Failure::new(
                    FailureKind::Unreachable,
                    format!("{what} on {}: the node ended the stream (stopping?)", client.url()),
                ));
            }
            Err(e) => return Err(client.failure(what, &e)),
            Ok(Some(m)) => m,
        };
        if print(msg).is_err() {
            return Ok(());
        }
    }
}

pub(crate) fn block_on<F: Future<Output = Result<(), Failure>>>(f: F) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(FailureKind::Other, format!("cannot start a runtime: {e}")))?;
    runtime.block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_both_forms() {
        assert_eq!(grpc_url("127.0.0.1:10920").unwrap(), "http://127.0.0.1:10920");
        assert_eq!(grpc_url("http://node-1:7/").unwrap(), "http://node-1:7");
        assert_eq!(grpc_url("[::1]:10920").unwrap(), "http://[::1]:10920");
        assert_eq!(grpc_url("https://node-1:7").unwrap(), "https://node-1:7");
        for bad in ["", "node-1", "ftp://a:1", "http://a:1/x", "a:b"] {
            let e = grpc_url(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
        }
    }
}
