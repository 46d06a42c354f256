//! Checking stored records for damage: the chunked walk over one segment that the background
//! scrub ([`crate::store::scrub`]) and `hasync verify` ([`crate::store::verify`]) share, and
//! the boundary check a reader uses to tell a damaged record from an offset inside a record.
//!
//! The walk classifies bytes exactly as every other reader does ([`scan::step`]), but reads
//! the segment through a caller's `read(pos, len)` in chunks of at most [`CHUNK`] bytes (more
//! only for one record larger than that), so that neither the scrub nor `hasync verify` ever
//! holds a whole segment in memory. Both read with plain reads ([`read_chunk`]), not through
//! the mapping: they hold no slice a truncate would wait for (see
//! [`crate::store::mapped_file`]) and add nothing to the process's mapped memory.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::store::CommitLog;
use crate::store::mapped_file::MappedFile;
use crate::store::record::{
    BLANK_HEADER_SIZE, BLANK_MAGIC, MAGIC_V1, MAGIC_V2, MAX_RECORD_OVERHEAD,
};
use crate::store::scan::{self, Step, Stop, StopReason};

/// The most bytes one read of the walk asks for (unless a single record is larger).
pub(crate) const CHUNK: usize = 1 << 20;

/// Damage found in a segment file: where, and what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The segment file.
    pub file: PathBuf,
    /// The commitlog offset of the record that failed.
    pub offset: u64,
    /// What failed (a CRC, the magic, a size, ...).
    pub reason: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at offset {}: {}", self.file.display(), self.offset, self.reason)
    }
}

/// Where the walk of one segment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentWalk {
    /// Records decoded and checked.
    pub(crate) records: u64,
    /// Bytes covered: the records and the end-of-file blank's span.
    pub(crate) bytes: u64,
    /// The file position the walk ended at.
    pub(crate) end: usize,
    /// Whether it reached the end of the file (its blank, or a record ending exactly there).
    pub(crate) sealed: bool,
    /// The stop that ended it before the end of the file, if any.
    pub(crate) stop: Option<Stop>,
}

/// The largest record a store with `max_message_size` takes: the body and
/// [`MAX_RECORD_OVERHEAD`] bytes of header, topic and properties.
pub(crate) fn largest_record(max_message_size: usize) -> usize {
    max_message_size.saturating_add(MAX_RECORD_OVERHEAD)
}

/// Walks the segment at commitlog `from_offset` (`segment_size` bytes) from its start, until
/// the end of the file, a stop, or the end of what `read` returns (a short read: the end of the
/// written bytes). `read(pos, len)` returns up to `len` bytes from file position `pos`, `len`
/// at most `chunk` unless one record is larger ([`CHUNK`] outside tests), and never more than
/// `max_record` ([`largest_record`]): a record whose TOTALSIZE claims more is a stop
/// ([`StopReason::TooLarge`]), found without reading the claim. `pace` is called after each
/// chunk, its slice dropped, with the bytes it covered, and ends the walk (`None`) when it
/// returns false.
pub(crate) fn walk_segment<B: AsRef<[u8]>, E>(
    from_offset: u64,
    segment_size: usize,
    (chunk, max_record): (usize, usize),
    mut read: impl FnMut(usize, usize) -> Result<B, E>,
    mut pace: impl FnMut(usize) -> bool,
) -> Result<Option<SegmentWalk>, E> {
    let mut walk = SegmentWalk { records: 0, bytes: 0, end: 0, sealed: false, stop: None };
    let mut want = chunk;
    while walk.end < segment_size {
        let len = want.min(segment_size - walk.end);
        let slice = read(walk.end, len)?;
        let bytes = slice.as_ref();
        let (start, short) = (walk.end, bytes.len() < len);
        want = chunk;
        let mut at = 0;
        while let Some(step) =
            scan::step(bytes, from_offset + start as u64, segment_size - start, at)
        {
            match step {
                Step::Record { view, .. } => {
                    at += view.total_size as usize;
                    walk.records += 1;
                }
                Step::EndOfFile { size, .. } => {
                    at += size as usize;
                }
                Step::Stop(Stop {
                    offset,
                    claimed_end,
                    reason: StopReason::Torn { needed, .. },
                }) if needed > max_record => {
                    let reason = StopReason::TooLarge { claimed: needed, max: max_record };
                    walk.stop = Some(Stop { offset, claimed_end, reason });
                    break;
                }
                Step::Stop(Stop { reason: StopReason::Torn { needed, .. }, .. }) if !short => {
                    // The record runs past this chunk: read it whole next time.
                    want = needed.max(chunk);
                    break;
                }
                Step::Stop(stop) => {
                    walk.stop = Some(stop);
                    break;
                }
            }
        }
        walk.end = start + at;
        walk.bytes = walk.end as u64;
        drop(slice);
        if walk.stop.is_some() || short {
            break;
        }
        if !pace(at) {
            return Ok(None);
        }
    }
    walk.sealed = walk.end == segment_size;
    debug_assert!(walk.end <= segment_size, "a record ran past the segment's end");
    Ok(Some(walk))
}

