//! Finding the valid end of the commitlog at start-up.
//!
//! The scan starts at the checkpoint's dispatched offset (a record boundary whose queue-offset
//! table the checkpoint holds) and decodes record after record, following blank records to the
//! next file. Every record that starts below the checkpoint's flushed offset must be intact: an
//! invalid one there is corruption, and start-up is refused with the file and offset (an explicit
//! repair truncates there instead). Past the flushed offset, the first invalid or incomplete
//! record is where the log ends: after a power loss "invalid, then valid again" is normal (pages
//! reach the disk out of order), so nothing after the first invalid record is trusted.
//!
//! After a clean stop the checkpoint covers everything and the scan only drops a partial last
//! record (a slave's log may end mid-record, since frames cut records).

use std::path::PathBuf;

use crate::store::checkpoint::{Checkpoint, QueueOffsets};
use crate::store::error::{Error, Result};
use crate::store::mapped_file_queue::MappedFileQueue;
use crate::store::record::{self, Decoded, RecordView};

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Whether the last stop was clean (no abort marker).
    pub clean: bool,
    /// Where the scan started.
    pub scan_from: u64,
    /// The recovered max offset: the end of the last intact record.
    pub max_offset: u64,
    /// The end of the last complete record (equal to `max_offset` after recovery).
    pub dispatched_offset: u64,
    /// Bytes decoded by the scan.
    pub scanned_bytes: u64,
    /// Records decoded by the scan.
    pub scanned_records: u64,
    /// When the log was cut: the end of the files before the cut, if data followed it.
    pub truncated_from: Option<u64>,
    /// Files removed because they lay wholly past the cut.
    pub removed_files: Vec<PathBuf>,
    /// The invalid record (or corruption repaired) that ended the scan, if any.
    pub stopped_because: Option<String>,
    /// Whether `repair` truncated at corruption below the checkpoint.
    pub repaired: bool,
}

/// The result of a scan, before truncation.
pub(crate) struct Recovered {
    pub report: RecoveryReport,
    pub queue_offsets: QueueOffsets,
    /// The checkpoint's flushed offset, clamped to the recovered end.
    pub flushed_offset: u64,
}

/// Records one decoded record in the queue-offset table (transaction halves and rollbacks do
/// not take a queue offset, as upstream).
pub(crate) fn apply_to_table(table: &mut QueueOffsets, view: &RecordView<'_>) {
    if record::is_transaction_prepared_or_rollback(view.sys_flag) {
        return;
    }
    let topic = String::from_utf8_lossy(view.topic);
    let next = view.queue_offset + 1;
    match table.get_mut(topic.as_ref()) {
        Some(queues) => {
            let e = queues.entry(view.queue_id).or_insert(next);
            *e = (*e).max(next);
        }
        None => {
            table.entry(topic.into_owned()).or_default().insert(view.queue_id, next);
        }
    }
}

