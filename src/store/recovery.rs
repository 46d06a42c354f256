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
//!
//! After a clean stop the checkpoint's flushed offset is where the data ends, and every byte
//! past it is zero: the writer only writes at the end, and every cut (truncate, the undo of a
//! failed append, this recovery) zeroes what it drops before a clean stop can follow. So a
//! clean start never reads past that offset (not to check for data past the cut, not to zero,
//! not to check that a spare is empty): a clean start costs the same whatever the size of the
//! unused tail of the last segment. Below the checkpoint a start verifies only what a crash can
//! have damaged (see `verify_below`); the background scrub ([`crate::store::scrub`]) checks the
//! sealed segments.
//!
//! Before the scan, an all-zero last file (not the only one) that the checkpoint claims no byte
//! of leaves the list as the ready spare: the store thread prepares the next segment under its
//! final name, so a stop finds it there. It holds no data: neither data lost nor corruption.

use std::path::{Path, PathBuf};

use crate::store::checkpoint::{Checkpoint, QueueOffsets};
use crate::store::cut_intent::CutIntent;
use crate::store::error::{Error, Result};
use crate::store::mapped_file_queue::{Extent, MappedFileQueue};
use crate::store::record::{self, RecordView};
use crate::store::scan::Step;

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
    pub(crate) report: RecoveryReport,
    pub(crate) queue_offsets: QueueOffsets,
    /// The checkpoint's flushed offset, clamped to the recovered end.
    pub(crate) flushed_offset: u64,
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
/// `checkpoint_file` is where `checkpoint` was read from (for errors). `unfinished`: a cut
/// whose checkpoint never landed ([`crate::store::cut_intent`]), finished here: the log ends
/// at its offset at the latest (a wipe removes every file), and a checkpoint that began past
/// it is not used (the table is rebuilt from the first file).
pub(crate) fn recover(
    queue: &MappedFileQueue,
    checkpoint: Option<Checkpoint>,
    checkpoint_file: &Path,
    clean: bool,
    repair: bool,
    unfinished: Option<CutIntent>,
) -> Result<Recovered> {
    if unfinished.is_some_and(|i| i.wipe) {
        let removed_files = queue.remove_all()?;
        let truncated_from = (!removed_files.is_empty()).then_some(0);
        return Ok(Recovered {
            report: RecoveryReport { removed_files, truncated_from, ..Default::default() },
            queue_offsets: QueueOffsets::new(),
            flushed_offset: 0,
        });
    }
    let cut_at = unfinished.map_or(u64::MAX, |i| i.offset);
    let checkpoint = checkpoint.map(|cp| cp.bounded(cut_at));
    // After a clean stop, nothing past the checkpoint's flushed offset is non-zero (module docs).
    let clean = clean && unfinished.is_none();
    let claimed = checkpoint.as_ref().map_or(0, |cp| cp.flushed_offset.max(cp.dispatched_offset));
    let zero_from = if clean { checkpoint.as_ref().map(|cp| cp.flushed_offset) } else { None };
    if let Some(spare) = queue.adopt_spare(claimed, zero_from.is_some()) {
        tracing::debug!(file = %spare.display(), "an unused prepared segment is the spare");
    }
    let (Some(first), Some(last)) = (queue.first(), queue.last()) else {
        let cp = checkpoint.filter(|cp| cp.dispatched_offset <= cut_at).unwrap_or_default();
        return Ok(Recovered {
            report: RecoveryReport { clean, ..Default::default() },
            queue_offsets: cp.queue_offsets,
            flushed_offset: 0,
        });
    };
    let cp = checkpoint.unwrap_or(Checkpoint {
        flushed_offset: first.from_offset(),
        dispatched_offset: first.from_offset(),
        ..Checkpoint::default()
    });
    // A slave's first write after a wipe may start the log at any segment-aligned offset.
    if cp.is_empty_log() && first.from_offset() > 0 {
        tracing::warn!(
            first = first.from_offset(),
            "the checkpoint is of an empty log; the log \
            starts at its first segment file"
        );
    }
    let cp = cp.read_by_a_start(cut_at, first.from_offset());
    check_covered(checkpoint_file, &cp, first.from_offset(), last.end_offset())?;
    let mut report = RecoveryReport { clean, ..Default::default() };
    let cp = if clean { cp } else { verify_or_repair(queue, cp, repair, &mut report)? };
    let Checkpoint { flushed_offset, dispatched_offset, queue_offsets: mut table, .. } = cp;
    report.scan_from = dispatched_offset;
    let tail = Tail { from: dispatched_offset, flushed: flushed_offset, repair, until: cut_at };
    let end = scan_tail(queue, tail, &mut table, &mut report)?;
    if end > cut_at {
        let intent_file = checkpoint_file.with_file_name(crate::store::cut_intent::CUT_INTENT_FILE);
        return Err(Error::Corruption {
            file: intent_file,
            offset: cut_at,
            reason: format!(
                "the unfinished cut's offset is not a record boundary (a record \
                runs to {end})"
            ),
        });
    }
    let flushed_offset = cut(queue, end, flushed_offset, zero_from, &mut report)?;
    debug_assert!(flushed_offset <= end, "the flushed offset never passes the recovered end");
    Ok(Recovered { report, queue_offsets: table, flushed_offset })
}

