//! The checkpoint: how far the commitlog is known durable, and the queue-offset table as of a
//! record boundary at or below that point.
//!
//! Written atomically (temporary file, fsync, rename, directory fsync) and only after the data
//! it covers was flushed, so after any crash the checkpoint never claims more than the disk has.
//! JSON, with a CRC over the body so a damaged file is refused instead of trusted.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;

/// The checkpoint file name inside the data directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// The abort marker: present while the store is open; found at start-up, it means the last stop
/// was not clean.
pub const ABORT_FILE: &str = "abort";

/// Next queue offset per topic and queue id.
pub type QueueOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// What the checkpoint records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Everything below this commitlog offset was durable when the checkpoint was written.
    pub flushed_offset: u64,
    /// The record boundary up to which `queue_offsets` accounts for every record
    /// (`<= flushed_offset`). Recovery scans from here.
    pub dispatched_offset: u64,
    /// Next queue offset per (topic, queue id) after the records below `dispatched_offset`.
    pub queue_offsets: QueueOffsets,
}

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    crc32: u32,
    body: String,
}

impl Checkpoint {
    /// Reads the checkpoint from `dir`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<Checkpoint>> {
        let path = dir.join(CHECKPOINT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        let bad = |reason: String| Error::Corruption { file: path.clone(), offset: 0, reason };
        let disk: OnDisk =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a checkpoint: {e}")))?;
        if disk.version != 1 {
            return Err(bad(format!("unknown checkpoint version {}", disk.version)));
        }
        let crc = crc32fast::hash(disk.body.as_bytes());
        if crc != disk.crc32 {
            return Err(bad(format!("checksum {crc:#010x} != stored {:#010x}", disk.crc32)));
        }
        let cp: Checkpoint = serde_json::from_str(&disk.body)
            .map_err(|e| bad(format!("bad checkpoint body: {e}")))?;
        if cp.dispatched_offset > cp.flushed_offset {
            return Err(bad(format!(
                "dispatched offset {} is past flushed offset {}",
                cp.dispatched_offset, cp.flushed_offset
            )));
        }
        Ok(Some(cp))
    }

    /// Writes the checkpoint into `dir` atomically.
    pub fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        debug_assert!(self.dispatched_offset <= self.flushed_offset);
        let body = serde_json::to_string(self).expect("checkpoint serializes");
        let disk = OnDisk { version: 1, crc32: crc32fast::hash(body.as_bytes()), body };
        let text = serde_json::to_vec(&disk).expect("checkpoint serializes");
        let path = dir.join(CHECKPOINT_FILE);
        fs.write_atomic(&path, &text).map_err(|e| Error::io("write", &path, e))
    }
}
