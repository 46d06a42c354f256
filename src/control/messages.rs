//! `hasync.v1.Messages`: Put and Read.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::control::{convert, pb, put_stream};
use crate::node::{Node, PutOutcome, PutStatus};
use crate::store::record::{self, Decoded, Message};
use crate::store::{CommitLog, Unreadable};

const READ_BYTES_DEFAULT: i64 = 1 << 20;
const READ_BYTES_MAX: i64 = 16 << 20;
const READ_MESSAGES_DEFAULT: u32 = 32;
const READ_MESSAGES_MAX: u32 = 1024;

pub(crate) struct MessagesService {
    node: Arc<Node>,
    store_host: SocketAddr,
    /// Cancelled when the control plane stops: open put streams end.
    stop: CancellationToken,
}

impl MessagesService {
    pub(crate) fn new(node: Arc<Node>, grpc_addr: SocketAddr, stop: CancellationToken) -> Self {
        let mut store_host = grpc_addr;
        if store_host.ip().is_unspecified() {
            store_host.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Self { node, store_host, stop }
    }
}

impl MessagesService {
    /// A put's messages checked and converted as Put checks them (nothing stored on an
    /// error): INVALID_ARGUMENT for none, too many, or a bad one.
    pub(crate) fn messages(
        &self,
        messages: Vec<pb::Message>,
        born_host: SocketAddr,
    ) -> Result<Vec<Message>, Status> {
        let limit = self.node.config().grpc.max_messages_per_put as usize;
        if messages.is_empty() {
            return Err(Status::invalid_argument("no messages"));
        }
        if messages.len() > limit {
            return Err(Status::invalid_argument(format!(
                "{} messages in one put; grpc.max-messages-per-put is {limit}",
                messages.len()
            )));
        }
        let max_body = self.node.config().store.max_message_size.0 as usize;
        messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| convert::message(i, m, born_host, self.store_host, max_body))
            .collect()
    }

    /// The node's shared handle (the streaming put begins its puts on it).
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Cancelled when the control plane stops.
    pub(crate) fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }
}

/// Put's answer to an outcome: MESSAGE_ILLEGAL is INVALID_ARGUMENT (nothing stored).
pub(crate) fn put_response(out: PutOutcome) -> Result<pb::PutResponse, Status> {
    if out.status == PutStatus::MessageIllegal {
        return Err(Status::invalid_argument(out.detail.unwrap_or_default()));
    }
    Ok(pb::PutResponse {
        status: convert::put_status(out.status) as i32,
        stored: out.stored,
        results: out
            .records
            .iter()
            .map(|r| pb::PutResult {
                offset: r.offset as i64,
                size: r.size as i32,
                queue_offset: r.queue_offset,
            })
            .collect(),
        end_offset: out.end_offset as i64,
        detail: out.detail.unwrap_or_default(),
        epoch: out.epoch,
    })
}

/// The address a call came from (0.0.0.0:0 when the transport does not say).
pub(crate) fn born_host<T>(request: &Request<T>) -> SocketAddr {
    request.remote_addr().unwrap_or_else(|| ([0, 0, 0, 0], 0).into())
}

/// A begun put awaited where it is; if the call is dropped first (the client went away or its
/// deadline passed), the rest of the wait moves to a task of its own, so the put's outcome is
/// still recorded (its metric) and nothing waits on a dropped call. No task per put otherwise:
/// a spawned put lands on another worker thread as often as not, and every wake-up across
/// threads costs tens of microseconds on a small virtual machine.
struct DetachOnDrop(Option<Pin<Box<dyn Future<Output = PutOutcome> + Send>>>);

impl Future for DetachOnDrop {
    type Output = PutOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PutOutcome> {
        let Some(wait) = self.0.as_mut() else {
            // Polled again after it answered (futures are not): nothing more to say.
            return Poll::Ready(PutOutcome {
                status: PutStatus::ServiceNotAvailable,
                stored: false,
                records: Vec::new(),
                end_offset: 0,
                detail: Some("the put was already answered".into()),
                epoch: 0,
            });
        };
        let out = std::task::ready!(wait.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(out)
    }
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if let Some(wait) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                wait.await;
            });
        }
    }
}

