//! Bearer-token auth as a tower layer: when a token is configured, mutating calls (and, if
//! configured, reads) need `authorization: Bearer <token>`, else UNAUTHENTICATED. Health and
//! reflection stay open so probes and tools work.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;

/// Methods that change state.
const MUTATING: &[&str] = &[
    "/hasync.v1.Replication/SetReplicationMode",
    "/hasync.v1.Replication/ChangeRole",
    "/hasync.v1.Replication/RegisterReplica",
    "/hasync.v1.Messages/Put",
    "/hasync.v1.Metadata/UpsertTopic",
    "/hasync.v1.Metadata/DeleteTopic",
    "/hasync.v1.Metadata/CommitConsumerOffset",
    "/hasync.v1.Metadata/UpsertSubscriptionGroup",
    "/hasync.v1.Metadata/DeleteSubscriptionGroup",
    "/hasync.v1.Metadata/SetDelayOffset",
];

/// Services that never need a token.
const OPEN_PREFIXES: &[&str] = &["/grpc.health.", "/grpc.reflection."];

/// The auth layer.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    expected: Option<Arc<str>>,
    reads_too: bool,
}

impl AuthLayer {
    /// A layer requiring `token` (empty = no auth) on mutating calls, and on reads when
    /// `reads_too`.
    pub(crate) fn new(token: &str, reads_too: bool) -> Self {
        let expected = (!token.is_empty()).then(|| Arc::from(format!("Bearer {token}")));
        Self { expected, reads_too }
    }

    fn needs_token(&self, path: &str) -> bool {
        if self.expected.is_none() || OPEN_PREFIXES.iter().any(|p| path.starts_with(p)) {
            return false;
        }
        self.reads_too || MUTATING.contains(&path)
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
            let given =
                req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            let expected = self.layer.expected.as_deref();
            if given != expected {
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
