//! The cut intent: a small file that makes a cut of published bytes (a truncate, a wipe)
//! survive a crash in the middle.
//!
//! A cut changes the disk in steps: it zeroes the bytes past the cut, unlinks the later
//! segment files, and only then stores a checkpoint that no longer claims the bytes cut. A
//! crash between the first step and the last used to leave the old checkpoint claiming bytes
//! that were zeroed, or files that were gone: the start was refused (even with `--repair` when
//! files were gone), or, when the old checkpoint's scan began past the cut, a zeroed hole was
//! accepted in the middle of the log.
//!
//! So before the first step changes the disk (once no reader holds the bytes, so the cut can
//! no longer give up), the cut stores this file: the offset cut to (or "everything", for a
//! wipe) and a generation, one more than any before. Every checkpoint records the generation
//! of the last cut its snapshot saw (`Checkpoint::cut_generation`). At start-up, an intent
//! whose generation is above the checkpoint's is a cut whose checkpoint never landed: recovery
//! finishes it (the scan ends at the cut whatever lies past it, the files past it go, and the
//! queue-offset table is rebuilt from the first file when the checkpoint's began past the cut),
//! stores a checkpoint and removes the file. An intent at or below the checkpoint's generation
//! is done; the file is removed. Appends are refused while a cut's checkpoint is owed (the
//! intent would cut them at a restart).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::state_file;

/// The cut intent's file name inside the data directory.
pub(crate) const CUT_INTENT_FILE: &str = "cut-intent";

/// The state-file kind of the cut intent.
const KIND: &str = "cut-intent";

/// A cut about to change the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CutIntent {
    /// The commitlog offset the log is cut to (a record boundary); 0 for a wipe.
    pub(crate) offset: u64,
    /// Every segment file goes (a slave's full resync), not only those past `offset`.
    pub(crate) wipe: bool,
    /// One more than the generation of any cut before it (see the module docs).
    pub(crate) generation: u64,
}

impl CutIntent {
    /// Reads the intent from `dir`; `Ok(None)` when there is none.
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(CUT_INTENT_FILE);
        Ok(state_file::load(fs, KIND, &path, |_| Err("not a cut intent file".to_owned()))?)
    }

    /// Stores the intent in `dir` atomically (durable when this returns).
    pub(crate) fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        Ok(state_file::store(fs, KIND, &dir.join(CUT_INTENT_FILE), self)?)
    }

    /// Removes the intent file from `dir` (durably); no error when there is none.
    pub(crate) fn remove(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        let path = dir.join(CUT_INTENT_FILE);
        match fs.remove(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use crate::store::fs::StdFs;

    #[test]
    fn an_intent_round_trips_and_removing_a_missing_one_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(CutIntent::load(&StdFs, dir.path()).unwrap(), None);
        let intent = CutIntent { offset: 4096, wipe: false, generation: 3 };
        intent.store(&StdFs, dir.path()).unwrap();
        assert_eq!(CutIntent::load(&StdFs, dir.path()).unwrap(), Some(intent));
        CutIntent::remove(&StdFs, dir.path()).unwrap();
        CutIntent::remove(&StdFs, dir.path()).unwrap();
        assert_eq!(CutIntent::load(&StdFs, dir.path()).unwrap(), None);
    }

    #[test]
    fn a_damaged_intent_is_refused_naming_its_file() {
        let dir = tempfile::tempdir().unwrap();
        CutIntent { offset: 1, wipe: false, generation: 1 }.store(&StdFs, dir.path()).unwrap();
        let path = dir.path().join(CUT_INTENT_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
        let err = CutIntent::load(&StdFs, dir.path()).unwrap_err();
        assert!(err.to_string().contains(CUT_INTENT_FILE), "{err}");
        // A start refuses it, naming it; a repair finishes it (a cut to the files' end) and removes it.
        let opts = crate::store::StoreOptions { scrub_rate: 0, ..Default::default() };
        let refused = crate::store::CommitLog::open(Arc::new(StdFs), dir.path(), opts.clone());
        let refused = refused.expect_err("a damaged intent refuses the start");
        assert!(refused.to_string().contains(CUT_INTENT_FILE), "{refused}");
        let repair = crate::store::StoreOptions { repair: true, ..opts };
        let log = crate::store::CommitLog::open(Arc::new(StdFs), dir.path(), repair).unwrap();
        assert!(!path.exists(), "the repair removed it");
        log.close().unwrap();
    }
}
