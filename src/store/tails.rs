//! Truncated tails kept aside: before a truncate that removes bytes of the log (a demoted
//! master's divergent tail, a slave's cut at the consistent point of its epoch check), the
//! bytes `[cut offset, max offset)` are copied into a tail file under `<data-dir>/truncated/`,
//! so what an old master acknowledged only to itself is not destroyed silently.
//!
//! A tail file is named after what it holds, so that a listing sorts by epoch, then offset:
//!
//! ```text
//! epoch-<E>-from-<start>-to-<end>-<unix ms>.tail
//! ```
//!
//! (`E` the last epoch of the cut records in 16 digits, the offsets in 20, the time in 13),
//! and holds a state-file header and its JSON payload ([`TailMeta`]: the range, the epochs of
//! the cut records, who caused the cut, when, the data directory's id, the CRC32 of the data),
//! then the data: the log's bytes of the range exactly as they were (records at the offsets
//! they had, an end-of-file blank where a segment ended). [`TailFile`] reads one back: the
//! header is checked when it is opened, the data's length and CRC by [`TailFile::verify`], and
//! [`TailFile::records`] decodes the records one at a time (never the whole file in memory).
//! Every damage is an error naming the file.
//!
//! Keeping a tail, counting the tails (`truncated/totals`) and their retention are in
//! [`keep`].

pub(crate) mod keep;

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::keep::{KeptTail, TailStatus};
use crate::store::record::{self, BLANK_HEADER_SIZE, Decoded, RecordView};
use crate::store::state_file::{self, StateFileError};

/// The directory of the tail files inside the data directory.
pub const TAILS_DIR: &str = "truncated";
/// The state-file kind of a tail file's header.
const KIND: &str = "tail";
/// The ending of a tail file's name.
pub const TAIL_SUFFIX: &str = ".tail";
/// How much of the log or of a tail file is read or written at once.
pub(crate) const CHUNK: usize = 1 << 20;

/// Why a tail is cut: what the node knows and the store does not (it fills it in).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailCause {
    /// What cut it: "demotion" (a role change to slave) or "epoch check" (a slave's check
    /// before it connects to its master).
    pub reason: String,
    /// The epochs of the cut records, from this node's epoch history, in order.
    pub epochs: Vec<u64>,
    /// The gRPC address of the master whose history made the cut necessary.
    pub master: String,
    /// That master's last epoch.
    pub master_epoch: u64,
    /// The node name of the master that opened that epoch (empty when unknown).
    #[serde(default)]
    pub master_name: String,
    /// This node's name.
    pub node_name: String,
    /// This data directory's id.
    pub data_dir_id: String,
}

/// A tail file's header payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailMeta {
    /// The number of this tail among every tail this data directory kept (from 1).
    pub seq: u64,
    /// The log offset of the first byte kept (the cut offset).
    pub start_offset: u64,
    /// The log offset just past the last byte kept (the max offset before the cut).
    pub end_offset: u64,
    /// CRC32 of the data.
    pub data_crc32: u32,
    /// When the tail was kept, Unix ms.
    pub time_unix_ms: i64,
    /// Why.
    #[serde(flatten)]
    pub cause: TailCause,
}

impl TailMeta {
    /// Bytes of data the file holds.
    pub fn len_bytes(&self) -> u64 {
        self.end_offset - self.start_offset
    }

    /// The epoch the name carries: the last of the cut records' epochs (0 when none is known).
    pub fn last_epoch(&self) -> u64 {
        self.cause.epochs.iter().copied().max().unwrap_or(0)
    }

    /// The file name of this tail (see the module docs).
    pub fn file_name(&self) -> String {
        format!(
            "epoch-{:016}-from-{:020}-to-{:020}-{:013}{TAIL_SUFFIX}",
            self.last_epoch(),
            self.start_offset,
            self.end_offset,
            self.time_unix_ms.max(0)
        )
    }

    /// The header and payload bytes that start the tail file.
    pub(crate) fn encode_header(&self) -> Vec<u8> {
        debug_assert!(self.start_offset < self.end_offset, "a tail holds at least one byte");
        let payload = serde_json::to_vec(self).expect("tail meta serializes");
        state_file::encode(KIND, &payload)
    }
}