/// A `read(pos, len)` for [`walk_segment`] over an open segment file: plain reads (never
/// the mapping), up to `len` bytes, fewer only at the end of the file.
pub(crate) fn read_chunk(file: &File, pos: usize, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buf[got..], (pos + got) as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

/// The damage a walk's stop stands for, in segment file `file`.
pub(crate) fn damage_of(file: &Path, stop: &Stop) -> Damage {
    Damage { file: file.to_path_buf(), offset: stop.offset, reason: stop.reason.to_string() }
}

/// What lies at a file position where a reader could not read a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Boundary {
    /// A record starts exactly there: what could not be read is damage.
    RecordStart,
    /// The position falls inside the record (or the end-of-file blank) starting at this file
    /// position: the reader's offset is wrong.
    Inside(usize),
    /// The records' sizes break off at this file position, before the reader's: the record
    /// there is damaged, and nothing past it can be placed.
    BrokenAt(usize),
}

/// Follows the records' TOTALSIZE fields from the start of a segment (`segment_size` bytes)
/// to file position `at`; only the 8-byte headers are looked at. The segment's written bytes
/// are read through `read(pos, len)` (up to `len` bytes from `pos`, fewer at their end) in
/// chunks of `chunk` bytes, each dropped before the next is read.
pub(crate) fn boundary<B: AsRef<[u8]>, E>(
    segment_size: usize,
    at: usize,
    chunk: usize,
    mut read: impl FnMut(usize, usize) -> Result<B, E>,
) -> Result<Boundary, E> {
    let mut pos = 0;
    let (mut buf_at, mut buf) = (0, None::<B>);
    loop {
        if pos == at {
            return Ok(Boundary::RecordStart);
        }
        let held = buf.as_ref().map_or(0, |b| buf_at + b.as_ref().len());
        if pos + BLANK_HEADER_SIZE > held {
            drop(buf.take()); // one chunk held at a time
            buf = Some(read(pos, chunk.max(BLANK_HEADER_SIZE))?);
            buf_at = pos;
        }
        let bytes = buf.as_ref().map_or(&[][..], |b| b.as_ref());
        let Some(header) = bytes.get(pos - buf_at..pos - buf_at + BLANK_HEADER_SIZE) else {
            return Ok(Boundary::BrokenAt(pos));
        };
        let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let magic = i32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let fits = usize::try_from(size)
            .ok()
            .filter(|&s| s >= BLANK_HEADER_SIZE && pos + s <= segment_size);
        let Some(size) = fits.filter(|_| [MAGIC_V1, MAGIC_V2, BLANK_MAGIC].contains(&magic)) else {
            return Ok(Boundary::BrokenAt(pos));
        };
        if pos + size > at {
            return Ok(Boundary::Inside(pos));
        }
        pos += size;
    }
}

