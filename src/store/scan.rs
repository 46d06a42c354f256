//! The one segment walk, pure: decode the record at a position, follow it to the next one, and
//! say precisely why the walk cannot go on.
//!
//! Every reader of stored records walks a segment the same way (the slave's dispatch, the
//! queue-offset rebuild of a truncate, [`crate::store::commitlog::RecordIter`], recovery and its
//! check below the checkpoint), so they all go through [`step`] and classify the same bytes the
//! same way:
//!
//! - a checked message record ([`Step::Record`]);
//! - the end-of-file blank record, which must end exactly at the segment's end
//!   ([`Step::EndOfFile`]); one that does not is [`StopReason::BlankMismatch`] (the bytes came
//!   from a store with another segment size);
//! - a stop ([`Step::Stop`]): the bytes end before a record that would fit in the segment does
//!   ([`StopReason::Torn`]: a torn tail, or a slave's log that ends mid-record), the header is
//!   all zeros ([`StopReason::Zeroed`]: never written, or lost), or the bytes are not a record
//!   ([`StopReason::Corrupt`]).
//!
//! Whether a stop is the normal end of the log or damage that must refuse start-up is not for
//! this module to say: recovery decides with [`Stop::claimed_end`] and the flushed offset.
//! No I/O here; the callers own the files.

use std::path::Path;

use crate::store::error::Error;
use crate::store::record::{self, BLANK_HEADER_SIZE, Decoded, RecordError, RecordView};

/// One step of a walk over a segment's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    /// A checked message record at commitlog `offset`; the next one starts at
    /// `offset + view.total_size`.
    Record {
        /// The record's commitlog offset.
        offset: u64,
        /// The decoded record.
        view: RecordView<'a>,
    },
    /// The end-of-file blank record at `offset`, ending exactly at the segment's end: the walk
    /// goes on at the next segment.
    EndOfFile {
        /// Where the blank record starts.
        offset: u64,
        /// The bytes it stands for, from `offset` to the segment's end.
        size: u64,
    },
    /// No record can be read at `stop.offset`; the walk ends here.
    Stop(Stop),
}

/// Where and why a walk ended before the end of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stop {
    /// The commitlog offset of the record that could not be read.
    pub(crate) offset: u64,
    /// The end the bytes at `offset` claim for themselves: `offset` plus their TOTALSIZE field,
    /// at least the 8-byte header, `u64::MAX` for a negative size. A stop whose claimed end lies
    /// at or below the flushed offset was durable, so it is damage, not a torn tail.
    pub(crate) claimed_end: u64,
    /// Why.
    pub(crate) reason: StopReason,
}

/// Why no record could be read at a position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StopReason {
    /// The bytes end before the record does, and the record would fit in the segment: a torn
    /// tail (more bytes may still complete it, as on a slave that received part of a record).
    #[error("incomplete record: needed {needed} bytes, {available} available")]
    Torn {
        /// Bytes the record needs: its header, or its TOTALSIZE.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// The 8-byte header is all zeros: nothing was written here, or it was lost.
    #[error("no record: the header is all zeros (never written, or lost)")]
    Zeroed,
    /// An end-of-file blank record that does not end exactly at the segment's end.
    #[error("blank record claims {blank_size} bytes but {remaining} remain in the file")]
    BlankMismatch {
        /// The size the blank record claims.
        blank_size: i32,
        /// The bytes from it to the segment's end.
        remaining: u64,
    },
    /// The bytes are not a valid record (bad magic, size, CRC, offset, fields, or a record
    /// that would run past the segment's end).
    #[error("{0}")]
    Corrupt(RecordError),
    /// TOTALSIZE claims more than the largest record the store takes (found only by the
    /// chunked walk of [`crate::store::integrity`], which does not read such a claim whole).
    #[error(
        "total_size {claimed} is more than the largest record, {max} bytes \
         (store.max-message-size plus header, topic and properties)"
    )]
    TooLarge {
        /// The size the record claims.
        claimed: usize,
        /// The largest record.
        max: usize,
    },
}

