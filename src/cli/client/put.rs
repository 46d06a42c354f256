//! `hasync put --topic T [--count N --size S | --body B] [--batch M] [--in-flight K]`: puts of
//! M messages each on one `PutStream`, up to K sent ahead of their answers, a progress bar on a
//! terminal for large counts, then a summary of the statuses, offsets, throughput and per-put
//! latency (from sending a put to its answer). A status other than PUT_OK ends
//! the run (unless `--keep-going`) and the exit code is 6, naming the status. A slave's
//! refusal naming its master is followed there once (unless `--no-follow`).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;

use crate::cli::client::format::bytes as human_bytes;
use crate::cli::client::{Client, Connection, Failure, FailureKind, block_on};
use crate::config::units::ByteSize;
use crate::control::pb;
use tonic::Status;

/// Body size when neither --size nor --body is given.
const SIZE_DEFAULT: u64 = 256;
/// A progress bar is drawn (on a terminal) from this many requests on.
const PROGRESS_FROM_REQUESTS: u64 = 20;

/// Arguments of `hasync put`.
#[derive(Debug, Clone, Args)]
pub struct PutArgs {
    /// Topic of the messages.
    #[arg(long)]
    pub(crate) topic: String,
    /// How many messages to put.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: u64,
    /// Body size of generated messages ("256B", "4KiB"); default 256B.
    #[arg(long, value_name = "SIZE", conflicts_with = "body")]
    pub(crate) size: Option<ByteSize>,
    /// The body of every message (UTF-8 text), instead of generated ones.
    #[arg(long, value_name = "TEXT")]
    pub(crate) body: Option<String>,
    /// Messages per Put request (stored all or none; the node allows up to
    /// grpc.max-messages-per-put).
    #[arg(long, value_name = "M", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch: u32,
    /// Puts sent ahead of their answers on one PutStream (each answered in order with its own
    /// status); 1 sends the next put only after the previous answer. Puts that may go at once
    /// travel packed in one request when the node reads `PutStreamRequest.more`.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) in_flight: u32,
    /// Consume queue id of the messages.
    #[arg(long, default_value_t = 0)]
    pub(crate) queue_id: i32,
    /// Tags of the messages (the TAGS property).
    #[arg(long, default_value = "")]
    pub(crate) tags: String,
    /// Keys of the messages, space-separated (the KEYS property).
    #[arg(long, default_value = "")]
    pub(crate) keys: String,
    /// Go on after a status other than PUT_OK (the exit code is still 6).
    #[arg(long)]
    pub(crate) keep_going: bool,
    /// Do not follow a slave's refusal to the master it names (by default the put goes
    /// there, once, and says so).
    #[arg(long)]
    pub(crate) no_follow: bool,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// A generated body: "message N " repeated to `size` bytes, so bodies differ and read back
/// recognisably.
pub fn generated_body(index: u64, size: usize) -> Bytes {
    let unit = format!("message {index} ");
    Bytes::from(unit.bytes().cycle().take(size).collect::<Vec<u8>>())
}

/// What the run saw.
struct Tally {
    statuses: Vec<(&'static str, u64)>,
    /// Puts answered (a packed request carries several).
    puts: u64,
    messages: u64,
    body_bytes: u64,
    first_offset: Option<i64>,
    end_offset: Option<i64>,
    latency_us: Histogram<u64>,
    /// The first status other than PUT_OK: (status, first message, messages, stored, detail).
    first_bad: Option<(&'static str, u64, u64, bool, String)>,
}

impl Tally {
    fn count(&mut self, status: &'static str, n: u64) {
        match self.statuses.iter_mut().find(|(s, _)| *s == status) {
            Some((_, c)) => *c += n,
            None => self.statuses.push((status, n)),
        }
    }
}

/// Runs `hasync put`.
pub(crate) fn run(args: PutArgs) -> Result<(), Failure> {
    // The node's own rule, checked before anything is sent.
    crate::metadata::names::check_topic(&args.topic)
        .map_err(|e| Failure::new(FailureKind::Usage, format!("--topic: {e}")))?;
    block_on(async move {
        let mut client = Client::connect(&args.conn).await?;
        let started = Instant::now();
        let (tally, error) = put_all(&mut client, &args).await;
        if tally.puts > 0 {
            print_summary(&client, &args, &tally, started.elapsed());
        }
        if let Some(e) = error {
            return Err(e);
        }
        match &tally.first_bad {
            None => Ok(()),
            Some((status, first, n, stored, detail)) => {
                let left = args.count - tally.messages;
                let left =
                    if left > 0 { format!("; {left} message(s) not sent") } else { String::new() };
                let range = format!("{first}..{}", first + n);
                let stored = if *stored { "stored on the master" } else { "NOT stored" };
                Err(Failure::new(
                    FailureKind::PutNotOk,
                    format!(
                        "{status} for message(s) {range} of {} ({stored}): {detail}{left}",
                        args.count
                    ),
                ))
            }
        }
    })
}

/// One put sent and not yet answered: its first message, message count, body bytes, when sent.
struct Sent {
    first: u64,
    n: u64,
    body_bytes: u64,
    at: Instant,
}

async fn put_all(client: &mut Client, args: &PutArgs) -> (Tally, Option<Failure>) {
    let mut tally = Tally {
        statuses: Vec::new(),
        puts: 0,
        messages: 0,
        body_bytes: 0,
        first_offset: None,
        end_offset: None,
        latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds"),
        first_bad: None,
    };
    let bar = progress_bar(args.count, args.count.div_ceil(u64::from(args.batch)));
    let error = stream_puts(client, args, &mut tally, bar.as_ref()).await.err();
    if let Some(b) = bar {
        if error.is_some() { b.abandon() } else { b.finish_and_clear() }
    }
    (tally, error)
}

/// The messages of the put starting at message `first`.
fn put_messages(args: &PutArgs, first: u64, n: u64) -> Vec<pb::Message> {
    let size = args.size.map_or(SIZE_DEFAULT, ByteSize::bytes) as usize;
    (first..first + n)
        .map(|i| pb::Message {
            topic: args.topic.clone(),
            queue_id: args.queue_id,
            tags: args.tags.clone(),
            keys: args.keys.clone(),
            properties: Default::default(),
            body: match &args.body {
                Some(b) => Bytes::from(b.clone().into_bytes()),
                None => generated_body(i, size),
            },
            flag: 0,
        })
        .collect()
}

/// The bodies one packed request carries at most, about (well under the node's default
/// `grpc.max-request-size` of 16 MiB; a single larger put still goes, alone).
pub(crate) const PACK_BYTES: u64 = 1 << 20;

/// Sends the puts on one PutStream, up to `--in-flight` ahead of their answers, and counts
/// each answer in order. After a status other than PUT_OK (without --keep-going) nothing more
/// is sent; the answers of what was sent are still counted. A put refused with an error
/// ends the run with it.
async fn stream_puts(
    client: &mut Client,
    args: &PutArgs,
    tally: &mut Tally,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<(), Failure> {
    let in_flight = args.in_flight as usize;
    let mut sender = None;
    let open = |c: Client| {
        let (tx, rx) = tokio::sync::mpsc::channel(in_flight);
        sender = Some(tx);
        async move {
            let r =
                c.messages().put_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await?;
            let most = r.metadata().get(crate::control::put_stream::PACKS_HEADER);
            let most = most.and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
            Ok(tonic::Response::new((most, r.into_inner())))
        }
    };
    let (most, mut answers) = client.call_on_master("Put", !args.no_follow, open).await?;
    // The puts ready at once travel in one request when the node reads `more`: at most as
    // many as it lets in one request, and about PACK_BYTES of bodies (one put always goes).
    let pack = most.unwrap_or(1).clamp(1, in_flight);
    let mut ready = std::collections::VecDeque::<pb::PutStreamResponse>::new();
    let Some(tx) = sender else {
        return Err(Failure::new(FailureKind::Other, "the put stream was not opened"));
    };
    let mut tx = Some(tx);
    let mut sent: std::collections::VecDeque<Sent> = std::collections::VecDeque::new();
    let (batch, mut next, mut stop) = (u64::from(args.batch), 0u64, false);
    // The node stopped taking puts (the request side closed under us), and the first put
    // refused with an error: either ends the run with an error once the answers of what was
    // sent are counted (those puts may be stored: they are never left out of the summary).
    let (mut send_closed, mut refused) = (false, None::<Failure>);
    loop {
        // Answers of a packed response are counted before anything more is sent, so that the
        // room they free goes out in one request.
        while !stop && next < args.count && sent.len() < in_flight && ready.is_empty() {
            let Some(t) = tx.as_ref() else { break };
            let (mut puts, mut at, mut bytes) = (Vec::new(), next, 0u64);
            while at < args.count
                && sent.len() + puts.len() < in_flight
                && puts.len() < pack
                && (puts.is_empty() || bytes < PACK_BYTES)
            {
                let n = batch.min(args.count - at);
                let messages = put_messages(args, at, n);
                let body_bytes = messages.iter().map(|m| m.body.len() as u64).sum();
                puts.push((
                    pb::PutStreamRequest { id: at, messages, more: Vec::new() },
                    n,
                    body_bytes,
                ));
                bytes += body_bytes;
                at += n;
            }
            let mut sents = Vec::with_capacity(puts.len());
            let mut puts = puts.into_iter().map(|(request, n, body_bytes)| {
                sents.push((request.id, n, body_bytes));
                request
            });
            let Some(mut request) = puts.next() else { break };
            request.more = puts.collect();
            if t.send(request).await.is_err() {
                (send_closed, stop) = (true, true);
                break;
            }
            let now = Instant::now();
            for (first, n, body_bytes) in sents {
                sent.push_back(Sent { first, n, body_bytes, at: now });
            }
            next = at;
        }
        if stop || next >= args.count {
            // Half-close: the node answers what it has and ends the stream.
            tx = None;
        }
        if sent.is_empty() {
            if let Some(e) = refused {
                return Err(e);
            }
            if !send_closed {
                return Ok(());
            }
            // Why the node stopped reading: its final status, when it gave one.
            let status = tokio::time::timeout(client.timeout(), answers.message()).await;
            let why = match status {
                Ok(Err(status)) => return Err(client.failure("Put", &status)),
                _ => "the node closed the put stream",
            };
            return Err(Failure::new(
                FailureKind::Unreachable,
                format!("{why} after {next} of {} message(s) were sent", args.count),
            ));
        }
        let next_answer = async {
            match ready.pop_front() {
                Some(a) => Ok(Ok(Some(a))),
                None => tokio::time::timeout(client.timeout(), answers.message()).await,
            }
        };
        let answer = match next_answer.await {
            Ok(Ok(Some(mut a))) => {
                ready.extend(std::mem::take(&mut a.more));
                a
            }
            Ok(Ok(None)) => {
                return Err(Failure::new(
                    FailureKind::Other,
                    format!("the node ended the put stream with {} put(s) unanswered", sent.len()),
                ));
            }
            Ok(Err(status)) => return Err(client.failure("Put", &status)),
            Err(_) => return Err(client.no_answer("Put")),
        };
        let Some(put) = sent.pop_front() else { return Ok(()) };
        let micros = u64::try_from(put.at.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = tally.latency_us.record(micros.min(3_600_000_000));
        if answer.id != put.first {
            return Err(Failure::new(
                FailureKind::Other,
                format!("answer for put {} came where put {} was due", answer.id, put.first),
            ));
        }
        let out = match answer.response {
            Some(out) if answer.error_code == 0 => out,
            _ => {
                // Nothing more is sent; the answers of the puts already sent still count.
                let status = Status::new(tonic::Code::from(answer.error_code), answer.error);
                if refused.is_none() {
                    let later = sent.len();
                    let mut e = client.failure("Put", &status);
                    if later > 0 {
                        e = Failure::new(
                            e.kind,
                            format!(
                                "{} (put of message(s) {}..{}; the {later} put(s) sent after it \
                                 are counted above)",
                                e.message,
                                put.first,
                                put.first + put.n
                            ),
                        );
                    }
                    refused = Some(e);
                }
                stop = true;
                continue;
            }
        };
        let status = pb::PutStatus::try_from(out.status).unwrap_or(pb::PutStatus::Unspecified);
        tally.count(status.as_str_name(), put.n);
        tally.puts += 1;
        tally.messages += put.n;
        tally.body_bytes += put.body_bytes;
        if out.stored {
            tally.first_offset = tally.first_offset.or(out.results.first().map(|r| r.offset));
            tally.end_offset = Some(out.end_offset);
        }
        if let Some(b) = bar {
            b.inc(put.n);
            let rate = b.position() as f64 / b.elapsed().as_secs_f64().max(1e-3);
            b.set_message(format!("{rate:.0} msg/s"));
        }
        if status != pb::PutStatus::PutOk {
            if tally.first_bad.is_none() {
                tally.first_bad =
                    Some((status.as_str_name(), put.first, put.n, out.stored, out.detail));
            }
            stop |= !args.keep_going;
        }
    }
}

fn progress_bar(messages: u64, requests: u64) -> Option<indicatif::ProgressBar> {
    if requests < PROGRESS_FROM_REQUESTS || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(messages),
        indicatif::ProgressDrawTarget::stderr(),
    );
    let style = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} msgs, {msg}, eta {eta}",
    )
    .map(|s| s.progress_chars("=> "));
    if let Ok(style) = style {
        bar.set_style(style);
    }
    Some(bar)
}

fn ms(micros: u64) -> String {
    format!("{:.2}ms", micros as f64 / 1000.0)
}

fn print_summary(client: &Client, args: &PutArgs, t: &Tally, elapsed: Duration) {
    println!(
        "put {} message(s) to topic {} on {} in {} put(s) of up to {} message(s), {} of bodies",
        t.messages,
        args.topic,
        client.url(),
        t.puts,
        args.batch,
        human_bytes(t.body_bytes as i64)
    );
    for (status, n) in &t.statuses {
        println!("  {status:<22} {n} message(s)");
    }
    match (t.first_offset, t.end_offset) {
        (Some(first), Some(end)) => println!("offsets {first}..{end}"),
        _ => println!("offsets none (nothing stored)"),
    }
    let secs = elapsed.as_secs_f64().max(1e-9);
    println!(
        "elapsed {:.3}s: {:.0} msg/s, {}/s of bodies",
        elapsed.as_secs_f64(),
        t.messages as f64 / secs,
        human_bytes((t.body_bytes as f64 / secs) as i64)
    );
    let h = &t.latency_us;
    println!(
        "latency per request: min {}  p50 {}  p99 {}  max {}",
        ms(h.min()),
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max())
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A Messages service that records how many puts each PutStream request carried. With
    /// `packs: None` it is an older node: it says nothing of packing and answers a request's
    /// first put only (it would not know `more`); with `Some(n)` it says it takes n per request
    /// and answers them all.
    struct Recorder {
        packs: Option<usize>,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    fn ok(id: u64) -> pb::PutStreamResponse {
        let response = pb::PutResponse {
            status: pb::PutStatus::PutOk as i32,
            stored: true,
            ..Default::default()
        };
        pb::PutStreamResponse { id, response: Some(response), ..Default::default() }
    }

    #[tonic::async_trait]
    impl pb::messages_server::Messages for Recorder {
        async fn put(
            &self,
            _: tonic::Request<pb::PutRequest>,
        ) -> Result<tonic::Response<pb::PutResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("PutStream only"))
        }

        type PutStreamStream = std::pin::Pin<
            Box<
                dyn futures_util::Stream<Item = Result<pb::PutStreamResponse, tonic::Status>>
                    + Send,
            >,
        >;

        async fn put_stream(
            &self,
            request: tonic::Request<tonic::Streaming<pb::PutStreamRequest>>,
        ) -> Result<tonic::Response<Self::PutStreamStream>, tonic::Status> {
            use futures_util::StreamExt as _;
            let (seen, packs) = (Arc::clone(&self.seen), self.packs);
            let answers = request.into_inner().map(move |put| {
                let put = put?;
                seen.lock().unwrap().push(1 + put.more.len());
                let more = if packs.is_some() {
                    put.more.iter().map(|p| ok(p.id)).collect()
                } else {
                    Vec::new()
                };
                Ok(pb::PutStreamResponse { more, ..ok(put.id) })
            });
            let mut response = tonic::Response::new(Box::pin(answers) as Self::PutStreamStream);
            if let Some(n) = packs {
                let n = n.to_string().parse().expect("digits");
                response.metadata_mut().insert(crate::control::put_stream::PACKS_HEADER, n);
            }
            Ok(response)
        }

        async fn read(
            &self,
            _: tonic::Request<pb::ReadRequest>,
        ) -> Result<tonic::Response<pb::ReadResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("PutStream only"))
        }
    }

    /// `hasync put --count 40 --in-flight 8` against a Recorder: the puts each request carried.
    async fn put_40_in_flight_8(packs: Option<usize>) -> (Tally, Vec<usize>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = Recorder { packs, seen: Arc::clone(&seen) };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::messages_server::MessagesServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            put: PutArgs,
        }
        let argv = ["put", "--topic", "T", "--count", "40", "--in-flight", "8", "--grpc", &url];
        let args = <Cli as clap::Parser>::try_parse_from(argv).unwrap().put;
        let mut client = Client::connect(&args.conn).await.unwrap();
        let (tally, error) = put_all(&mut client, &args).await;
        server.abort();
        assert!(error.is_none(), "{:?}", error.map(|e| e.to_string()));
        let seen = seen.lock().unwrap().clone();
        (tally, seen)
    }

    /// A node that does not say it takes packed puts gets one put per request (an older node
    /// would drop the packed ones unseen); one that says n gets up to n per request.
    #[tokio::test]
    async fn put_packs_only_for_a_node_that_says_it_takes_packs_and_no_more_than_it_says() {
        let (tally, seen) = put_40_in_flight_8(None).await;
        assert_eq!((tally.puts, tally.messages), (40, 40));
        assert_eq!(tally.statuses, vec![("PUT_OK", 40)]);
        assert_eq!(seen, vec![1; 40], "puts per request to a node without the header");

        let (tally, seen) = put_40_in_flight_8(Some(4)).await;
        assert_eq!((tally.puts, tally.messages), (40, 40));
        assert_eq!(seen.iter().sum::<usize>(), 40, "{seen:?}");
        assert!(seen.iter().all(|&n| (1..=4).contains(&n)), "more than the node takes: {seen:?}");
        // Eight puts are ready at the start: the first request carries as many as it may.
        assert_eq!(seen[0], 4, "{seen:?}");
    }

    #[test]
    fn generated_bodies_have_the_size_and_name_their_index() {
        assert_eq!(&generated_body(7, 20)[..], b"message 7 message 7 ");
        assert_eq!(generated_body(123, 4096).len(), 4096);
        assert!(generated_body(0, 0).is_empty());
    }
}