/// File position of PHYSICALOFFSET in a message record's header.
const PHYSICAL_OFFSET_AT: usize = 28;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::{Message, encode, encode_blank};

    const SEG: usize = 8192;
    const FROM: u64 = 4 * SEG as u64;

    fn msg(len: usize) -> Message {
        Message {
            topic: "T".into(),
            queue_id: 0,
            flag: 0,
            body: bytes::Bytes::from(vec![7u8; len]),
            properties: bytes::Bytes::new(),
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: "127.0.0.1:1".parse().unwrap(),
            store_timestamp_ms: 2,
            store_host: "127.0.0.1:2".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    /// A sealed segment of `n` records of `len` body bytes; returns it and the record starts.
    fn segment(n: usize, len: usize) -> (Vec<u8>, Vec<usize>) {
        let mut seg = vec![0u8; SEG];
        let (mut at, mut starts) = (0, Vec::new());
        for i in 0..n {
            let rec = encode(&msg(len), i as i64, (FROM + at as u64) as i64).unwrap();
            seg[at..at + rec.len()].copy_from_slice(&rec);
            starts.push(at);
            at += rec.len();
        }
        encode_blank((SEG - at) as i32, &mut seg[at..]);
        (seg, starts)
    }

    fn walk(seg: &[u8], chunk_reads: &mut Vec<(usize, usize)>) -> SegmentWalk {
        let read = |pos: usize, len: usize| -> Result<Vec<u8>, ()> {
            chunk_reads.push((pos, len));
            Ok(seg[pos..pos + len].to_vec())
        };
        // Chunks of 1000 bytes: records cross them.
        walk_segment(FROM, SEG, (1000, usize::MAX), read, |_| true).unwrap().unwrap()
    }

    /// [`boundary`] over a segment in memory, in chunks of 1000 bytes.
    fn bound(seg: &[u8], size: usize, at: usize) -> Boundary {
        let read = |pos: usize, len: usize| -> Result<&[u8], ()> {
            Ok(&seg[pos.min(seg.len())..(pos + len).min(seg.len())])
        };
        boundary(size, at, 1000, read).unwrap()
    }

    #[test]
    fn a_size_field_claiming_more_than_the_largest_record_stops_without_reading_it() {
        let (mut seg, starts) = segment(20, 300);
        let claimed = (SEG - starts[4] - 100) as i32;
        seg[starts[4]..starts[4] + 4].copy_from_slice(&claimed.to_be_bytes());
        let mut reads = Vec::new();
        let read = |pos: usize, len: usize| -> Result<Vec<u8>, ()> {
            reads.push(len);
            Ok(seg[pos..pos + len].to_vec())
        };
        let w = walk_segment(FROM, SEG, (1000, 2000), read, |_| true).unwrap().unwrap();
        let stop = w.stop.unwrap();
        assert_eq!((w.records, stop.offset), (4, FROM + starts[4] as u64));
        assert_eq!(stop.reason, StopReason::TooLarge { claimed: claimed as usize, max: 2000 });
        assert!(reads.iter().all(|&len| len <= 1000), "one read of the claim: {reads:?}");
        // A record larger than a chunk but not than the largest record is read whole.
        let (seg, _) = segment(3, 1500);
        let read = |pos: usize, len: usize| -> Result<&[u8], ()> { Ok(&seg[pos..pos + len]) };
        let w = walk_segment(FROM, SEG, (1000, 2000), read, |_| true).unwrap().unwrap();
        assert_eq!((w.records, w.sealed, w.stop), (3, true, None));
    }

    #[test]
    fn a_sealed_segment_walks_to_its_end_in_chunks() {
        let (seg, starts) = segment(20, 300);
        let mut reads = Vec::new();
        let w = walk(&seg, &mut reads);
        assert_eq!((w.records, w.sealed, w.stop, w.end), (20, true, None, SEG));
        assert!(reads.len() > SEG / 1000 && reads.iter().all(|r| r.1 <= 1000), "{reads:?}");
        assert_eq!(bound(&seg, SEG, starts[7]), Boundary::RecordStart);
        assert_eq!(bound(&seg, SEG, starts[7] + 3), Boundary::Inside(starts[7]));
    }

    #[test]
    fn a_crc_flip_stops_the_walk_at_that_record_naming_the_crc() {
        let (mut seg, starts) = segment(20, 300);
        seg[starts[12] + 200] ^= 1;
        let w = walk(&seg, &mut Vec::new());
        let stop = w.stop.unwrap();
        assert_eq!((w.records, stop.offset), (12, FROM + starts[12] as u64));
        assert!(stop.reason.to_string().contains("crc"), "{}", stop.reason);
        assert!(!w.sealed);
        // The sizes still lead to the damaged record: it is a record start.
        assert_eq!(bound(&seg, SEG, starts[12]), Boundary::RecordStart);
        // A damaged size field breaks the chain there.
        seg[starts[5]] ^= 0x40;
        assert_eq!(bound(&seg, SEG, starts[12]), Boundary::BrokenAt(starts[5]));
    }

    #[test]
    fn a_short_read_ends_the_walk_quietly_at_a_record_boundary() {
        let (seg, starts) = segment(5, 300);
        let read = |pos: usize, len: usize| -> Result<&[u8], ()> {
            Ok(&seg[pos..(pos + len).min(starts[3])])
        };
        let w = walk_segment(FROM, SEG, (1000, usize::MAX), read, |_| true).unwrap().unwrap();
        assert_eq!((w.records, w.end, w.sealed, w.stop), (3, starts[3], false, None));
        // A pace that says stop ends the walk with no result.
        let (seg, _) = segment(20, 300);
        let read = |pos: usize, len: usize| -> Result<&[u8], ()> { Ok(&seg[pos..pos + len]) };
        assert_eq!(walk_segment(FROM, SEG, (1000, usize::MAX), read, |_| false).unwrap(), None);
    }
}

/// What lies at an offset where a reader could not read a record
/// ([`CommitLog::unreadable_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The record there is damaged, or the records' sizes break off before it (then `offset`
    /// of the damage is below the reader's).
    Damaged(Damage),
    /// The offset falls inside the record (or end-of-file blank) starting at `record_start`.
    NotARecordStart {
        /// Where the record holding the offset starts.
        record_start: u64,
    },
}

