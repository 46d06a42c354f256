//! `hasync.v1.Messages/PutStream`: puts sent one after another on one stream, answered in the
//! order sent, each with its own status.
//!
//! The answer stream is itself the engine: each time HTTP/2 asks it for the next answer it
//! reads what the client has sent (while the in-flight limits allow), begins those puts on the
//! node (admission and append happen there and then, so puts land in the order sent), and
//! gives the oldest put's answer once that put is decided. No task and no channel per stream
//! or per put: the wake-ups stay on the connection's task. A client that stops reading answers
//! stops HTTP/2 from asking for more, so the node stops reading puts, and the in-flight limits
//! bound what the node holds; the client is then held back by HTTP/2 flow control.
//!
//! A request may pack more puts (`PutStreamRequest.more`): each is begun as a put of its own,
//! in order, and one response answers them all, once the last is decided (they are appended
//! one after another, so the ack that covers the last covers the others: the earlier ones
//! wait little longer than alone). The in-flight limits count puts, not requests.
//! The call's response headers carry [`PACKS_HEADER`] (the most puts a request may pack), so
//! a client knows it may pack; a request with more ends the call with INVALID_ARGUMENT.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesOrdered, Stream, StreamExt as _};
use prost::Message as _;
use tonic::{Status, Streaming};

use super::messages::{MessagesService, put_response};
use crate::control::pb;

/// The response header that says the node reads `PutStreamRequest.more`; its value is the
/// most puts one request may carry (`grpc.put-stream-max-in-flight`). A client packs puts
/// only when it is there, since a node that predates it would drop the packed puts unseen
/// (protobuf skips fields it does not know).
pub const PACKS_HEADER: &str = "hasync-put-stream-packs";

/// One request's answer, boxed (the node's waits are opaque futures).
type Answer = Pin<Box<dyn Future<Output = pb::PutStreamResponse> + Send>>;

/// One put's answer as owed: decided at its start (refused), or its put's wait.
enum Owed {
    Refused(pb::PutStreamResponse),
    Pending(u64, crate::node::PendingPut),
}

impl Owed {
    async fn answer(self) -> pb::PutStreamResponse {
        match self {
            Owed::Refused(answer) => answer,
            Owed::Pending(id, pending) => match put_response(pending.outcome().await) {
                Ok(response) => pb::PutStreamResponse {
                    id,
                    response: Some(response),
                    error_code: 0,
                    error: String::new(),
                    more: Vec::new(),
                },
                Err(status) => refusal(id, &status),
            },
        }
    }
}

/// The answers of one PutStream call.
pub(crate) struct PutStream {
    service: MessagesService,
    inbound: Streaming<pb::PutStreamRequest>,
    born_host: SocketAddr,
    /// Requests begun and not yet answered, oldest first.
    in_flight: FuturesOrdered<Answer>,
    /// The size and the number of puts of each request in `in_flight`, in the same order.
    sizes: VecDeque<(usize, usize)>,
    in_flight_bytes: usize,
    in_flight_puts: usize,
    max_in_flight: usize,
    max_in_flight_bytes: usize,
    /// The client half-closed, or its stream failed (then `ending` says how).
    inbound_done: bool,
    /// The error that ends the call once every begun put was answered.
    ending: Option<Status>,
    /// Fires when the control plane stops: nothing more is read, the call ends once every
    /// begun put was answered.
    stopping: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    finished: bool,
}

impl PutStream {
    pub(crate) fn new(
        service: MessagesService,
        inbound: Streaming<pb::PutStreamRequest>,
        born_host: SocketAddr,
    ) -> Self {
        let grpc = &service.node().config().grpc;
        let stopping = Box::pin(service.stop_token().clone().cancelled_owned());
        let (max_in_flight, max_in_flight_bytes) = (
            grpc.put_stream_max_in_flight as usize,
            grpc.put_stream_max_in_flight_bytes.0 as usize,
        );
        Self {
            service,
            inbound,
            born_host,
            in_flight: FuturesOrdered::new(),
            sizes: VecDeque::new(),
            in_flight_bytes: 0,
            in_flight_puts: 0,
            max_in_flight,
            max_in_flight_bytes,
            inbound_done: false,
            ending: None,
            stopping,
            finished: false,
        }
    }

    /// Whether another request may be read: under both limits, or nothing in flight (one
    /// request of any accepted size always fits; the puts of a request read under the limits
    /// may take them past it, by at most one request).
    fn has_room(&self) -> bool {
        self.in_flight.is_empty()
            || (self.in_flight_puts < self.max_in_flight
                && self.in_flight_bytes < self.max_in_flight_bytes)
    }

