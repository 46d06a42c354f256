//! `hasync verify`: checks a stopped node's data directory without changing a byte of it.
//!
//! Every segment file is read with plain reads in chunks ([`integrity::walk_segment`], the
//! walk the scrub uses, classifying bytes as recovery does), never mapped and never written.
//! Damage is what a start must not trust: a record that cannot be read although the
//! checkpoint says it was durable (it ends at or below the checkpoint's flushed offset), in any
//! segment, a file of the wrong size, a gap between files, a checkpoint that is unreadable or
//! claims more than the files hold, a record whose TOTALSIZE claims more than the largest
//! record `store.max-message-size` allows. Without a checkpoint every file but the last must
//! be sealed; an all-zero last file (the spare the store prepares ahead, which a start adopts)
//! does not count as the last, the one before it does. A stop past the flushed offset is the
//! end of the log, as a start would find it (after an unclean stop the tail there may be torn;
//! a start cuts it).

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::store::checkpoint::{ABORT_FILE, CHECKPOINT_FILE, Checkpoint};
use crate::store::commitlog::COMMITLOG_DIR;
use crate::store::cut_intent::{CUT_INTENT_FILE, CutIntent};
use crate::store::error::{Error, Result};
use crate::store::fs::StdFs;
use crate::store::integrity::{self, Damage};
use crate::store::mapped_file::parse_file_name;

/// What the check of one segment file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    /// The file.
    pub file: PathBuf,
    /// Its start offset (from its name).
    pub from_offset: u64,
    /// Records checked.
    pub records: u64,
    /// Where its readable records end (a commitlog offset; its end offset when sealed).
    pub ends_at: u64,
    /// Whether it holds records up to its end (its blank, or a record ending there).
    pub sealed: bool,
    /// The damage found in it (the walk stops at the first).
    pub damage: Option<Damage>,
}

/// What `hasync verify` found in a data directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Whether the last stop was clean (no abort marker).
    pub clean: bool,
    /// The checkpoint's flushed offset, when a readable checkpoint exists.
    pub checkpoint_flushed: Option<u64>,
    /// The segment size (the first file's size), when there are files.
    pub segment_size: Option<u64>,
    /// One entry per segment file, in offset order.
    pub segments: Vec<SegmentReport>,
    /// Every damage found, the files' and the checkpoint's.
    pub damage: Vec<Damage>,
    /// A cut (a truncate, a wipe) that a stop interrupted before its checkpoint landed, which
    /// the next start finishes ([`crate::store::cut_intent`]); the checkpoint is read as that
    /// cut leaves it.
    pub unfinished_cut: Option<UnfinishedCut>,
}

/// A cut the next start finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnfinishedCut {
    /// The offset the log is cut to (0 for a wipe).
    pub offset: u64,
    /// Every segment file goes (a slave's full resync).
    pub wipe: bool,
}

impl VerifyReport {
    /// Records checked in all files.
    pub fn records(&self) -> u64 {
        self.segments.iter().map(|s| s.records).sum()
    }
}

/// Checks the data directory `data_dir` (of a stopped node) of a node with the default
/// `store.max-message-size`: [`verify_data_dir_with`].
pub fn verify_data_dir(
    data_dir: &Path,
    progress: impl FnMut(&SegmentReport),
) -> Result<VerifyReport> {
    let max_message_size = crate::store::StoreOptions::default().max_message_size;
    verify_data_dir_with(data_dir, max_message_size, progress)
}

