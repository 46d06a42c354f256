//! The small state files (the checkpoint, the epoch history, the role file) share one format:
//!
//! ```text
//! hasync-state <kind> v<version> len=<payload bytes> crc32=<8 hex digits>\n
//! <payload: JSON>
//! ```
//!
//! The header names what the file is (`kind`), which version of the format wrote it, how long the
//! payload is and the CRC32 of the payload, so that a truncated, damaged or foreign file is
//! refused with an error that says which of these it is, instead of being trusted. Files are
//! written through the [`FileSystem`] seam's `write_atomic` (temporary file, fsync, rename,
//! directory fsync) and read through its `read`, so failpoint tests reach every one of them.
//!
//! A file that does not start with the magic was written before this format existed (each kind
//! had its own JSON then). [`load`] hands such a file to the caller's parser for that older
//! format; the next write replaces it with the current format.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::fs::FileSystem;

/// The first bytes of every state file in the current format.
pub(crate) const MAGIC: &str = "hasync-state";
/// The format version this build writes, and the highest it reads.
pub(crate) const VERSION: u32 = 1;
/// The longest header line accepted; a longer first line is not a header.
const MAX_HEADER: usize = 256;

/// Why a state file could not be read or written. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// The file system refused the read or the write.
    #[error("cannot {op} {kind} file {}: {source}", path.display())]
    Io {
        /// What the file holds ("checkpoint", "epoch", "role").
        kind: &'static str,
        /// What was being done ("read", "write").
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file ends before its header or its payload does (a torn write or a cut copy).
    #[error("{kind} file {} is truncated: {reason}", path.display())]
    Truncated {
        /// What the file holds.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The file is damaged: a bad header, a checksum mismatch, another kind's file, or a
    /// payload that does not parse.
    #[error("{kind} file {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// What the file holds.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file was written by a newer build, in a format version this one cannot read.
    #[error(
        "{kind} file {} has format version {version}; this build reads up to version {supported}",
        path.display()
    )]
    UnsupportedVersion {
        /// What the file holds.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The version in the file.
        version: u32,
        /// The highest version this build reads.
        supported: u32,
    },
}

impl StateFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. }
            | Self::Truncated { path, .. }
            | Self::Corrupt { path, .. }
            | Self::UnsupportedVersion { path, .. } => path,
        }
    }
}

/// The bytes of a state file of `kind` holding `payload`.
pub(crate) fn encode(kind: &str, payload: &[u8]) -> Vec<u8> {
    debug_assert!(!kind.is_empty() && !kind.contains(char::is_whitespace));
    let header = format!(
        "{MAGIC} {kind} v{VERSION} len={} crc32={:08x}\n",
        payload.len(),
        crc32fast::hash(payload)
    );
    debug_assert!(header.len() <= MAX_HEADER);
    let mut out = Vec::with_capacity(header.len() + payload.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// What a state file's bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Contents<'a> {
    /// The checked payload of a file in the current format.
    Current(&'a [u8]),
    /// A whole file without the magic: the format the kind used before this one.
    Legacy(&'a [u8]),
}

/// Checks the header of `bytes` (the contents of `path`, a `kind` file) and returns the payload.
pub(crate) fn decode<'a>(
    kind: &'static str,
    path: &Path,
    bytes: &'a [u8],
) -> Result<Contents<'a>, StateFileError> {
    let truncated =
        |reason: String| StateFileError::Truncated { kind, path: path.to_path_buf(), reason };
    let corrupt =
        |reason: String| StateFileError::Corrupt { kind, path: path.to_path_buf(), reason };
    if !bytes.starts_with(MAGIC.as_bytes()) {
        if MAGIC.as_bytes().starts_with(bytes) {
            return Err(truncated(format!("{} bytes, less than a header", bytes.len())));
        }
        return Ok(Contents::Legacy(bytes));
    }
    let Some(nl) = bytes.iter().take(MAX_HEADER + 1).position(|&b| b == b'\n') else {
        if bytes.len() <= MAX_HEADER {
            return Err(truncated("the header line has no end".into()));
        }
        return Err(corrupt(format!("no header line end within {MAX_HEADER} bytes")));
    };
    let h = check_header(kind, path, &bytes[..nl])?;
    let payload = &bytes[nl + 1..];
    if (payload.len() as u64) < h.len {
        return Err(truncated(format!(
            "payload of {} bytes, header says {}",
            payload.len(),
            h.len
        )));
    }
    if payload.len() as u64 > h.len {
        return Err(corrupt(format!("payload of {} bytes, header says {}", payload.len(), h.len)));
    }
    let crc = crc32fast::hash(payload);
    if crc != h.crc32 {
        return Err(corrupt(format!("checksum {crc:#010x} != stored {:#010x}", h.crc32)));
    }
    Ok(Contents::Current(payload))
}

/// Parses and checks the header line `line` (without its newline) of the `kind` file `path`:
/// its syntax, a version this build reads, its kind.
fn check_header<'a>(
    kind: &'static str,
    path: &Path,
    line: &'a [u8],
) -> Result<Header<'a>, StateFileError> {
    let corrupt =
        |reason: String| StateFileError::Corrupt { kind, path: path.to_path_buf(), reason };
    let header =
        std::str::from_utf8(line).map_err(|_| corrupt("the header line is not UTF-8".into()))?;
    let h = Header::parse(header).map_err(|why| corrupt(format!("header {header:?}: {why}")))?;
    if h.version > VERSION || h.version == 0 {
        return Err(StateFileError::UnsupportedVersion {
            kind,
            path: path.to_path_buf(),
            version: h.version,
            supported: VERSION,
        });
    }
    if h.kind != kind {
        return Err(corrupt(format!("it is a {:?} file, not a {kind:?} file", h.kind)));
    }
    Ok(h)
}

