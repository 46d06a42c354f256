//! `hasync status [--json] [--watch]`: GetStatus (or the WatchStatus stream) as a table for
//! people or as JSON under the proto field names for scripts. The table renderer is shared with
//! `hasync quickstart`.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use clap::Args;

use crate::cli::client::format::{ago, bytes, millis, rate};
use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::control::pb;

use super::status_json::table_name;
pub(crate) use super::status_json::to_json;

/// Arguments of `hasync status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
    /// Print the GetStatus fields as JSON under their proto names (one object per line with
    /// --watch).
    #[arg(long)]
    pub(crate) json: bool,
    /// Redraw from the WatchStatus stream until Ctrl-C.
    #[arg(long)]
    pub(crate) watch: bool,
    /// Time between --watch updates (the node raises it to at least 100ms).
    #[arg(long, value_name = "DURATION", default_value = "1s",
          value_parser = crate::config::units::parse_duration)]
    pub(crate) interval: Duration,
}

/// Runs `hasync status`.
pub(crate) fn run(args: StatusArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        if args.watch {
            return watch(&client, &args).await;
        }
        let mut r = client.replication();
        let status = client.call("GetStatus", r.get_status(pb::GetStatusRequest {})).await?;
        if args.json {
            println!("{}", to_json(&status));
        } else {
            print!("{}", render_table(&status));
        }
        Ok(())
    })
}

async fn watch(client: &Client, args: &StatusArgs) -> Result<(), Failure> {
    let interval_ms = u32::try_from(args.interval.as_millis()).unwrap_or(u32::MAX);
    let mut r = client.replication();
    let stream =
        client.call("WatchStatus", r.watch_status(pb::WatchStatusRequest { interval_ms })).await?;
    let redraw = !args.json && std::io::stdout().is_terminal();
    super::follow(client, "WatchStatus", stream, |status| {
        let mut out = std::io::stdout().lock();
        let written = if args.json {
            writeln!(out, "{}", to_json(&status))
        } else if redraw {
            let header = format!("{} every {:?}; Ctrl-C stops", client.url(), args.interval);
            write!(out, "\x1b[2J\x1b[H{header}\n\n{}", render_table(&status))
        } else {
            writeln!(out, "--- {}\n{}", time_of(status.time_unix_ms), render_table(&status))
        };
        written.and_then(|()| out.flush())
    })
    .await
}