/// Refuses a checkpoint (read from `checkpoint_file`) that claims offsets the segment files
/// `[first, last)` do not hold.
fn check_covered(checkpoint_file: &Path, cp: &Checkpoint, first: u64, last: u64) -> Result<()> {
    if cp.dispatched_offset >= first && cp.flushed_offset <= last {
        return Ok(());
    }
    Err(Error::Corruption {
        file: checkpoint_file.to_path_buf(),
        offset: cp.dispatched_offset,
        reason: format!(
            "checkpoint covers [{}, {}) but the segment files hold [{first}, {last})",
            cp.dispatched_offset, cp.flushed_offset
        ),
    })
}

/// The refusal for damage below the checkpointed flushed offset.
fn below_checkpoint(file: PathBuf, offset: u64, problem: &str, flushed: u64) -> Error {
    Error::Corruption {
        file,
        offset,
        reason: format!(
            "{problem} (below the checkpointed flushed offset {flushed}; start with --repair \
             to truncate here)"
        ),
    }
}

/// After an unclean stop: refuses damage below the dispatched offset, or with `repair` returns
/// the checkpoint to scan from instead (from the first file, cut at the damage).
fn verify_or_repair(
    queue: &MappedFileQueue,
    cp: Checkpoint,
    repair: bool,
    report: &mut RecoveryReport,
) -> Result<Checkpoint> {
    let Some((file, offset, problem)) = verify_below(queue, cp.dispatched_offset, report) else {
        return Ok(cp);
    };
    if !repair {
        return Err(below_checkpoint(file, offset, &problem, cp.flushed_offset));
    }
    // Rebuild the queue-offset table from the first file and cut at the damage.
    tracing::warn!(offset, %problem, "repair: truncating at corruption below the checkpoint");
    report.repaired = true;
    Ok(Checkpoint {
        flushed_offset: offset,
        dispatched_offset: queue.min_offset().unwrap_or(0),
        ..Checkpoint::default()
    })
}

/// Where the tail scan starts and what it must find intact.
#[derive(Debug, Clone, Copy)]
struct Tail {
    /// The checkpoint's dispatched offset: a record boundary.
    from: u64,
    /// The checkpoint's flushed offset: every record wholly below it must be intact.
    flushed: u64,
    /// Truncate at damage below `flushed` instead of refusing.
    repair: bool,
    /// Where the scan ends at the latest: an unfinished cut's offset, or `u64::MAX`.
    until: u64,
}

