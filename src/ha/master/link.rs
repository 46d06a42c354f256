//! One connection's write side (`ha::master`), shared by its writer task and the put path.
//!
//! The writer task sends what the store appended, woken by the store's max offset. A SYNC put
//! waits for that frame, and the wake-up of another task (often on another worker thread) is
//! on its path. So a put may also push the frame itself, from its own task, right after its
//! append ([`Link::try_push`]): only when the link is idle (the writer is not writing, nothing
//! of an earlier frame is left), and only with one non-blocking write. Whatever the socket does
//! not take at once is left to the writer, which sends it before anything else. Frames are
//! the same bytes either way: the frame from the cursor to the store's max offset, at most
//! `transfer-batch-size`, never across a segment file.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;

use crate::ha::codec;
use crate::metrics::HaCounters;
use crate::store::CommitLog;

/// The write half of one connection and where its stream stands.
pub(super) struct Link {
    state: tokio::sync::Mutex<LinkState>,
    /// Woken when a push left the writer something to do (the rest of a frame, an error).
    kick: tokio::sync::Notify,
    /// The slave's last accepted ack (its report when streaming started): a push goes only
    /// when it covers everything sent. With frames in flight the writer batches what puts
    /// append meanwhile, one write for many puts; pushing then would cost one write per put.
    acked: AtomicU64,
    /// The connection's cursor (`Owner::sent`): everything below it is being or was sent.
    pub(super) sent: Arc<AtomicU64>,
    /// Frames a push wrote (wholly or in part).
    pushed: AtomicU64,
}

/// Under the link's lock: held by the writer while it writes, tried (never waited for) by a put.
pub(super) struct LinkState {
    pub(super) wr: OwnedWriteHalf,
    /// Set when streaming starts: the next offset to send (everything below it was written,
    /// or is in `rest`) and the connection's cursor (published before each frame is written).
    pub(super) stream: Option<(u64, Arc<AtomicU64>)>,
    /// The unwritten end of a frame a push began: the writer sends it before anything else.
    pub(super) rest: Option<Bytes>,
    /// A push's write failed: the writer ends the connection with it.
    pub(super) failed: Option<std::io::Error>,
    /// When a frame or heartbeat was last written (a heartbeat goes after idleness).
    pub(super) last_write: tokio::time::Instant,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

impl Link {
    pub(super) fn new(wr: OwnedWriteHalf) -> Self {
        let last_write = tokio::time::Instant::now();
        let state = LinkState { wr, stream: None, rest: None, failed: None, last_write };
        let (state, kick) = (tokio::sync::Mutex::new(state), tokio::sync::Notify::new());
        Self {
            state,
            kick,
            acked: AtomicU64::new(0),
            sent: Arc::default(),
            pushed: AtomicU64::new(0),
        }
    }

    /// Frames a push wrote, wholly or in part (the writer wrote the rest).
    #[cfg(test)]
    pub(super) fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// Whether a push may find the link idle: everything sent is acked (no lock taken; the
    /// push checks again under the link's).
    pub(super) fn may_push(&self) -> bool {
        self.sent.load(Ordering::Acquire) <= self.acked.load(Ordering::Acquire)
    }

    /// Records the slave's report or accepted ack `offset` (never lowered).
    pub(super) fn acked(&self, offset: u64) {
        self.acked.fetch_max(offset, Ordering::Release);
    }

    /// The state, for the writer (waits while a push holds it: never across an await).
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, LinkState> {
        self.state.lock().await
    }

    /// Resolves when a push left the writer work (a permit is kept when it is not waiting).
    pub(super) async fn kicked(&self) {
        self.kick.notified().await;
    }

