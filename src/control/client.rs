//! The one gRPC client builder: every client of a node's API (the CLI, a slave's epoch check,
//! a slave's metadata pull) connects through [`GrpcClient::connect`], so all of them take the
//! same address forms, send the bearer token the same way, bound connecting and calls, and
//! talk TLS with a CA certificate when the address is `https://`.

use std::path::PathBuf;
use std::time::Duration;

use super::coalesce::Lookahead;
use tonic::codegen::InterceptedService;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::control::pb::cluster_client::ClusterClient;
use crate::control::pb::messages_client::MessagesClient;
use crate::control::pb::metadata_client::MetadataClient;
use crate::control::pb::replication_client::ReplicationClient;

/// Largest response accepted: a 16 MiB read (the node's cap) plus one record of the largest
/// message size and framing; also bounds one metadata chunk.
pub(crate) const RESPONSE_MAX: usize = 64 << 20;

/// How to reach a node's gRPC API.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `host:port`, `http://host:port` or `https://host:port`.
    pub address: String,
    /// Bearer token sent with every call (`authorization: Bearer TOKEN`); empty: none.
    pub token: String,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long one call may take (None: the caller bounds its calls itself).
    pub request_timeout: Option<Duration>,
    /// PEM certificate of the node or of its CA. Set, it makes a scheme-less address TLS.
    pub ca_file: Option<PathBuf>,
    /// Name to verify in the node's certificate; default: the host of the address.
    pub tls_domain: Option<String>,
}

impl ClientOptions {
    /// Options for `address` with no token, no TLS, a 5 s connect bound and no call bound.
    pub fn to(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            token: String::new(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            ca_file: None,
            tls_domain: None,
        }
    }
}

/// Why a client could not be built or connected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The address is not `host:port`, `http://host:port` or `https://host:port`.
    #[error("{address:?}: {reason}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `https://` address without a CA certificate to verify the node with.
    #[error("{url}: TLS needs the PEM certificate of the node or of the CA that signed it")]
    NoCaFile {
        /// The URL.
        url: String,
    },
    /// The CA certificate file cannot be read.
    #[error("cannot read the CA certificate {}: {source}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS settings were refused.
    #[error("TLS settings for {url}: {reason}")]
    Tls {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The token is not printable ASCII.
    #[error("the token must be printable ASCII")]
    BadToken,
    /// No connection could be made in time.
    #[error("cannot connect to {url}: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why (the transport error chain, or the time-out).
        reason: String,
    },
}

/// The URL of an address given as `host:port`, `http://host:port` or `https://host:port`;
/// a scheme-less address is `https` when `tls` is asked for.
pub(crate) fn grpc_url(address: &str, tls: bool) -> Result<String, ClientError> {
    let addr = address.trim();
    let bad = |reason| ClientError::BadAddress { address: addr.to_owned(), reason };
    const FORMS: &str = "expected host:port, http://host:port or https://host:port";
    let (scheme, rest) = match addr.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
        Some(_) => return Err(bad(FORMS)),
        None if tls => ("https", addr),
        None => ("http", addr),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains('/') {
        return Err(bad(FORMS));
    }
    let url = format!("{scheme}://{rest}");
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| bad("not a valid address"))?;
    if uri.port_u16().is_none() {
        return Err(bad("the port is missing (the default gRPC port is 10920)"));
    }
    Ok(url)
}

/// The TLS settings for an `https://` URL: the CA certificate to trust and the name to verify.
fn tls_config(url: &str, opts: &ClientOptions) -> Result<ClientTlsConfig, ClientError> {
    let Some(ca) = &opts.ca_file else {
        return Err(ClientError::NoCaFile { url: url.to_owned() });
    };
    let pem =
        std::fs::read(ca).map_err(|source| ClientError::CaFile { path: ca.clone(), source })?;
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| ClientError::BadAddress {
        address: url.to_owned(),
        reason: "not a valid address",
    })?;
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let domain = opts.tls_domain.clone().unwrap_or_else(|| host.to_owned());
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(domain))
}

