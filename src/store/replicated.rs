//! The slave's write: the master's raw bytes at exactly the offset they hold on the master,
//! each record they complete dispatched (its consume-queue position recorded) and, on the
//! checked path, verified (CRC, structure) before it is published.

use std::time::Duration;

use crate::store::commitlog::{CommitLog, WriterState};
use crate::store::error::{Error, Result};
use crate::store::fence::Writes;
use crate::store::mapped_file_queue::Extent;
use crate::store::recovery;
use crate::store::scan::{Step, StopReason};

/// How long the cut of a refused record's published first part waits for readers.
pub(crate) const REFUSED_CUT_WAIT: Duration = Duration::from_millis(200);

impl CommitLog {
    /// Writes the master's raw bytes at exactly `offset` (the slave's path). The bytes must start
    /// at the current max offset (an empty store accepts any segment-aligned offset and starts
    /// there) and fit in the current file; when it is exactly full the next file is created.
    /// Returns the new max offset. A violation is a typed error; nothing is written then.
    /// Bytes that are not records are stored (see [`Self::append_at_checked`]).
    pub fn append_at(&self, offset: u64, bytes: &[u8]) -> Result<u64> {
        self.append_replicated(offset, bytes, false)
    }

    /// As [`Self::append_at`] (the slave's write), but each record the bytes complete is checked
    /// (the dispatch's decode: CRC, structure) before it is published; at the first that fails
    /// the records before it are kept, nothing from it on ([`Error::DamagedRecord`]).
    pub fn append_at_checked(&self, offset: u64, bytes: &[u8]) -> Result<u64> {
        self.append_replicated(offset, bytes, true)
    }

    /// The replicated write, its I/O outcome reported to the disk monitor.
    fn append_replicated(&self, offset: u64, bytes: &[u8], refuse_damage: bool) -> Result<u64> {
        let written = self.write_replicated(offset, bytes, refuse_damage);
        self.shared.disk.record(crate::store::disk::APPEND, &written);
        written
    }

    fn write_replicated(&self, offset: u64, bytes: &[u8], refuse_damage: bool) -> Result<u64> {
        let queue = &self.shared.queue;
        let seg = self.segment_size();
        self.run_write_hook();
        let mut w = self.shared.writer();
        self.check_open()?;
        if !matches!(w.writes, Writes::Any | Writes::Replicated) {
            return Err(Error::Fenced);
        }
        // Nothing is written past a cut whose durable half (retried here first) or checkpoint
        // is owed.
        queue.settle()?;
        self.shared.check_cut_checkpointed(&w)?;
        let max = self.max_offset();
        let file = if self.is_empty() && offset != max {
            // Holds no bytes (no file, or an empty first file left by a crash): any
            // segment-aligned offset starts the log.
            if !offset.is_multiple_of(seg) {
                return Err(Error::NotSegmentAligned { offset, segment_size: seg });
            }
            if bytes.is_empty() {
                return Ok(max);
            }
            if bytes.len() as u64 > seg {
                return Err(Error::CrossesSegment {
                    offset,
                    len: bytes.len(),
                    segment_end: offset + seg,
                });
            }
            queue.remove_all_empty()?;
            let first = queue.create(offset)?;
            w.dispatched = offset;
            self.flusher.prepare_next(); // the log's first segment: warm it, prepare the next
            first
        } else {
            if offset != max {
                return Err(Error::OffsetMismatch { expected: max, given: offset });
            }
            if bytes.is_empty() {
                return Ok(max);
            }
            let last = queue.last_or_create(offset)?;
            if last.from_offset() == offset {
                self.flusher.prepare_next(); // a new segment: have the next one prepared
            }
            let segment_end = last.end_offset();
            if offset + bytes.len() as u64 > segment_end {
                return Err(Error::CrossesSegment { offset, len: bytes.len(), segment_end });
            }
            last
        };
        file.append(bytes);
        let new_max = file.from_offset() + file.wrote_pos() as u64;
        if let Err(e) = self.dispatch(&mut w, new_max, refuse_damage) {
            // The master's segments are not this store's, or a record is damaged: keep the
            // records before it (dispatch stopped there), nothing from it on.
            if self.cut_refused(&mut w, offset)? {
                drop(w);
                // As after a truncate: no checkpoint may claim the bytes cut.
                if let Err(cp) = crate::store::flush::flush_and_checkpoint(&self.shared) {
                    tracing::error!(error = %cp, "no checkpoint after cutting a refused record");
                }
            }
            return Err(e);
        }
        self.shared.publish_max(new_max);
        Ok(new_max)
    }

