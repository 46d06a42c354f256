//! The gRPC port's connections: bounded, and closed when they idle.
//!
//! [`Incoming`] accepts every connection at once (none waits in the backlog; only when accept
//! itself fails, out of descriptors, does accepting pause for 50 ms) and closes, with a log line and `hasync_grpc_connections_refused_total`, any beyond
//! the limit: the smaller of `grpc.max-connections` and the fd budget (the soft
//! `RLIMIT_NOFILE` less [`fd_reserve`], the descriptors kept for the store, its state files
//! and the HA data plane, so that no client flood can take them). Each accepted connection
//! ([`Conn`]) is watched: one that sent no byte within `grpc.handshake-timeout` (bare TCP that
//! never speaks HTTP/2 or TLS), or that had no open stream for `grpc.idle-timeout`, reads as
//! closed by the peer, which ends it (`hasync_grpc_connections_closed_total`). Streams are
//! counted by [`ConnTrackLayer`]: a call's stream is open from its request until its response
//! body is dropped. HTTP/2 keepalive (`grpc.keepalive-interval` / `-timeout`) ends a
//! connection whose peer stopped answering pings.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::http;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use crate::metrics::GrpcConnMetrics;

/// Descriptors kept out of the gRPC budget besides the HA slots: the process's own (stdio,
/// the runtime, listeners, the data-dir lock, the log), a segment being created and the next
/// one being prepared, checkpoint and metadata writes (temporary file and directory), a
/// slave's link and metadata channel, metrics scrapes.
pub(crate) const FD_RESERVE_BASE: u64 = 64;

/// The descriptors the store and the data plane keep: [`FD_RESERVE_BASE`] plus every socket
/// the HA port may hold (`ha.max-connections` live slaves and the connections that have not
/// reported yet, [`crate::ha::master::unreported_limit`]) and the metrics port's connections.
pub(crate) fn fd_reserve(ha_max_connections: u32) -> u64 {
    let live = ha_max_connections as usize;
    let metrics = crate::metrics::listener::MAX_CONNECTIONS;
    FD_RESERVE_BASE + (live + crate::ha::master::unreported_limit(live) + metrics) as u64
}

/// The connection limit in force and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// Most gRPC connections open at once.
    pub(crate) max: usize,
    /// `"max_connections"` (the key) or `"fd_budget"` (the descriptor limit was lower).
    pub(crate) reason: &'static str,
}

/// The limit for `max_connections` under a soft descriptor limit of `nofile` (None: unlimited)
/// less `reserve`. Never below 1: a node must stay manageable; the start warns when the budget
/// is that low.
pub(crate) fn limit(max_connections: u32, nofile: Option<u64>, reserve: u64) -> Limit {
    let configured = max_connections as usize;
    let budget = nofile.map_or(usize::MAX, |n| n.saturating_sub(reserve) as usize);
    if budget < configured {
        Limit { max: budget.max(1), reason: "fd_budget" }
    } else {
        Limit { max: configured, reason: "max_connections" }
    }
}

/// The process's soft descriptor limit (None: unlimited).
pub(crate) fn nofile_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// The timeouts a connection is watched with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// The first byte must come within this.
    pub(crate) handshake: Duration,
    /// Longest time with no open stream.
    pub(crate) idle: Duration,
}

/// What [`Incoming`], every [`Conn`] and the [`ConnTrackLayer`] share.
#[derive(Debug)]
struct Shared {
    limit: Limit,
    timeouts: Timeouts,
    open: AtomicUsize,
    by_peer: Mutex<HashMap<SocketAddr, Arc<ConnState>>>,
    metrics: GrpcConnMetrics,
    refusals: Mutex<Refusals>,
    /// Set (under `by_peer`) when the server stops: no connection is admitted after it.
    stopping: AtomicBool,
}

/// Refusals since the last log line (at most one line a second).
#[derive(Debug, Default)]
struct Refusals {
    last_line: Option<Instant>,
    unlogged: u64,
}