    /// Begins the puts of one request (the put itself, then those in its `more`, in order):
    /// each checked and converted as Put does, admitted and appended now; one answer for them
    /// all joins the queue (the request's own, the others in its `more`).
    fn begin(&mut self, mut req: pb::PutStreamRequest) {
        let size = req.encoded_len();
        let more = std::mem::take(&mut req.more);
        let puts = 1 + more.len();
        let first = self.begin_one(req);
        let answer: Answer = if more.is_empty() {
            Box::pin(first.answer())
        } else {
            let mut rest = Vec::with_capacity(more.len());
            for put in more {
                rest.push(if put.more.is_empty() {
                    self.begin_one(put)
                } else {
                    let status = Status::invalid_argument(
                        "a put in `more` carries no `more` of its own: nothing of it was stored",
                    );
                    Owed::Refused(refusal(put.id, &status))
                });
            }
            Box::pin(async move {
                let mut answer = first.answer().await;
                answer.more.reserve_exact(rest.len());
                for owed in rest {
                    answer.more.push(owed.answer().await);
                }
                answer
            })
        };
        self.in_flight.push_back(answer);
        self.sizes.push_back((size, puts));
        self.in_flight_bytes += size;
        self.in_flight_puts += puts;
    }

    /// Begins one put: refused at once, or admitted and appended.
    fn begin_one(&self, req: pb::PutStreamRequest) -> Owed {
        let node = self.service.node();
        match node
            .check_master("a put")
            .map_err(Status::from)
            .and_then(|()| self.service.messages(req.messages, self.born_host))
        {
            Err(status) => Owed::Refused(refusal(req.id, &status)),
            Ok(msgs) => Owed::Pending(req.id, node.begin_put(msgs)),
        }
    }

    /// Reads and begins what the client sent, while there is room and it is ready.
    fn read_puts(&mut self, cx: &mut Context<'_>) {
        if !self.inbound_done && self.stopping.as_mut().poll(cx).is_ready() {
            self.inbound_done = true;
            self.ending = Some(Status::unavailable(
                "the node is shutting down: puts sent after the last answer were not read, \
                 nothing of them was stored",
            ));
        }
        while !self.inbound_done && self.has_room() {
            match Pin::new(&mut self.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(req))) if req.more.len() >= self.max_in_flight => {
                    // Bounded: a pack never holds more puts than the limit lets in flight.
                    self.inbound_done = true;
                    self.ending = Some(Status::invalid_argument(format!(
                        "a request packs {} puts, above grpc.put-stream-max-in-flight ({}): \
                         nothing of it was stored; send at most that many per request",
                        req.more.len() + 1,
                        self.max_in_flight
                    )));
                }
                Poll::Ready(Some(Ok(req))) => self.begin(req),
                Poll::Ready(Some(Err(status))) => {
                    self.inbound_done = true;
                    self.ending = Some(status);
                }
                Poll::Ready(None) => self.inbound_done = true,
                Poll::Pending => break,
            }
        }
    }
}

/// The answer to a put refused with an error (nothing stored).
fn refusal(id: u64, status: &Status) -> pb::PutStreamResponse {
    pb::PutStreamResponse {
        id,
        response: None,
        error_code: status.code() as i32,
        error: status.message().to_owned(),
        more: Vec::new(),
    }
}

impl Stream for PutStream {
    type Item = Result<pb::PutStreamResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.finished {
            return Poll::Ready(None);
        }
        self.read_puts(cx);
        match self.in_flight.poll_next_unpin(cx) {
            Poll::Ready(Some(answer)) => {
                let (size, puts) = self.sizes.pop_front().unwrap_or((0, 0));
                self.in_flight_bytes -= size.min(self.in_flight_bytes);
                self.in_flight_puts -= puts.min(self.in_flight_puts);
                // Room again: read what waits (its waker registered for the next round).
                self.read_puts(cx);
                Poll::Ready(Some(Ok(answer)))
            }
            // Nothing in flight: done when the client is, else wait for its next put.
            Poll::Ready(None) if self.inbound_done => {
                self.finished = true;
                Poll::Ready(self.ending.take().map(Err))
            }
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for PutStream {
    /// The call ended with puts still waiting (cancelled, or its deadline passed): they are
    /// stored; their waits finish in a task of their own so their outcomes are still recorded.
    fn drop(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let mut rest = std::mem::take(&mut self.in_flight);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { while rest.next().await.is_some() {} });
        }
    }
}
