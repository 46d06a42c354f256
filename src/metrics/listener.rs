//! The metrics port's listener: at most [`MAX_CONNECTIONS`] connections at once (more are
//! closed at accept), each closed after [`IDLE_TIMEOUT`] without a byte read or written, so a
//! flood of connections to the metrics port can neither take the file descriptors the store
//! needs nor hold a graceful stop with half a request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Most metrics connections open at once (a scraper uses one per target); counted in the
/// control plane's file-descriptor reserve.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// A metrics connection with no byte read or written for this long is closed (Prometheus
/// scrapes every 15-60 s and reconnects when it must).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// A [`TcpListener`] that admits at most `MAX_CONNECTIONS` connections, each with an idle timer.
pub(crate) struct Limited {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
}

impl Limited {
    pub(crate) fn new(inner: TcpListener) -> Self {
        Self::with(inner, MAX_CONNECTIONS, IDLE_TIMEOUT)
    }

    fn with(inner: TcpListener, max: usize, idle: Duration) -> Self {
        Self { inner, slots: Arc::new(Semaphore::new(max)), idle }
    }

    async fn accept_one(&mut self) -> (Timed, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(permit) => return (Timed::new(stream, permit, self.idle), addr),
                    // Closed at once (dropped): the kernel backlog does not fill up either.
                    Err(_) => tracing::debug!(peer = %addr, "metrics connection refused: limit"),
                },
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait, go on.
                    tracing::debug!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl axum::serve::Listener for Limited {
    type Io = Timed;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl Future<Output = (Self::Io, Self::Addr)> + Send {
        self.accept_one()
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection holding its slot, failing with `TimedOut` once idle too long.
pub(crate) struct Timed {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Timed {
    fn new(stream: TcpStream, slot: OwnedSemaphorePermit, idle: Duration) -> Self {
        Self { stream, _slot: slot, idle, deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    /// After an I/O call: progress restarts the idle timer; no progress past it is an error.
    fn timed<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                let next = Instant::now() + self.idle;
                self.deadline.as_mut().reset(next);
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "metrics connection idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.timed(cx, r)
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.timed(cx, r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_flush(cx);
        this.timed(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn a_connection_beyond_the_limit_is_closed_and_an_idle_one_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut limited = Limited::with(l, 1, Duration::from_millis(200));
        let mut first = TcpStream::connect(addr).await.unwrap();
        let (mut held, _) = limited.accept_one().await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        // The second is accepted and dropped while the accept waits for a third.
        let third = tokio::spawn(async move { limited.accept_one().await });
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf)).await;
        assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "the second was closed: {n:?}");
        third.abort();
        // The held one: no byte for longer than the idle time is an error on its side.
        first.write_all(b"x").await.unwrap();
        assert_eq!(held.read(&mut buf).await.unwrap(), 1);
        let e = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf)).await;
        assert!(
            matches!(&e, Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut),
            "idle connection timed out: {e:?}"
        );
    }
}
