//! A gRPC client's connection that sends a unary request in one write.
//!
//! Through tonic, hyper and h2 as they come, a unary request leaves in three writes: HEADERS
//! alone (h2's connection task writes it, which opens the stream, and only then gives the
//! stream send capacity), then the DATA frame, then an empty DATA frame that ends the stream
//! (tonic's body says it has ended only when polled once more). The server wakes for each,
//! and a unary call is answered only once its stream has ended. On a small machine each
//! wake-up of a sleeping CPU costs tens of microseconds.
//!
//! Two parts make it one write, with the same frames in the same order:
//! - [`Lookahead`] gives each request a body that looks one frame ahead without waiting, so
//!   the last DATA frame carries END_STREAM itself (no empty frame after it);
//! - [`Coalesced`] holds a socket's first write after a flush back for one turn of the
//!   scheduler: it asks to be polled again and returns `Pending`, so the body's task, woken
//!   when the stream opened, queues its DATA frame before the HEADERS frame is written.
//!
//! Every client of the node's API connects through [`connect`]: the CLI, a slave's calls to
//! its master (`control::remote`) and the benches.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket whose first write after each flush waits one scheduler turn (see the module).
/// Reads, flushes and shutdowns pass straight through.
#[derive(Debug)]
pub struct Coalesced<T> {
    inner: T,
    /// The current burst of writes has waited its turn; cleared by a completed flush.
    waited: bool,
}