/// Checks the data directory `data_dir` (of a stopped node whose `store.max-message-size` is
/// `max_message_size`); `progress` sees each segment's report as soon as it is checked. Fails
/// (no report) when `data_dir` has no commitlog directory or a file cannot be read; damage is
/// in the report.
pub fn verify_data_dir_with(
    data_dir: &Path,
    max_message_size: usize,
    mut progress: impl FnMut(&SegmentReport),
) -> Result<VerifyReport> {
    let dir = data_dir.join(COMMITLOG_DIR);
    let mut report =
        VerifyReport { clean: !data_dir.join(ABORT_FILE).exists(), ..Default::default() };
    let checkpoint_file = data_dir.join(CHECKPOINT_FILE);
    let checkpoint = match Checkpoint::load(&StdFs, data_dir) {
        Ok(cp) => cp,
        Err(e) => {
            let reason = format!("unreadable checkpoint: {e}");
            report.damage.push(Damage { file: checkpoint_file.clone(), offset: 0, reason });
            None
        }
    };
    let generation = checkpoint.as_ref().map_or(0, |cp| cp.cut_generation);
    let intent = CutIntent::load(&StdFs, data_dir).unwrap_or_else(|e| {
        let reason = format!("unreadable cut intent: {e}");
        report.damage.push(Damage { file: data_dir.join(CUT_INTENT_FILE), offset: 0, reason });
        None
    });
    let files = list_segments(&dir)?;
    // As the next start reads it (an unfinished cut bounds what it claims; a wipe's, nothing).
    let unfinished = intent.filter(|i| i.generation > generation);
    report.unfinished_cut = unfinished.map(|i| UnfinishedCut { offset: i.offset, wipe: i.wipe });
    let cut_at = unfinished.map_or(u64::MAX, |i| i.offset);
    let first = files.first().map_or(0, |(from, _)| *from);
    let checkpoint = checkpoint
        .filter(|_| !unfinished.is_some_and(|i| i.wipe))
        .map(|cp| cp.read_by_a_start(cut_at, first));
    report.checkpoint_flushed = checkpoint.as_ref().map(|cp| cp.flushed_offset);
    let max_record = integrity::largest_record(max_message_size);
    // Without a checkpoint, the file being written is the last one that is not the spare.
    let spare = report.checkpoint_flushed.is_none()
        && files.len() >= 2
        && files.last().map_or(Ok(false), |(_, path)| is_all_zero(path))?;
    let written = files.len() - usize::from(spare);
    for (i, (from, path)) in files.iter().enumerate() {
        let size = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?.len();
        let seg = *report.segment_size.get_or_insert(size);
        if let Some(d) = layout_damage(path, *from, size, seg, i.checked_sub(1).map(|p| files[p].0))
        {
            report.damage.push(d);
            continue;
        }
        let last = i + 1 >= written;
        let limits = (seg as usize, max_record);
        let seg_report = check_file(path, *from, limits, report.checkpoint_flushed, last)?;
        report.damage.extend(seg_report.damage.clone());
        progress(&seg_report);
        report.segments.push(seg_report);
    }
    if let (Some(cp), Some(first), Some(last)) =
        (&checkpoint, files.first(), report.segments.last())
    {
        let end = last.from_offset + report.segment_size.unwrap_or(0);
        if cp.dispatched_offset < first.0 || cp.flushed_offset > end {
            let reason = format!(
                "checkpoint covers [{}, {}) but the segment files hold [{}, {end})",
                cp.dispatched_offset, cp.flushed_offset, first.0
            );
            report.damage.push(Damage { file: checkpoint_file, offset: cp.flushed_offset, reason });
        }
    }
    Ok(report)
}

/// The segment files of `dir` (20-digit names), in offset order.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
        let entry = entry.map_err(|e| Error::io("list", dir, e))?;
        if let Some(offset) = entry.file_name().to_str().and_then(parse_file_name) {
            files.push((offset, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// A file of the wrong size, at an unaligned offset, or after a gap.
fn layout_damage(path: &Path, from: u64, size: u64, seg: u64, prev: Option<u64>) -> Option<Damage> {
    let reason = if size != seg {
        format!("file is {size} bytes, the first segment file is {seg}")
    } else if !from.is_multiple_of(seg) {
        format!("start offset is not a multiple of the segment size {seg}")
    } else if let Some(prev) = prev.filter(|p| p + seg != from) {
        format!("gap between files: the previous file ends at {}", prev + seg)
    } else {
        return None;
    };
    Some(Damage { file: path.to_path_buf(), offset: from, reason })
}

/// Walks one segment file; a stop is damage when the checkpoint says its bytes were durable
/// (or, without a checkpoint, in any file but the last).
fn check_file(
    path: &Path,
    from: u64,
    (seg, max_record): (usize, usize),
    flushed: Option<u64>,
    last: bool,
) -> Result<SegmentReport> {
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let read = |pos: usize, len: usize| {
        integrity::read_chunk(&file, pos, len).map_err(|e| Error::io("read", path, e))
    };
    let limits = (integrity::CHUNK, max_record.min(seg));
    let walk = integrity::walk_segment(from, seg, limits, read, |_| true)?
        .expect("a walk that is never paced to a stop always ends with a result");
    let durable = |claimed_end: u64| flushed.map_or(!last, |f| claimed_end <= f);
    let damage = match &walk.stop {
        Some(stop) if durable(stop.claimed_end) => Some(integrity::damage_of(path, stop)),
        _ if !walk.sealed && durable(from + seg as u64) => Some(Damage {
            file: path.to_path_buf(),
            offset: from + walk.end as u64,
            reason: "the file ends before its records do".into(),
        }),
        _ => None,
    };
    Ok(SegmentReport {
        file: path.to_path_buf(),
        from_offset: from,
        records: walk.records,
        ends_at: from + walk.end as u64,
        sealed: walk.sealed,
        damage,
    })
}

/// Whether every byte of the file at `path` is zero (plain reads, a chunk at a time).
fn is_all_zero(path: &Path) -> Result<bool> {
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut pos = 0;
    loop {
        let chunk = integrity::read_chunk(&file, pos, integrity::CHUNK)
            .map_err(|e| Error::io("read", path, e))?;
        if chunk.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        if chunk.len() < integrity::CHUNK {
            return Ok(true);
        }
        pos += chunk.len();
    }
}