/// One connection's state, as the watchdog and the stream counter see it.
#[derive(Debug)]
struct ConnState {
    streams: AtomicUsize,
    /// When the connection last had no open stream (its accept, at first).
    idle_since: Mutex<Instant>,
    read_any: AtomicBool,
    /// Whether a call ever opened a stream on it.
    ever_streamed: AtomicBool,
    /// Set by the watchdog: reads answer end-of-stream from then on.
    closed: AtomicBool,
    read_waker: Mutex<Option<Waker>>,
    /// Set at a stop that closes every connection: writes fail from then on, so that a
    /// connection whose writes block (a client frozen at the TCP level, its buffers full)
    /// ends at once instead of with a keepalive.
    writes_closed: AtomicBool,
    write_waker: Mutex<Option<Waker>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ConnState {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.read_waker).take() {
            w.wake();
        }
    }

    /// Closes reads, and writes too (see `writes_closed`).
    fn close_both(&self) {
        self.writes_closed.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.write_waker).take() {
            w.wake();
        }
        self.close();
    }
}

/// What a write on a connection whose writes were closed gets.
fn writes_closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection closed at the stop")
}

/// The accept side: a stream of connections for tonic's `serve_with_incoming_shutdown`.
#[derive(Debug)]
pub(crate) struct Incoming {
    listener: TcpListener,
    shared: Arc<Shared>,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long accepting pauses after it failed (out of descriptors: the backlog waits).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

impl Incoming {
    /// Accepts on `listener` under `limit`, watching each connection with `timeouts`; returns
    /// the layer that counts streams on these connections too.
    pub(crate) fn new(
        listener: TcpListener,
        limit: Limit,
        timeouts: Timeouts,
        metrics: GrpcConnMetrics,
    ) -> (Self, ConnTrackLayer) {
        let shared = Arc::new(Shared {
            limit,
            timeouts,
            open: AtomicUsize::new(0),
            by_peer: Mutex::default(),
            metrics,
            refusals: Mutex::default(),
            stopping: AtomicBool::new(false),
        });
        let layer = ConnTrackLayer { shared: Arc::clone(&shared) };
        (Self { listener, shared, backoff: None }, layer)
    }

    fn admit(&self, stream: TcpStream, peer: SocketAddr) -> Option<Conn> {
        let shared = &self.shared;
        let open = shared.open.fetch_add(1, Ordering::SeqCst);
        if open >= shared.limit.max {
            shared.open.fetch_sub(1, Ordering::SeqCst);
            drop(stream);
            shared.metrics.refused(shared.limit.reason).inc();
            self.log_refusal(peer, open);
            return None;
        }
        debug_assert!(open < shared.limit.max, "admitted beyond the limit");
        shared.metrics.accepted.inc();
        shared.metrics.open.inc();
        // TCP_NODELAY: small unary calls must not wait on Nagle and delayed ACKs.
        let _ = stream.set_nodelay(true);
        let state = Arc::new(ConnState {
            streams: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            read_any: AtomicBool::new(false),
            ever_streamed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            read_waker: Mutex::new(None),
            writes_closed: AtomicBool::new(false),
            write_waker: Mutex::new(None),
        });
        {
            let mut by_peer = lock(&shared.by_peer);
            if shared.stopping.load(Ordering::SeqCst) {
                drop(by_peer);
                shared.open.fetch_sub(1, Ordering::SeqCst);
                shared.metrics.open.dec();
                return None;
            }
            by_peer.insert(peer, Arc::clone(&state));
        }
        tokio::spawn(watch(Arc::downgrade(&state), Arc::downgrade(shared), peer));
        Some(Conn { stream, peer, state, shared: Arc::clone(shared) })
    }

