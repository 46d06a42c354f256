//! The etcd v3 backend of [`Coordinator`], over tonic, with a client generated from the
//! subset of etcd's public API in `proto/etcd/` (clients only; see build.rs).
//!
//! - Endpoints: `host:port`, `http://host:port` or `https://host:port`, tried in turn from the
//!   last one that answered. A call goes to the next endpoint when one cannot serve
//!   (unreachable, no answer within the timeout, no leader); a write (a transaction with a put
//!   or a delete, a lease grant) goes on only when it surely was not applied (the connection
//!   failed, or the member refused before proposing), else it fails with
//!   [`Error::Unavailable`] saying the outcome is unknown.
//! - Every attempt is bounded by [`EtcdOptions::timeout`], so a call fails within
//!   endpoints × timeout; a watch's set-up is bounded, not the stream.
//! - TLS with a CA file, and a client certificate and key for client-cert auth.
//! - A user and password: `Auth.Authenticate` once, its token in the `token` metadata of every
//!   call, authenticating again (once per call) when etcd says the token is invalid.
//! - Reads are linearizable (`serializable = false`); watches require a leader (etcd's
//!   `hasleader` option): a member cut off from its cluster's leader ends them rather than
//!   keeping them open and silent.
//! - A keep-alive is one request and its answer on a `LeaseKeepAlive` stream of its own (an
//!   HTTP/2 stream on the endpoint's connection), so concurrent keep-alives cannot take each
//!   other's answers.

mod watch;
mod wire;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use self::pb::etcdserverpb as rpc;
use self::wire::{Failure, Subject};
use super::{
    Coordinator, Error, KeyValue, Lease, LeaseId, Revision, Txn, TxnResponse, WatchStream,
};
use crate::control::pem::{self, PemKind};

/// Code generated from `proto/etcd/` (etcd's public v3 API, the subset hasync speaks) by
/// build.rs; public so tests and tools can administer an etcd (users, roles) with it.
pub mod pb {
    /// etcd's `etcdserverpb` package: the KV, Watch, Lease and Auth services.
    pub mod etcdserverpb {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("etcdserverpb");
    }
    /// etcd's `mvccpb` package: keys and events.
    pub mod mvccpb {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("mvccpb");
    }
    /// etcd's `authpb` package: permissions.
    pub mod authpb {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("authpb");
    }
}

/// The most bytes one answer of etcd may take (a large prefix read).
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// How often an idle-but-streaming connection is pinged (etcd refuses pings more often than
/// every 5 s by default: `--grpc-keepalive-min-time`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How to reach etcd. Its `Debug` leaves the password out.
#[derive(Clone)]
pub struct EtcdOptions {
    /// `host:port`, `http://host:port` or `https://host:port` (a scheme-less endpoint is
    /// `https` when [`EtcdOptions::tls`] is set).
    pub endpoints: Vec<String>,
    /// The bound of each attempt of a call (and of connecting).
    pub timeout: Duration,
    /// TLS; None: plaintext.
    pub tls: Option<EtcdTls>,
    /// A user and password for etcd's auth; None: no auth.
    pub user: Option<(String, String)>,
}

/// The TLS files of [`EtcdOptions`].
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificates (PEM).
    pub ca_file: PathBuf,
    /// A client certificate (PEM), for etcd's `--client-cert-auth`; with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
}

/// An etcd v3 cluster as a [`Coordinator`]. Clones share the connections.
#[derive(Debug, Clone)]
pub struct EtcdCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    members: Vec<Member>,
    /// The endpoint that answered last: calls start there.
    current: AtomicUsize,
    timeout: Duration,
    user: Option<(String, String)>,
    token: Mutex<Option<MetadataValue<Ascii>>>,
    /// One authentication at a time.
    authenticating: tokio::sync::Mutex<()>,
    /// The endpoints, for errors.
    endpoints: String,
}

/// The user name of a `user` option, for `Debug` (never the password).
fn user_name(user: &Option<(String, String)>) -> Option<&str> {
    user.as_ref().map(|(name, _)| name.as_str())
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .field("user", &user_name(&self.user))
            .finish()
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .field("user", &user_name(&self.user))
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Member {
    url: String,
    channel: Channel,
}

/// Whether a call may go to the next endpoint after an ambiguous failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A read, a keep-alive, a revoke: sending it twice is harmless.
    Idempotent,
    /// A write: sent again only when it surely was not applied.
    Write,
}