/// Walks from the checkpoint's dispatched offset to the first record that cannot be read and
/// returns where the valid log ends. A stop whose bytes lay wholly below the flushed offset is
/// damage (refused unless `repair`); past it, a stop is the normal end of the log: a record
/// that straddles the flushed offset may be torn (a slave's log may even end mid-record).
fn scan_tail(
    queue: &MappedFileQueue,
    tail: Tail,
    table: &mut QueueOffsets,
    report: &mut RecoveryReport,
) -> Result<u64> {
    let walked = queue.walk(tail.from, tail.until, Extent::Whole, |step| match step {
        Step::Record { view, .. } => {
            apply_to_table(table, view);
            report.scanned_bytes += view.total_size as u64;
            report.scanned_records += 1;
        }
        Step::EndOfFile { size, .. } => report.scanned_bytes += size,
        Step::Stop(_) => {}
    });
    if let Some((file, stop)) = walked.stop {
        debug_assert_eq!(stop.offset, walked.end);
        let problem = stop.reason.to_string();
        if stop.claimed_end <= tail.flushed {
            if !tail.repair {
                let path = file.path().to_path_buf();
                return Err(below_checkpoint(path, stop.offset, &problem, tail.flushed));
            }
            report.repaired = true;
        }
        report.stopped_because = Some(format!("offset {}: {problem}", stop.offset));
    }
    Ok(walked.end)
}

/// Cuts the log at `end` (zeroing what follows, removing files wholly past it) and sets every
/// file's positions; returns the flushed offset, `flushed` clamped to `end`. With `zero_from`
/// (a clean stop's end of data), the bytes from there on are known zero and are not read.
fn cut(
    queue: &MappedFileQueue,
    end: u64,
    flushed: u64,
    zero_from: Option<u64>,
    report: &mut RecoveryReport,
) -> Result<u64> {
    let files = queue.files();
    for f in &files {
        if f.end_offset() <= end {
            f.set_recovered(f.size(), f.size());
        }
    }
    let zero_from = zero_from.unwrap_or(u64::MAX).max(end);
    let had_more = files.iter().any(|f| f.end_offset() > end && f.from_offset() > end)
        || queue.find(end).is_some_and(|f| has_bytes_between(&f, end, zero_from));
    report.removed_files = queue.truncate_known_zero(end, zero_from)?;
    if had_more || !report.removed_files.is_empty() {
        report.truncated_from = Some(end);
    }
    let flushed_offset = flushed.min(end);
    if let Some(f) = queue.find(end).or_else(|| queue.last()) {
        let wrote = (end.min(f.end_offset()) - f.from_offset()) as usize;
        let flushed = (flushed_offset.max(f.from_offset()) - f.from_offset()) as usize;
        f.set_recovered(wrote, flushed.min(wrote));
    }
    report.max_offset = end;
    report.dispatched_offset = end;
    Ok(flushed_offset)
}

/// Whether any byte of the file in commitlog offsets `[from, until)` is non-zero (there was
/// data past the cut).
fn has_bytes_between(file: &crate::store::mapped_file::MappedFile, from: u64, until: u64) -> bool {
    let at = (from - file.from_offset()) as usize;
    let to = (until.min(file.end_offset()) - file.from_offset()) as usize;
    to > at && file.raw(at, to - at).iter().any(|&b| b != 0)
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
    let walked = queue.walk(start_file.from_offset(), dispatched, Extent::Whole, |step| {
        if let Step::Record { view, .. } = step {
            report.scanned_bytes += view.total_size as u64;
            report.scanned_records += 1;
        }
    });
    if let Some((file, stop)) = walked.stop {
        return Some((file.path().to_path_buf(), stop.offset, stop.reason.to_string()));
    }
    if walked.end != dispatched {
        let file = queue.find(dispatched)?.path().to_path_buf();
        let problem = format!("a record runs past the checkpoint at {}", walked.end);
        return Some((file, dispatched, problem));
    }
    None
}