    fn log_refusal(&self, peer: SocketAddr, open: usize) {
        let mut r = lock(&self.shared.refusals);
        r.unlogged += 1;
        let now = Instant::now();
        if r.last_line.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        let limit = self.shared.limit;
        tracing::warn!(
            %peer,
            open,
            limit = limit.max,
            set_by = limit.reason,
            refused = r.unlogged,
            "gRPC connection refused: at the connection limit (grpc.max-connections or the fd \
             budget); `refused` counts refusals since the last such line"
        );
        r.last_line = Some(now);
        r.unlogged = 0;
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(sleep) = self.backoff.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.backoff = None;
            }
            match std::task::ready!(self.listener.poll_accept(cx)) {
                Ok((stream, peer)) => {
                    if let Some(conn) = self.admit(stream, peer) {
                        return Poll::Ready(Some(Ok(conn)));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed; pausing accepts briefly");
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }
}

/// Closes the connection when it sent nothing within the handshake timeout, or had no stream
/// for the idle timeout; ends when the connection is gone.
async fn watch(state: Weak<ConnState>, shared: Weak<Shared>, peer: SocketAddr) {
    let Some(timeouts) = shared.upgrade().map(|s| s.timeouts) else { return };
    tokio::time::sleep(timeouts.handshake).await;
    let close = |state: &ConnState, reason: &'static str| {
        if let Some(s) = shared.upgrade() {
            s.metrics.closed(reason).inc();
        }
        // Debug: a flood of silent connections must not become a flood of log lines (the
        // metric counts them).
        tracing::debug!(%peer, reason, "closing gRPC connection (grpc.handshake-timeout or grpc.idle-timeout)");
        state.close();
    };
    {
        let Some(s) = state.upgrade() else { return };
        if !s.read_any.load(Ordering::SeqCst) {
            close(&s, "handshake");
            return;
        }
    }
    loop {
        let next = {
            let Some(s) = state.upgrade() else { return };
            let since = lock(&s.idle_since);
            let now = Instant::now();
            if s.streams.load(Ordering::SeqCst) > 0 {
                now + timeouts.idle
            } else if now.duration_since(*since) >= timeouts.idle {
                close(&s, "idle");
                return;
            } else {
                *since + timeouts.idle
            }
        };
        tokio::time::sleep_until(next.into()).await;
    }
}

/// An accepted gRPC connection.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ConnState>,
    shared: Arc<Shared>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
        self.shared.metrics.open.dec();
        let mut by_peer = lock(&self.shared.by_peer);
        if by_peer.get(&self.peer).is_some_and(|s| Arc::ptr_eq(s, &self.state)) {
            by_peer.remove(&self.peer);
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.state.closed.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.state.read_any.store(true, Ordering::SeqCst);
            }
            Poll::Pending => {
                *lock(&self.state.read_waker) = Some(cx.waker().clone());
                // Closed between the check and storing the waker: nobody would wake us.
                if self.state.closed.load(Ordering::SeqCst) {
                    return Poll::Ready(Ok(()));
                }
            }
            _ => {}
        }
        polled
    }
}

