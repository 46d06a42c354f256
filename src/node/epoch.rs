//! The epoch history: `(epoch, start offset)` entries, durable in `<data-dir>/epoch`, each with
//! the name of the node that opened the epoch (for people and the fault harness's checker;
//! never compared).
//!
//! Every history begins with the implicit entry `(0, 0)` (no name), so two nodes of one group
//! always share epoch 0. A promotion appends `(epoch, max offset, its node name)`. When a node becomes a slave, the
//! [`consistent_point`] of its history and its new master's says where the two logs stop
//! agreeing; the slave truncates there and adopts the master's history (as RocketMQ 5's
//! controller mode and Kafka's leader epochs do).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::fs::FileSystem;
use crate::store::state_file::{self, StateFileError};

/// The epoch file's name inside the data directory.
pub const EPOCH_FILE: &str = "epoch";
/// The marker written next to the epoch file at a first start: it says the data dir is one of
/// a build that always writes the epoch file, so a missing one is a fault (see
/// [`EpochHistory::load_for_start`]).
pub const EPOCH_REQUIRED_FILE: &str = "epoch-required";
/// The state-file kind of the epoch file.
const KIND: &str = "epoch";
/// The version inside an epoch file of the format before the common state-file format.
const LEGACY_VERSION: u32 = 1;

/// One epoch, the commitlog offset where it starts, and who opened it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochEntry {
    /// The epoch.
    pub epoch: u64,
    /// Its first offset.
    pub start_offset: u64,
    /// The node name of the master that opened the epoch (empty for `(0, 0)`, for entries
    /// written before names were kept, and for a master that did not say). Not written when
    /// empty, so such entries are stored as before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub master_name: String,
}

impl EpochEntry {
    /// Whether `self` and `other` are the same epoch starting at the same offset, opened by
    /// the same master. A missing name matches any (a history adopted from a build without
    /// names is the same history); two different names are two masters that opened the same
    /// epoch number (an orchestrator that reused an epoch): their logs diverge from its start.
    pub fn same_epoch(&self, other: &EpochEntry) -> bool {
        let names_agree = self.master_name.is_empty()
            || other.master_name.is_empty()
            || self.master_name == other.master_name;
        (self.epoch, self.start_offset) == (other.epoch, other.start_offset) && names_agree
    }
}

/// Why an epoch operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The epoch file could not be read or written, or is damaged (the error names the file,
    /// the operation and, for an I/O error, keeps the OS error as its source).
    #[error(transparent)]
    File(StateFileError),
    /// The epoch file is missing although the node had a history (its log holds data, or it
    /// ran a role change): a fault, not a first start.
    #[error(
        "the epoch file {} is missing, but {evidence}: a lost history is a fault, not a first \
         start (a fresh one could hide that this log diverged from its group's). Restore the \
         file from a backup of this data dir, or start once with --allow-missing-epoch-history \
         (node.allow-missing-epoch-history = true) to begin a fresh history",
        path.display()
    )]
    Missing {
        /// The epoch file.
        path: std::path::PathBuf,
        /// What says the node had a history.
        evidence: String,
    },
    /// An entry that does not follow the last one.
    #[error("epoch {epoch} at offset {start} does not follow epoch {last_epoch} at {last_start}")]
    NotIncreasing {
        /// The new epoch.
        epoch: u64,
        /// Its start.
        start: u64,
        /// The last epoch.
        last_epoch: u64,
        /// Its start.
        last_start: u64,
    },
}

/// The state-file kind of the marker [`EPOCH_REQUIRED_FILE`].
const REQUIRED_KIND: &str = "epoch-required";

/// Writes the marker [`EPOCH_REQUIRED_FILE`] (after the epoch file: a crash between the two
/// leaves an epoch file without the marker, which the next start marks).
fn mark_required(fs: &dyn FileSystem, dir: &Path) -> Result<(), EpochError> {
    let path = dir.join(EPOCH_REQUIRED_FILE);
    state_file::store(fs, REQUIRED_KIND, &path, &EPOCH_FILE).map_err(EpochError::File)
}

