//! `hasync.v1.Messages/PutStream` end to end: order, per-put status in SYNC mode with a
//! stalled slave, flow control against a client that stops reading, and cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hasync::config::{ReplicationMode, Role};
use hasync::control::pb::{self, PutStatus, PutStreamRequest, PutStreamResponse};
use tokio_stream::StreamExt as _;
use tonic::Code;

use crate::metrics::scrape;
use crate::support::grpc::*;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};

async fn master(dir: &std::path::Path, mode: ReplicationMode) -> ApiNode {
    let mut c = node_config(dir, Role::Master);
    c.replication.mode = mode;
    c.store.segment_size = hasync::config::units::ByteSize::mib(8);
    ApiNode::start(c).await
}

/// A SYNC master and its slave in sync through a proxy (to stall the slave), with their
/// directories.
async fn proxied_pair() -> ([tempfile::TempDir; 2], ApiNode, Proxy, ApiNode) {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    ([md, sd], m, proxy, s)
}

fn put(id: u64, msgs: Vec<pb::Message>) -> PutStreamRequest {
    PutStreamRequest { id, messages: msgs, more: Vec::new() }
}

/// Opens a PutStream fed by a channel of `room` puts.
async fn open(
    m: &ApiNode,
    room: usize,
) -> (tokio::sync::mpsc::Sender<PutStreamRequest>, tonic::Streaming<PutStreamResponse>) {
    let (tx, rx) = tokio::sync::mpsc::channel(room);
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let answers = m.messages().await.put_stream(stream).await.unwrap().into_inner();
    (tx, answers)
}

