//! `hasync read --from OFFSET [--max N] [--json]`: decoded records from a record start, on a
//! master or a slave, as one line per message or as JSON under the proto field names.

use std::fmt::Write as _;

use clap::Args;
use serde_json::{Value, json};

use crate::cli::client::format::{base64, body_preview};
use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::control::pb;

/// The most messages one Read call returns (the node's cap).
const PER_CALL_MAX: u32 = 1024;
/// Characters of a body shown in the table.
const BODY_PREVIEW_CHARS: usize = 60;

/// Arguments of `hasync read`.
#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// Physical offset of a record start (0, or a `next offset` printed by an earlier read).
    #[arg(long, value_name = "OFFSET")]
    pub(crate) from: i64,
    /// Most messages to read (more than 1024 takes several calls).
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max: u32,
    /// Print the ReadResponse as JSON under the proto field names (bodies in base64 as
    /// `body`, and as `body_text` when they are UTF-8).
    #[arg(long)]
    pub(crate) json: bool,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync read`.
pub(crate) fn run(args: ReadArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let mut m = client.messages();
        let mut messages = Vec::new();
        let mut at = args.from;
        let mut last;
        loop {
            let want = (args.max - messages.len() as u32).min(PER_CALL_MAX);
            let req = pb::ReadRequest {
                offset: at,
                max_bytes: 0,
                max_messages: want,
                ..Default::default()
            };
            last = client.call("Read", m.read(req)).await?;
            let got = last.messages.len();
            messages.append(&mut last.messages);
            let moved = last.next_offset != at;
            at = last.next_offset;
            if got == 0 || !moved || messages.len() >= args.max as usize {
                break;
            }
        }
        last.messages = messages;
        if args.json {
            println!("{}", to_json(&last));
        } else {
            print!("{}", render(args.from, &last));
        }
        Ok(())
    })
}

fn message_json(m: &pb::StoredMessage) -> Value {
    let mut v = json!({
        "physical_offset": m.physical_offset,
        "size": m.size,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "flag": m.flag,
        "body": base64(&m.body),
        "tags": m.tags,
        "keys": m.keys,
        "properties": m.properties,
        "born_timestamp_unix_ms": m.born_timestamp_unix_ms,
        "store_timestamp_unix_ms": m.store_timestamp_unix_ms,
        "born_host": m.born_host,
        "store_host": m.store_host,
        "sys_flag": m.sys_flag,
        "reconsume_times": m.reconsume_times,
    });
    if let Ok(text) = std::str::from_utf8(&m.body) {
        v["body_text"] = Value::from(text);
    }
    v
}

/// The response as JSON (proto field names; int64 as numbers).
pub(crate) fn to_json(r: &pb::ReadResponse) -> Value {
    json!({
        "messages": r.messages.iter().map(message_json).collect::<Vec<_>>(),
        "next_offset": r.next_offset,
        "min_offset": r.min_offset,
        "max_offset": r.max_offset,
    })
}

/// One line per message, then where to read next.
pub(crate) fn render(from: i64, r: &pb::ReadResponse) -> String {
    let mut out = String::new();
    let range = format!("the node holds {}..{}", r.min_offset, r.max_offset);
    if r.messages.is_empty() {
        let _ = writeln!(out, "no messages at offset {from} ({range})");
        return out;
    }
    let tw = r.messages.iter().map(|m| m.topic.len()).max().unwrap_or(0).max(5);
    let _ = writeln!(
        out,
        "{:>12}  {:>6}  {:<tw$}  {:>5}  {:>12}  {:<10}  body",
        "offset", "size", "topic", "queue", "queue offset", "tags"
    );
    for m in &r.messages {
        let _ = writeln!(
            out,
            "{:>12}  {:>6}  {:<tw$}  {:>5}  {:>12}  {:<10}  {}",
            m.physical_offset,
            m.size,
            m.topic,
            m.queue_id,
            m.queue_offset,
            m.tags,
            body_preview(&m.body, BODY_PREVIEW_CHARS)
        );
    }
    let _ =
        writeln!(out, "{} message(s); next offset {} ({range})", r.messages.len(), r.next_offset);
    out
}