/// Adds `authorization: Bearer <token>` to every call when a token is given.
#[derive(Debug, Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl BearerToken {
    /// The interceptor for `token` (empty: none).
    pub fn new(token: &str) -> Result<Self, ClientError> {
        match token.trim() {
            "" => Ok(Self(None)),
            t => format!("Bearer {t}")
                .parse()
                .map(|v| Self(Some(v)))
                .map_err(|_| ClientError::BadToken),
        }
    }

    /// Whether a token is sent.
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// The channel type of every client.
pub type AuthChannel = InterceptedService<Lookahead<Channel>, BearerToken>;

/// A connected client of one node.
#[derive(Debug, Clone)]
pub struct GrpcClient {
    channel: Lookahead<Channel>,
    token: BearerToken,
    url: String,
}

impl GrpcClient {
    /// Connects eagerly, so an unreachable node fails here.
    pub async fn connect(opts: &ClientOptions) -> Result<Self, ClientError> {
        let url = grpc_url(&opts.address, opts.ca_file.is_some())?;
        let token = BearerToken::new(&opts.token)?;
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|_| ClientError::BadAddress {
                address: opts.address.clone(),
                reason: "not a valid address",
            })?
            .connect_timeout(opts.connect_timeout)
            .tcp_nodelay(true);
        if let Some(t) = opts.request_timeout {
            endpoint = endpoint.timeout(t);
        }
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls_config(&url, opts)?)
                .map_err(|e| ClientError::Tls { url: url.clone(), reason: error_chain(&e) })?;
        }
        let unreachable = |reason| ClientError::Unreachable { url: url.clone(), reason };
        let connecting = super::coalesce::connect(&endpoint);
        let channel = match tokio::time::timeout(opts.connect_timeout, connecting).await {
            Err(_) => {
                return Err(unreachable(format!("no answer within {:?}", opts.connect_timeout)));
            }
            Ok(Err(e)) => return Err(unreachable(error_chain(&e))),
            Ok(Ok(c)) => c,
        };
        Ok(Self { channel, token, url })
    }

    /// The node's URL (`http://host:port` or `https://host:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether a token is sent.
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_set()
    }

    /// A `hasync.v1.Replication` client.
    pub fn replication(&self) -> ReplicationClient<AuthChannel> {
        ReplicationClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    /// A `hasync.v1.Messages` client.
    pub fn messages(&self) -> MessagesClient<AuthChannel> {
        MessagesClient::with_interceptor(self.channel.clone(), self.token.clone())
            .max_decoding_message_size(RESPONSE_MAX)
    }

    /// A `hasync.v1.Metadata` client.
    pub fn metadata(&self) -> MetadataClient<AuthChannel> {
        MetadataClient::with_interceptor(self.channel.clone(), self.token.clone())
            .max_decoding_message_size(RESPONSE_MAX)
    }

    /// A `hasync.v1.Cluster` client.
    pub fn cluster(&self) -> ClusterClient<AuthChannel> {
        ClusterClient::with_interceptor(self.channel.clone(), self.token.clone())
            .max_decoding_message_size(RESPONSE_MAX)
    }

    /// A `grpc.health.v1.Health` client.
    pub fn health(&self) -> tonic_health::pb::health_client::HealthClient<AuthChannel> {
        tonic_health::pb::health_client::HealthClient::with_interceptor(
            self.channel.clone(),
            self.token.clone(),
        )
    }
}

