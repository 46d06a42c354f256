//! A watch: one `Watch` stream per watch, created and confirmed within the call's timeout,
//! then read by a task that forwards etcd's answers as [`WatchBatch`]es until the stream
//! fails, etcd cancels the watch (compaction) or the receiver is dropped (which closes the
//! stream). Watches require a leader: a member cut off from its cluster's leader ends them.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::codec::Streaming;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::pb::etcdserverpb as rpc;
use super::{MAX_ANSWER_BYTES, request, wire};
use crate::coordinator::{Error, Revision, WatchBatch, WatchStream};

/// How many batches a watch buffers before its task waits for the reader.
const WATCH_BUFFER: usize = 64;
/// The metadata key of etcd's require-leader option (`rpctypes.MetadataRequireLeaderKey`).
const REQUIRE_LEADER_KEY: &str = "hasleader";

/// A created watch: etcd's answers, and the request side, kept open while the watch lives.
pub(super) struct Opened {
    answers: Streaming<rpc::WatchResponse>,
    requests: mpsc::Sender<rpc::WatchRequest>,
}

/// The creation of a watch of every key under `prefix` from `from` (0: from now).
pub(super) fn create_request(prefix: &str, from: Revision) -> rpc::WatchRequest {
    let (key, range_end) = wire::prefix_range(prefix);
    rpc::WatchRequest {
        request_union: Some(rpc::watch_request::RequestUnion::CreateRequest(
            rpc::WatchCreateRequest {
                key,
                range_end,
                start_revision: from.max(0),
                ..Default::default()
            },
        )),
    }
}

/// Opens a `Watch` stream on `ch` and waits for etcd to confirm the watch.
pub(super) async fn open(
    ch: Channel,
    create: rpc::WatchRequest,
    token: &Option<MetadataValue<Ascii>>,
) -> Result<tonic::Response<Opened>, Status> {
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(create)
        .await
        .map_err(|_| Status::internal("the watch's request stream closed before it was used"))?;
    let mut client =
        rpc::watch_client::WatchClient::new(ch).max_decoding_message_size(MAX_ANSWER_BYTES);
    let mut req = request(ReceiverStream::new(rx), token);
    // etcd's require-leader: a member that loses its leader ends the stream (after a few
    // election timeouts) instead of keeping it open and silent while the cluster moves on.
    req.metadata_mut().insert(REQUIRE_LEADER_KEY, MetadataValue::from_static("true"));
    let resp = client.watch(req).await?;
    let (meta, mut answers, ext) = resp.into_parts();
    let first = answers.message().await?.ok_or_else(|| {
        Status::unavailable("the watch stream ended before the watch was created")
    })?;
    if first.canceled {
        let reason = format!("etcd cancelled the watch at its creation: {}", first.cancel_reason);
        // etcd puts the error of a refused creation in the reason, as text.
        let r = &first.cancel_reason;
        return Err(if r.contains("invalid auth token") {
            Status::unauthenticated(reason)
        } else if r.contains("permission denied") {
            Status::permission_denied(reason)
        } else {
            Status::failed_precondition(reason)
        });
    }
    if !first.created {
        return Err(Status::unavailable("etcd's first watch answer is not the watch's creation"));
    }
    Ok(tonic::Response::from_parts(meta, Opened { answers, requests }, ext))
}

/// Forwards a created watch's answers to the returned stream (see the module docs).
pub(super) fn spawn(opened: Opened, from: Revision, endpoints: String) -> WatchStream {
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    tokio::spawn(forward(opened, from, endpoints, tx));
    rx
}

async fn forward(
    opened: Opened,
    from: Revision,
    endpoints: String,
    tx: mpsc::Sender<Result<WatchBatch, Error>>,
) {
    let Opened { mut answers, requests } = opened;
    // The revision the next event is expected at (for a compaction's error).
    let mut next = from;
    loop {
        let answer = tokio::select! {
            a = answers.message() => a,
            () = tx.closed() => return,
        };
        let outcome = match answer {
            Ok(Some(resp)) => batch(resp, &mut next),
            Ok(None) => Err(Error::Unavailable {
                endpoints: endpoints.clone(),
                reason: "Watch: etcd ended the watch stream".into(),
            }),
            Err(status) => Err(Error::Unavailable {
                endpoints: endpoints.clone(),
                reason: format!("Watch: {}", wire::describe(&status)),
            }),
        };
        match outcome {
            Ok(None) => {}
            Ok(Some(b)) => {
                if tx.send(Ok(b)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                drop(requests);
                return;
            }
        }
    }
}

/// One answer of etcd: a batch, nothing (a progress notice), or the error that ends the watch.
fn batch(resp: rpc::WatchResponse, next: &mut Revision) -> Result<Option<WatchBatch>, Error> {
    if resp.compact_revision > 0 {
        return Err(Error::Compacted { requested: *next, compact_revision: resp.compact_revision });
    }
    if resp.canceled {
        let reason = match resp.cancel_reason.as_str() {
            "" => "etcd cancelled the watch".to_owned(),
            r => format!("etcd cancelled the watch: {r}"),
        };
        return Err(Error::Refused { call: "Watch", reason });
    }
    if resp.events.is_empty() {
        return Ok(None);
    }
    let revision = wire::revision(resp.header.as_ref());
    let last = resp.events.iter().filter_map(|e| e.kv.as_ref()).map(|kv| kv.mod_revision).max();
    let events: Vec<_> = resp
        .events
        .into_iter()
        .map(wire::watch_event)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    if let Some(rev) = last {
        *next = rev + 1;
    }
    if events.is_empty() {
        return Ok(None);
    }
    Ok(Some(WatchBatch { revision, events }))
}