impl Conn {
    /// A write (`op`), unless writes were closed (at a stop): then an error. A write that waits
    /// keeps its waker, so that closing the writes wakes it.
    fn unless_writes_closed<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if self.state.writes_closed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(writes_closed()));
        }
        let polled = op(Pin::new(&mut self.stream), cx);
        if polled.is_pending() {
            *lock(&self.state.write_waker) = Some(cx.waker().clone());
            // Closed between the check and storing the waker: nobody would wake us.
            if self.state.writes_closed.load(Ordering::SeqCst) {
                return Poll::Ready(Err(writes_closed()));
            }
        }
        polled
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.unless_writes_closed(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.unless_writes_closed(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.unless_writes_closed(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Counts each call's stream on its connection, from the request until the response body is
/// dropped, so that a connection with a long stream (WatchStatus) is never idle.
#[derive(Debug, Clone)]
pub(crate) struct ConnTrackLayer {
    shared: Arc<Shared>,
}

impl ConnTrackLayer {
    /// At a stop: admits no more connections and closes every one that never carried a
    /// call. One that has not finished its handshake would hold the graceful stop until a
    /// timeout (the server cannot answer it with GOAWAY yet); every other connection gets the
    /// server's GOAWAY and ends once its calls did.
    pub(crate) fn close_unused(&self) {
        self.close_where(|state| !state.ever_streamed.load(Ordering::SeqCst), ConnState::close);
    }

    /// At a stop whose calls did not end in time: closes every connection (reads answer
    /// end-of-stream, writes fail, a blocked write included), so the server ends them with
    /// whatever calls they still carry, also one whose client stopped reading at the TCP level.
    pub(crate) fn close_all(&self) {
        self.close_where(|_| true, ConnState::close_both);
    }

    /// Admits no more connections and closes those `which` picks with `close`.
    fn close_where(&self, which: impl Fn(&ConnState) -> bool, close: impl Fn(&ConnState)) {
        let by_peer = lock(&self.shared.by_peer);
        self.shared.stopping.store(true, Ordering::SeqCst);
        for state in by_peer.values() {
            let since = lock(&state.idle_since);
            if which(state) {
                close(state);
            }
            drop(since);
        }
    }
}

impl<S> tower::Layer<S> for ConnTrackLayer {
    type Service = ConnTrack<S>;
    fn layer(&self, inner: S) -> ConnTrack<S> {
        ConnTrack { shared: Arc::clone(&self.shared), inner }
    }
}

/// See [`ConnTrackLayer`].
#[derive(Debug, Clone)]
pub(crate) struct ConnTrack<S> {
    shared: Arc<Shared>,
    inner: S,
}

/// An open stream: counted while it lives.
#[derive(Debug)]
struct StreamGuard(Arc<ConnState>);

impl StreamGuard {
    fn open(state: Arc<ConnState>) -> Self {
        // Under the lock the watchdog decides under: it never closes a connection it saw
        // without a stream while this one opens.
        let since = lock(&state.idle_since);
        state.streams.fetch_add(1, Ordering::SeqCst);
        state.ever_streamed.store(true, Ordering::SeqCst);
        drop(since);
        Self(state)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // The last stream's end starts the idle clock (under the lock the watchdog reads).
        let mut since = lock(&self.0.idle_since);
        if self.0.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            *since = Instant::now();
        }
    }
}

impl<S> ConnTrack<S> {
    fn state_of<B>(&self, req: &http::Request<B>) -> Option<Arc<ConnState>> {
        let ext = req.extensions();
        let peer =
            ext.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr).or_else(|| {
                ext.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|t| t.get_ref().remote_addr())
            })?;
        lock(&self.shared.by_peer).get(&peer).cloned()
    }
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ConnTrack<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<Tracked<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let guard = self.state_of(&req).map(StreamGuard::open);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|inner| Tracked { inner, _guard: guard }))
        })
    }
}

/// A response body that keeps its stream counted until it is dropped.
#[derive(Debug)]
pub(crate) struct Tracked<B> {
    inner: B,
    _guard: Option<StreamGuard>,
}

impl<B> http_body::Body for Tracked<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_key_unless_the_fd_budget_is_lower() {
        assert_eq!(limit(100, Some(10_000), 192), Limit { max: 100, reason: "max_connections" });
        assert_eq!(limit(100, None, 192), Limit { max: 100, reason: "max_connections" });
        assert_eq!(limit(100, Some(256), 192), Limit { max: 64, reason: "fd_budget" });
        assert_eq!(limit(100, Some(100), 192), Limit { max: 1, reason: "fd_budget" });
        assert_eq!(fd_reserve(64), 64 + 64 + 128 + 16, "HA slots, unreported bound, metrics");
        assert_eq!(fd_reserve(4), 64 + 4 + 16 + 16);
    }
}