    /// Sends the next frame now, from the caller's task, when the link is idle (not held by
    /// the writer, nothing left of an earlier frame, everything sent acked) and the store has
    /// bytes beyond the cursor: one non-blocking write; what the socket did not take is left
    /// to the writer. Never waits, never fails: a write error is the writer's to report (it
    /// closes the connection with it).
    pub(super) fn try_push(&self, store: &CommitLog, batch: usize, counters: &HaCounters) {
        let Ok(mut st) = self.state.try_lock() else { return };
        let Some((next, _)) = st.stream else { return };
        let in_flight = next > self.acked.load(Ordering::Acquire);
        if in_flight || st.rest.is_some() || st.failed.is_some() || next >= store.max_offset() {
            return;
        }
        // A read error is the writer's too: it reads the same offset and ends with it.
        let Ok(Some(Frame { header, body: chunk })) = st.next_frame(store, batch) else { return };
        let len = chunk.len() as u64;
        let total = header.len() + chunk.len();
        let written = match st.wr.try_write_vectored(&[IoSlice::new(&header), IoSlice::new(&chunk)])
        {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        };
        st.last_write = tokio::time::Instant::now();
        match written {
            Ok(n) => {
                if n < total {
                    st.rest = Some(unwritten(&header, &chunk, n));
                }
                drop(st);
                // The frame is sent: by this push alone, or with the writer's help.
                Frame::count(len, counters);
                if n > 0 {
                    self.pushed.fetch_add(1, Ordering::Relaxed);
                }
                if n < total {
                    self.kick.notify_one();
                }
            }
            Err(e) => {
                st.failed = Some(e);
                drop(st);
                self.kick.notify_one();
            }
        }
    }
}

/// One transfer frame: its header and its body, a zero-copy slice of the store.
pub(super) struct Frame {
    pub(super) header: [u8; codec::TRANSFER_HEADER_SIZE],
    pub(super) body: Bytes,
}

impl Frame {
    /// Counts a sent frame of `len` body bytes.
    pub(super) fn count(len: u64, counters: &HaCounters) {
        counters.sent_frames.inc();
        counters.sent_bytes.inc_by(len);
    }
}

impl LinkState {
    /// Takes the next frame from the cursor: at most `batch` bytes of what the store holds
    /// there, never across a segment file. The connection's cursor moves past it before it is
    /// written, so that an ack of these bytes is never refused; `Ok(None)` when nothing is
    /// readable at the cursor (or streaming has not started).
    pub(super) fn next_frame(
        &mut self,
        store: &CommitLog,
        batch: usize,
    ) -> crate::store::Result<Option<Frame>> {
        let Some((next, sent)) = self.stream.as_ref() else { return Ok(None) };
        let Some(body) = store.read(*next, batch)? else { return Ok(None) };
        let end = *next + body.len() as u64;
        sent.store(end, Ordering::Release);
        let header = codec::encode_transfer_header(*next as i64, body.len() as i32);
        self.stream = Some((end, Arc::clone(sent)));
        Ok(Some(Frame { header, body }))
    }
}

/// What is left of a frame (`header` then `body`) after its first `written` bytes.
fn unwritten(header: &[u8], body: &Bytes, written: usize) -> Bytes {
    if written >= header.len() {
        return body.slice(written - header.len()..);
    }
    let mut rest = Vec::with_capacity(header.len() + body.len() - written);
    rest.extend_from_slice(&header[written..]);
    rest.extend_from_slice(body);
    Bytes::from(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::test_peers::{SEG, put, store_in};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpSocket, TcpStream};

    #[test]
    fn what_is_left_of_a_frame_is_its_bytes_after_the_written_ones() {
        let header = [1u8, 2, 3, 4];
        let body = Bytes::from_static(&[5, 6, 7]);
        let frame: Vec<u8> = header.iter().chain(body.iter()).copied().collect();
        for written in 0..frame.len() {
            assert_eq!(&unwritten(&header, &body, written)[..], &frame[written..], "{written}");
        }
    }

    /// A connected pair with small socket buffers: the link's end and the peer's.
    async fn pair() -> (Link, TcpStream) {
        let listener = TcpSocket::new_v4().unwrap();
        listener.set_send_buffer_size(4096).unwrap();
        listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = listener.listen(1).unwrap();
        let peer = TcpSocket::new_v4().unwrap();
        peer.set_recv_buffer_size(4096).unwrap();
        let (peer, accepted) = tokio::join!(peer.connect(addr), listener.accept());
        let (_rd, wr) = accepted.unwrap().0.into_split();
        (Link::new(wr), peer.unwrap())
    }

    /// Reads frames from `peer`, from `at` to `end`: each starts where the last ended and holds
    /// the store's bytes.
    async fn read_frames(peer: &mut TcpStream, store: &CommitLog, mut at: u64, end: u64) {
        while at < end {
            let mut h = [0u8; codec::TRANSFER_HEADER_SIZE];
            peer.read_exact(&mut h).await.unwrap();
            let off = u64::from_be_bytes(h[..8].try_into().unwrap());
            let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as usize;
            assert_eq!(off, at, "a frame starts where the last one ended");
            let mut body = vec![0u8; size];
            peer.read_exact(&mut body).await.unwrap();
            assert_eq!(&body[..], &store.read(off, size).unwrap().unwrap()[..], "at {off}");
            at += size as u64;
        }
        assert_eq!(at, end);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_push_sends_the_next_frame_and_leaves_the_rest_of_a_full_socket_to_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), SEG);
        let counters = HaCounters::default();
        let (link, mut peer) = pair().await;
        let sent = Arc::clone(&link.sent);
        // Not streaming yet: a push sends nothing.
        let end = put(&store, 1, 100);
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(sent.load(Ordering::Acquire), 0);
        link.lock().await.stream = Some((0, Arc::clone(&sent)));
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(sent.load(Ordering::Acquire), end, "the cursor is published");
        read_frames(&mut peer, &store, 0, end).await;
        // A frame in flight (not acked): the writer batches what comes next, a push sends
        // nothing.
        let first = put(&store, 1, 100);
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(sent.load(Ordering::Acquire), end, "nothing is pushed before the ack");
        link.acked(end);
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(sent.load(Ordering::Acquire), first);
        read_frames(&mut peer, &store, end, first).await;
        link.acked(first);
        // Nothing new: nothing is sent.
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(link.lock().await.stream.as_ref().unwrap().0, first);

