//! The checkpoint: how far the commitlog is known durable, and the queue-offset table as of a
//! record boundary at or below that point.
//!
//! Written atomically (temporary file, fsync, rename, directory fsync) and only after the data
//! it covers was flushed, so after any crash the checkpoint never claims more than the disk has.
//! A [`crate::store::state_file`]: JSON behind a header with a CRC32, so a damaged file is
//! refused instead of trusted.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::state_file::{self, StateFileError};

/// The checkpoint file name inside the data directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// The abort marker: present while the store is open; found at start-up, it means the last stop
/// was not clean.
pub(crate) const ABORT_FILE: &str = "abort";

/// Next queue offset per topic and queue id.
pub type QueueOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// What the checkpoint records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Everything below this commitlog offset was durable when the checkpoint was written.
    pub(crate) flushed_offset: u64,
    /// The record boundary up to which `queue_offsets` accounts for every record
    /// (`<= flushed_offset`). Recovery scans from here.
    pub(crate) dispatched_offset: u64,
    /// Next queue offset per (topic, queue id) after the records below `dispatched_offset`.
    pub(crate) queue_offsets: QueueOffsets,
    /// The node's confirm offset ([`crate::store::confirm`]) when the checkpoint was taken
    /// (`<= flushed_offset`). A checkpoint written before it existed loads as 0: nothing is
    /// known confirmed, the safe value (the first acks raise it).
    #[serde(default)]
    pub(crate) confirm_offset: u64,
    /// The generation of the last cut whose intent was stored and whose cut the snapshot saw
    /// ([`crate::store::cut_intent`]). A checkpoint written before it existed loads as 0.
    #[serde(default)]
    pub(crate) cut_generation: u64,
}

/// The state-file kind of the checkpoint.
const KIND: &str = "checkpoint";

/// The checkpoint file as written before the common state-file format: JSON around the body,
/// itself JSON, with a CRC32 of the body.
#[derive(Deserialize)]
struct LegacyFile {
    version: u32,
    crc32: u32,
    body: String,
}

/// Parses a checkpoint file in the format before the common one.
fn parse_legacy(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    let disk: LegacyFile =
        serde_json::from_slice(bytes).map_err(|e| format!("not a checkpoint: {e}"))?;
    if disk.version != 1 {
        return Err(format!("unknown checkpoint version {}", disk.version));
    }
    let crc = crc32fast::hash(disk.body.as_bytes());
    if crc != disk.crc32 {
        return Err(format!("checksum {crc:#010x} != stored {:#010x}", disk.crc32));
    }
    serde_json::from_str(&disk.body).map_err(|e| format!("bad checkpoint body: {e}"))
}

impl Checkpoint {
    /// Reads the checkpoint from `dir` through `fs`; `Ok(None)` when there is none. A file in
    /// the format before the common state-file format is read too.
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Checkpoint>> {
        let path = dir.join(CHECKPOINT_FILE);
        let Some(cp) = state_file::load(fs, KIND, &path, parse_legacy)? else {
            return Ok(None);
        };
        if cp.dispatched_offset > cp.flushed_offset {
            return Err(Error::from(StateFileError::Corrupt {
                kind: KIND,
                path,
                reason: format!(
                    "dispatched offset {} is past flushed offset {}",
                    cp.dispatched_offset, cp.flushed_offset
                ),
            }));
        }
        Ok(Some(cp))
    }

    /// Whether it is the checkpoint of an empty log (a fresh store's, a wipe's): nothing at
    /// offset 0, no queue.
    pub(crate) fn is_empty_log(&self) -> bool {
        self.flushed_offset == 0 && self.dispatched_offset == 0 && self.queue_offsets.is_empty()
    }

    /// The checkpoint as a start reads it (recovery and `hasync verify` alike), with an
    /// unfinished cut at `cut_at` (`u64::MAX`: none) and the first segment file starting at
    /// `first`: [`Checkpoint::bounded`] by the cut; when it began past the cut, its table is
    /// dropped (rebuilt from the first file), what it said was flushed below the cut still
    /// counting; the checkpoint of an empty log claims nothing, so it starts at `first`. (One
    /// elsewhere with no queue may be a log of transaction halves whose first files are
    /// missing: it still claims them.)
    pub(crate) fn read_by_a_start(self, cut_at: u64, first: u64) -> Checkpoint {
        let cp = self.bounded(cut_at);
        if cp.dispatched_offset > cut_at {
            let flushed_offset = cp.flushed_offset.max(first);
            Checkpoint { flushed_offset, dispatched_offset: first, ..Checkpoint::default() }
        } else if cp.is_empty_log() {
            Checkpoint { flushed_offset: first, dispatched_offset: first, ..cp }
        } else {
            cp
        }
    }

