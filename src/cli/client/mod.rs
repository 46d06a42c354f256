//! The client subcommands (`status`, `mode`, `put`, `read`, `health`): thin clients of the
//! gRPC control plane. This module holds what they share: the connection flags (`--grpc` /
//! `HASYNC_GRPC`, `--token` / `HASYNC_TOKEN`, timeouts, TLS with `--ca-cert` /
//! `HASYNC_CA_CERT` for `https://` addresses), the bearer-token interceptor, one
//! deadline per call, and the mapping of every failure to one line and a documented exit code
//! ([`EXIT_CODES`]) that scripts can rely on.
//!
//! Nothing here holds node state: each command connects, calls, prints and exits.

mod failure;
pub mod format;
pub mod health;
pub mod metadata;
pub mod mode;
pub mod put;
pub mod read;
pub mod role;
pub mod status;
mod status_json;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tonic::codegen::InterceptedService;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

pub use self::failure::{EXIT_CODES, Failure, FailureKind, code_name, kind_of};
use crate::control::pb::messages_client::MessagesClient;
use crate::control::pb::replication_client::ReplicationClient;

/// Largest Read response accepted: a 16 MiB read (the node's cap) plus one record of the
/// largest message size and framing.
const READ_RESPONSE_MAX: usize = 64 << 20;

/// The gRPC address used when neither `--grpc` nor `HASYNC_GRPC` is given.
pub const DEFAULT_GRPC: &str = "127.0.0.1:10920";

/// The flags every client subcommand takes: where the node is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The node's gRPC address: host:port or http://host:port.
    #[arg(long = "grpc", env = "HASYNC_GRPC", value_name = "ADDR", default_value = DEFAULT_GRPC)]
    pub grpc: String,
    /// Bearer token for nodes with grpc.token set (sent as `authorization: Bearer TOKEN`).
    #[arg(long, env = "HASYNC_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long connecting may take.
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = crate::config::units::parse_duration)]
    pub connect_timeout: Duration,
    /// How long one call may take (a SYNC put waits up to replication.slave-timeout).
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::config::units::parse_duration)]
    pub timeout: Duration,
    /// PEM certificate of the node (or of its CA) to verify a TLS node (--grpc https://...).
    #[arg(long, env = "HASYNC_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Name to verify in the node's TLS certificate; default: the host of --grpc.
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

impl Connection {
    /// Flags for `addr` with no token and the default timeouts.
    pub fn to(addr: impl Into<String>) -> Self {
        Self {
            grpc: addr.into(),
            token: None,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            ca_cert: None,
            tls_domain: None,
        }
    }
}

/// The URL of an address given as `host:port`, `http://host:port` or `https://host:port`.
pub fn grpc_url(addr: &str) -> Result<String, Failure> {
    let addr = addr.trim();
    let usage = |why: &str| Failure::new(FailureKind::Usage, format!("--grpc {addr:?}: {why}"));
    let (scheme, rest) = match addr.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
        Some(_) => return Err(usage("expected host:port, http://host:port or https://host:port")),
        None => ("http", addr),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains('/') {
        return Err(usage("expected host:port, http://host:port or https://host:port"));
    }
    let url = format!("{scheme}://{rest}");
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| usage("not a valid address"))?;
    if uri.port_u16().is_none() {
        return Err(usage("the port is missing (the default gRPC port is 10920)"));
    }
    Ok(url)
}

/// The TLS settings for an `https://` URL: the CA certificate to trust and the name to verify.
fn tls_config(url: &str, conn: &Connection) -> Result<ClientTlsConfig, Failure> {
    let usage = |why: String| Failure::new(FailureKind::Usage, why);
    let Some(ca) = &conn.ca_cert else {
        return Err(usage(format!(
            "--grpc {url}: TLS needs --ca-cert FILE (or HASYNC_CA_CERT): the PEM certificate of \
             the node or of the CA that signed it"
        )));
    };
    let pem = std::fs::read(ca)
        .map_err(|e| usage(format!("--ca-cert {}: cannot read: {e}", ca.display())))?;
    let uri: tonic::codegen::http::Uri =
        url.parse().map_err(|_| usage(format!("--grpc {url}: not a valid address")))?;
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let domain = conn.tls_domain.clone().unwrap_or_else(|| host.to_owned());
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(domain))
}