/// One step of the walk over a tail file's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailRecord<'a> {
    /// A checked message record at the log offset it had.
    Message {
        /// Its log offset.
        offset: u64,
        /// The record.
        view: RecordView<'a>,
    },
    /// The end-of-file blank of a segment: the next record starts `size` bytes on (the tail
    /// may end before that, within the blank's span).
    Blank {
        /// Its log offset.
        offset: u64,
        /// The span it claims.
        size: u64,
    },
    /// The data ends within a record: the log was cut in the middle of one (a slave's partial
    /// last record). The walk ends.
    Partial {
        /// Where the record starts.
        offset: u64,
        /// How many of its bytes the tail holds.
        len: u64,
    },
    /// Bytes that are not a record (the walk cannot go on past them).
    Damaged {
        /// Where they start.
        offset: u64,
        /// What is wrong.
        reason: &'a str,
    },
}

/// A tail file opened for reading, its header checked.
#[derive(Debug, Clone)]
pub struct TailFile {
    path: PathBuf,
    meta: TailMeta,
    /// Where the data starts in the file.
    data_at: u64,
}

impl TailFile {
    /// Opens `path` and checks its header: a state-file header of kind "tail" with a valid
    /// payload, and a file length of exactly the header plus the range's bytes.
    pub fn open(path: &Path) -> Result<Self, StateFileError> {
        let io_err =
            |source| StateFileError::Io { kind: KIND, op: "read", path: path.into(), source };
        let corrupt =
            |reason: String| StateFileError::Corrupt { kind: KIND, path: path.into(), reason };
        let file = File::open(path).map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        let mut r = BufReader::new(file);
        let (payload, data_at) = state_file::read_prefix(KIND, path, &mut r)?;
        let meta: TailMeta = serde_json::from_slice(&payload)
            .map_err(|e| corrupt(format!("payload does not parse: {e}")))?;
        if meta.end_offset <= meta.start_offset {
            return Err(corrupt(format!(
                "the range [{}, {}) is empty",
                meta.start_offset, meta.end_offset
            )));
        }
        let data_len = file_len - data_at;
        if data_len < meta.len_bytes() {
            return Err(StateFileError::Truncated {
                kind: KIND,
                path: path.into(),
                reason: format!(
                    "{data_len} bytes of data, the header says {} ([{}, {}))",
                    meta.len_bytes(),
                    meta.start_offset,
                    meta.end_offset
                ),
            });
        }
        if data_len > meta.len_bytes() {
            return Err(corrupt(format!(
                "{data_len} bytes of data, the header says {}",
                meta.len_bytes()
            )));
        }
        Ok(Self { path: path.to_path_buf(), meta, data_at })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its header.
    pub fn meta(&self) -> &TailMeta {
        &self.meta
    }

    /// A reader positioned at the data.
    fn data(&self) -> Result<BufReader<io::Take<File>>, StateFileError> {
        let mut f = File::open(&self.path).map_err(|e| self.io_err(e))?;
        f.seek(SeekFrom::Start(self.data_at)).map_err(|e| self.io_err(e))?;
        Ok(BufReader::with_capacity(CHUNK, f.take(self.meta.len_bytes())))
    }

    fn io_err(&self, source: io::Error) -> StateFileError {
        StateFileError::Io { kind: KIND, op: "read", path: self.path.clone(), source }
    }

    fn corrupt(&self, reason: String) -> StateFileError {
        StateFileError::Corrupt { kind: KIND, path: self.path.clone(), reason }
    }

    /// Reads the whole data (in chunks) and checks its CRC against the header's.
    pub fn verify(&self) -> Result<(), StateFileError> {
        let mut r = self.data()?;
        let mut crc = crc32fast::Hasher::new();
        let mut read = 0u64;
        loop {
            let buf = r.fill_buf().map_err(|e| self.io_err(e))?;
            if buf.is_empty() {
                break;
            }
            crc.update(buf);
            let n = buf.len();
            read += n as u64;
            r.consume(n);
        }
        if read != self.meta.len_bytes() {
            return Err(StateFileError::Truncated {
                kind: KIND,
                path: self.path.clone(),
                reason: format!("{read} bytes of data, the header says {}", self.meta.len_bytes()),
            });
        }
        let crc = crc.finalize();
        if crc != self.meta.data_crc32 {
            return Err(self.corrupt(format!(
                "data checksum {crc:#010x} != stored {:#010x}",
                self.meta.data_crc32
            )));
        }
        Ok(())
    }

    /// Walks the data from its first byte (a record start: the log is cut at record
    /// boundaries), calling `each` for every step, at the log offsets the bytes had; one record
    /// at a time is in memory. Ends at the end of the data, or after a [`TailRecord::Partial`]
    /// or [`TailRecord::Damaged`] step. Does not check the CRC ([`TailFile::verify`] does).
    pub fn records(&self, mut each: impl FnMut(TailRecord<'_>)) -> Result<(), StateFileError> {
        let mut r = self.data()?;
        let (mut offset, end) = (self.meta.start_offset, self.meta.end_offset);
        let mut buf = Vec::new();
        while offset < end {
            let left = end - offset;
            if left < BLANK_HEADER_SIZE as u64 {
                each(TailRecord::Partial { offset, len: left });
                return Ok(());
            }
            buf.resize(BLANK_HEADER_SIZE, 0);
            self.read_exact(&mut r, &mut buf)?;
            let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let magic = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
            if magic == record::BLANK_MAGIC && size >= BLANK_HEADER_SIZE as i32 {
                each(TailRecord::Blank { offset, size: size as u64 });
                let skip = (size as u64).min(left) - BLANK_HEADER_SIZE as u64;
                let skipped = io::copy(&mut (&mut r).take(skip), &mut io::sink())
                    .map_err(|e| self.io_err(e))?;
                debug_assert_eq!(skipped, skip, "the data holds the range's bytes");
                offset += BLANK_HEADER_SIZE as u64 + skip;
                continue;
            }
            if size > BLANK_HEADER_SIZE as i32 && size as u64 > left {
                each(TailRecord::Partial { offset, len: left });
                return Ok(());
            }
            if size > BLANK_HEADER_SIZE as i32 {
                buf.resize(size as usize, 0);
                self.read_exact(&mut r, &mut buf[BLANK_HEADER_SIZE..])?;
            }
            match record::decode(&buf, offset as i64) {
                Ok(Decoded::Message(view)) => {
                    each(TailRecord::Message { offset, view });
                    offset += view.total_size as u64;
                }
                Ok(Decoded::Blank { .. }) => unreachable!("blanks are handled above"),
                Err(e) => {
                    each(TailRecord::Damaged { offset, reason: &e.to_string() });
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn read_exact(&self, r: &mut impl Read, buf: &mut [u8]) -> Result<(), StateFileError> {
        r.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => StateFileError::Truncated {
                kind: KIND,
                path: self.path.clone(),
                reason: "the data ends before the header says".into(),
            },
            _ => self.io_err(e),
        })
    }
}

/// A tail file found in a listing: its header, or why it cannot be read.
#[derive(Debug)]
pub struct Listed {
    /// The file.
    pub path: PathBuf,
    /// Its length on disk.
    pub file_len: u64,
    /// When it was last modified, Unix ms (0 when unknown).
    pub modified_unix_ms: i64,
    /// The opened file, or why it cannot be opened.
    pub file: Result<TailFile, StateFileError>,
}

impl Listed {
    /// When the tail was kept: its header's time, or the file's modification time.
    pub fn time_unix_ms(&self) -> i64 {
        self.file.as_ref().map_or(self.modified_unix_ms, |f| f.meta.time_unix_ms)
    }
}

/// The tail files in `dir` (the data directory's `truncated/`), by name (epoch, then offset);
/// empty when `dir` does not exist. Only `*.tail` files: a temporary file of a keep that did
/// not finish is not one.
pub fn list(dir: &Path) -> io::Result<Vec<Listed>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.ends_with(TAIL_SUFFIX)) {
            continue;
        }
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        let modified_unix_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        let path = entry.path();
        let file = TailFile::open(&path);
        out.push(Listed { path, file_len: meta.len(), modified_unix_ms, file });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

#[cfg(test)]
mod tests;