impl Stop {
    /// The store error for this stop in segment file `file`: a blank mismatch is
    /// [`Error::SegmentSizeMismatch`], anything else [`Error::Corruption`] with the reason.
    pub(crate) fn to_error(&self, file: &Path) -> Error {
        match self.reason {
            StopReason::BlankMismatch { blank_size, remaining } => Error::SegmentSizeMismatch {
                offset: self.offset,
                blank_size: i64::from(blank_size),
                remaining,
            },
            _ => Error::Corruption {
                file: file.to_path_buf(),
                offset: self.offset,
                reason: self.reason.to_string(),
            },
        }
    }

    /// Whether the bytes may still become a record (a torn tail, not damage, when more bytes
    /// can follow).
    #[cfg(test)]
    pub(crate) fn is_torn(&self) -> bool {
        matches!(self.reason, StopReason::Torn { .. })
    }
}

/// Decodes the step at file position `pos` of a segment.
///
/// `bytes` are the segment's bytes from its start (all of them, or only those written so far);
/// `from_offset` is the segment's commitlog offset and `segment_size` its full size. `None` when
/// `pos` is at or past the end of `bytes` (nothing more to read there).
pub(crate) fn step(
    bytes: &[u8],
    from_offset: u64,
    segment_size: usize,
    pos: usize,
) -> Option<Step<'_>> {
    debug_assert!(bytes.len() <= segment_size, "bytes beyond the segment's end");
    if pos >= bytes.len() {
        return None;
    }
    let buf = &bytes[pos..];
    let offset = from_offset + pos as u64;
    let remaining = segment_size - pos;
    let stop = |reason| Step::Stop(Stop { offset, claimed_end: claimed_end(buf, offset), reason });
    Some(match record::decode(buf, offset as i64) {
        Ok(Decoded::Message(view)) => Step::Record { offset, view },
        Ok(Decoded::Blank { size }) if size as usize == remaining => {
            Step::EndOfFile { offset, size: size as u64 }
        }
        Ok(Decoded::Blank { size }) => {
            stop(StopReason::BlankMismatch { blank_size: size, remaining: remaining as u64 })
        }
        Err(_) if buf.len() >= BLANK_HEADER_SIZE && buf[..BLANK_HEADER_SIZE] == [0; 8] => {
            stop(StopReason::Zeroed)
        }
        Err(RecordError::Incomplete { needed, available }) if needed <= remaining => {
            stop(StopReason::Torn { needed, available })
        }
        Err(e) => stop(StopReason::Corrupt(e)),
    })
}

/// `offset` plus the TOTALSIZE the bytes claim, at least the 8-byte header.
fn claimed_end(buf: &[u8], offset: u64) -> u64 {
    let claimed = buf.get(..4).map_or(0, |b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let size = u64::try_from(claimed).unwrap_or(u64::MAX).max(BLANK_HEADER_SIZE as u64);
    offset.saturating_add(size)
}

/// An iterator over the steps of one segment from a position: every record, then the
/// end-of-file blank or a stop, or nothing more when the bytes end at a record boundary.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct Scan<'a> {
    bytes: &'a [u8],
    from_offset: u64,
    segment_size: usize,
    pos: usize,
    done: bool,
}

#[cfg(test)]
impl<'a> Scan<'a> {
    /// Walks `bytes` (the segment's bytes from its start, see [`step`]) from file position
    /// `pos`.
    pub(crate) fn new(bytes: &'a [u8], from_offset: u64, segment_size: usize, pos: usize) -> Self {
        Self { bytes, from_offset, segment_size, pos, done: false }
    }

    /// The commitlog offset the next step starts at (the segment's end after its blank).
    pub(crate) fn offset(&self) -> u64 {
        self.from_offset + self.pos as u64
    }
}

#[cfg(test)]
impl<'a> Iterator for Scan<'a> {
    type Item = Step<'a>;

    fn next(&mut self) -> Option<Step<'a>> {
        if self.done {
            return None;
        }
        let s = step(self.bytes, self.from_offset, self.segment_size, self.pos)?;
        match &s {
            Step::Record { view, .. } => self.pos += view.total_size as usize,
            Step::EndOfFile { .. } => {
                self.pos = self.segment_size;
                self.done = true;
            }
            Step::Stop(_) => self.done = true,
        }
        debug_assert!(self.pos <= self.segment_size, "a record ran past the segment's end");
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::{Message, encode, encode_blank};