/// The bodies of the first 1024 messages stored, read back through Read, as text.
async fn bodies_from_start(m: &ApiNode) -> Vec<String> {
    let read = m
        .messages()
        .await
        .read(pb::ReadRequest { offset: 0, max_messages: 1024, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    read.messages.iter().map(|x| String::from_utf8(x.body.to_vec()).unwrap()).collect()
}

/// The next answer, within 10 s.
async fn next(answers: &mut tonic::Streaming<PutStreamResponse>) -> PutStreamResponse {
    tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("an answer within 10 s")
        .expect("no stream error")
        .expect("the stream goes on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_are_stored_and_answered_in_the_order_sent_and_a_bad_one_does_not_end_the_stream() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    // 300 puts sent without waiting (ids deliberately not increasing), every 7th a batch of
    // 3, put 150 with an empty topic.
    let mut reqs = Vec::new();
    for i in 0..300u64 {
        let n = if i % 7 == 0 { 3 } else { 1 };
        let topic = if i == 150 { "" } else { "T" };
        let msgs = (0..n).map(|j| pb_msg(topic, format!("{i}.{j}").as_bytes())).collect();
        reqs.push(put(1000 - i, msgs));
    }
    let mut answers =
        m.messages().await.put_stream(tokio_stream::iter(reqs.clone())).await.unwrap().into_inner();
    let mut end = 0i64;
    let mut queue_offset = 0i64;
    for (i, req) in reqs.iter().enumerate() {
        let a = next(&mut answers).await;
        assert_eq!(a.id, req.id, "answer {i} is for the put sent {i}th");
        if i == 150 {
            assert_eq!(a.error_code, Code::InvalidArgument as i32, "{a:?}");
            assert!(a.error.contains("topic"), "{a:?}");
            assert!(a.response.is_none());
            continue;
        }
        assert_eq!(a.error_code, 0, "{a:?}");
        let r = a.response.unwrap();
        assert_eq!(r.status(), PutStatus::PutOk, "{r:?}");
        assert_eq!(r.results.len(), req.messages.len());
        // Stored in the order sent: each put starts where the previous one ended.
        assert_eq!(r.results[0].offset, end, "put {i} starts at the previous end");
        for res in &r.results {
            assert_eq!(res.queue_offset, queue_offset);
            queue_offset += 1;
        }
        end = r.end_offset;
    }
    assert!(answers.message().await.unwrap().is_none(), "the stream ends after the last answer");
    assert_eq!(m.node.store().max_offset() as i64, end, "nothing of the bad put was stored");
    // Read back in order.
    assert_eq!(&bodies_from_start(&m).await[..4], ["0.0", "0.1", "0.2", "1.0"]);
    s.stop().await;
    m.stop().await;
}

/// Puts packed in one request (`more`) are puts of their own: stored in the order sent, each
/// all or none, answered together in one response (the first put's answer, the others in its
/// `more`, in order, each with its own id, status and offsets); a bad put or a put carrying a
/// `more` of its own is refused alone, and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_puts_are_each_their_own_put_answered_in_one_response_in_order() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    let one = |id: u64, body: &str| put(id, vec![pb_msg("T", body.as_bytes())]);
    // A pack of 4: a single message, a batch of 2, a bad topic, a nested pack (refused).
    let mut first = one(10, "a");
    let batch = put(11, vec![pb_msg("T", b"b.0"), pb_msg("T", b"b.1")]);
    let bad = put(12, vec![pb_msg("", b"bad")]);
    let mut nested = one(13, "nested");
    nested.more.push(one(14, "inner"));
    first.more = vec![batch, bad, nested];
    // Then a put on its own, then a pack of 3 single messages.
    let alone = one(20, "c");
    let mut pack = one(30, "d");
    pack.more = vec![one(31, "e"), one(32, "f")];
    let requests = vec![first, alone, pack];
    let mut answers =
        m.messages().await.put_stream(tokio_stream::iter(requests)).await.unwrap().into_inner();

    let a = next(&mut answers).await;
    let ids: Vec<u64> = std::iter::once(a.id).chain(a.more.iter().map(|x| x.id)).collect();
    assert_eq!(ids, [10, 11, 12, 13], "one response for the pack, its answers in order");
    let r10 = a.response.clone().unwrap();
    let r11 = a.more[0].response.clone().unwrap();
    assert_eq!((r10.status(), r11.status()), (PutStatus::PutOk, PutStatus::PutOk));
    assert_eq!((r10.results[0].offset, r10.results.len()), (0, 1));
    assert_eq!(r11.results.len(), 2, "a batch in a pack is stored all together");
    assert_eq!(r11.results[0].offset, r10.end_offset, "stored in the order sent");
    let (bad, nested) = (&a.more[1], &a.more[2]);
    assert_eq!(bad.error_code, Code::InvalidArgument as i32, "{bad:?}");
    assert!(bad.error.contains("topic") && bad.response.is_none(), "{bad:?}");
    assert_eq!(nested.error_code, Code::InvalidArgument as i32, "{nested:?}");
    assert!(nested.error.contains("more") && nested.response.is_none(), "{nested:?}");
    assert!(a.more.iter().all(|x| x.more.is_empty()), "answers are never nested further");

    let b = next(&mut answers).await;
    assert_eq!((b.id, b.more.len()), (20, 0), "a request without `more`: one answer");
    let r20 = b.response.unwrap();
    assert_eq!(r20.results[0].offset, r11.end_offset, "nothing of the refused puts was stored");
    let c = next(&mut answers).await;
    let ids: Vec<u64> = std::iter::once(c.id).chain(c.more.iter().map(|x| x.id)).collect();
    assert_eq!(ids, [30, 31, 32]);
    let mut end = r20.end_offset;
    for x in std::iter::once(&c).chain(&c.more) {
        let r = x.response.clone().unwrap();
        assert_eq!((r.status(), r.results[0].offset), (PutStatus::PutOk, end), "{x:?}");
        end = r.end_offset;
    }
    assert!(answers.message().await.unwrap().is_none(), "the stream ends after the last answer");
    assert_eq!(m.node.store().max_offset() as i64, end);
    assert_eq!(bodies_from_start(&m).await, ["a", "b.0", "b.1", "c", "d", "e", "f"]);
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_stalled_slave_each_put_gets_its_own_flush_slave_timeout_in_order() {
    let (_dirs, m, proxy, s) = proxied_pair().await;
    let (tx, mut answers) = open(&m, 8).await;
    // One put acked before the stall.
    tx.send(put(0, vec![pb_msg("T", b"before")])).await.unwrap();
    let a = next(&mut answers).await;
    assert_eq!(a.response.unwrap().status(), PutStatus::PutOk);
    proxy.set_mode(ProxyMode::Stall);
    // Put 1, then put 2 800 ms later (slave-timeout is 2 s).
    let t1 = Instant::now();
    tx.send(put(1, vec![pb_msg("T", b"first")])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t2 = Instant::now();
    tx.send(put(2, vec![pb_msg("T", b"second")])).await.unwrap();
    wait_until(5, "both puts waiting", || m.node.status().pending_sync_puts == 2).await;
    let a1 = next(&mut answers).await;
    let at1 = Instant::now();
    let a2 = next(&mut answers).await;
    let at2 = Instant::now();
    assert_eq!((a1.id, a2.id), (1, 2), "answered in the order sent");
    let (r1, r2) = (a1.response.unwrap(), a2.response.unwrap());
    assert_eq!(r1.status(), PutStatus::FlushSlaveTimeout, "{r1:?}");
    assert_eq!(r2.status(), PutStatus::FlushSlaveTimeout, "{r2:?}");
    assert!(r1.stored && r2.stored, "both are on the master");
    assert!(r1.detail.contains(&r1.end_offset.to_string()), "{r1:?}");
    assert!(r2.detail.contains(&r2.end_offset.to_string()), "{r2:?}");
    assert!(r2.results[0].offset == r1.end_offset, "stored in the order sent");
    // Each waited its own 2 s from its own send: the second was not answered at the first's
    // deadline, nor did the first wait for the second's.
    assert!(at1 - t1 >= Duration::from_millis(1900), "put 1 answered after {:?}", at1 - t1);
    assert!(at2 - t2 >= Duration::from_millis(1900), "put 2 answered after {:?}", at2 - t2);
    assert!(at2 - at1 >= Duration::from_millis(500), "put 2 had its own deadline");
    // The slave comes back: the stream goes on with PUT_OK.
    proxy.set_mode(ProxyMode::Pass);
    wait_until(15, "slave in sync again", || m.node.status().in_sync_replicas == 1).await;
    tx.send(put(3, vec![pb_msg("T", b"after")])).await.unwrap();
    let a3 = next(&mut answers).await;
    assert_eq!((a3.id, a3.response.unwrap().status()), (3, PutStatus::PutOk));
    drop(tx);
    assert!(answers.message().await.unwrap().is_none());
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_answers_holds_the_node_back_without_growing_it() {
    let (_md, m, channel) = held_back_master().await;
    const PUTS: u64 = 20_000;
    let (taken, mut answers) = unread_puts(channel, PUTS, 1).await;
    // Not reading: the node stops once the answers fill the client's window.
    let stored = || m.node.store().max_offset();
    let (held_bytes, held_taken) = until_held_back(&m, &taken).await;
    let record = m.node.store().records_from(0).next().unwrap().unwrap().bytes.len() as u64;
    let held = held_bytes / record;
    assert!(held < PUTS / 2, "the node stored {held} of {PUTS} puts with nobody reading");
    assert!(held_taken < PUTS / 2, "the client sent {held_taken} of {PUTS}");
    assert!(m.node.status().pending_sync_puts == 0);
    // Reading again: everything completes, in order.
    for i in 0..PUTS {
        let a = next(&mut answers).await;
        assert_eq!(a.id, i);
        assert_eq!(a.response.unwrap().status(), PutStatus::PutOk);
    }
    assert!(answers.message().await.unwrap().is_none());
    assert_eq!(stored(), record * PUTS);
    m.stop().await;
}

/// The same with packed puts (8, the limit, per request): the in-flight limit counts puts,
/// not requests, and unread answers still stop the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_packed_answers_holds_the_node_back_too() {
    let (_md, m, channel) = held_back_master().await;
    const PUTS: u64 = 20_000;
    let (taken, mut answers) = unread_puts(channel, PUTS, 8).await;
    let (held_bytes, held_taken) = until_held_back(&m, &taken).await;
    let record = m.node.store().records_from(0).next().unwrap().unwrap().bytes.len() as u64;
    let held = held_bytes / record;
    assert!(held < PUTS / 2, "the node stored {held} of {PUTS} puts with nobody reading");
    assert!(held_taken < PUTS / 2, "the client sent {held_taken} of {PUTS}");
    let mut id = 0;
    while id < PUTS {
        let a = next(&mut answers).await;
        for x in std::iter::once(&a).chain(&a.more) {
            assert_eq!(x.id, id);
            assert_eq!(x.response.as_ref().unwrap().status(), PutStatus::PutOk);
            id += 1;
        }
    }
    assert!(answers.message().await.unwrap().is_none());
    assert_eq!(m.node.store().max_offset(), record * PUTS);
    m.stop().await;
}

/// The node says how many puts a request may pack (the in-flight limit); a request packing
/// more ends the call with INVALID_ARGUMENT naming the limit, after the answers owed before
/// it, and nothing of it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_packing_more_puts_than_the_limit_ends_the_call_storing_nothing_of_it() {
    let (_md, m, channel) = held_back_master().await;
    let mut ok = put(0, vec![pb_msg("T", b"ok")]);
    ok.more = (1..8).map(|i| put(i, vec![pb_msg("T", b"ok")])).collect();
    let mut over = put(8, vec![pb_msg("T", b"over")]);
    over.more = (9..17).map(|i| put(i, vec![pb_msg("T", b"over")])).collect();
    let mut client = pb::messages_client::MessagesClient::new(channel);
    let response = client.put_stream(tokio_stream::iter(vec![ok, over])).await.unwrap();
    let most = response.metadata().get("hasync-put-stream-packs").map(|v| v.to_str().unwrap());
    assert_eq!(most, Some("8"), "the node says how many puts a request may carry");
    let mut answers = response.into_inner();
    let a = next(&mut answers).await;
    assert_eq!((a.id, a.more.len()), (0, 7), "the pack of 8 is answered");
    let e = answers.message().await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("9 puts") && e.message().contains("max-in-flight"), "{e:?}");
    assert_eq!(bodies_from_start(&m).await, vec!["ok"; 8], "nothing of the 9 was stored");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_leaves_its_stored_puts_to_finish_on_the_node() {
    let (_dirs, m, proxy, s) = proxied_pair().await;
    proxy.set_mode(ProxyMode::Stall);
    let (tx, answers) = open(&m, 8).await;
    for i in 0..5 {
        tx.send(put(i, vec![pb_msg("T", b"cancelled")])).await.unwrap();
    }
    wait_until(5, "five puts waiting", || m.node.status().pending_sync_puts == 5).await;
    // The client goes away without a half-close.
    drop(answers);
    drop(tx);
    let stored = m.node.store().max_offset();
    assert!(stored > 0, "the puts were stored");
    // Their waits end on the node at their deadline, and their outcomes are recorded.
    wait_until(10, "waiters completed", || m.node.status().pending_sync_puts == 0).await;
    let metrics = m.running.metrics_addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let x = scrape(metrics).await;
        if x.value("hasync_puts_total", &[("status", "FLUSH_SLAVE_TIMEOUT")]) == 5.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the cancelled puts' outcomes were not recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node goes on: a new stream puts and is answered once the slave is back.
    proxy.set_mode(ProxyMode::Pass);
    wait_until(15, "slave in sync again", || m.node.status().in_sync_replicas == 1).await;
    let (tx, mut answers) = open(&m, 8).await;
    tx.send(put(9, vec![pb_msg("T", b"again")])).await.unwrap();
    let a = next(&mut answers).await;
    assert_eq!((a.id, a.response.unwrap().status()), (9, PutStatus::PutOk));
    assert!(m.node.store().max_offset() > stored);
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_stream_on_a_slave_is_refused_naming_its_master() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Async).await;
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    let stream = tokio_stream::iter(vec![put(0, vec![pb_msg("T", b"x")])]);
    let e = s.messages().await.put_stream(stream).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("slave"), "{e:?}");
    assert_eq!(s.node.store().max_offset(), 0);
    s.stop().await;
    m.stop().await;
}

/// A client that stopped reading answers does not hold a stopping node: the stop ends within
/// its bound although answers wait unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_answers_does_not_hold_the_nodes_stop() {
    let (_md, m, channel) = held_back_master().await;
    let (taken, mut answers) = unread_puts(channel, 20_000, 1).await;
    // Not reading, until the node stops taking puts.
    until_held_back(&m, &taken).await;
    let started = Instant::now();
    let stop = tokio::time::timeout(Duration::from_secs(30), m.stop()).await;
    assert!(stop.is_ok(), "the stop waited 30 s for a client that does not read");
    // Its connection was closed after the first 5 s drain bound; the server task then ended.
    // (Had the close done nothing, the stop would have ended only by the abort after a second
    // 5 s bound, with the connection still open.)
    let took = started.elapsed();
    assert!(took < Duration::from_secs(9), "the stop took {took:?}: the connection was not closed");
    // The connection was closed, not left behind: reading again ends (the answers the node
    // sent, then an error or the end) within a bounded number of answers and time.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        for _ in 0..20_000 {
            match answers.message().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return true,
            }
        }
        false
    })
    .await;
    assert_eq!(ended, Ok(true), "the stream did not end after the stop");
}