/// Whether a call's status was made on this side from a failure of the connection (the
/// transport, hyper, HTTP/2 or the socket), not answered by the node. A node's own statuses
/// (its refusals, and its INTERNAL or UNKNOWN) come as grpc-status and carry no such source;
/// a plaintext call to a TLS port fails either way, as UNKNOWN "transport error" when the
/// connection breaks or as INTERNAL "h2 protocol error" when the port's TLS alert is read as
/// HTTP/2 frames, depending on timing. A stream the node reset (RST_STREAM) is the node's
/// answer, not a broken connection: its code, which tonic takes from the reset's reason
/// (ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED, REFUSED_STREAM: UNAVAILABLE), says what it is.
pub(crate) fn connection_failed(status: &tonic::Status) -> bool {
    let chain = || std::iter::successors(std::error::Error::source(status), |e| e.source());
    let reset_by_node = chain()
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .any(|e| e.is_reset() && e.is_remote());
    !reset_by_node
        && chain().any(|e| {
            e.is::<h2::Error>()
                || e.is::<hyper::Error>()
                || e.is::<tonic::transport::Error>()
                || e.is::<std::io::Error>()
        })
}

/// An error and its sources on one line (`a: b: c`), without repeats.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_the_node_resets_is_its_answer_not_a_broken_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A server that resets every stream, as h2's flood guard does (ENHANCE_YOUR_CALM).
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(socket).await.unwrap();
            while let Some(Ok((_request, mut respond))) = conn.accept().await {
                respond.send_reset(h2::Reason::ENHANCE_YOUR_CALM);
            }
        });
        let call = async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            tonic_health::pb::health_client::HealthClient::new(channel)
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
        server.abort();
        let status = answer.expect("the call ended within 10 s").unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(!connection_failed(&status), "a reset stream taken for a broken connection");
    }

    #[test]
    fn a_status_from_a_broken_connection_is_told_from_a_nodes_answer() {
        // As tonic makes a broken connection's status: UNKNOWN, its source the error.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let broken = tonic::Status::from_error(Box::new(io));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(connection_failed(&broken), "{broken:?}");
        let mut h2 = tonic::Status::internal("h2 protocol error");
        h2.set_source(std::sync::Arc::new(h2::Error::from(h2::Reason::PROTOCOL_ERROR)));
        assert!(connection_failed(&h2), "{h2:?}");
        // A node's own answers carry no source, whatever their code.
        for answer in [
            tonic::Status::unknown("the node's own UNKNOWN"),
            tonic::Status::internal("the node's own INTERNAL"),
            tonic::Status::failed_precondition("a slave takes no put"),
        ] {
            assert!(!connection_failed(&answer), "{answer:?}");
        }
    }

    #[test]
    fn addresses_take_every_form_and_a_ca_file_makes_tls() {
        assert_eq!(grpc_url("127.0.0.1:10920", false).unwrap(), "http://127.0.0.1:10920");
        assert_eq!(grpc_url("127.0.0.1:10920", true).unwrap(), "https://127.0.0.1:10920");
        assert_eq!(grpc_url("http://node-1:7/", true).unwrap(), "http://node-1:7");
        assert_eq!(grpc_url("[::1]:10920", false).unwrap(), "http://[::1]:10920");
        assert_eq!(grpc_url("https://node-1:7", false).unwrap(), "https://node-1:7");
        for bad in ["", "node-1", "ftp://a:1", "http://a:1/x", "a:b"] {
            assert!(matches!(grpc_url(bad, false), Err(ClientError::BadAddress { .. })), "{bad}");
        }
    }

    #[test]
    fn a_token_that_is_not_ascii_is_refused() {
        assert!(!BearerToken::new("  ").unwrap().is_set());
        assert!(BearerToken::new("s3cret").unwrap().is_set());
        assert!(matches!(BearerToken::new("to\u{1}ken"), Err(ClientError::BadToken)));
    }

    #[tokio::test]
    async fn https_without_a_ca_file_names_what_is_missing() {
        let e = GrpcClient::connect(&ClientOptions::to("https://127.0.0.1:1")).await.unwrap_err();
        assert!(matches!(e, ClientError::NoCaFile { .. }), "{e}");
    }
}