        // The peer stops reading (each push acked as if it had): pushes fill the socket until
        // one leaves a rest, after which pushes send nothing (the writer's turn).
        let mut rounds = 0;
        while link.lock().await.rest.is_none() {
            rounds += 1;
            assert!(rounds < 10_000, "the socket never filled");
            put(&store, 1, 3000);
            link.try_push(&store, 8 * 1024, &counters);
            link.acked(sent.load(Ordering::Acquire));
        }
        let at = link.lock().await.stream.as_ref().unwrap().0;
        assert_eq!(sent.load(Ordering::Acquire), at);
        put(&store, 1, 3000);
        link.try_push(&store, 8 * 1024, &counters);
        assert_eq!(link.lock().await.stream.as_ref().unwrap().0, at, "a push waits for the rest");

        // As the writer does: the rest goes first, then the frames after it.
        let writer = async {
            let mut st = link.lock().await;
            let mut rest = st.rest.take().unwrap();
            st.wr.write_all_buf(&mut rest).await.unwrap();
            drop(st);
            let max = store.max_offset();
            link.acked(sent.load(Ordering::Acquire));
            link.try_push(&store, usize::MAX, &counters);
            let mut st = link.lock().await;
            while let Some(r) = st.rest.take() {
                st.wr.write_all(&r).await.unwrap();
            }
            assert_eq!(st.stream.as_ref().unwrap().0, max);
        };
        let max = store.max_offset();
        tokio::join!(writer, read_frames(&mut peer, &store, first, max));
        assert!(link.pushed() >= rounds, "pushes that wrote: {} of {rounds}", link.pushed());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_push_whose_write_fails_leaves_the_error_to_the_writer_and_pushes_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), SEG);
        let counters = HaCounters::default();
        let (link, peer) = pair().await;
        let sent = Arc::clone(&link.sent);
        link.lock().await.stream = Some((0, Arc::clone(&sent)));
        // The slave resets the connection: a write after the reset fails.
        peer.set_zero_linger().unwrap();
        drop(peer);
        let mut rounds = 0;
        while link.lock().await.failed.is_none() {
            rounds += 1;
            assert!(rounds < 200, "no push saw the reset");
            put(&store, 1, 100);
            link.try_push(&store, usize::MAX, &counters);
            link.acked(sent.load(Ordering::Acquire));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The writer is woken to end the connection with the error.
        tokio::time::timeout(std::time::Duration::from_secs(5), link.kicked())
            .await
            .expect("the writer is kicked");
        let frames = counters.sent_frames.get();
        assert_eq!(frames, rounds - 1, "every push but the failed one counted its frame");
        let at = sent.load(Ordering::Acquire);
        put(&store, 1, 100);
        link.try_push(&store, usize::MAX, &counters);
        assert_eq!(sent.load(Ordering::Acquire), at, "no push after a failed one");
        assert_eq!(counters.sent_frames.get(), frames, "a failed frame is not counted");
        assert!(link.lock().await.rest.is_none());
    }
}
