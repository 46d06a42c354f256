//! Bearer-token auth as a tower layer. When a token is configured every call needs
//! `authorization: Bearer <token>`, else UNAUTHENTICATED, except health and reflection
//! ([`ALWAYS_OPEN`], so probes and tools work) and the read-only methods of [`READ_ONLY`] while
//! reads are open (`grpc.token-for-reads = false`). The lists name what may go without the
//! token, never what needs it: a method added later needs the token until it is listed here
//! (fail closed). The token is compared in constant time.

use std::sync::Arc;
use std::task::{Context, Poll};

use subtle::ConstantTimeEq as _;
use tonic::codegen::http;

/// Health and reflection: never need the token (Kubernetes probes cannot send one).
pub(crate) const ALWAYS_OPEN: &[&str] = &[
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The methods that read and change nothing: callable without the token while reads are open.
/// Every path in neither list (any method of any service, known or not) needs the token.
pub(crate) const READ_ONLY: &[&str] = &[
    "/hasync.v1.Replication/GetStatus",
    "/hasync.v1.Replication/WatchStatus",
    "/hasync.v1.Replication/GetEpochHistory",
    "/hasync.v1.Messages/Read",
    "/hasync.v1.Metadata/Get",
    "/hasync.v1.Metadata/Pull",
    "/hasync.v1.Cluster/GetClusterStatus",
    "/hasync.v1.Cluster/GetHistory",
    "/hasync.v1.Cluster/WatchTopology",
];

/// The auth layer.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    expected: Option<Arc<[u8]>>,
    reads_too: bool,
}

impl AuthLayer {
    /// A layer requiring `token` (empty = no auth) on every call except the [`ALWAYS_OPEN`]
    /// and [`READ_ONLY`] ones, and on the read-only ones too when `reads_too`.
    pub(crate) fn new(token: &str, reads_too: bool) -> Self {
        let expected = (!token.is_empty()).then(|| Arc::from(format!("Bearer {token}").as_bytes()));
        Self { expected, reads_too }
    }

    fn needs_token(&self, path: &str) -> bool {
        self.expected.is_some()
            && !ALWAYS_OPEN.contains(&path)
            && (self.reads_too || !READ_ONLY.contains(&path))
    }

    /// Whether `given` is the expected header value, compared in constant time (the length of
    /// the expected value is not secret: only its bytes are).
    fn accepts(&self, given: &[u8]) -> bool {
        self.expected.as_deref().is_some_and(|e| bool::from(e.ct_eq(given)))
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Auth<S> {
        Auth { layer: self.clone(), inner }
    }
}

/// The auth service.
#[derive(Debug, Clone)]
pub(crate) struct Auth<S> {
    layer: AuthLayer,
    inner: S,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Auth<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util_box::BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path().to_owned();
        if self.layer.needs_token(&path) {
            let given = req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes());
            if !given.is_some_and(|g| self.layer.accepts(g)) {
                let why = if given.is_none() {
                    "missing `authorization: Bearer <token>` metadata"
                } else {
                    "wrong bearer token"
                };
                tracing::warn!(%path, why, "request refused: unauthenticated");
                let status = tonic::Status::unauthenticated(format!("{path}: {why}"));
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        Box::pin(self.inner.call(req))
    }
}

mod futures_util_box {
    pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

/// Logs every refused call (a response carrying a non-OK `grpc-status` in its headers: the
/// trailers-only answer tonic gives an error) with the method, the code and the message, in
/// one place for every service.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogRefusalsLayer;

impl<S> tower::Layer<S> for LogRefusalsLayer {
    type Service = LogRefusals<S>;
    fn layer(&self, inner: S) -> LogRefusals<S> {
        LogRefusals { inner }
    }
}

/// See [`LogRefusalsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct LogRefusals<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for LogRefusals<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util_box::BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            if let Some(code) = resp.headers().get("grpc-status").and_then(|v| v.to_str().ok())
                && code != "0"
            {
                let code = tonic::Code::from_bytes(code.as_bytes());
                let message = resp
                    .headers()
                    .get("grpc-message")
                    .and_then(|v| v.to_str().ok())
                    .map(percent_decode)
                    .unwrap_or_default();
                tracing::warn!(method = %path, code = ?code, %message, "request refused");
            }
            Ok(resp)
        })
    }
}

/// Decodes the `%XX` escapes of a `grpc-message` header.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..(i + 3).min(s.len())], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