    const SEG: usize = 4096;
    const FROM: u64 = 3 * SEG as u64;

    fn msg(body: &[u8]) -> Message {
        Message {
            topic: "T".into(),
            queue_id: 1,
            flag: 0,
            body: bytes::Bytes::copy_from_slice(body),
            properties: bytes::Bytes::from_static(b"TAGS\x01a\x02"),
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: "127.0.0.1:1".parse().unwrap(),
            store_timestamp_ms: 2,
            store_host: "127.0.0.1:2".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    /// A segment holding `n` records then the end-of-file blank; returns it and the records'
    /// file positions.
    fn segment(n: usize) -> (Vec<u8>, Vec<usize>) {
        let mut seg = vec![0u8; SEG];
        let mut at = 0;
        let mut starts = Vec::new();
        for i in 0..n {
            let rec = encode(&msg(&[i as u8; 100]), i as i64, (FROM + at as u64) as i64).unwrap();
            seg[at..at + rec.len()].copy_from_slice(&rec);
            starts.push(at);
            at += rec.len();
        }
        encode_blank((SEG - at) as i32, &mut seg[at..]);
        starts.push(at);
        (seg, starts)
    }

    fn stop_of(steps: &[Step<'_>]) -> Option<Stop> {
        match steps.last() {
            Some(Step::Stop(s)) => Some(s.clone()),
            _ => None,
        }
    }

    #[test]
    fn normal_segment_yields_every_record_then_the_blank() {
        let (seg, starts) = segment(5);
        let mut scan = Scan::new(&seg, FROM, SEG, 0);
        let steps: Vec<_> = scan.by_ref().collect();
        assert_eq!(steps.len(), 6);
        for (s, &at) in steps.iter().zip(&starts[..5]) {
            assert!(matches!(s, Step::Record { offset, .. } if *offset == FROM + at as u64));
        }
        let blank_at = starts[5];
        assert_eq!(
            steps[5],
            Step::EndOfFile { offset: FROM + blank_at as u64, size: (SEG - blank_at) as u64 }
        );
        assert_eq!(scan.offset(), FROM + SEG as u64, "the walk goes on at the next segment");
        assert_eq!(scan.next(), None);
    }

    #[test]
    fn starts_at_any_record_boundary() {
        let (seg, starts) = segment(3);
        let steps: Vec<_> = Scan::new(&seg, FROM, SEG, starts[2]).collect();
        assert!(
            matches!(steps[0], Step::Record { offset, .. } if offset == FROM + starts[2] as u64)
        );
        assert!(matches!(steps[1], Step::EndOfFile { .. }));
    }

    #[test]
    fn written_bytes_ending_at_a_record_boundary_end_the_walk_quietly() {
        let (seg, starts) = segment(3);
        let mut scan = Scan::new(&seg[..starts[2]], FROM, SEG, 0);
        assert_eq!(scan.by_ref().count(), 2);
        assert_eq!(scan.offset(), FROM + starts[2] as u64);
        // An empty segment (nothing written) has no step at all.
        assert_eq!(Scan::new(&[], FROM, SEG, 0).count(), 0);
    }

    #[test]
    fn zeroed_tail_is_a_zeroed_stop() {
        let (mut seg, starts) = segment(3);
        seg[starts[2]..].fill(0);
        let steps: Vec<_> = Scan::new(&seg, FROM, SEG, 0).collect();
        assert_eq!(steps.len(), 3);
        let stop = stop_of(&steps).unwrap();
        assert_eq!(stop.offset, FROM + starts[2] as u64);
        assert_eq!(stop.reason, StopReason::Zeroed);
        assert_eq!(stop.claimed_end, stop.offset + 8, "a zero size claims the header");
        // A segment that is zeros from its start (preallocated, never written) stops at once.
        let zeros = vec![0u8; SEG];
        let stop = stop_of(&Scan::new(&zeros, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        assert_eq!((stop.offset, stop.reason), (FROM, StopReason::Zeroed));
    }

    #[test]
    fn torn_record_is_a_torn_stop_when_it_would_fit() {
        let (seg, starts) = segment(3);
        let cut = starts[1] + 50;
        let steps: Vec<_> = Scan::new(&seg[..cut], FROM, SEG, 0).collect();
        let stop = stop_of(&steps).unwrap();
        assert_eq!(stop.offset, FROM + starts[1] as u64);
        assert!(stop.is_torn(), "{stop:?}");
        assert_eq!(stop.claimed_end, FROM + starts[2] as u64);
        // A partial header (even one that starts with zeros) is torn too.
        let stop = step(&seg[..starts[1] + 3], FROM, SEG, starts[1]).unwrap();
        assert!(matches!(stop, Step::Stop(s) if s.is_torn()));
    }

    #[test]
    fn torn_record_zeroed_past_the_cut_is_corrupt_when_all_bytes_are_there() {
        // A power loss zeroes the end of the record: the whole segment is there, so the record
        // decodes with a bad CRC (or a malformed field), not as incomplete.
        let (mut seg, starts) = segment(3);
        seg[starts[1] + 90..].fill(0);
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        assert_eq!(stop.offset, FROM + starts[1] as u64);
        assert!(matches!(stop.reason, StopReason::Corrupt(_)), "{stop:?}");
        assert_eq!(stop.claimed_end, FROM + starts[2] as u64);
    }

    #[test]
    fn garbled_bytes_are_corrupt() {
        let (mut seg, starts) = segment(3);
        seg[starts[2] + 4] ^= 0x5A; // the magic
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        assert_eq!(stop.offset, FROM + starts[2] as u64);
        assert!(matches!(stop.reason, StopReason::Corrupt(RecordError::BadMagic(_))));
        // A flipped body byte is a CRC mismatch.
        let (mut seg, starts) = segment(3);
        seg[starts[0] + 150] ^= 0xFF;
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        assert_eq!(stop.offset, FROM);
        assert!(matches!(stop.reason, StopReason::Corrupt(RecordError::BodyCrcMismatch { .. })));
        assert!(stop.reason.to_string().contains("crc"));
        // A negative size claims everything.
        let mut seg = vec![0xFFu8; SEG];
        seg[4..8].copy_from_slice(&record::MAGIC_V1.to_be_bytes());
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        assert_eq!(stop.claimed_end, u64::MAX);
    }

    #[test]
    fn record_claiming_past_the_segment_end_is_corrupt_not_torn() {
        let (mut seg, starts) = segment(2);
        let at = starts[1];
        seg[at..at + 4].copy_from_slice(&(SEG as i32).to_be_bytes());
        seg[at + 4..at + 8].copy_from_slice(&record::MAGIC_V1.to_be_bytes());
        let stop = stop_of(&Scan::new(&seg[..at + 100], FROM, SEG, 0).collect::<Vec<_>>());
        let stop = stop.unwrap();
        assert!(matches!(stop.reason, StopReason::Corrupt(RecordError::Incomplete { .. })));
    }

    #[test]
    fn blank_that_does_not_end_at_the_file_end_is_a_mismatch() {
        let (mut seg, starts) = segment(2);
        let at = starts[2];
        encode_blank((SEG - at - 512) as i32, &mut seg[at..]);
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        let remaining = (SEG - at) as u64;
        assert_eq!(
            stop.reason,
            StopReason::BlankMismatch { blank_size: (SEG - at - 512) as i32, remaining }
        );
        assert_eq!(stop.claimed_end, FROM + (SEG - 512) as u64);
        let path = Path::new("seg");
        assert!(matches!(
            stop.to_error(path),
            Error::SegmentSizeMismatch { offset, remaining: r, .. }
                if offset == FROM + at as u64 && r == remaining
        ));
    }

    #[test]
    fn every_stop_but_a_blank_mismatch_is_corruption_naming_file_and_offset() {
        let (mut seg, starts) = segment(2);
        seg[starts[1]..].fill(0);
        let stop = stop_of(&Scan::new(&seg, FROM, SEG, 0).collect::<Vec<_>>()).unwrap();
        match stop.to_error(Path::new("dir/seg")) {
            Error::Corruption { file, offset, reason } => {
                assert_eq!(file, Path::new("dir/seg"));
                assert_eq!(offset, FROM + starts[1] as u64);
                assert_eq!(reason, StopReason::Zeroed.to_string());
            }
            other => panic!("{other}"),
        }
    }
}