/// The longest payload [`read_prefix`] accepts: the state-file part of a file that carries
/// data of its own after it is a small description of that data.
pub(crate) const MAX_PREFIX_PAYLOAD: u64 = 1 << 20;

/// Reads the header and the checked payload of a `kind` file `path` from the start of `r`,
/// leaving `r` just past the payload: for a file whose state-file part is followed by data of
/// its own (a tail file, [`crate::store::tails`]), which the caller reads on. Returns the
/// payload and how many bytes of `r` the header and the payload took. A file without the
/// magic is corrupt (there is no older format to hand it to).
pub(crate) fn read_prefix(
    kind: &'static str,
    path: &Path,
    r: &mut impl io::BufRead,
) -> Result<(Vec<u8>, u64), StateFileError> {
    let io_err = |source| StateFileError::Io { kind, op: "read", path: path.to_path_buf(), source };
    let truncated =
        |reason: String| StateFileError::Truncated { kind, path: path.to_path_buf(), reason };
    let corrupt =
        |reason: String| StateFileError::Corrupt { kind, path: path.to_path_buf(), reason };
    let mut line = Vec::with_capacity(MAX_HEADER);
    io::BufRead::read_until(&mut io::Read::take(&mut *r, MAX_HEADER as u64 + 1), b'\n', &mut line)
        .map_err(io_err)?;
    if !line.starts_with(MAGIC.as_bytes()) {
        if MAGIC.as_bytes().starts_with(&line) {
            return Err(truncated(format!("{} bytes, less than a header", line.len())));
        }
        return Err(corrupt(format!("not a {kind} file: it does not start with {MAGIC:?}")));
    }
    let Some(b'\n') = line.last() else {
        if line.len() <= MAX_HEADER {
            return Err(truncated("the header line has no end".into()));
        }
        return Err(corrupt(format!("no header line end within {MAX_HEADER} bytes")));
    };
    let h = check_header(kind, path, &line[..line.len() - 1])?;
    if h.len > MAX_PREFIX_PAYLOAD {
        return Err(corrupt(format!(
            "header says {} payload bytes, at most {MAX_PREFIX_PAYLOAD}",
            h.len
        )));
    }
    let mut payload = vec![0u8; h.len as usize];
    io::Read::read_exact(r, &mut payload).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            truncated(format!("the file ends within the {} payload bytes the header says", h.len))
        }
        _ => io_err(e),
    })?;
    let crc = crc32fast::hash(&payload);
    if crc != h.crc32 {
        return Err(corrupt(format!("checksum {crc:#010x} != stored {:#010x}", h.crc32)));
    }
    Ok((payload, line.len() as u64 + h.len))
}

/// A parsed header line (without its newline).
struct Header<'a> {
    kind: &'a str,
    version: u32,
    len: u64,
    crc32: u32,
}