impl<T> Coalesced<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, waited: false }
    }

    /// The first write of a burst: ask to be polled again after what is ready now.
    fn wait_turn(&mut self, cx: &mut Context<'_>) -> bool {
        if self.waited {
            return false;
        }
        self.waited = true;
        cx.waker().wake_by_ref();
        true
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.wait_turn(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.wait_turn(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if flushed.is_ready() {
            self.waited = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connects a channel whose sockets are [`Coalesced`]. The TCP connection is hyper's, made
/// as tonic's own connector makes it, from the endpoint's settings (TCP_NODELAY, keepalive,
/// every address of the name tried, IPv4 after 300 ms without IPv6, the connect timeout
/// split among them); the endpoint's TLS and connect timeout apply on top.
pub async fn connect(
    endpoint: &tonic::transport::Endpoint,
) -> Result<Lookahead<tonic::transport::Channel>, tonic::transport::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(endpoint.get_tcp_nodelay());
    http.set_keepalive(endpoint.get_tcp_keepalive());
    http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
    http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
    http.set_connect_timeout(endpoint.get_connect_timeout());
    Ok(Lookahead(endpoint.connect_with_connector(Connector(http)).await?))
}

/// Makes a TCP connection with hyper's connector and makes it [`Coalesced`].
#[derive(Debug, Clone)]
struct Connector(HttpConnector);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Connecting = futures_util::future::BoxFuture<
    'static,
    Result<TokioIo<Coalesced<tokio::net::TcpStream>>, BoxError>,
>;

impl tower::Service<tonic::codegen::http::Uri> for Connector {
    type Response = TokioIo<Coalesced<tokio::net::TcpStream>>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Connecting {
        let connecting = self.0.call(uri);
        Box::pin(async move { Ok(TokioIo::new(Coalesced::new(connecting.await?.into_inner()))) })
    }
}

/// A channel whose request bodies say they end as soon as their last chunk is out, so a
/// unary request's one DATA frame carries END_STREAM (no empty DATA frame after it).
#[derive(Debug, Clone)]
pub struct Lookahead<S>(S);

type Req = tonic::codegen::http::Request<tonic::body::Body>;

impl<S: tower::Service<Req>> tower::Service<Req> for Lookahead<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> S::Future {
        self.0.call(req.map(|inner| {
            tonic::body::Body::new(LookaheadBody { inner, peeked: None, ended: false })
        }))
    }
}

/// A body that looks one frame ahead, without waiting, after each frame it gives.
struct LookaheadBody {
    inner: tonic::body::Body,
    peeked: Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>,
    ended: bool,
}

impl http_body::Body for LookaheadBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let frame = match self.peeked.take() {
            Some(frame) => frame,
            None if self.ended => return Poll::Ready(None),
            None => match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(frame)) => frame,
            },
        };
        if frame.is_ok() && !self.ended {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => {}
                Poll::Ready(None) => self.ended = true,
                Poll::Ready(Some(next)) => self.peeked = Some(next),
            }
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.peeked.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.peeked {
            None => self.inner.size_hint(),
            Some(_) => http_body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::Wake;

    use http_body_util::BodyExt as _;
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    /// A socket that records the bytes of each write call.
    struct Recorder {
        inner: tokio::net::TcpStream,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
            let written: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).take(n).collect();
            self.writes.lock().unwrap().push(written);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Opens a [`Coalesced`] [`Recorder`].
    #[derive(Clone)]
    struct RecordingConnector(Arc<Mutex<Vec<Vec<u8>>>>);

    impl tower::Service<tonic::codegen::http::Uri> for RecordingConnector {
        type Response = hyper_util::rt::TokioIo<Coalesced<Recorder>>;
        type Error = io::Error;
        type Future = Pin<Box<dyn std::future::Future<Output = io::Result<Self::Response>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
            let writes = self.0.clone();
            Box::pin(async move {
                let addr = format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap());
                let inner = tokio::net::TcpStream::connect(addr).await?;
                inner.set_nodelay(true)?;
                Ok(hyper_util::rt::TokioIo::new(Coalesced::new(Recorder { inner, writes })))
            })
        }
    }

    /// The HTTP/2 frames of a client's writes, each as (write index, type, flags, stream,
    /// payload length), after the connection preface.
    fn frames(writes: &[Vec<u8>]) -> Vec<(usize, u8, u8, u32, usize)> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut owner = Vec::new();
        let mut bytes = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            owner.extend(std::iter::repeat_n(i, w.len()));
            bytes.extend_from_slice(w);
        }
        assert!(bytes.starts_with(PREFACE), "the client's first bytes are the preface");
        let mut at = PREFACE.len();
        let mut out = Vec::new();
        while at + 9 <= bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            let (kind, flags) = (bytes[at + 3], bytes[at + 4]);
            let stream =
                u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
            let end = at + 9 + len;
            assert!(end <= bytes.len(), "a frame cut short");
            assert_eq!(owner[at], owner[end - 1], "a frame split across writes");
            out.push((owner[at], kind, flags, stream, len));
            at = end;
        }
        out
    }

    #[tokio::test]
    async fn a_unary_request_leaves_in_one_write_its_last_data_frame_ending_the_stream() {
        // A plain tonic server (the health service) on loopback, stopped at the end.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let stop = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(
            tonic::transport::Server::builder().add_service(health).serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
        );
        let _stop_on_exit = stop.clone().drop_guard();
        let writes = Arc::new(Mutex::new(Vec::new()));
        let connector = RecordingConnector(writes.clone());
        let endpoint = tonic::transport::Endpoint::from_shared(url).unwrap();
        let channel = Lookahead(endpoint.connect_with_connector(connector).await.unwrap());
        let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
        // A 1 KiB body (its DATA frame chained by h2's writer, not copied), then a small one.
        for size in [1024, 10] {
            let service = "s".repeat(size);
            let answer = client.check(tonic_health::pb::HealthCheckRequest { service }).await;
            assert_eq!(answer.unwrap_err().code(), tonic::Code::NotFound, "an unknown service");
        }
        let writes = writes.lock().unwrap().clone();
        let frames = frames(&writes);
        for stream in [1, 3] {
            let of: Vec<_> = frames.iter().filter(|f| f.3 == stream).collect();
            let kinds: Vec<_> = of.iter().map(|f| (f.1, f.2 & 1 == 1)).collect();
            assert_eq!(
                kinds,
                [(1, false), (0, true)],
                "stream {stream}: HEADERS, then one DATA frame that ends the stream \
                 (frames as (type, END_STREAM)); all frames: {frames:?}"
            );
            assert_eq!(of[0].0, of[1].0, "stream {stream}: in one write; all frames: {frames:?}");
        }
        stop.cancel();
        server.await.unwrap().unwrap();
    }

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn the_first_write_after_a_flush_waits_one_turn_and_the_bytes_pass_unchanged() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut socket = Coalesced::new(a);
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut write = |s: &mut Coalesced<_>, bytes: &[u8]| Pin::new(s).poll_write(&mut cx, bytes);
        assert!(write(&mut socket, b"ab").is_pending(), "the first write waits a turn");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "and asks to be polled again");
        assert!(matches!(write(&mut socket, b"ab"), Poll::Ready(Ok(2))));
        assert!(matches!(write(&mut socket, b"cd"), Poll::Ready(Ok(2))), "the same burst");
        socket.flush().await.unwrap();
        let mut write = |s: &mut Coalesced<_>, bytes: &[u8]| Pin::new(s).poll_write(&mut cx, bytes);
        assert!(write(&mut socket, b"ef").is_pending(), "a new burst after the flush waits");
        assert!(matches!(write(&mut socket, b"ef"), Poll::Ready(Ok(2))));
        socket.shutdown().await.unwrap();
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got).await.unwrap();
        assert_eq!(got, b"abcdef");
    }

    #[tokio::test]
    async fn a_body_says_it_ended_with_its_last_frame_and_keeps_its_frames_in_order() {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>(4);
        let inner = tonic::body::Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let mut body = LookaheadBody { inner, peeked: None, ended: false };
        let data = |f: http_body::Frame<bytes::Bytes>| f.into_data().unwrap();
        for chunk in ["a", "b"] {
            tx.send(Ok(http_body::Frame::data(chunk.into()))).await.unwrap();
        }
        assert_eq!(data(body.frame().await.unwrap().unwrap()), "a");
        assert!(!http_body::Body::is_end_stream(&body), "b is still to come");
        assert_eq!(data(body.frame().await.unwrap().unwrap()), "b");
        assert!(!http_body::Body::is_end_stream(&body), "the sender is still there");
        for chunk in ["c", "d"] {
            tx.send(Ok(http_body::Frame::data(chunk.into()))).await.unwrap();
        }
        drop(tx);
        assert_eq!(data(body.frame().await.unwrap().unwrap()), "c");
        assert!(!http_body::Body::is_end_stream(&body), "d is still to come");
        assert_eq!(data(body.frame().await.unwrap().unwrap()), "d");
        assert!(http_body::Body::is_end_stream(&body), "nothing after d, seen without waiting");
        assert!(body.frame().await.is_none());
    }
}
