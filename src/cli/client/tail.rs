//! `hasync read --tail-file FILE` and `hasync read --tail-dir DATA_DIR`: the truncated tails a
//! node kept aside under `<data-dir>/truncated/` (`store::tails`), read from the files
//! themselves (no node is asked; the node may be stopped). A tail file's header and the CRC of
//! its data are checked first; a damaged file is an error naming it (exit 1).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::cli::client::read::{message_json, message_table};
use crate::cli::client::{Failure, FailureKind};
use crate::control::convert;
use crate::store::tails::{self, TAILS_DIR, TailFile, TailMeta, TailRecord};

/// What the walk over a tail file found.
#[derive(Debug, Default)]
struct Walked {
    messages: Vec<crate::control::pb::StoredMessage>,
    blanks: usize,
    /// A partial last record: its offset and the bytes the tail holds of it.
    partial: Option<(u64, u64)>,
    /// Bytes that are not a record: their offset and what is wrong.
    damaged: Option<(u64, String)>,
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(FailureKind::Other, e.to_string())
}

/// Opens `path`, checks its header and CRC, and walks its records (at most `max` messages).
fn read_tail(path: &Path, max: Option<u32>) -> Result<(TailFile, Walked), Failure> {
    let f = TailFile::open(path).map_err(failed)?;
    f.verify().map_err(failed)?;
    let mut w = Walked::default();
    let limit = max.map_or(usize::MAX, |m| m as usize);
    f.records(|r| match r {
        TailRecord::Message { offset, view } if w.messages.len() < limit => {
            w.messages.push(convert::stored(&view, offset));
        }
        TailRecord::Message { .. } => {}
        TailRecord::Blank { .. } => w.blanks += 1,
        TailRecord::Partial { offset, len } => w.partial = Some((offset, len)),
        TailRecord::Damaged { offset, reason } => w.damaged = Some((offset, reason.to_owned())),
    })
    .map_err(failed)?;
    Ok((f, w))
}