    /// Cuts a refused write back to the end of the last record dispatch accepted
    /// (`w.dispatched`). The bytes of this write, from `offset`, were never published: that
    /// cut waits for no reader. When the refused record began in an earlier write (frames cut
    /// records anywhere), its first part was published (and acked): that part is cut too, as a
    /// truncate cuts, waiting for readers holding slices of the file (at most
    /// [`REFUSED_CUT_WAIT`]: this is the slave's write path), so the max offset, the flushed
    /// offset and the next report are the refused record's start. A cut that gives up on
    /// readers leaves that first part (the error is logged; the refusal stands, and the next
    /// refusal of the record, after the link's refusal backoff, tries again). Returns whether published bytes were cut.
    fn cut_refused(&self, w: &mut WriterState, offset: u64) -> Result<bool> {
        let queue = &self.shared.queue;
        let keep = w.dispatched;
        debug_assert!(self.max_offset() <= offset, "this write was not published");
        if keep >= offset {
            queue.truncate_unpublished(keep)?;
            self.shared.publish_max(keep);
            return Ok(false);
        }
        queue.truncate_unpublished(offset)?;
        let cut = self.shared.begin_cut();
        match queue.truncate_waiting(keep, REFUSED_CUT_WAIT) {
            Ok(_) => {
                tracing::warn!(
                    from = offset,
                    to = keep,
                    "the first part of a refused record is cut"
                );
                self.shared.publish_max(keep);
                self.shared.clamp_confirm(keep);
                self.lower_flushed(keep);
                drop(cut);
                Ok(true)
            }
            Err(e) => {
                drop(cut);
                tracing::error!(error = %e, offset = keep,
                    "could not cut the first part of a refused record; it stays until the next try");
                self.shared.publish_max(offset);
                Ok(false)
            }
        }
    }

    /// Advances the slave's dispatch point over every complete record below `max`, keeping the
    /// queue-offset table current (the slave's consume queues are rebuilt from it). A blank
    /// record that does not end exactly at this store's file end means the master's segment
    /// size differs: an error. Bytes that do not decode as records are an error with
    /// `refuse_damage`, else they stop the dispatch (logged).
    fn dispatch(&self, w: &mut WriterState, max: u64, refuse_damage: bool) -> Result<()> {
        if w.dispatch_error.is_some() {
            return Ok(());
        }
        let table = &mut w.queue_offsets;
        let walked = self.shared.queue.walk(w.dispatched, max, Extent::Written, |step| {
            if let Step::Record { view, .. } = step {
                recovery::apply_to_table(table, view);
            }
        });
        w.dispatched = walked.end;
        let Some((file, stop)) = walked.stop else { return Ok(()) };
        match stop.reason {
            // The rest of the record has not arrived yet.
            StopReason::Torn { .. } => Ok(()),
            StopReason::BlankMismatch { .. } => Err(stop.to_error(file.path())),
            reason if refuse_damage => {
                Err(Error::DamagedRecord { offset: stop.offset, reason: reason.to_string() })
            }
            _ => {
                tracing::error!(offset = stop.offset, error = %stop.reason,
                    "replicated bytes do not decode as a record; queue offsets stop here");
                w.dispatch_error = Some(format!("offset {}: {}", stop.offset, stop.reason));
                Ok(())
            }
        }
    }
}