/// Scans from the checkpoint and cuts the log at the end of the last intact record.
pub(crate) fn recover(
    queue: &MappedFileQueue,
    checkpoint: Option<Checkpoint>,
    clean: bool,
    repair: bool,
) -> Result<Recovered> {
    let files = queue.files();
    let (Some(first), Some(last)) = (files.first(), files.last()) else {
        let cp = checkpoint.unwrap_or_default();
        return Ok(Recovered {
            report: RecoveryReport { clean, ..Default::default() },
            queue_offsets: cp.queue_offsets,
            flushed_offset: 0,
        });
    };
    let cp = checkpoint.unwrap_or(Checkpoint {
        flushed_offset: first.from_offset(),
        dispatched_offset: first.from_offset(),
        queue_offsets: QueueOffsets::new(),
    });
    if cp.dispatched_offset < first.from_offset() || cp.flushed_offset > last.end_offset() {
        return Err(Error::Corruption {
            file: queue.dir().join(crate::store::checkpoint::CHECKPOINT_FILE),
            offset: cp.dispatched_offset,
            reason: format!(
                "checkpoint covers [{}, {}) but the segment files hold [{}, {})",
                cp.dispatched_offset,
                cp.flushed_offset,
                first.from_offset(),
                last.end_offset()
            ),
        });
    }
    let mut cp = cp;
    let mut report = RecoveryReport { clean, ..Default::default() };
    if !clean
        && let Some((file, offset, problem)) =
            verify_below(queue, cp.dispatched_offset, &mut report)
    {
        if !repair {
            return Err(Error::Corruption {
                file,
                offset,
                reason: format!(
                    "{problem} (below the checkpointed flushed offset {}; start with --repair \
                     to truncate here)",
                    cp.flushed_offset
                ),
            });
        }
        // Rebuild the queue-offset table from the first file and cut at the damage.
        tracing::warn!(offset, %problem, "repair: truncating at corruption below the checkpoint");
        report.repaired = true;
        cp = Checkpoint {
            flushed_offset: offset,
            dispatched_offset: first.from_offset(),
            queue_offsets: QueueOffsets::new(),
        };
    }
    report.scan_from = cp.dispatched_offset;
    let mut table = cp.queue_offsets;
    let mut pos = cp.dispatched_offset;
    loop {
        let Some(file) = queue.find(pos) else { break };
        let at = (pos - file.from_offset()) as usize;
        let buf = file.raw(at, file.size() - at);
        let problem = match record::decode(&buf, pos as i64) {
            Ok(Decoded::Message(view)) => {
                apply_to_table(&mut table, &view);
                pos += view.total_size as u64;
                report.scanned_bytes += view.total_size as u64;
                report.scanned_records += 1;
                continue;
            }
            Ok(Decoded::Blank { size }) if size as usize == file.size() - at => {
                report.scanned_bytes += size as u64;
                pos = file.end_offset();
                continue;
            }
            Ok(Decoded::Blank { size }) => {
                format!(
                    "blank record claims {size} bytes but {} remain in the file",
                    file.size() - at
                )
            }
            Err(e) => e.to_string(),
        };
        // A record that did not lie wholly below the flushed offset may be torn: that is the
        // normal end of a log (a slave's log may even end mid-record), not corruption.
        let claimed = buf.get(..4).map_or(0, |b| i32::from_be_bytes(b.try_into().unwrap()));
        let claimed_end = pos.saturating_add(u64::try_from(claimed).unwrap_or(u64::MAX).max(8));
        if claimed_end <= cp.flushed_offset {
            if !repair {
                return Err(Error::Corruption {
                    file: file.path().to_path_buf(),
                    offset: pos,
                    reason: format!(
                        "{problem} (below the checkpointed flushed offset {}; start with --repair \
                         to truncate here)",
                        cp.flushed_offset
                    ),
                });
            }
            report.repaired = true;
        }
        report.stopped_because = Some(format!("offset {pos}: {problem}"));
        break;
    }
    for f in &files {
        if f.end_offset() <= pos {
            f.set_recovered(f.size(), f.size());
        }
    }
    let had_more = files.iter().any(|f| f.end_offset() > pos && f.from_offset() > pos)
        || queue.find(pos).is_some_and(|f| has_bytes_after(&f, (pos - f.from_offset()) as usize));
    report.removed_files = queue.truncate(pos)?;
    if had_more || !report.removed_files.is_empty() {
        report.truncated_from = Some(pos);
    }
    let flushed_offset = cp.flushed_offset.min(pos);
    if let Some(f) = queue.find(pos).or_else(|| queue.last()) {
        let wrote = (pos.min(f.end_offset()) - f.from_offset()) as usize;
        let flushed = (flushed_offset.max(f.from_offset()) - f.from_offset()) as usize;
        f.set_recovered(wrote, flushed.min(wrote));
    }
    report.max_offset = pos;
    report.dispatched_offset = pos;
    Ok(Recovered { report, queue_offsets: table, flushed_offset })
}

/// Whether any byte at or after `at` in the file is non-zero (there was data past the cut).
fn has_bytes_after(file: &crate::store::mapped_file::MappedFile, at: usize) -> bool {
    let tail = file.raw(at, file.size() - at);
    tail.iter().any(|&b| b != 0)
}

/// After an unclean stop, checks every record from the start of the file holding the last
/// dispatched byte up to the dispatched offset: they were flushed, so each must be intact.
/// Returns the first damaged one (file, offset, problem).
fn verify_below(
    queue: &MappedFileQueue,
    dispatched: u64,
    report: &mut RecoveryReport,
) -> Option<(PathBuf, u64, String)> {
    let start_file = queue.find(dispatched.checked_sub(1)?)?;
    let mut pos = start_file.from_offset();
    while pos < dispatched {
        let file = queue.find(pos)?;
        let at = (pos - file.from_offset()) as usize;
        let buf = file.raw(at, file.size() - at);
        let problem = match record::decode(&buf, pos as i64) {
            Ok(Decoded::Message(view)) => {
                pos += view.total_size as u64;
                report.scanned_bytes += view.total_size as u64;
                report.scanned_records += 1;
                continue;
            }
            Ok(Decoded::Blank { size }) if size as usize == file.size() - at => {
                pos = file.end_offset();
                continue;
            }
            Ok(Decoded::Blank { size }) => format!("blank record claims {size} bytes"),
            Err(e) => e.to_string(),
        };
        return Some((file.path().to_path_buf(), pos, problem));
    }
    if pos != dispatched {
        let file = queue.find(dispatched)?.path().to_path_buf();
        return Some((file, dispatched, format!("a record runs past the checkpoint at {pos}")));
    }
    None
}