/// A Unix-ms time as RFC 3339 (UTC).
fn time_of(unix_ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

fn meta_json(m: &TailMeta) -> Value {
    json!({
        "seq": m.seq,
        "start_offset": m.start_offset,
        "end_offset": m.end_offset,
        "bytes": m.len_bytes(),
        "data_crc32": format!("{:08x}", m.data_crc32),
        "time_unix_ms": m.time_unix_ms,
        "reason": m.cause.reason,
        "epochs": m.cause.epochs,
        "master": m.cause.master,
        "master_epoch": m.cause.master_epoch,
        "master_name": m.cause.master_name,
        "node_name": m.cause.node_name,
        "data_dir_id": m.cause.data_dir_id,
    })
}

/// The header lines of a tail file for people.
fn describe(out: &mut String, path: &Path, m: &TailMeta) {
    let epochs: Vec<String> = m.cause.epochs.iter().map(u64::to_string).collect();
    let by = if m.cause.master_name.is_empty() {
        String::new()
    } else {
        format!(", opened by {}", m.cause.master_name)
    };
    let _ = writeln!(out, "tail file     {}", path.display());
    let _ = writeln!(
        out,
        "range         [{}, {}): {} bytes, CRC32 {:08x} ok",
        m.start_offset,
        m.end_offset,
        m.len_bytes(),
        m.data_crc32
    );
    let _ = writeln!(out, "epochs        {} (of the cut records)", epochs.join(", "));
    let _ = writeln!(
        out,
        "cut by        {} to follow master {} (epoch {}{by})",
        m.cause.reason, m.cause.master, m.cause.master_epoch
    );
    let _ = writeln!(
        out,
        "kept          {} as tail #{} of node {} (data dir {})",
        time_of(m.time_unix_ms),
        m.seq,
        m.cause.node_name,
        m.cause.data_dir_id
    );
}

/// Runs `hasync read --tail-file FILE [--max N] [--json]`.
pub(crate) fn run_file(path: &Path, max: Option<u32>, as_json: bool) -> Result<(), Failure> {
    let (f, w) = read_tail(path, max)?;
    let m = f.meta();
    if as_json {
        let out = json!({
            "file": path.display().to_string(),
            "meta": meta_json(m),
            "messages": w.messages.iter().map(message_json).collect::<Vec<_>>(),
            "segment_ends": w.blanks,
            "partial": w.partial.map(|(offset, len)| json!({"offset": offset, "bytes": len})),
            "damaged": w
                .damaged
                .as_ref()
                .map(|(offset, why)| json!({"offset": offset, "reason": why})),
        });
        println!("{out}");
        return Ok(());
    }
    let mut out = String::new();
    describe(&mut out, path, m);
    out.push_str(&message_table(&w.messages));
    let _ = write!(out, "{} message(s), {} segment end(s)", w.messages.len(), w.blanks);
    if let Some((offset, len)) = w.partial {
        let _ = write!(out, "; ends with {len} bytes of a record at {offset} (cut mid-record)");
    }
    if let Some((offset, why)) = &w.damaged {
        let _ = write!(out, "; bytes at {offset} are not a record: {why}");
    }
    out.push('\n');
    print!("{out}");
    Ok(())
}

/// The tail directory of `dir`: `dir/truncated` when it exists, else `dir` itself (the
/// `truncated/` directory given directly).
fn tails_dir(dir: &Path) -> PathBuf {
    let inner = dir.join(TAILS_DIR);
    if inner.is_dir() { inner } else { dir.to_path_buf() }
}

/// Runs `hasync read --tail-dir DATA_DIR [--json]`: one line per tail file (its range, size,
/// epochs, cause and time); every file's header and CRC are checked, and a damaged one is
/// listed with what is wrong, then the command fails naming the damaged files.
pub(crate) fn run_dir(dir: &Path, as_json: bool) -> Result<(), Failure> {
    if !dir.is_dir() {
        return Err(failed(format!("{} is not a directory", dir.display())));
    }
    let tdir = tails_dir(dir);
    let listed =
        tails::list(&tdir).map_err(|e| failed(format!("cannot list {}: {e}", tdir.display())))?;
    let mut damaged = Vec::new();
    let mut rows = Vec::new();
    for l in &listed {
        let checked = l
            .file
            .as_ref()
            .map_err(ToString::to_string)
            .and_then(|f| f.verify().map_err(|e| e.to_string()).map(|()| f.meta().clone()));
        if let Err(why) = &checked {
            damaged.push(why.clone());
        }
        rows.push((l.path.clone(), checked));
    }
    if as_json {
        let files: Vec<Value> = rows
            .iter()
            .map(|(path, c)| match c {
                Ok(m) => json!({"file": path.display().to_string(), "meta": meta_json(m)}),
                Err(why) => json!({"file": path.display().to_string(), "error": why}),
            })
            .collect();
        println!("{}", json!({"dir": tdir.display().to_string(), "files": files}));
    } else {
        print!("{}", render_dir(&tdir, &rows));
    }
    match damaged.len() {
        0 => Ok(()),
        n => Err(failed(format!("{n} damaged tail file(s): {}", damaged.join("; ")))),
    }
}

type Row = (PathBuf, Result<TailMeta, String>);

/// The listing's table.
fn render_dir(dir: &Path, rows: &[Row]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        let _ = writeln!(out, "no tail files in {}", dir.display());
        return out;
    }
    let _ = writeln!(
        out,
        "{:>12}  {:>12}  {:>10}  {:<8}  {:<12}  {:<24}  file",
        "from", "to", "bytes", "epochs", "cut by", "kept"
    );
    let mut total = 0;
    for (path, r) in rows {
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match r {
            Ok(m) => {
                total += m.len_bytes();
                let epochs: Vec<String> = m.cause.epochs.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    out,
                    "{:>12}  {:>12}  {:>10}  {:<8}  {:<12}  {:<24}  {name}",
                    m.start_offset,
                    m.end_offset,
                    m.len_bytes(),
                    epochs.join(","),
                    m.cause.reason,
                    time_of(m.time_unix_ms),
                );
            }
            Err(why) => {
                let _ = writeln!(out, "DAMAGED  {name}: {why}");
            }
        }
    }
    let _ = writeln!(out, "{} tail file(s) in {}, {total} bytes", rows.len(), dir.display());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_shows_each_range_and_names_a_damaged_file() {
        let meta = TailMeta {
            seq: 1,
            start_offset: 100,
            end_offset: 400,
            data_crc32: 0xabcd,
            time_unix_ms: 1_000,
            cause: tails::TailCause {
                reason: "demotion".into(),
                epochs: vec![2, 3],
                ..Default::default()
            },
        };
        let rows: Vec<Row> = vec![
            (PathBuf::from("/d/truncated/a.tail"), Ok(meta)),
            (PathBuf::from("/d/truncated/b.tail"), Err("tail file b is corrupt: x".into())),
        ];
        let t = render_dir(Path::new("/d/truncated"), &rows);
        let row = t.lines().find(|l| l.ends_with("a.tail")).unwrap();
        for want in ["100", "400", "300", "2,3", "demotion", "1970-01-01T00:00:01.000Z"] {
            assert!(row.contains(want), "{want} in {row}");
        }
        assert!(t.contains("DAMAGED  b.tail: tail file b is corrupt: x"), "{t}");
        assert!(t.contains("2 tail file(s) in /d/truncated, 300 bytes"), "{t}");
        assert_eq!(render_dir(Path::new("/e"), &[]), "no tail files in /e\n");
    }
}