/// Adds `authorization: Bearer <token>` to every call when a token is given.
#[derive(Debug, Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// The channel type of every client.
pub type AuthChannel = InterceptedService<Channel, BearerToken>;

/// A connected client of one node.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    token: BearerToken,
    url: String,
    timeout: Duration,
}

impl Client {
    /// Connects (eagerly, so an unreachable node fails here with exit code 3).
    pub async fn connect(conn: &Connection) -> Result<Self, Failure> {
        let url = grpc_url(&conn.grpc)?;
        let token = match conn.token.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                Failure::new(FailureKind::Usage, "the token must be printable ASCII")
            })?),
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| Failure::new(FailureKind::Usage, format!("--grpc {url}: {e}")))?
            .connect_timeout(conn.connect_timeout)
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            endpoint = endpoint.tls_config(tls_config(&url, conn)?).map_err(|e| {
                Failure::new(FailureKind::Usage, format!("TLS settings: {}", error_chain(&e)))
            })?;
        }
        let unreachable = |why: String| {
            Failure::new(FailureKind::Unreachable, format!("cannot connect to {url}: {why}"))
        };
        let channel = match tokio::time::timeout(conn.connect_timeout, endpoint.connect()).await {
            Err(_) => {
                return Err(unreachable(format!("no answer within {:?}", conn.connect_timeout)));
            }
            Ok(Err(e)) => return Err(unreachable(error_chain(&e))),
            Ok(Ok(c)) => c,
        };
        Ok(Self { channel, token: BearerToken(token), url, timeout: conn.timeout })
    }

    /// The node's URL (`http://host:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether a token is sent.
    pub fn has_token(&self) -> bool {
        self.token.0.is_some()
    }

    /// A `hasync.v1.Replication` client.
    pub fn replication(&self) -> ReplicationClient<AuthChannel> {
        ReplicationClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    /// A `hasync.v1.Messages` client.
    pub fn messages(&self) -> MessagesClient<AuthChannel> {
        MessagesClient::with_interceptor(self.channel.clone(), self.token.clone())
            .max_decoding_message_size(READ_RESPONSE_MAX)
    }

    /// A `hasync.v1.Metadata` client.
    pub fn metadata(&self) -> crate::control::pb::metadata_client::MetadataClient<AuthChannel> {
        crate::control::pb::metadata_client::MetadataClient::with_interceptor(
            self.channel.clone(),
            self.token.clone(),
        )
        .max_decoding_message_size(READ_RESPONSE_MAX)
    }

    /// A `grpc.health.v1.Health` client.
    pub fn health(&self) -> tonic_health::pb::health_client::HealthClient<AuthChannel> {
        tonic_health::pb::health_client::HealthClient::with_interceptor(
            self.channel.clone(),
            self.token.clone(),
        )
    }

    /// Runs one unary call named `what` under `--timeout`, mapping its failure.
    pub async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(Failure::new(
                FailureKind::Unreachable,
                format!("{what} on {}: no answer within {:?} (--timeout)", self.url, self.timeout),
            )),
            Ok(Err(status)) => Err(self.failure(what, &status)),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }

    /// The failure for a gRPC status answered to `what`: kind, code name and message.
    pub fn failure(&self, what: &str, status: &Status) -> Failure {
        let kind = kind_of(status.code());
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
            format!("{what} on {}: {}: {message}{hint}", self.url, code_name(status.code())),
        )
    }
}

/// An error and its sources on one line (`a: b: c`), without repeats.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Runs a client command on a small single-threaded runtime.
pub fn block_on<F: Future<Output = Result<(), Failure>>>(f: F) -> Result<(), Failure> {
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