impl EtcdCoordinator {
    /// Checks the options, then asks etcd about lease 0 (a call every user may make,
    /// authenticating first when a user is set), so a wrong endpoint, certificate or password
    /// fails here.
    pub async fn connect(opts: EtcdOptions) -> Result<Self, Error> {
        let c = Self::connect_lazy(opts)?;
        c.ping().await?;
        Ok(c)
    }

    /// Checks the options and builds the connections without connecting: the first call
    /// connects (and authenticates). Needs a tokio runtime.
    pub fn connect_lazy(opts: EtcdOptions) -> Result<Self, Error> {
        if opts.endpoints.is_empty() {
            return Err(Error::Config("no etcd endpoint given".into()));
        }
        if opts.timeout.is_zero() {
            return Err(Error::Config("the etcd call timeout is 0".into()));
        }
        let tls = opts.tls.as_ref().map(tls_config).transpose()?;
        let mut members = Vec::with_capacity(opts.endpoints.len());
        for e in &opts.endpoints {
            let url = endpoint_url(e, tls.is_some())?;
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|err| Error::Config(format!("etcd endpoint {e}: {err}")))?
                .connect_timeout(opts.timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                .keep_alive_timeout(opts.timeout.max(Duration::from_secs(1)))
                .keep_alive_while_idle(false);
            if let Some(tls) = &tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(|err| {
                    Error::Config(format!("etcd endpoint {e}: TLS: {}", chain(&err)))
                })?;
            }
            members.push(Member { url, channel: endpoint.connect_lazy() });
        }
        if let Some((user, _)) = &opts.user
            && user.is_empty()
        {
            return Err(Error::Config("the etcd user name is empty".into()));
        }
        let endpoints = members.iter().map(|m| m.url.as_str()).collect::<Vec<_>>().join(",");
        Ok(Self {
            inner: Arc::new(Inner {
                members,
                current: AtomicUsize::new(0),
                timeout: opts.timeout,
                user: opts.user,
                token: Mutex::new(None),
                authenticating: tokio::sync::Mutex::new(()),
                endpoints,
            }),
        })
    }

    /// One round trip that needs no permission: `LeaseTimeToLive` of lease 0 (which never
    /// exists).
    async fn ping(&self) -> Result<(), Error> {
        let r = self
            .call("LeaseTimeToLive", Kind::Idempotent, Subject::default(), |ch, token| async move {
                let req = rpc::LeaseTimeToLiveRequest { id: 0, keys: false };
                lease(ch).lease_time_to_live(request(req, &token)).await
            })
            .await;
        match r {
            Ok(_) | Err(Error::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Compacts etcd's history below `revision` (a watch from below it is then
    /// [`Error::Compacted`]).
    pub async fn compact(&self, revision: Revision) -> Result<(), Error> {
        let subject = Subject { lease: 0, revision };
        self.call("Compact", Kind::Idempotent, subject, move |ch, token| async move {
            let req = rpc::CompactionRequest { revision, physical: true };
            kv(ch).compact(request(req, &token)).await
        })
        .await?;
        Ok(())
    }

    /// The endpoints as URLs, comma-separated (for errors and status).
    pub fn endpoints(&self) -> &str {
        &self.inner.endpoints
    }

    /// Runs `f` on the endpoints in turn, from the last one that answered (see the module
    /// docs for when it goes on).
    async fn call<T, F, Fut>(
        &self,
        call: &'static str,
        kind: Kind,
        subject: Subject,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Channel, Option<MetadataValue<Ascii>>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let n = self.inner.members.len();
        let start = self.inner.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        let mut authenticated_again = false;
        let mut i = 0;
        while i < n {
            let idx = (start + i) % n;
            let m = &self.inner.members[idx];
            let token = match self.token(m).await {
                Ok(t) => t,
                Err(Attempt::Endpoint(reason)) => {
                    failures.push(format!("{}: {reason}", m.url));
                    i += 1;
                    continue;
                }
                Err(Attempt::Fatal(e)) => return Err(e),
            };
            let status =
                match tokio::time::timeout(self.inner.timeout, f(m.channel.clone(), token.clone()))
                    .await
                {
                    Ok(Ok(resp)) => {
                        self.inner.current.store(idx, Ordering::Relaxed);
                        return Ok(resp.into_inner());
                    }
                    Ok(Err(status)) => status,
                    Err(_) => {
                        failures
                            .push(format!("{}: no answer within {:?}", m.url, self.inner.timeout));
                        if kind == Kind::Write {
                            // The next call starts at the next endpoint.
                            self.inner.current.store((idx + 1) % n, Ordering::Relaxed);
                            return Err(self.unavailable(call, &failures, true));
                        }
                        i += 1;
                        continue;
                    }
                };
            let mut failure = wire::failure(&status);
            // A token may lose its rights when etcd's auth store changes (and some etcd
            // versions answer a watch with a stale token "permission denied"): authenticate
            // again once before believing a refusal.
            if status.code() == tonic::Code::PermissionDenied {
                failure = Failure::Token;
            }
            match failure {
                Failure::Token if self.inner.user.is_some() && !authenticated_again => {
                    self.forget_token(token.as_ref());
                    authenticated_again = true;
                }
                Failure::Endpoint { unsent } => {
                    failures.push(format!("{}: {}", m.url, wire::describe(&status)));
                    if kind == Kind::Write && !unsent {
                        self.inner.current.store((idx + 1) % n, Ordering::Relaxed);
                        return Err(self.unavailable(call, &failures, true));
                    }
                    i += 1;
                }
                Failure::Token | Failure::Answer => {
                    return Err(wire::answer_error(call, &status, subject));
                }
            }
        }
        Err(self.unavailable(call, &failures, false))
    }

    fn unavailable(&self, call: &'static str, failures: &[String], maybe_applied: bool) -> Error {
        let mut reason = format!("{call}: {}", failures.join("; "));
        if maybe_applied {
            reason.push_str(" (the outcome is unknown: it may have been applied)");
        }
        Error::Unavailable { endpoints: self.inner.endpoints.clone(), reason }
    }

    /// The auth token to send (None without a user), authenticating through `m` when there is
    /// none yet.
    async fn token(&self, m: &Member) -> Result<Option<MetadataValue<Ascii>>, Attempt> {
        let Some((name, password)) = &self.inner.user else { return Ok(None) };
        if let Some(t) = self.cached_token() {
            return Ok(Some(t));
        }
        let _one = self.inner.authenticating.lock().await;
        if let Some(t) = self.cached_token() {
            return Ok(Some(t));
        }
        let req = rpc::AuthenticateRequest { name: name.clone(), password: password.clone() };
        let mut client = rpc::auth_client::AuthClient::new(m.channel.clone());
        let resp = match tokio::time::timeout(self.inner.timeout, client.authenticate(req)).await {
            Err(_) => {
                return Err(Attempt::Endpoint(format!(
                    "Authenticate: no answer within {:?}",
                    self.inner.timeout
                )));
            }
            Ok(Err(status)) => {
                return Err(match wire::failure(&status) {
                    Failure::Endpoint { .. } => {
                        Attempt::Endpoint(format!("Authenticate: {}", wire::describe(&status)))
                    }
                    _ => Attempt::Fatal(
                        match wire::answer_error("Authenticate", &status, Subject::default()) {
                            Error::Auth(m) => Error::Auth(format!("user {name}: {m}")),
                            other => Error::Auth(format!("user {name}: {other}")),
                        },
                    ),
                });
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        let token: MetadataValue<Ascii> = resp.token.parse().map_err(|_| {
            Attempt::Fatal(Error::Auth(format!("user {name}: etcd's token is not ASCII")))
        })?;
        *self.inner.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(Some(token))
    }

    fn cached_token(&self) -> Option<MetadataValue<Ascii>> {
        self.inner.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Drops the token etcd refused, unless another call already replaced it.
    fn forget_token(&self, refused: Option<&MetadataValue<Ascii>>) {
        let mut t = self.inner.token.lock().unwrap_or_else(|e| e.into_inner());
        if t.as_ref() == refused {
            *t = None;
        }
    }
}

/// Why one endpoint's attempt did not even start.
enum Attempt {
    /// The endpoint failed: try the next.
    Endpoint(String),
    /// A failure no other endpoint changes (the credentials).
    Fatal(Error),
}

/// A request with the auth token, when there is one.
fn request<T>(msg: T, token: &Option<MetadataValue<Ascii>>) -> Request<T> {
    let mut req = Request::new(msg);
    if let Some(t) = token {
        req.metadata_mut().insert("token", t.clone());
    }
    req
}

fn kv(ch: Channel) -> rpc::kv_client::KvClient<Channel> {
    rpc::kv_client::KvClient::new(ch).max_decoding_message_size(MAX_ANSWER_BYTES)
}

fn lease(ch: Channel) -> rpc::lease_client::LeaseClient<Channel> {
    rpc::lease_client::LeaseClient::new(ch)
}

/// The URL of an endpoint; a scheme-less one is `https` with TLS.
fn endpoint_url(endpoint: &str, tls: bool) -> Result<String, Error> {
    let e = endpoint.trim();
    let bad = |why: &str| {
        Error::Config(format!(
            "etcd endpoint {e:?}: {why} (expected host:port, http://host:port or https://host:port)"
        ))
    };
    let (scheme, rest) = match e.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some(_) => return Err(bad("unknown scheme")),
        None if tls => ("https", e),
        None => ("http", e),
    };
    match (scheme, tls) {
        ("https", false) => {
            return Err(bad("https needs the coordinator's TLS settings (a CA file)"));
        }
        ("http", true) => return Err(bad("http while TLS is configured")),
        _ => {}
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains('/') {
        return Err(bad("not host:port"));
    }
    let url = format!("{scheme}://{rest}");
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| bad("not a valid address"))?;
    if uri.port_u16().is_none() {
        return Err(bad("the port is missing (etcd's client port is usually 2379)"));
    }
    Ok(url)
}

/// The TLS settings: the CA, and the client identity when given.
fn tls_config(tls: &EtcdTls) -> Result<ClientTlsConfig, Error> {
    let pem_error = |e: pem::PemError| Error::Config(chain(&e));
    let ca = pem::read("coordinator TLS CA file", &tls.ca_file, PemKind::Certificate)
        .map_err(pem_error)?;
    let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let cert = pem::read("coordinator TLS client certificate", cert, PemKind::Certificate)
                .map_err(pem_error)?;
            let key = pem::read("coordinator TLS client key", key, PemKind::PrivateKey)
                .map_err(pem_error)?;
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        _ => {
            return Err(Error::Config(
                "a TLS client certificate needs its key file, and a key its certificate".into(),
            ));
        }
    }
    Ok(cfg)
}

/// An error and its sources in one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        source = inner.source();
    }
    s
}

/// etcd's TTLs are whole seconds, at least one.
fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

#[async_trait::async_trait]
impl Coordinator for EtcdCoordinator {
    async fn grant(&self, ttl: Duration) -> Result<Lease, Error> {
        let ttl = ttl_secs(ttl);
        let resp = self
            .call("LeaseGrant", Kind::Write, Subject::default(), move |ch, token| async move {
                lease(ch).lease_grant(request(rpc::LeaseGrantRequest { ttl, id: 0 }, &token)).await
            })
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::Refused { call: "LeaseGrant", reason: resp.error });
        }
        Ok(Lease { id: resp.id, ttl: secs(resp.ttl) })
    }

    async fn keep_alive(&self, id: LeaseId) -> Result<Duration, Error> {
        let subject = Subject { lease: id, revision: 0 };
        let resp = self
            .call("LeaseKeepAlive", Kind::Idempotent, subject, move |ch, token| async move {
                // The request stream stays open until the answer came.
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.send(rpc::LeaseKeepAliveRequest { id }).await;
                let answers =
                    lease(ch).lease_keep_alive(request(ReceiverStream::new(rx), &token)).await?;
                let (meta, mut answers, ext) = answers.into_parts();
                let answer = answers.message().await?.ok_or_else(|| {
                    Status::unavailable("the keep-alive stream ended without an answer")
                })?;
                drop(tx);
                Ok(tonic::Response::from_parts(meta, answer, ext))
            })
            .await?;
        if resp.ttl <= 0 {
            return Err(Error::LeaseNotFound(id));
        }
        Ok(secs(resp.ttl))
    }

    async fn revoke(&self, id: LeaseId) -> Result<(), Error> {
        let subject = Subject { lease: id, revision: 0 };
        let r = self
            .call("LeaseRevoke", Kind::Idempotent, subject, move |ch, token| async move {
                lease(ch).lease_revoke(request(rpc::LeaseRevokeRequest { id }, &token)).await
            })
            .await;
        match r {
            Ok(_) | Err(Error::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), Error> {
        let req = wire::range_key(key);
        let resp = self
            .call("Range", Kind::Idempotent, Subject::default(), move |ch, token| {
                let req = req.clone();
                async move { kv(ch).range(request(req, &token)).await }
            })
            .await?;
        let rev = wire::revision(resp.header.as_ref());
        Ok((wire::key_values(resp.kvs)?.into_iter().next(), rev))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), Error> {
        let req = wire::range_prefix(prefix);
        let resp = self
            .call("Range", Kind::Idempotent, Subject::default(), move |ch, token| {
                let req = req.clone();
                async move { kv(ch).range(request(req, &token)).await }
            })
            .await?;
        let rev = wire::revision(resp.header.as_ref());
        Ok((wire::key_values(resp.kvs)?, rev))
    }

    async fn get_prefix_at(
        &self,
        prefix: &str,
        revision: Revision,
    ) -> Result<Vec<KeyValue>, Error> {
        let req = rpc::RangeRequest { revision, ..wire::range_prefix(prefix) };
        let subject = Subject { lease: 0, revision };
        let resp = self
            .call("Range", Kind::Idempotent, subject, move |ch, token| {
                let req = req.clone();
                async move { kv(ch).range(request(req, &token)).await }
            })
            .await?;
        wire::key_values(resp.kvs)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let kind = if wire::txn_writes(&txn) { Kind::Write } else { Kind::Idempotent };
        let subject = Subject { lease: wire::txn_lease(&txn), revision: 0 };
        let req = wire::txn_request(&txn);
        let resp = self
            .call("Txn", kind, subject, move |ch, token| {
                let req = req.clone();
                async move { kv(ch).txn(request(req, &token)).await }
            })
            .await?;
        wire::txn_response(resp)
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error> {
        let create = watch::create_request(prefix, from);
        let opened = self
            .call("Watch", Kind::Idempotent, Subject::default(), move |ch, token| {
                let create = create.clone();
                async move { watch::open(ch, create, &token).await }
            })
            .await?;
        Ok(watch::spawn(opened, from, self.inner.endpoints.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_every_form_and_a_scheme_must_agree_with_tls() {
        assert_eq!(endpoint_url("127.0.0.1:2379", false).unwrap(), "http://127.0.0.1:2379");
        assert_eq!(endpoint_url("etcd-0:2379", true).unwrap(), "https://etcd-0:2379");
        assert_eq!(endpoint_url("http://h:1/", false).unwrap(), "http://h:1");
        for (bad, tls) in [
            ("h", false),
            ("ftp://h:1", false),
            ("https://h:1", false),
            ("http://h:1", true),
            ("h:1/x", false),
        ] {
            let e = endpoint_url(bad, tls).unwrap_err().to_string();
            assert!(e.contains("etcd endpoint"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn debug_output_never_shows_the_password() {
        let opts = EtcdOptions {
            endpoints: vec!["127.0.0.1:2379".into()],
            timeout: Duration::from_secs(1),
            tls: None,
            user: Some(("hasync".into(), "s3cret".into())),
        };
        let c = EtcdCoordinator::connect_lazy(opts.clone()).unwrap();
        for s in [format!("{opts:?}"), format!("{c:?}")] {
            assert!(s.contains("hasync") && !s.contains("s3cret"), "{s}");
        }
    }

    #[tokio::test]
    async fn options_that_cannot_work_are_refused_naming_what() {
        let opts = |endpoints: Vec<&str>| EtcdOptions {
            endpoints: endpoints.into_iter().map(String::from).collect(),
            timeout: Duration::from_secs(1),
            tls: None,
            user: None,
        };
        assert!(EtcdCoordinator::connect_lazy(opts(vec![])).is_err());
        let mut o = opts(vec!["127.0.0.1:1"]);
        o.tls = Some(EtcdTls {
            ca_file: "/nonexistent/ca.pem".into(),
            cert_file: None,
            key_file: None,
        });
        let e = EtcdCoordinator::connect_lazy(o).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_unavailable_naming_it() {
        // A port nobody listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = EtcdCoordinator::connect_lazy(EtcdOptions {
            endpoints: vec![format!("127.0.0.1:{port}")],
            timeout: Duration::from_secs(2),
            tls: None,
            user: None,
        })
        .unwrap();
        let e = c.get("/k").await.unwrap_err();
        assert!(
            matches!(&e, Error::Unavailable { endpoints, .. } if endpoints.contains(&port.to_string())),
            "{e}"
        );
        // A write whose connection failed was surely not sent: no "outcome unknown".
        let e = c.grant(Duration::from_secs(5)).await.unwrap_err().to_string();
        assert!(!e.contains("outcome is unknown"), "{e}");
    }
}