#[tonic::async_trait]
impl pb::messages_server::Messages for MessagesService {
    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        self.node.check_master("a put")?;
        let born_host = born_host(&request);
        let msgs = self.messages(request.into_inner().messages, born_host)?;
        let pending = self.node.begin_put(msgs);
        let out = DetachOnDrop(Some(Box::pin(pending.outcome()))).await;
        put_response(out).map(Response::new)
    }

    type PutStreamStream = put_stream::PutStream;

    async fn put_stream(
        &self,
        request: Request<Streaming<pb::PutStreamRequest>>,
    ) -> Result<Response<Self::PutStreamStream>, Status> {
        self.node.check_master("a put stream")?;
        let born_host = born_host(&request);
        let service = Self {
            node: Arc::clone(&self.node),
            store_host: self.store_host,
            stop: self.stop.clone(),
        };
        let most = self.node.config().grpc.put_stream_max_in_flight;
        let answers = put_stream::PutStream::new(service, request.into_inner(), born_host);
        let mut response = Response::new(answers);
        response.metadata_mut().insert(put_stream::PACKS_HEADER, most.into());
        Ok(response)
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let req = request.into_inner();
        let store = self.node.store();
        let (min, max) = (store.min_offset(), store.max_offset());
        let range = format!("valid range is [{min}, {max}]");
        let offset = u64::try_from(req.offset).map_err(|_| {
            Status::out_of_range(format!("offset {} is negative; {range}", req.offset))
        })?;
        if offset < min || offset > max {
            return Err(Status::out_of_range(format!(
                "offset {offset} is outside the store; {range}"
            )));
        }
        if req.max_bytes < 0 {
            return Err(Status::invalid_argument("max_bytes is negative"));
        }
        let max_bytes =
            if req.max_bytes == 0 { READ_BYTES_DEFAULT } else { req.max_bytes.min(READ_BYTES_MAX) };
        let max_messages = if req.max_messages == 0 {
            READ_MESSAGES_DEFAULT
        } else {
            req.max_messages.min(READ_MESSAGES_MAX)
        };
        // Whole records ending at or below the readable end only (what a failover cannot cut,
        // unless the caller asks for everything); nothing past it, `next` left where it was.
        let end = if req.include_unconfirmed { max } else { self.node.readable_offset() };
        let mut it = store.records_from(offset);
        let mut messages = Vec::new();
        let mut bytes = 0i64;
        let mut next = offset;
        let mut unreadable_first = None;
        while messages.len() < max_messages as usize && (messages.is_empty() || bytes < max_bytes) {
            let Some(rec) = it.next() else {
                if it.offset() <= end {
                    next = it.offset().max(next);
                }
                break;
            };
            let rec = match rec {
                Ok(rec) => rec,
                // The good records before damage are answered; `next` stops at the damaged
                // one, where the next Read answers DATA_LOSS.
                Err(_) if !messages.is_empty() => break,
                Err(e) => {
                    unreadable_first = Some(e);
                    break;
                }
            };
            let rec_end = rec.offset + rec.bytes.len() as u64;
            if rec_end > end {
                break;
            }
            let Ok(Decoded::Message(view)) = record::decode(&rec.bytes, rec.offset as i64) else {
                return Err(Status::internal(format!("record at {} does not decode", rec.offset)));
            };
            if !messages.is_empty() && bytes + i64::from(view.total_size) > max_bytes {
                break;
            }
            bytes += i64::from(view.total_size);
            messages.push(convert::stored(&view, rec.offset));
            next = rec_end;
        }
        if let Some(e) = unreadable_first {
            return Err(unreadable(Arc::clone(store), offset, &e, &range).await);
        }
        Ok(Response::new(pb::ReadResponse {
            messages,
            next_offset: next as i64,
            min_offset: min as i64,
            max_offset: max as i64,
        }))
    }
}

/// The answer for a Read whose first record could not be read: DATA_LOSS naming the file,
/// offset and what failed when a record starts there (or the records break off before it),
/// INVALID_ARGUMENT when `offset` lies inside a record. A stop past `offset` (the walk crossed
/// an end-of-file blank first) is at a record start: DATA_LOSS as the store reported it.
/// [`CommitLog::unreadable_at`] reads the segment file: it runs on a blocking thread.
async fn unreadable(
    store: Arc<CommitLog>,
    offset: u64,
    e: &crate::store::Error,
    range: &str,
) -> Status {
    let stopped_at = match e {
        crate::store::Error::Corruption { offset, .. } => *offset,
        _ => offset,
    };
    if stopped_at != offset {
        return Status::data_loss(format!("damaged record: {e}"));
    }
    let found = match tokio::task::spawn_blocking(move || store.unreadable_at(offset)).await {
        Ok(found) => found,
        Err(e) => return Status::internal(format!("the damage check at {offset} failed: {e}")),
    };
    match found {
        Some(Unreadable::Damaged(d)) => Status::data_loss(format!(
            "damaged record in {} at offset {}: {}; the records before it are readable \
             (`hasync verify` lists the damage)",
            d.file.display(),
            d.offset,
            d.reason
        )),
        Some(Unreadable::NotARecordStart { record_start }) => Status::invalid_argument(format!(
            "offset {offset} is not the start of a record (the record holding it starts at \
             {record_start}); {range}"
        )),
        // The record reads now: the log changed under the read (a truncate).
        None => Status::aborted(format!("the log changed while reading at {offset}; read again")),
    }
}