/// A client frozen at the TCP level (it reads nothing, so its socket's buffers fill and the
/// node's writes to it block) does not hold the node's stop either: past the drain bound its
/// connection is closed for writing too, so the server ends at once instead of at the abort
/// after a second bound (and the connection ends with the stop, not with a keepalive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_frozen_at_the_tcp_level_does_not_hold_the_nodes_stop() {
    let md = tempfile::tempdir().unwrap();
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Async;
    c.store.segment_size = hasync::config::units::ByteSize::mib(64);
    let m = ApiNode::start(c).await;
    for _ in 0..192 {
        let put = m.node.put(vec![crate::support::msg("T", 0, &[7u8; 15_000])]).await;
        assert_eq!(put.status, hasync::node::PutStatus::PutOk, "{put:?}");
    }
    let proxy = Proxy::start(m.running.grpc_addr(), ProxyMode::Pass).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .initial_stream_window_size(1 << 30)
        .initial_connection_window_size(1 << 30)
        .connect()
        .await
        .unwrap();
    // From now on the client side reads nothing: 16 answers of about 2.9 MB each are far more
    // than the sockets buffer, so the node's writes block.
    proxy.set_mode(ProxyMode::StallReplies);
    let reads: Vec<_> = (0..16)
        .map(|_| {
            let mut client = pb::messages_client::MessagesClient::new(channel.clone());
            tokio::spawn(async move {
                let read = pb::ReadRequest {
                    offset: 0,
                    max_bytes: 3 << 20,
                    max_messages: 1024,
                    include_unconfirmed: true,
                };
                client.read(read).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let stop = tokio::time::timeout(Duration::from_secs(30), m.running.shutdown()).await;
    let took = started.elapsed();
    assert!(matches!(stop, Ok(Ok(()))), "{stop:?}");
    assert!(took < Duration::from_secs(9), "the stop took {took:?}: the connection was not closed");
    for r in reads {
        r.abort();
    }
}

/// An ASYNC master taking at most 8 puts in flight per stream, and a channel to it whose
/// receive windows are HTTP/2's 64 KiB default, so unread answers stop the node soon.
async fn held_back_master() -> (tempfile::TempDir, ApiNode, tonic::transport::Channel) {
    let md = tempfile::tempdir().unwrap();
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Async;
    c.store.segment_size = hasync::config::units::ByteSize::mib(64);
    c.grpc.put_stream_max_in_flight = 8;
    let m = ApiNode::start(c).await;
    let channel = tonic::transport::Endpoint::from_shared(m.url.clone())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    (md, m, channel)
}

/// Waits (at most 10 s) until neither the node's stored bytes nor the puts the client's
/// transport took (`taken`) move over 300 ms; returns both.
async fn until_held_back(m: &ApiNode, taken: &AtomicU64) -> (u64, u64) {
    let state = || (m.node.store().max_offset(), taken.load(Ordering::SeqCst));
    let mut last = state();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = state();
        if now == last && now.0 > 0 {
            return now;
        }
        assert!(Instant::now() < deadline, "the node never stopped taking puts: {now:?}");
        last = now;
    }
}

/// Opens a PutStream on `channel` whose source offers `puts` 1 KiB puts (ids 0..puts), `pack`
/// to a request (the others in its `more`), and counts each put the transport takes; returns
/// the count and the answers (not read yet).
async fn unread_puts(
    channel: tonic::transport::Channel,
    puts: u64,
    pack: u64,
) -> (Arc<AtomicU64>, tonic::Streaming<PutStreamResponse>) {
    let taken = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&taken);
    let body = vec![b'x'; 1024];
    let source = tokio_stream::iter((0..puts).step_by(pack as usize)).map(move |first| {
        let ids = first..(first + pack).min(puts);
        counted.fetch_add(ids.end - ids.start, Ordering::SeqCst);
        let mut request = put(first, vec![pb_msg("T", &body)]);
        request.more = ids.skip(1).map(|i| put(i, vec![pb_msg("T", &body)])).collect();
        request
    });
    let mut client = pb::messages_client::MessagesClient::new(channel);
    (taken, client.put_stream(source).await.unwrap().into_inner())
}