impl CommitLog {
    /// Why no record can be read at `offset`, for a reader whose walk stopped there. Blocking
    /// (plain reads; the node's Read runs it under `spawn_blocking`). When the header there is
    /// a record's that names `offset` as its own (PHYSICALOFFSET), a record starts there: its
    /// damage is read from that record alone. Else it follows the records' sizes from the start
    /// of the segment file to `offset` (headers only, read in [`CHUNK`]s with plain reads, so
    /// no slice a truncate would wait for is held) to tell damage from an offset inside a
    /// record. `None` when a record can be read there after all, or the store does not hold
    /// `offset`.
    pub fn unreadable_at(&self, offset: u64) -> Option<Unreadable> {
        let file = self.shared.queue.find(offset)?;
        let (from, size) = (file.from_offset(), file.size());
        let at = (offset - from) as usize;
        if names_itself(&file, at) {
            return damaged_at(&file, at);
        }
        let wrote = file.wrote_pos();
        let f = std::fs::File::open(file.path()).ok()?;
        let read = |pos: usize, len: usize| read_chunk(&f, pos, len.min(wrote.saturating_sub(pos)));
        match boundary(size, at, CHUNK, read).ok()? {
            Boundary::RecordStart => damaged_at(&file, at),
            Boundary::Inside(pos) => {
                Some(Unreadable::NotARecordStart { record_start: from + pos as u64 })
            }
            Boundary::BrokenAt(pos) => damaged_at(&file, pos).or_else(|| {
                let reason = "the records' sizes break off here".to_owned();
                let file = file.path().to_path_buf();
                Some(Unreadable::Damaged(Damage { file, offset: from + pos as u64, reason }))
            }),
        }
    }
}

/// Whether the bytes at file position `at` are a message record's header naming its own
/// commitlog offset: a record starts there (its header is intact; the damage is further in).
fn names_itself(file: &MappedFile, at: usize) -> bool {
    let Some(header) = file.read(at, PHYSICAL_OFFSET_AT + 8) else { return false };
    let Some(h) = header.get(..PHYSICAL_OFFSET_AT + 8) else { return false };
    let magic = i32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let mut physical = [0u8; 8];
    physical.copy_from_slice(&h[PHYSICAL_OFFSET_AT..]);
    [MAGIC_V1, MAGIC_V2].contains(&magic)
        && u64::from_be_bytes(physical) == file.from_offset() + at as u64
}

/// The damage of the record at file position `pos`, read from its bytes alone (a slice of at
/// most its claimed size, dropped on return); `None` when it reads.
fn damaged_at(file: &MappedFile, pos: usize) -> Option<Unreadable> {
    let claimed = file.read(pos, BLANK_HEADER_SIZE).and_then(|h| {
        let b = h.get(..4)?;
        usize::try_from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok()
    });
    let len = claimed.unwrap_or(0).max(BLANK_HEADER_SIZE);
    let bytes = file.read(pos, len).unwrap_or_default();
    let offset = file.from_offset() + pos as u64;
    match scan::step(&bytes, offset, file.size() - pos, 0) {
        Some(Step::Stop(stop)) => Some(Unreadable::Damaged(damage_of(file.path(), &stop))),
        _ => None,
    }
}