/// What says a node had an epoch history, so that a missing epoch file is a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Evidence {
    /// What it is, as the refusal names it ("the commitlog file ... holds data").
    pub(crate) what: String,
    /// Whether a build before the epoch-file rule leaves it without an epoch file: data in the
    /// log of a node that never changed role does; a role file does not (those builds wrote
    /// the epoch file with every role change).
    pub(crate) older_builds_leave_it: bool,
}

/// The history, always starting with `(0, 0)`, epochs and starts increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochHistory {
    entries: Vec<EpochEntry>,
}

impl Default for EpochHistory {
    fn default() -> Self {
        Self { entries: vec![EpochEntry { epoch: 0, start_offset: 0, master_name: String::new() }] }
    }
}

/// The epoch file as written before the common state-file format.
#[derive(Deserialize)]
struct LegacyFile {
    format_version: u32,
    crc32: u32,
    entries: Vec<EpochEntry>,
}

/// Parses an epoch file in the format before the common one.
fn parse_legacy(bytes: &[u8]) -> Result<Vec<EpochEntry>, String> {
    let disk: LegacyFile =
        serde_json::from_slice(bytes).map_err(|e| format!("not an epoch file: {e}"))?;
    if disk.format_version != LEGACY_VERSION {
        return Err(format!("unknown format version {}", disk.format_version));
    }
    let text = serde_json::to_string(&disk.entries).expect("entries serialize");
    if crc32fast::hash(text.as_bytes()) != disk.crc32 {
        return Err("checksum mismatch".into());
    }
    Ok(disk.entries)
}

impl EpochHistory {
    /// A history from entries (the implicit `(0, 0)` is added when missing); entries must
    /// increase.
    pub(crate) fn from_entries(
        entries: impl IntoIterator<Item = EpochEntry>,
    ) -> Result<Self, EpochError> {
        let mut h = Self::default();
        for e in entries {
            if e.epoch == 0 && e.start_offset == 0 {
                continue;
            }
            h.append_opened_by(e.epoch, e.start_offset, &e.master_name)?;
        }
        Ok(h)
    }

    /// The entries, `(0, 0)` first.
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The last entry.
    /// The epoch covering `offset`: the last entry starting at or below it (0 before any).
    pub fn epoch_at(&self, offset: u64) -> u64 {
        self.entries().iter().rev().find(|e| e.start_offset <= offset).map_or(0, |e| e.epoch)
    }

    pub fn last(&self) -> EpochEntry {
        self.entries.last().expect("never empty").clone()
    }

    /// Appends `(epoch, start)` without a master name (see [`Self::append_opened_by`]).
    pub(crate) fn append(&mut self, epoch: u64, start: u64) -> Result<(), EpochError> {
        self.append_opened_by(epoch, start, "")
    }

    /// Appends `(epoch, start)` opened by the master named `master_name`: the epoch must be
    /// greater than the last one and the start not before the last start.
    pub(crate) fn append_opened_by(
        &mut self,
        epoch: u64,
        start: u64,
        master_name: &str,
    ) -> Result<(), EpochError> {
        let last = self.entries.last().expect("never empty");
        if epoch <= last.epoch || start < last.start_offset {
            return Err(EpochError::NotIncreasing {
                epoch,
                start,
                last_epoch: last.epoch,
                last_start: last.start_offset,
            });
        }
        let master_name = master_name.to_owned();
        self.entries.push(EpochEntry { epoch, start_offset: start, master_name });
        Ok(())
    }