impl<'a> Header<'a> {
    fn parse(line: &'a str) -> Result<Self, String> {
        let mut words = line.split(' ');
        let (Some(MAGIC), Some(kind), Some(version), Some(len), Some(crc), None) =
            (words.next(), words.next(), words.next(), words.next(), words.next(), words.next())
        else {
            return Err(format!("not `{MAGIC} <kind> v<version> len=<n> crc32=<hex>`"));
        };
        let field = |word: &'a str, prefix: &str| {
            word.strip_prefix(prefix).ok_or_else(|| format!("{word:?} does not start {prefix:?}"))
        };
        let version = field(version, "v")?.parse().map_err(|e| format!("version: {e}"))?;
        let len = field(len, "len=")?.parse().map_err(|e| format!("len: {e}"))?;
        let crc32 =
            u32::from_str_radix(field(crc, "crc32=")?, 16).map_err(|e| format!("crc32: {e}"))?;
        Ok(Self { kind, version, len, crc32 })
    }
}

/// Reads the `kind` file at `path` through `fs`; `Ok(None)` when it does not exist. The payload
/// of a current-format file is JSON for `T`; a file without the magic goes to `legacy`, which
/// parses the kind's older format or says why it cannot.
pub(crate) fn load<T: DeserializeOwned>(
    fs: &dyn FileSystem,
    kind: &'static str,
    path: &Path,
    legacy: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Option<T>, StateFileError> {
    let bytes = match fs.read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateFileError::Io { kind, op: "read", path: path.to_path_buf(), source });
        }
    };
    let corrupt =
        |reason: String| StateFileError::Corrupt { kind, path: path.to_path_buf(), reason };
    match decode(kind, path, &bytes)? {
        Contents::Current(payload) => serde_json::from_slice(payload)
            .map(Some)
            .map_err(|e| corrupt(format!("payload does not parse: {e}"))),
        Contents::Legacy(whole) => legacy(whole).map(Some).map_err(corrupt),
    }
}

