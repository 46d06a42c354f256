//! The store's error type: domain outcomes (corruption, offset mismatch, full disk), not libraries.

use std::io;
use std::path::PathBuf;

use crate::store::record::RecordError;
use crate::store::state_file::StateFileError;

/// Result alias for the store.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything the store can refuse or fail with. Each message names the file and offset involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call on a store file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("create", "map", "msync", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The disk has no room for a new segment file or checkpoint.
    #[error("disk full: cannot {op} {}: {source}", path.display())]
    DiskFull {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// Stored data is damaged where it must be intact (before the checkpoint, a wrong file size,
    /// a gap between files). Start-up refuses to go on; `--repair` may truncate at `offset`.
    #[error("corruption in {} at offset {offset}: {reason}", file.display())]
    Corruption {
        /// The segment file.
        file: PathBuf,
        /// The commitlog offset where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A slave's checked write ([`crate::store::CommitLog::append_at_checked`]) holds a complete
    /// record that fails its CRC or structure check: nothing from `offset` on was stored.
    #[error("replicated bytes at offset {offset} are not a valid record: {reason}")]
    DamagedRecord {
        /// Where the damaged record starts.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// A slave write did not start exactly at the store's max offset.
    #[error("append at offset {given} refused: the store's max offset is {expected}")]
    OffsetMismatch {
        /// The store's max offset, where the bytes must start.
        expected: u64,
        /// The offset the bytes were given for.
        given: u64,
    },
    /// A slave write would run past the end of its segment file.
    #[error(
        "{len} bytes at offset {offset} cross the segment boundary at {segment_end} \
         (do master and slave use the same segment-size?)"
    )]
    CrossesSegment {
        /// Where the bytes start.
        offset: u64,
        /// How many bytes.
        len: usize,
        /// The end of the segment file holding `offset`.
        segment_end: u64,
    },
    /// A blank record does not end at this store's file end: the bytes came from a store with
    /// another segment size.
    #[error(
        "the end-of-file blank record at offset {offset} spans {blank_size} bytes but {remaining} \
         remain in this segment file: store.segment-size differs from the master's"
    )]
    SegmentSizeMismatch {
        /// Where the blank record starts.
        offset: u64,
        /// The size the blank record claims.
        blank_size: i64,
        /// The bytes left in this store's file.
        remaining: u64,
    },
    /// An empty store was asked to start at an offset that is not a segment boundary.
    #[error("offset {offset} is not a multiple of the segment size {segment_size}")]
    NotSegmentAligned {
        /// The offset given.
        offset: u64,
        /// The configured segment size.
        segment_size: u64,
    },
    /// A message body is larger than `store.max-message-size`.
    #[error("message body of {size} bytes exceeds store.max-message-size ({max} bytes)")]
    MessageTooLarge {
        /// The body size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A message could not be encoded (topic or properties too long, ...).
    #[error("invalid message: {0}")]
    Record(#[from] RecordError),
    /// The `[store]` settings break a rule the store checks (the largest record must fit in a
    /// segment); names the config key.
    #[error(transparent)]
    Config(#[from] crate::config::Error),
    /// A read asked for an offset the store does not hold.
    #[error("offset {offset} is outside the stored range [{min}, {max})")]
    OutOfRange {
        /// The offset asked for.
        offset: u64,
        /// The min offset.
        min: u64,
        /// The max offset.
        max: u64,
    },
    /// The store was closed or is shutting down.
    #[error("store is closed")]
    Closed,
    /// The write fence is raised (a role change is running or failed, or a master came back
    /// after an unclean stop): nothing is appended until the fence is lowered.
    #[error("writes are fenced: the node is changing role or waits for a ChangeRole")]
    Fenced,
    /// An append refused because a cut of the log (a truncate, a wipe) is not checkpointed yet:
    /// a restart before its checkpoint finishes the cut ([`crate::store::cut_intent`]), which
    /// would cut the append too. Every checkpoint retries (the store thread's, once per
    /// flush interval).
    #[error(
        "append refused: the log was cut to offset {offset} and that cut is not checkpointed \
         yet (its checkpoint failed; the store thread retries it every flush interval)"
    )]
    CutNotCheckpointed {
        /// The max offset: where the log was cut.
        offset: u64,
    },
    /// A truncate gave up, changing nothing: readers kept slices of the file it had to rewrite
    /// for longer than it waits.
    #[error(
        "cannot cut {} at {pos}: {readers} reader(s) still hold slices of it after {waited:?}",
        file.display()
    )]
    ReadersHold {
        /// The segment file.
        file: PathBuf,
        /// Where in the file the cut was to start.
        pos: usize,
        /// Slices still alive when the wait ended.
        readers: usize,
        /// How long the truncate waited.
        waited: std::time::Duration,
    },
    /// The bytes a truncate would remove could not be kept aside in a tail file
    /// ([`crate::store::tails`]): the truncate was refused and the log is as it was.
    #[error(
        "cannot keep the truncated tail [{start}, {end}) aside in {}: {source}; nothing was \
         truncated",
        path.display()
    )]
    KeepTail {
        /// The tail file it was to be.
        path: PathBuf,
        /// The cut offset.
        start: u64,
        /// The max offset before the cut.
        end: u64,
        /// Why not.
        #[source]
        source: Box<Error>,
    },
    /// The log changed while a tail that a truncate removes was kept aside (a write landed,
    /// or another cut): the truncate was refused and the log is as it was.
    #[error(
        "the log changed while its tail [{start}, {end}) was kept aside: {reason}; nothing \
         was truncated"
    )]
    TailChanged {
        /// The cut offset.
        start: u64,
        /// The max offset the tail was to end at.
        end: u64,
        /// What changed.
        reason: String,
    },
    /// A state file of the store (the checkpoint) is damaged or from a newer build.
    #[error(transparent)]
    StateFile(StateFileError),
}

impl From<StateFileError> for Error {
    /// The file system's refusals become [`Error::Io`] or [`Error::DiskFull`]; a damaged or
    /// unreadable file stays a [`StateFileError`].
    fn from(e: StateFileError) -> Self {
        match e {
            StateFileError::Io { op, path, source, .. } => Error::io(op, path, source),
            other => Error::StateFile(other),
        }
    }
}

impl Error {
    /// Builds an [`Error::Io`], or [`Error::DiskFull`] when the OS says the disk is full.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if is_disk_full(&source) {
            Error::DiskFull { op, path, source }
        } else {
            Error::Io { op, path, source }
        }
    }
}

/// Whether an I/O error means the disk (or the quota) is full.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error()
        || code == rustix::io::Errno::DQUOT.raw_os_error())
        || e.kind() == io::ErrorKind::StorageFull
}