    /// Loads `<dir>/epoch` through `fs`; a missing file is the implicit history. A file in the
    /// format before the common state-file format is read too.
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Self, EpochError> {
        let path = dir.join(EPOCH_FILE);
        let Some(entries) =
            state_file::load(fs, KIND, &path, parse_legacy).map_err(EpochError::File)?
        else {
            return Ok(Self::default());
        };
        Self::from_entries(entries).map_err(|e| {
            EpochError::File(StateFileError::Corrupt { kind: KIND, path, reason: e.to_string() })
        })
    }

    /// Loads the history a node starts with. A missing file is a first start only when
    /// nothing says the node had a history (`evidence` is `None`: an empty log, no role file);
    /// then the implicit history is written, so that from now on a missing file is a fault.
    /// Otherwise a missing file is refused, unless `allow_missing` (then a warning and a fresh
    /// history, written too).
    ///
    /// The marker [`EPOCH_REQUIRED_FILE`], written with the epoch file, tells this build's data
    /// dirs from those of builds before this rule, which wrote the epoch file only at a role
    /// change or a slave's first check against its master: without the marker, data in the log
    /// and no epoch file is such a data dir, whose history was the implicit `(0, 0)`; it is
    /// written (with a warning) instead of refused. A found epoch file gets the marker too.
    pub(crate) fn load_for_start(
        fs: &dyn FileSystem,
        dir: &Path,
        evidence: Option<Evidence>,
        allow_missing: bool,
    ) -> Result<Self, EpochError> {
        let path = dir.join(EPOCH_FILE);
        let marked = dir.join(EPOCH_REQUIRED_FILE).exists();
        if path.exists() {
            let history = Self::load(fs, dir)?;
            if !marked {
                mark_required(fs, dir)?;
            }
            return Ok(history);
        }
        match evidence {
            Some(e) if !marked && e.older_builds_leave_it => tracing::warn!(
                file = %path.display(), evidence = %e.what,
                "no epoch file and no {EPOCH_REQUIRED_FILE}: a data dir of a build before the \
                 epoch file was written at the first start; its history is the implicit (0, 0), \
                 written now (from now on a missing epoch file is refused)"
            ),
            Some(e) if !allow_missing => {
                return Err(EpochError::Missing { path, evidence: e.what });
            }
            Some(e) => tracing::warn!(
                file = %path.display(), evidence = %e.what,
                "the epoch file is missing; starting with a fresh history as \
                 node.allow-missing-epoch-history asks"
            ),
            None => {}
        }
        let fresh = Self::default();
        fresh.store(fs, dir)?;
        mark_required(fs, dir)?;
        Ok(fresh)
    }

    /// Rewrites `<dir>/epoch` atomically through `fs`, in the common state-file format.
    pub(crate) fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<(), EpochError> {
        state_file::store(fs, KIND, &dir.join(EPOCH_FILE), &self.entries).map_err(EpochError::File)
    }

    /// Where `epoch` ends: the next entry's start, or `max_offset` for the last one.
    fn end_of(&self, index: usize, max_offset: u64) -> u64 {
        self.entries.get(index + 1).map_or(max_offset, |e| e.start_offset)
    }
}

/// The offset up to which a slave's log (history `local`, max `local_max`) agrees with its
/// master's (`master`, `master_max`): the highest epoch both hold with the same start offset,
/// and the smaller of that epoch's end on each side. `None` when they share no epoch (cannot
/// happen while both begin with `(0, 0)`, but a damaged history could).
pub(crate) fn consistent_point(
    local: &EpochHistory,
    local_max: u64,
    master: &EpochHistory,
    master_max: u64,
) -> Option<u64> {
    for (li, le) in local.entries.iter().enumerate().rev() {
        if let Some(mi) = master.entries.iter().position(|me| me.same_epoch(le)) {
            return Some(local.end_of(li, local_max).min(master.end_of(mi, master_max)));
        }
    }
    None
}