    /// The checkpoint as it stands once the log is cut at `offset`: nothing past it is
    /// flushed. (Its table is only good while the dispatched offset is at or below `offset`.)
    pub(crate) fn bounded(self, offset: u64) -> Checkpoint {
        let flushed_offset =
            self.flushed_offset.min(offset).max(self.dispatched_offset.min(offset));
        let confirm_offset = self.confirm_offset.min(flushed_offset);
        Checkpoint { flushed_offset, confirm_offset, ..self }
    }

    /// Writes the checkpoint into `dir` atomically, in the common state-file format.
    pub(crate) fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        debug_assert!(self.dispatched_offset <= self.flushed_offset);
        Ok(state_file::store(fs, KIND, &dir.join(CHECKPOINT_FILE), self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::fs::{SimFs, StdFs};

    fn sample() -> Checkpoint {
        let mut queue_offsets = QueueOffsets::new();
        queue_offsets.entry("t".into()).or_default().insert(3, 17);
        Checkpoint {
            flushed_offset: 900,
            dispatched_offset: 800,
            queue_offsets,
            confirm_offset: 0,
            cut_generation: 0,
        }
    }

    #[test]
    fn a_checkpoint_without_a_confirm_offset_loads_as_zero_and_it_round_trips() {
        // As builds before the confirm offset wrote it: the common format, no such field.
        #[derive(Serialize)]
        struct Before {
            flushed_offset: u64,
            dispatched_offset: u64,
            queue_offsets: QueueOffsets,
        }
        let dir = tempfile::tempdir().unwrap();
        let s = sample();
        let before = Before {
            flushed_offset: s.flushed_offset,
            dispatched_offset: s.dispatched_offset,
            queue_offsets: s.queue_offsets.clone(),
        };
        state_file::store(&StdFs, KIND, &dir.path().join(CHECKPOINT_FILE), &before).unwrap();
        assert_eq!(Checkpoint::load(&StdFs, dir.path()).unwrap(), Some(sample()));
        let with = Checkpoint { confirm_offset: 850, ..sample() };
        with.store(&StdFs, dir.path()).unwrap();
        assert_eq!(Checkpoint::load(&StdFs, dir.path()).unwrap(), Some(with));
    }

    /// A checkpoint as the format before the common one wrote it.
    fn legacy_bytes(cp: &Checkpoint) -> Vec<u8> {
        let body = serde_json::to_string(cp).unwrap();
        let crc = crc32fast::hash(body.as_bytes());
        serde_json::to_vec(&serde_json::json!({ "version": 1, "crc32": crc, "body": body }))
            .unwrap()
    }

    #[test]
    fn a_legacy_checkpoint_loads_and_the_next_write_is_in_the_common_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        std::fs::write(&path, legacy_bytes(&sample())).unwrap();
        let cp = Checkpoint::load(&StdFs, dir.path()).unwrap().unwrap();
        assert_eq!(cp, sample());
        cp.store(&StdFs, dir.path()).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(b"hasync-state checkpoint v1 "));
        assert_eq!(Checkpoint::load(&StdFs, dir.path()).unwrap(), Some(sample()));
    }

    #[test]
    fn a_damaged_legacy_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        let text = String::from_utf8(legacy_bytes(&sample())).unwrap().replace("900", "901");
        std::fs::write(&path, text).unwrap();
        let err = Checkpoint::load(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(err, Error::StateFile(StateFileError::Corrupt { .. })), "{err}");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn a_checkpoint_past_its_flushed_offset_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bad = Checkpoint { flushed_offset: 10, dispatched_offset: 20, ..Checkpoint::default() };
        state_file::store(&StdFs, KIND, &dir.path().join(CHECKPOINT_FILE), &bad).unwrap();
        let err = Checkpoint::load(&StdFs, dir.path()).unwrap_err();
        assert!(err.to_string().contains("past flushed offset"), "{err}");
    }

    #[test]
    fn a_failed_checkpoint_write_is_an_io_error_and_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let fs = SimFs::new();
        sample().store(&fs, dir.path()).unwrap();
        fs.fail_writes(|p| p.ends_with(CHECKPOINT_FILE));
        let newer = Checkpoint { flushed_offset: 1000, ..sample() };
        let err = newer.store(&fs, dir.path()).unwrap_err();
        assert!(matches!(err, Error::Io { op: "write", .. }), "{err}");
        assert_eq!(Checkpoint::load(&fs, dir.path()).unwrap(), Some(sample()));
    }
}