/// A Unix-ms time as RFC 3339 UTC with milliseconds.
fn time_of(unix_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The status as a table for people (a few labelled lines, then one row per slave on a
/// master or the master link on a slave). Ends with a newline.
pub(crate) fn render_table(s: &pb::ReplicationStatus) -> String {
    let mut out = String::new();
    let is_master = s.role == pb::Role::Master as i32;
    let role = match pb::Role::try_from(s.role) {
        Ok(pb::Role::Master) => "master",
        Ok(pb::Role::Slave) => "slave",
        _ => "unknown",
    };
    let mode = match pb::ReplicationMode::try_from(s.mode) {
        Ok(pb::ReplicationMode::Sync) => "SYNC",
        Ok(pb::ReplicationMode::Async) => "ASYNC",
        _ => "unknown",
    };
    let k = s.sync_ack_replicas;
    let _ = writeln!(out, "node          {}", s.node_name);
    let _ = writeln!(
        out,
        "role          {role} (epoch {}, {} in the epoch history)",
        s.epoch, s.epoch_history_length
    );
    if s.fenced && s.promised_epoch > s.epoch {
        let _ = writeln!(
            out,
            "FENCED        promised epoch {} to a fence: no writes, no data plane until a \
             ChangeRole at epoch {} or above",
            s.promised_epoch, s.promised_epoch
        );
    } else if s.fenced {
        let _ =
            writeln!(out, "FENCED        puts are refused until a ChangeRole confirms the role");
    }
    if s.voters_set {
        let voters = if s.voters.is_empty() { "none yet".to_owned() } else { s.voters.join(", ") };
        let _ = writeln!(out, "voters        {voters} (only their acks count for SYNC puts)");
    }
    if let Some(c) = s.role_change.as_ref().filter(|c| !c.failed_step.is_empty()) {
        let _ = writeln!(
            out,
            "ROLE CHANGE   failed at step \"{}\" (epoch {}): {}; repeat the exact ChangeRole, or \
             use a higher epoch",
            c.failed_step, c.epoch, c.error
        );
    }
    if let Some(d) = s.disk.as_ref().filter(|d| d.full) {
        let _ = writeln!(
            out,
            "DISK FULL     failing: {} ({} failed writes); last: {}",
            d.failing.join(", "),
            d.failed_writes,
            d.last_error
        );
    }
    let _ = match (is_master, mode) {
        (true, "SYNC") => writeln!(out, "mode          SYNC: a put waits for {k} slave ack(s)"),
        (true, _) => writeln!(out, "mode          {mode}: a put returns once stored (k = {k})"),
        (false, _) => writeln!(out, "mode          {mode} (configured; a slave takes no puts)"),
    };
    let _ = writeln!(
        out,
        "offsets       min {}  max {}  flushed {}  confirm {}  readable {}",
        s.min_offset, s.max_offset, s.flushed_offset, s.confirm_offset, s.readable_offset
    );
    if is_master {
        let _ = writeln!(out, "in sync       {} slave(s), {k} needed for SYNC", s.in_sync_replicas);
        render_slaves(&mut out, s);
    }
    if let Some(l) = &s.master_link {
        render_link(&mut out, s, l);
    }
    if let Some(m) = &s.metadata_sync {
        render_metadata(&mut out, s.time_unix_ms, m);
    }
    if let Some(c) = &s.scrub {
        render_scrub(&mut out, c);
    }
    if s.truncated_bytes > 0 || s.truncated_files > 0 {
        let _ = writeln!(
            out,
            "truncated     {} kept aside in total, {} tail file(s) under <data-dir>/truncated/ \
             (hasync read --tail-dir)",
            bytes(gauge(s.truncated_bytes)),
            s.truncated_files
        );
    }
    out
}

/// A u64 count as the i64 the size formatter takes.
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The background scrub: progress, and every damage it lists.
fn render_scrub(out: &mut String, c: &pb::ScrubStatus) {
    if c.rate_bytes_per_sec == 0 {
        let _ = writeln!(out, "scrub         off (store.scrub-rate = 0)");
        return;
    }
    let _ = writeln!(
        out,
        "scrub         {} pass(es), {} segment check(s), {} damaged segment(s)",
        c.passes, c.segments_checked, c.damaged_segments
    );
    for d in &c.damage {
        let _ = writeln!(out, "  DAMAGE      {} at offset {}: {}", d.file, d.offset, d.reason);
    }
}

/// The metadata tables' change counters, and a slave's pull loop.
fn render_metadata(out: &mut String, now_ms: i64, m: &pb::MetadataSync) {
    let versions: Vec<String> = m
        .versions
        .iter()
        .map(|t| {
            let name = table_name(t.table).trim_start_matches("METADATA_TABLE_");
            let counter = t.version.as_ref().map_or(0, |v| v.counter);
            format!("{} {counter}", name.to_ascii_lowercase().replace('_', " "))
        })
        .collect();
    if !versions.is_empty() {
        let _ = writeln!(out, "metadata      versions: {}", versions.join(", "));
    }
    if !m.master.is_empty() {
        let error = if m.last_error.is_empty() { "none" } else { m.last_error.as_str() };
        let _ = writeln!(
            out,
            "              pulled from {}: last success {}, {} ok, {} failed, last error: {error}",
            m.master,
            ago(now_ms, m.last_success_unix_ms),
            m.pulls_ok,
            m.pulls_failed
        );
    }
}

fn render_slaves(out: &mut String, s: &pb::ReplicationStatus) {
    if s.slaves.is_empty() {
        let _ = writeln!(out, "slaves        none connected");
        return;
    }
    let w = s.slaves.iter().map(|r| r.address.len()).max().unwrap_or(0).max("address".len());
    let _ = writeln!(
        out,
        "\n{:<5}  {:<w$}  {:>12}  {:>10}  {:>8}  {:>7}  {:>12}  {:>12}",
        "slave", "address", "ack offset", "lag", "lag time", "in sync", "last ack", "rate"
    );
    for r in &s.slaves {
        let _ = writeln!(
            out,
            "{:<5}  {:<w$}  {:>12}  {:>10}  {:>8}  {:>7}  {:>12}  {:>12}",
            r.replica_id,
            r.address,
            r.ack_offset,
            bytes(r.lag_bytes),
            millis(r.lag_millis),
            if r.in_sync { "yes" } else { "NO" },
            ago(s.time_unix_ms, r.last_ack_unix_ms),
            rate(r.bytes_per_sec),
        );
    }
}

fn render_link(out: &mut String, s: &pb::ReplicationStatus, l: &pb::MasterLink) {
    let up = if l.connected { "connected" } else { "NOT connected" };
    let _ = writeln!(out, "master link   {} {up}", l.address);
    let behind = match l.master_max_offset {
        Some(m) => {
            format!("master max {m}, behind {}", bytes(m.saturating_sub(s.max_offset).max(0)))
        }
        None => "master max not heard yet".to_owned(),
    };
    let _ = writeln!(
        out,
        "              {behind}, last frame {}",
        ago(s.time_unix_ms, l.last_frame_unix_ms)
    );
    let error = if l.last_error.is_empty() { "none" } else { l.last_error.as_str() };
    let _ = writeln!(
        out,
        "              reconnects {}, received {}, last error: {error}",
        l.reconnects,
        bytes(l.bytes_received)
    );
    if !l.epoch_check.is_empty() {
        let _ = writeln!(out, "              epoch check: {}", l.epoch_check);
    }
    if !l.registration.is_empty() {
        let _ = writeln!(out, "              registration: {}", l.registration);
    }
    if !l.damaged_record.is_empty() {
        let _ = writeln!(out, "              STOPPED: {}", l.damaged_record);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn master() -> pb::ReplicationStatus {
        pb::ReplicationStatus {
            node_name: "m".into(),
            role: pb::Role::Master as i32,
            epoch: 0,
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: 1,
            min_offset: 0,
            max_offset: 4096,
            flushed_offset: 2048,
            confirm_offset: 3072,
            in_sync_replicas: 1,
            slaves: vec![pb::SlaveStatus {
                replica_id: 3,
                address: "127.0.0.1:5000".into(),
                ack_offset: 3072,
                lag_bytes: 1024,
                lag_millis: 1500,
                in_sync: true,
                last_ack_unix_ms: 9_900,
                bytes_per_sec: 2048.0,
                connected_since_unix_ms: 1,
                first_offset: 0,
                identity: "data-dir 0a".into(),
                node_name: "s".into(),
                voter: true,
            }],
            master_link: None,
            time_unix_ms: 10_000,
            metadata_sync: None,
            epoch_history_length: 1,
            fenced: false,
            readable_offset: 3072,
            data_dir_id: "0a".into(),
            role_change: None,
            disk: None,
            scrub: None,
            promised_epoch: 0,
            voters: Vec::new(),
            voters_set: false,
            truncated_bytes: 0,
            truncated_files: 0,
        }
    }

    #[test]
    fn the_table_shows_truncated_tails_only_once_there_are_some() {
        let mut s = master();
        assert!(!render_table(&s).contains("truncated"), "none kept: no line");
        (s.truncated_bytes, s.truncated_files) = (3 << 10, 2);
        let t = render_table(&s);
        assert!(t.contains("truncated     3.0 KiB kept aside in total, 2 tail file(s)"), "{t}");
    }

    #[test]
    fn the_table_shows_role_mode_offsets_and_each_slave() {
        let t = render_table(&master());
        assert!(t.contains("role          master (epoch 0, 1 in the epoch history)"), "{t}");
        assert!(!t.contains("FENCED"), "{t}");
        assert!(t.contains("SYNC: a put waits for 1 slave ack(s)"), "{t}");
        assert!(t.contains("min 0  max 4096  flushed 2048  confirm 3072  readable 3072"), "{t}");
        let row = t.lines().find(|l| l.contains("127.0.0.1:5000")).unwrap();
        for want in ["3072", "1.0 KiB", "1.5s", "yes", "100ms ago", "2.0 KiB/s"] {
            assert!(row.contains(want), "{want} in {row}");
        }
    }

    #[test]
    fn a_full_disk_shows_as_a_line_and_in_json() {
        let mut s = master();
        assert!(!render_table(&s).contains("DISK FULL"));
        s.disk = Some(pb::DiskStatus {
            full: true,
            since_unix_ms: 9_000,
            last_error: "append: disk full".into(),
            failed_writes: 3,
            failing: vec!["append".into()],
        });
        let t = render_table(&s);
        assert!(
            t.contains("DISK FULL     failing: append (3 failed writes); last: append: disk full"),
            "{t}"
        );
        let j = to_json(&s);
        assert_eq!(j["disk"]["full"], true);
        assert_eq!(j["disk"]["failing"][0], "append");
    }

    #[test]
    fn json_uses_proto_names_and_enum_names() {
        let j = to_json(&master());
        assert_eq!(j["role"], "ROLE_MASTER");
        assert_eq!(j["mode"], "REPLICATION_MODE_SYNC");
        assert_eq!(j["max_offset"], 4096);
        assert_eq!(j["slaves"][0]["ack_offset"], 3072);
        assert!(j["master_link"].is_null());
    }

    #[test]
    fn a_slave_shows_its_master_link() {
        let mut s = master();
        s.role = pb::Role::Slave as i32;
        s.slaves.clear();
        s.master_link = Some(pb::MasterLink {
            address: "10.0.0.1:10912".into(),
            connected: true,
            last_frame_unix_ms: 9_000,
            master_max_offset: Some(5120),
            reconnects: 2,
            last_error: String::new(),
            bytes_received: 4096,
            epoch_check: "epoch histories agree".into(),
            registration: "registered as data-dir 0a (replica 3)".into(),
            damaged_record: "damaged record at offset 4096 from master 10.0.0.1:10912: x".into(),
        });
        s.fenced = true;
        s.metadata_sync = Some(pb::MetadataSync {
            versions: vec![pb::TableVersion {
                table: pb::MetadataTable::Topics as i32,
                version: Some(pb::DataVersion {
                    state_version: 0,
                    timestamp_unix_ms: 1,
                    counter: 4,
                }),
            }],
            master: "10.0.0.1:10920".into(),
            last_success_unix_ms: 8_000,
            last_attempt_unix_ms: 8_000,
            last_error: String::new(),
            pulls_ok: 5,
            pulls_failed: 1,
        });
        let t = render_table(&s);
        assert!(t.contains("metadata      versions: topics 4"), "{t}");
        assert!(
            t.contains("pulled from 10.0.0.1:10920: last success 2.0s ago, 5 ok, 1 failed"),
            "{t}"
        );
        let j = to_json(&s);
        assert_eq!(j["metadata_sync"]["versions"][0]["table"], "METADATA_TABLE_TOPICS");
        assert_eq!(j["metadata_sync"]["versions"][0]["version"]["counter"], 4);
        assert_eq!(j["metadata_sync"]["pulls_ok"], 5);
        assert!(t.contains("master link   10.0.0.1:10912 connected"), "{t}");
        assert!(t.contains("epoch check: epoch histories agree"), "{t}");
        assert!(t.contains("STOPPED: damaged record at offset 4096 from master"), "{t}");
        assert!(t.contains("FENCED        puts are refused"), "{t}");
        s.promised_epoch = 4;
        s.voters_set = true;
        let t = render_table(&s);
        assert!(t.contains("FENCED        promised epoch 4 to a fence"), "{t}");
        assert!(t.contains("voters        none yet"), "{t}");
        assert_eq!(to_json(&s)["promised_epoch"], 4);
        assert!(t.contains("master max 5120, behind 1.0 KiB, last frame 1.0s ago"), "{t}");
        assert!(!t.contains("in sync "), "{t}");
        assert_eq!(to_json(&s)["master_link"]["master_max_offset"], 5120);
    }

    /// The field names of `message NAME { ... }` in the proto text.
    fn proto_fields(proto: &str, name: &str) -> Vec<String> {
        let start = proto.find(&format!("message {name} {{")).expect("message in proto");
        let body = &proto[start..];
        let body = &body[..body.find("\n}").expect("message end")];
        body.lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("//") && l.contains(" = ") && l.ends_with(';'))
            .map(|l| l.split(" = ").next().unwrap().split_whitespace().last().unwrap().to_owned())
            .collect()
    }

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
        k.sort();
        k
    }

    /// `--json` must carry every field of the proto, under its name: a field added to
    /// replication.proto fails here until [`to_json`] prints it.
    #[test]
    fn json_carries_every_proto_field() {
        let proto = include_str!("../../../proto/hasync/v1/replication.proto");
        let mut s = master();
        s.master_link = Some(pb::MasterLink::default());
        s.scrub = Some(pb::ScrubStatus {
            damage: vec![pb::ScrubDamage::default()],
            ..Default::default()
        });
        s.metadata_sync = Some(pb::MetadataSync {
            versions: vec![pb::TableVersion { table: 1, version: Some(Default::default()) }],
            ..Default::default()
        });
        let j = to_json(&s);
        for (name, v) in [
            ("ReplicationStatus", &j),
            ("SlaveStatus", &j["slaves"][0]),
            ("MasterLink", &j["master_link"]),
            ("MetadataSync", &j["metadata_sync"]),
            ("TableVersion", &j["metadata_sync"]["versions"][0]),
            ("ScrubStatus", &j["scrub"]),
            ("ScrubDamage", &j["scrub"]["damage"][0]),
        ] {
            let mut want = proto_fields(proto, name);
            want.sort();
            assert!(!want.is_empty(), "{name}");
            assert_eq!(keys(v), want, "{name}: JSON keys vs proto fields");
        }
    }
}