/// A history from `(epoch, start offset)` pairs, for tests.
#[cfg(test)]
pub(crate) fn history_of(entries: &[(u64, u64)]) -> EpochHistory {
    EpochHistory::from_entries(entries.iter().map(|&(epoch, start_offset)| EpochEntry {
        epoch,
        start_offset,
        master_name: String::new(),
    }))
    .expect("increasing test entries")
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::history_of as h;
    use crate::store::fs::{SimFs, StdFs};

    #[test]
    fn identical_histories_agree_up_to_the_shorter_log() {
        let a = h(&[(1, 100), (2, 300)]);
        assert_eq!(consistent_point(&a, 500, &a, 500), Some(500));
        assert_eq!(consistent_point(&a, 450, &a, 500), Some(450));
    }

    #[test]
    fn one_epoch_opened_by_two_masters_diverges_from_its_start() {
        // Found by the fault harness: an orchestrator promoted a second node with an epoch a
        // node it had promoted (and that then died) already used; the first one, demoted
        // later, kept its own records of that epoch as if they were the new master's.
        let named = |entries: &[(u64, u64, &str)]| {
            EpochHistory::from_entries(entries.iter().map(|&(epoch, start_offset, name)| {
                EpochEntry { epoch, start_offset, master_name: name.to_owned() }
            }))
            .unwrap()
        };
        let slave = named(&[(0, 0, "n1"), (1, 600, "n2")]);
        let master = named(&[(0, 0, "n1"), (1, 600, "n1"), (2, 900, "n3")]);
        assert_eq!(consistent_point(&slave, 800, &master, 1400), Some(600));
        // A history without names (an older build's) still agrees with a named one.
        let unnamed = named(&[(0, 0, ""), (1, 600, "")]);
        assert_eq!(consistent_point(&unnamed, 800, &master, 1400), Some(800));
    }

    #[test]
    fn a_slave_ahead_within_the_same_epoch_is_cut_to_the_master() {
        let a = h(&[(1, 100)]);
        assert_eq!(consistent_point(&a, 900, &a, 600), Some(600));
    }

    #[test]
    fn a_new_master_epoch_cuts_what_the_old_master_wrote_after_it() {
        // The old master wrote to 800 in epoch 1; the new master took over at 500 with epoch 2.
        let old = h(&[(1, 100)]);
        let new = h(&[(1, 100), (2, 500)]);
        assert_eq!(consistent_point(&old, 800, &new, 900), Some(500));
        // Upstream's examples: {1:100,2:300,3:500} vs {1:100,2:300,3:450}: the point is 450.
        let local = h(&[(1, 100), (2, 300), (3, 500)]);
        let master = h(&[(1, 100), (2, 300), (3, 450)]);
        assert_eq!(consistent_point(&local, 700, &master, 600), Some(450));
    }

    #[test]
    fn no_shared_epoch() {
        let a = EpochHistory { entries: vec![h(&[(1, 100)]).last()] };
        let b = EpochHistory { entries: vec![h(&[(1, 200)]).last()] };
        assert_eq!(consistent_point(&a, 500, &b, 500), None);
    }

    #[test]
    fn only_the_implicit_entry() {
        let a = EpochHistory::default();
        assert_eq!(consistent_point(&a, 700, &a, 300), Some(300));
        assert_eq!(consistent_point(&a, 0, &a, 300), Some(0));
    }

    #[test]
    fn entries_must_increase_and_the_file_round_trips() {
        let mut a = h(&[(1, 100)]);
        assert!(a.append(1, 200).is_err());
        assert!(a.append(2, 50).is_err());
        a.append(3, 100).unwrap();
        let dir = tempfile::tempdir().unwrap();
        a.store(&StdFs, dir.path()).unwrap();
        assert_eq!(EpochHistory::load(&StdFs, dir.path()).unwrap(), a);
        let path = dir.path().join(EPOCH_FILE);
        let text = std::fs::read_to_string(&path).unwrap().replace("100", "101");
        std::fs::write(&path, text).unwrap();
        assert!(
            EpochHistory::load(&StdFs, dir.path()).unwrap_err().to_string().contains("checksum")
        );
    }

    /// An epoch file as the format before the common one wrote it.
    fn legacy_bytes(entries: &[EpochEntry]) -> Vec<u8> {
        let crc = crc32fast::hash(serde_json::to_string(entries).unwrap().as_bytes());
        let disk = serde_json::json!({ "format_version": 1, "crc32": crc, "entries": entries });
        serde_json::to_vec_pretty(&disk).unwrap()
    }

    #[test]
    fn a_legacy_epoch_file_loads_and_the_next_write_is_in_the_common_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EPOCH_FILE);
        let a = h(&[(1, 100), (4, 700)]);
        std::fs::write(&path, legacy_bytes(a.entries())).unwrap();
        let loaded = EpochHistory::load(&StdFs, dir.path()).unwrap();
        assert_eq!(loaded, a);
        loaded.store(&StdFs, dir.path()).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(b"hasync-state epoch v1 "));
        assert_eq!(EpochHistory::load(&StdFs, dir.path()).unwrap(), a);
    }

    #[test]
    fn names_are_kept_stored_and_never_compared() {
        let mut named = EpochHistory::default();
        named.append_opened_by(1, 100, "node-a").unwrap();
        named.append_opened_by(2, 300, "node-b").unwrap();
        let names: Vec<_> = named.entries().iter().map(|e| e.master_name.as_str()).collect();
        assert_eq!(names, ["", "node-a", "node-b"]);
        let dir = tempfile::tempdir().unwrap();
        named.store(&StdFs, dir.path()).unwrap();
        assert_eq!(EpochHistory::load(&StdFs, dir.path()).unwrap(), named);
        // The same epochs without names (a build before names, or a legacy file) agree.
        let unnamed = h(&[(1, 100), (2, 300)]);
        assert_eq!(consistent_point(&unnamed, 500, &named, 400), Some(400));
        assert_eq!(consistent_point(&named, 500, &unnamed, 400), Some(400));
    }

    #[test]
    fn an_epoch_file_without_names_loads_with_empty_names() {
        // Both older formats: the legacy one, and the common one before names were kept.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EPOCH_FILE);
        let old = r#"[{"epoch":0,"start_offset":0},{"epoch":3,"start_offset":700}]"#;
        let crc = crc32fast::hash(old.as_bytes());
        std::fs::write(&path, format!(r#"{{"format_version":1,"crc32":{crc},"entries":{old}}}"#))
            .unwrap();
        let loaded = EpochHistory::load(&StdFs, dir.path()).unwrap();
        assert_eq!(loaded, h(&[(3, 700)]));
        assert!(loaded.entries().iter().all(|e| e.master_name.is_empty()));
        let entries: serde_json::Value = serde_json::from_str(old).unwrap();
        state_file::store(&StdFs, KIND, &path, &entries).unwrap();
        assert_eq!(EpochHistory::load(&StdFs, dir.path()).unwrap(), h(&[(3, 700)]));
    }

    #[test]
    fn a_damaged_legacy_epoch_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EPOCH_FILE);
        let text = String::from_utf8(legacy_bytes(h(&[(1, 100)]).entries())).unwrap();
        std::fs::write(&path, text.replace("100", "101")).unwrap();
        let err = EpochHistory::load(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(err, EpochError::File(StateFileError::Corrupt { .. })), "{err}");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn a_stored_history_that_does_not_increase_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let entries = [h(&[(2, 10)]).last(), h(&[(1, 20)]).last()];
        state_file::store(&StdFs, KIND, &dir.path().join(EPOCH_FILE), &entries).unwrap();
        let err = EpochHistory::load(&StdFs, dir.path()).unwrap_err();
        assert!(err.to_string().contains("does not follow"), "{err}");
    }

    #[test]
    fn a_failed_write_keeps_the_old_history_and_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let fs = SimFs::new();
        let a = h(&[(1, 100)]);
        a.store(&fs, dir.path()).unwrap();
        fs.fail_writes(|p| p.ends_with(EPOCH_FILE));
        let err = h(&[(1, 100), (2, 300)]).store(&fs, dir.path()).unwrap_err();
        let EpochError::File(StateFileError::Io { op: "write", path, .. }) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(path, &dir.path().join(EPOCH_FILE));
        let os = std::error::Error::source(&err).expect("the OS error is kept");
        assert!(os.downcast_ref::<std::io::Error>().is_some(), "{os:?}");
        assert_eq!(EpochHistory::load(&fs, dir.path()).unwrap(), a);
    }

    #[test]
    fn a_missing_file_is_a_first_start_only_without_evidence_of_a_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EPOCH_FILE);
        let first = EpochHistory::load_for_start(&StdFs, dir.path(), None, false).unwrap();
        assert_eq!(first, EpochHistory::default());
        assert!(path.exists(), "a first start writes the history it starts with");
        assert!(dir.path().join(EPOCH_REQUIRED_FILE).exists(), "and the marker");
        std::fs::remove_file(&path).unwrap();
        let evidence = || Some(data("the commitlog holds data up to offset 7"));
        let e = EpochHistory::load_for_start(&StdFs, dir.path(), evidence(), false).unwrap_err();
        assert!(matches!(&e, EpochError::Missing { path: p, .. } if *p == path), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("offset 7") && text.contains("--allow-missing-epoch-history"),
            "{text}"
        );
        assert!(!path.exists(), "a refusal writes nothing");
        let fresh = EpochHistory::load_for_start(&StdFs, dir.path(), evidence(), true).unwrap();
        assert_eq!(fresh, EpochHistory::default());
        assert!(path.exists());
        // With the file there, evidence does not matter: it is loaded.
        let mut h = fresh;
        h.append(3, 10).unwrap();
        h.store(&StdFs, dir.path()).unwrap();
        assert_eq!(EpochHistory::load_for_start(&StdFs, dir.path(), evidence(), false).unwrap(), h);
    }

    fn data(what: &str) -> Evidence {
        Evidence { what: what.into(), older_builds_leave_it: true }
    }

    /// Collects every formatted log line.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_data_dir_of_an_older_build_without_the_marker_gets_the_implicit_history_and_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let (path, marker) = (dir.path().join(EPOCH_FILE), dir.path().join(EPOCH_REQUIRED_FILE));
        let lines = Lines::default();
        let l = lines.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || l.clone()).finish();
        let subscriber = tracing::Dispatch::new(subscriber);
        // A second dispatcher keeps the warning's callsite enabled if another test's node hits
        // it first on its own thread (see store::disk's test of the same).
        let _second = tracing::Dispatch::new(tracing_subscriber::registry());
        let h = tracing::dispatcher::with_default(&subscriber, || {
            EpochHistory::load_for_start(&StdFs, dir.path(), Some(data("the log")), false)
        });
        assert_eq!(h.unwrap(), EpochHistory::default());
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("WARN") && text.contains("a build before"), "{text}");
        assert!(path.exists() && marker.exists(), "both written");
        // A role file is no upgrade case: those builds wrote the epoch file at a role change.
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&marker).unwrap();
        let role = Evidence { what: "the role file".into(), older_builds_leave_it: false };
        let e = EpochHistory::load_for_start(&StdFs, dir.path(), Some(role), false).unwrap_err();
        assert!(matches!(e, EpochError::Missing { .. }), "{e}");
        // An epoch file without the marker (an older build's, or a crash between the two)
        // gets the marker.
        history_of(&[(2, 5)]).store(&StdFs, dir.path()).unwrap();
        let loaded = EpochHistory::load_for_start(&StdFs, dir.path(), None, false).unwrap();
        assert_eq!(loaded, history_of(&[(2, 5)]));
        assert!(marker.exists());
    }
}
