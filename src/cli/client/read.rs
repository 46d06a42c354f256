//! `hasync read --from OFFSET [--max N] [--json]`: decoded records from a record start, on a
//! master or a slave, as one line per message or as JSON under the proto field names.
//! `hasync read --tail-file FILE` and `--tail-dir DATA_DIR` read the truncated tails a node
//! kept aside instead ([`super::tail`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};

use crate::cli::client::format::{base64, body_preview};
use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::control::pb;

/// The most messages one Read call returns (the node's cap).
const PER_CALL_MAX: u32 = 1024;
/// Messages read from a node when `--max` is not given.
const DEFAULT_MAX: u32 = 32;
/// Characters of a body shown in the table.
const BODY_PREVIEW_CHARS: usize = 60;

/// Arguments of `hasync read`.
#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// Physical offset of a record start (0, or a `next offset` printed by an earlier read).
    #[arg(long, value_name = "OFFSET", required_unless_present_any = ["tail_file", "tail_dir"])]
    pub(crate) from: Option<i64>,
    /// Most messages to read (more than 1024 takes several calls); default 32 from a node,
    /// every message of a --tail-file.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max: Option<u32>,
    /// Print the ReadResponse as JSON under the proto field names (bodies in base64 as
    /// `body`, and as `body_text` when they are UTF-8).
    #[arg(long)]
    pub(crate) json: bool,
    /// Decode a tail file a node kept aside under <data-dir>/truncated/ (the bytes a truncate
    /// removed) instead of asking a node: its header (range, epochs, cause), its CRC checked,
    /// and its records at the offsets they had in the log. A damaged file is an error.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["from", "tail_dir"])]
    pub(crate) tail_file: Option<PathBuf>,
    /// List the tail files of a data directory (its truncated/ subdirectory) with their
    /// ranges, each checked; a damaged one is named and makes the command fail.
    #[arg(long, value_name = "DATA_DIR", conflicts_with_all = ["from", "max"])]
    pub(crate) tail_dir: Option<PathBuf>,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync read`.
pub(crate) fn run(args: ReadArgs) -> Result<(), Failure> {
    if let Some(file) = &args.tail_file {
        return super::tail::run_file(file, args.max, args.json);
    }
    if let Some(dir) = &args.tail_dir {
        return super::tail::run_dir(dir, args.json);
    }
    let from = args.from.expect("clap requires --from without --tail-file or --tail-dir");
    let max = args.max.unwrap_or(DEFAULT_MAX);
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let mut m = client.messages();
        let mut messages = Vec::new();
        let mut at = from;
        let mut last;
        loop {
            let want = (max - messages.len() as u32).min(PER_CALL_MAX);
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
            if got == 0 || !moved || messages.len() >= max as usize {
                break;
            }
        }
        last.messages = messages;
        if args.json {
            println!("{}", to_json(&last));
        } else {
            print!("{}", render(from, &last));
        }
        Ok(())
    })
}

/// One message as JSON (proto field names; int64 as numbers).
pub(crate) fn message_json(m: &pb::StoredMessage) -> Value {
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
    out.push_str(&message_table(&r.messages));
    let _ =
        writeln!(out, "{} message(s); next offset {} ({range})", r.messages.len(), r.next_offset);
    out
}

/// The messages' table: a header line, then one line per message.
pub(crate) fn message_table(messages: &[pb::StoredMessage]) -> String {
    let mut out = String::new();
    let tw = messages.iter().map(|m| m.topic.len()).max().unwrap_or(0).max(5);
    let _ = writeln!(
        out,
        "{:>12}  {:>6}  {:<tw$}  {:>5}  {:>12}  {:<10}  body",
        "offset", "size", "topic", "queue", "queue offset", "tags"
    );
    for m in messages {
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
    out
}