/// Writes `value` as the `kind` file at `path`, atomically, through `fs`.
pub(crate) fn store<T: Serialize>(
    fs: &dyn FileSystem,
    kind: &'static str,
    path: &Path,
    value: &T,
) -> Result<(), StateFileError> {
    let payload = serde_json::to_vec(value).expect("state file payload serializes");
    fs.write_atomic(path, &encode(kind, &payload)).map_err(|source| StateFileError::Io {
        kind,
        op: "write",
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::fs::{SimFs, StdFs};

    const KIND: &str = "test";

    fn decoded(bytes: &[u8]) -> Result<Contents<'_>, StateFileError> {
        decode(KIND, Path::new("/d/test"), bytes)
    }

    #[test]
    fn a_payload_round_trips_and_the_header_is_readable() {
        let bytes = encode(KIND, b"{\"a\":1}");
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(text, "hasync-state test v1 len=7 crc32=561bacaf\n{\"a\":1}");
        assert_eq!(decoded(&bytes).unwrap(), Contents::Current(b"{\"a\":1}"));
        assert_eq!(decoded(&encode(KIND, b"")).unwrap(), Contents::Current(b""));
    }

    #[test]
    fn a_file_without_the_magic_is_legacy() {
        assert_eq!(decoded(b"{\"version\":1}").unwrap(), Contents::Legacy(b"{\"version\":1}"));
    }

    #[test]
    fn every_cut_of_a_file_is_truncated() {
        let bytes = encode(KIND, b"[1,2,3]");
        for cut in 0..bytes.len() {
            let err = decoded(&bytes[..cut]).unwrap_err();
            assert!(matches!(err, StateFileError::Truncated { .. }), "cut {cut}: {err}");
            assert!(err.to_string().contains("/d/test"), "{err}");
        }
    }

    #[test]
    fn a_changed_byte_is_corrupt_or_unsupported() {
        let bytes = encode(KIND, b"[1,2,3]");
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x01;
            match decoded(&b) {
                // A flipped magic byte makes a file of no format at all: the legacy parser
                // refuses it.
                Ok(Contents::Legacy(_)) => assert!(at < MAGIC.len(), "byte {at}"),
                Ok(Contents::Current(_)) => panic!("byte {at}: damage not seen"),
                Err(StateFileError::Corrupt { .. } | StateFileError::Truncated { .. }) => {}
                Err(StateFileError::UnsupportedVersion { version, .. }) => {
                    assert_ne!(version, VERSION)
                }
                Err(e) => panic!("byte {at}: {e}"),
            }
        }
    }

    #[test]
    fn a_checksum_mismatch_says_so() {
        let mut bytes = encode(KIND, b"[1,2,3]");
        *bytes.last_mut().unwrap() = b'4';
        let err = decoded(&bytes).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn a_newer_version_and_another_kind_are_refused() {
        let text = String::from_utf8(encode(KIND, b"[]")).unwrap();
        let newer = text.replace(" v1 ", " v2 ");
        let err = decoded(newer.as_bytes()).unwrap_err();
        assert!(
            matches!(err, StateFileError::UnsupportedVersion { version: 2, supported: 1, .. }),
            "{err}"
        );
        let other = text.replace(" test ", " role ");
        let err = decoded(other.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not a \"test\" file"), "{err}");
        let garbage = "hasync-state test v1 len=2 crc32=zz\n[]";
        assert!(matches!(decoded(garbage.as_bytes()), Err(StateFileError::Corrupt { .. })));
        let long = format!("hasync-state {}", "x".repeat(MAX_HEADER));
        assert!(matches!(decoded(long.as_bytes()), Err(StateFileError::Corrupt { .. })));
    }

    #[test]
    fn a_prefix_is_read_and_checked_and_the_data_after_it_left_to_the_caller() {
        let path = Path::new("/d/test");
        let mut bytes = encode(KIND, b"{\"n\":2}");
        let prefix_len = bytes.len() as u64;
        bytes.extend_from_slice(b"DATA");
        let mut r = io::Cursor::new(&bytes[..]);
        let (payload, used) = read_prefix(KIND, path, &mut r).unwrap();
        assert_eq!((payload.as_slice(), used), (&b"{\"n\":2}"[..], prefix_len));
        let mut rest = Vec::new();
        io::Read::read_to_end(&mut r, &mut rest).unwrap();
        assert_eq!(rest, b"DATA");
        for cut in 0..prefix_len as usize {
            let err = read_prefix(KIND, path, &mut io::Cursor::new(&bytes[..cut])).unwrap_err();
            assert!(matches!(err, StateFileError::Truncated { .. }), "cut {cut}: {err}");
        }
        let mut damaged = bytes.clone();
        damaged[prefix_len as usize - 1] ^= 1;
        let err = read_prefix(KIND, path, &mut io::Cursor::new(&damaged[..])).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        let err = read_prefix(KIND, path, &mut io::Cursor::new(&b"DATA only"[..])).unwrap_err();
        assert!(err.to_string().contains("not a test file"), "{err}");
    }

    #[test]
    fn load_and_store_through_the_seam() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test");
        let no_legacy = |_: &[u8]| -> Result<Vec<u32>, String> { Err("no legacy".into()) };
        assert_eq!(load(&StdFs, KIND, &path, no_legacy).unwrap(), None);
        store(&StdFs, KIND, &path, &vec![1u32, 2]).unwrap();
        assert_eq!(load(&StdFs, KIND, &path, no_legacy).unwrap(), Some(vec![1, 2]));
        std::fs::write(&path, "[7]").unwrap();
        let legacy = |b: &[u8]| serde_json::from_slice::<Vec<u32>>(b).map_err(|e| e.to_string());
        assert_eq!(load(&StdFs, KIND, &path, legacy).unwrap(), Some(vec![7]));
        let err = load(&StdFs, KIND, &path, no_legacy).unwrap_err();
        assert!(matches!(&err, StateFileError::Corrupt { reason, .. } if reason == "no legacy"));
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_keeps_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test");
        let fs = SimFs::new();
        store(&fs, KIND, &path, &1u32).unwrap();
        let failing = path.clone();
        fs.fail_writes(move |p| p == failing);
        let err = store(&fs, KIND, &path, &2u32).unwrap_err();
        assert!(matches!(&err, StateFileError::Io { op: "write", .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(err.path(), path);
        let never = |_: &[u8]| -> Result<u32, String> { Err("legacy".into()) };
        assert_eq!(load(&fs, KIND, &path, never).unwrap(), Some(1));
        fs.clear_write_failures();
        store(&fs, KIND, &path, &2u32).unwrap();
        assert_eq!(load(&fs, KIND, &path, never).unwrap(), Some(2));
    }
}
