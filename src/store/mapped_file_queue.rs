//! The segment files of one commitlog, in offset order: load, roll, lookup, truncate, delete.
//!
//! Files are named by their 20-digit start offset, all exactly `segment_size` bytes, and
//! contiguous. The first file may start at any segment-aligned offset (an empty slave's first
//! file is the master's last one, not 0).
//!
//! No lock that readers take (the list's) is held across file-system I/O. The store thread
//! prepares the segment after the last one ([`MappedFileQueue::prepare_next`]: create it under
//! a `.prealloc` name with its space allocated and synced, rename it to its final name, which
//! syncs the directory), publishes it as the ready spare, and only then faults its pages in
//! ([`MappedFileQueue::warm_ahead`], after any flush that was due), without any lock:
//! `MADV_POPULATE_WRITE` changes no byte, so a roll may take the spare and append to it
//! meanwhile. A roll on the write path only moves the ready spare into the list. When no spare
//! is ready at roll time, the writer takes the preparation lock: it waits there for the store
//! thread to finish creating the file it is preparing, or, when none is being created, creates
//! the file itself, holding neither the list lock nor the spare's. Removals (truncate, wipe,
//! retention) take files out of the list first and unlink them after. Lock order: preparation,
//! owed work, ready spare, list, and a file's flush lock last.
//!
//! A cut (truncate, wipe, the undo of a failed append) is done in memory as a whole once it
//! has begun: the positions, the list and the ready spare say the log ends at the cut even
//! when the disk fails the durable half. That half is owed ([`Owed`]): a zeroing whose msync
//! failed is written again and synced by every flush and append
//! ([`MappedFileQueue::settle_for_flush`], [`MappedFileQueue::settle`]), which fail while it
//! fails; the later files and a discarded spare are unlinked at once, farthest first, unless
//! a zeroing is owed (then after it) or the unlink fails (then by a later settle); appends are
//! refused while anything is owed, and no segment is created or renamed into place while an
//! unlink is. An error from a cut means nothing changed.
//!
//! A crash can leave the prepared spare under its final name, as an all-zero last file:
//! recovery hands it back as the ready spare ([`MappedFileQueue::adopt_spare`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::mapped_file::{MappedFile, READER_WAIT, file_name, parse_file_name};
use crate::store::scan::{self, Step, Stop};
use crate::store::warm::WarmTurns;

/// Suffix of a spare segment file created ahead of time.
const SPARE_SUFFIX: &str = ".prealloc";

/// Which bytes of each segment file a [`MappedFileQueue::walk`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extent {
    /// Only the bytes written so far (`[0, wrote)`): for walks over a live log.
    Written,
    /// The whole file, whatever the positions say: for recovery, before positions are known,
    /// and for the queue-offset rebuild below the max offset.
    Whole,
}

/// Where a [`MappedFileQueue::walk`] ended.
#[derive(Debug)]
pub(crate) struct Walked {
    /// The offset of the next step: past the last record or blank visited, or at the stop.
    pub(crate) end: u64,
    /// The stop that ended the walk, with the file holding it; `None` when the walk reached
    /// its limit, the end of the files, or the end of the written bytes.
    pub(crate) stop: Option<(Arc<MappedFile>, Stop)>,
}

/// What cuts did in memory but could not yet make durable (see the module docs).
#[derive(Debug, Default)]
struct Owed {
    /// Zeroed ranges `[pos, until)` of a file (one per file) whose msync failed.
    zeroes: Vec<(Arc<MappedFile>, usize, usize)>,
    /// Files out of the list (a cut's later files, a discarded spare) not unlinked yet,
    /// farthest first: their unlink failed, or waits for an owed zeroing (unlinked first, a
    /// restart would find the old checkpoint's claims on files no longer there, which refuses
    /// the start even with `--repair`).
    unlinks: Vec<Arc<MappedFile>>,
}

/// Whether a store error is a missing file (an unlink already done).
fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The ordered segment files of a commitlog directory.
#[derive(Debug)]
pub(crate) struct MappedFileQueue {
    dir: PathBuf,
    segment_size: usize,
    fs: Arc<dyn FileSystem>,
    files: RwLock<Vec<Arc<MappedFile>>>,
    /// The next segment, prepared by the store thread (allocated, synced, under its final name;
    /// faulted in after it is published) so that a roll on the write path only moves it into
    /// `files`.
    ready: Mutex<Option<Arc<MappedFile>>>,
    /// Held by whoever creates a segment file, discards the ready spare or removes files; never
    /// by readers.
    prep: Mutex<()>,
    /// The durable half of cuts the disk failed (see the module docs).
    owed: Mutex<Owed>,
    /// Whether `owed` holds anything: checked by every flush and append.
    owes: AtomicBool,
    /// Called once segment files have left the list and been unlinked (or their unlink is
    /// owed), before the removal returns (the scrub closes a removed file it reads: [`MappedFileQueue::on_removal`]).
    removal_hook: std::sync::OnceLock<RemovalHook>,
    /// Tests: runs in `warm_ahead` right before the spare is faulted in.
    #[cfg(test)]
    before_warm: Mutex<Option<WarmHook>>,
}

/// See `MappedFileQueue::before_warm`.
#[cfg(test)]
struct WarmHook(Box<dyn FnOnce() + Send>);

#[cfg(test)]
impl std::fmt::Debug for WarmHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WarmHook")
    }
}

/// See [`MappedFileQueue::on_removal`].
struct RemovalHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for RemovalHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemovalHook")
    }
}

impl MappedFileQueue {
    /// Opens the directory (creating it if missing) and maps every segment file in it. Refuses a
    /// file of the wrong size or a gap between files, naming the file. Names that are not 20
    /// digits are ignored (left untouched). Positions are all 0 until recovery sets them.
    pub(crate) fn load(fs: Arc<dyn FileSystem>, dir: &Path, segment_size: usize) -> Result<Self> {
        fs.create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let name = entry.file_name();
            let name = name.to_str().unwrap_or_default();
            if let Some(offset) = parse_file_name(name) {
                found.push((offset, entry.path()));
            } else if name.ends_with(SPARE_SUFFIX) {
                // An unused spare from an earlier run: it never held data.
                fs.remove(&entry.path()).map_err(|e| Error::io("remove", entry.path(), e))?;
            }
        }
        found.sort();
        let mut files: Vec<Arc<MappedFile>> = Vec::with_capacity(found.len());
        for (offset, path) in found {
            if !offset.is_multiple_of(segment_size as u64) {
                return Err(Error::Corruption {
                    file: path,
                    offset,
                    reason: format!(
                        "start offset is not a multiple of segment-size {segment_size}"
                    ),
                });
            }
            if let Some(prev) = files.last()
                && prev.end_offset() != offset
            {
                return Err(Error::Corruption {
                    file: path,
                    offset: prev.end_offset(),
                    reason: format!(
                        "gap between files: {} ends at {}, the next file starts at {offset}",
                        prev.path().display(),
                        prev.end_offset()
                    ),
                });
            }
            files.push(Arc::new(MappedFile::open(Arc::clone(&fs), &path, offset, segment_size)?));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_size,
            fs,
            files: RwLock::new(files),
            ready: Mutex::new(None),
            prep: Mutex::new(()),
            owed: Mutex::default(),
            owes: AtomicBool::new(false),
            removal_hook: std::sync::OnceLock::new(),
            #[cfg(test)]
            before_warm: Mutex::new(None),
        })
    }

    /// Sets the hook every removal of segment files (retention, truncate, wipe) calls after
    /// the files left the list and were unlinked (or their unlink is owed), before it returns;
    /// it holds no list lock then (the preparation lock, and a truncate's or wipe's writer
    /// lock, are held). Only the first hook set is kept.
    pub(crate) fn on_removal(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.removal_hook.set(RemovalHook(hook));
    }

    fn removed(&self) {
        if let Some(hook) = self.removal_hook.get() {
            (hook.0)();
        }
    }

    /// The directory holding the files.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
    fn read_files(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<MappedFile>>> {
        self.files.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write_files(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<MappedFile>>> {
        self.files.write().unwrap_or_else(|e| e.into_inner())
    }
    fn ready(&self) -> MutexGuard<'_, Option<Arc<MappedFile>>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn prep(&self) -> MutexGuard<'_, ()> {
        self.prep.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot of all files in offset order.
    pub(crate) fn files(&self) -> Vec<Arc<MappedFile>> {
        self.read_files().clone()
    }
    /// Number of files.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.read_files().len()
    }
    /// Whether there are no files.
    pub(crate) fn is_empty(&self) -> bool {
        self.read_files().is_empty()
    }
    /// The first file.
    pub(crate) fn first(&self) -> Option<Arc<MappedFile>> {
        self.read_files().first().cloned()
    }
    /// The last file (the one being written).
    pub(crate) fn last(&self) -> Option<Arc<MappedFile>> {
        self.read_files().last().cloned()
    }

    /// The start of the first file, or `None` when there are no files.
    pub(crate) fn min_offset(&self) -> Option<u64> {
        self.read_files().first().map(|f| f.from_offset())
    }
    /// The end of the valid data: the last file's start plus its wrote position.
    pub(crate) fn max_offset(&self) -> Option<u64> {
        self.read_files().last().map(|f| f.from_offset() + f.wrote_pos() as u64)
    }

    /// The file holding `offset`, if any.
    pub(crate) fn find(&self, offset: u64) -> Option<Arc<MappedFile>> {
        let files = self.read_files();
        let first = files.first()?.from_offset();
        if offset < first {
            return None;
        }
        let idx = ((offset - first) / self.segment_size as u64) as usize;
        let f = files.get(idx)?;
        debug_assert!(f.contains(offset), "files must be contiguous");
        Some(Arc::clone(f))
    }

    /// Walks the records from `from` (a record boundary) with the one segment walk
    /// ([`scan::step`]), following end-of-file blanks to the next file, until the next step
    /// would start at or past `until`. Calls `visit` with every record and blank; returns where
    /// the walk ended and the stop that ended it, if any.
    pub(crate) fn walk(
        &self,
        from: u64,
        until: u64,
        extent: Extent,
        mut visit: impl FnMut(&Step<'_>),
    ) -> Walked {
        let mut pos = from;
        while pos < until {
            let Some(file) = self.find(pos) else { break };
            let bytes = match extent {
                Extent::Whole => file.raw(0, file.size()),
                Extent::Written => file.read(0, usize::MAX).unwrap_or_default(),
            };
            let from_offset = file.from_offset();
            while pos < until {
                let at = (pos - from_offset) as usize;
                let Some(step) = scan::step(&bytes, from_offset, file.size(), at) else { break };
                match &step {
                    Step::Record { view, .. } => pos += view.total_size as u64,
                    Step::EndOfFile { .. } => pos = file.end_offset(),
                    Step::Stop(stop) => {
                        return Walked { end: pos, stop: Some((file, stop.clone())) };
                    }
                }
                visit(&step);
                if pos == file.end_offset() {
                    break;
                }
            }
            debug_assert!(pos <= file.end_offset(), "a record ran past its file");
            if pos != file.end_offset() {
                break;
            }
        }
        Walked { end: pos, stop: None }
    }

    /// Appends the file starting at `from_offset`: the ready spare when it starts there, else a
    /// new file (see the module docs). It must be segment-aligned and, unless the queue is
    /// empty, follow the last file exactly.
    pub(crate) fn create(&self, from_offset: u64) -> Result<Arc<MappedFile>> {
        if !from_offset.is_multiple_of(self.segment_size as u64) {
            return Err(Error::NotSegmentAligned {
                offset: from_offset,
                segment_size: self.segment_size as u64,
            });
        }
        if let Some(f) = self.install_ready(from_offset) {
            return Ok(f);
        }
        // Waits here for the store thread when it is creating the file right now (not while
        // it warms it: that runs without this lock).
        let _prep = self.prep();
        if let Some(f) = self.install_ready(from_offset) {
            return Ok(f);
        }
        self.discard_ready();
        self.settle_unlinks()?;
        let f =
            MappedFile::create(Arc::clone(&self.fs), &self.dir, from_offset, self.segment_size)?;
        let f = Arc::new(f);
        self.push(Arc::clone(&f));
        Ok(f)
    }

    /// Moves the ready spare into the list when it starts at `from_offset`. Under the spare's
    /// lock, so that the store thread sees the spare and the last file change together.
    fn install_ready(&self, from_offset: u64) -> Option<Arc<MappedFile>> {
        let mut ready = self.ready();
        if ready.as_ref()?.from_offset() != from_offset {
            return None;
        }
        let f = ready.take()?;
        self.push(Arc::clone(&f));
        Some(f)
    }

    fn push(&self, f: Arc<MappedFile>) {
        let mut files = self.write_files();
        if let Some(last) = files.last() {
            assert_eq!(last.end_offset(), f.from_offset(), "a new file must follow the last one");
        }
        files.push(f);
    }

    /// Removes the ready spare, if any (owed, and unlinked at once unless an earlier unlink
    /// is still owed). The caller holds the preparation lock.
    fn discard_ready(&self) {
        let stale = self.ready().take();
        if let Some(f) = stale {
            let mut owed = self.owed();
            owed.unlinks.push(f);
            let _ = self.settle_unlinks_locked(&mut owed);
        }
    }

    /// Unlinks `f` and syncs the directory. A file already gone (an earlier try unlinked it
    /// and then failed to sync the directory) only has the directory synced.
    fn unlink(&self, f: &MappedFile) -> Result<()> {
        match f.remove() {
            Err(e) if is_not_found(&e) => {
                self.fs.sync_dir(&self.dir).map_err(|e| Error::io("sync directory", &self.dir, e))
            }
            done => done,
        }
    }

    fn owed(&self) -> MutexGuard<'_, Owed> {
        self.owed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a cut's durable half is owed (one atomic load).
    pub(crate) fn owes(&self) -> bool {
        self.owes.load(Ordering::Acquire)
    }

    /// What a flush must do first (see the module docs): each owed zeroing is written again
    /// ([`MappedFile::rezero`]: after a failed writeback the kernel may hold its pages clean,
    /// or drop them and read the old bytes back) and synced; then, once no zeroing is owed,
    /// the owed unlinks are done, farthest first, stopping at the first that fails. A zeroing
    /// of a file no longer in the list or owed an unlink is dropped. Returns the first
    /// failure; what is not done stays owed.
    pub(crate) fn settle_for_flush(&self) -> Result<()> {
        if !self.owes() {
            return Ok(());
        }
        let mut owed = self.owed();
        let files = self.files();
        let mut first = None;
        let Owed { zeroes, unlinks } = &mut *owed;
        zeroes.retain(|(f, pos, until)| {
            if !files.iter().chain(unlinks.iter()).any(|g| Arc::ptr_eq(f, g)) {
                return false;
            }
            match f.rezero(*pos, *until) {
                Ok(()) => false,
                Err(e) => {
                    first.get_or_insert(e);
                    true
                }
            }
        });
        if let Err(e) = self.settle_unlinks_locked(&mut owed) {
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }

    /// [`MappedFileQueue::settle_for_flush`], failing while anything at all is owed, naming
    /// it: before an append, nothing is written past a cut whose durable half is not done.
    pub(crate) fn settle(&self) -> Result<()> {
        if !self.owes() {
            return Ok(());
        }
        self.settle_for_flush()?;
        self.still_owed()
    }

    /// The owed unlinks, farthest first, stopping at the first that fails; none while a
    /// zeroing is owed (see [`Owed`]). Updates `owes`.
    fn settle_unlinks_locked(&self, owed: &mut Owed) -> Result<()> {
        let mut done = 0;
        let mut failed = Ok(());
        let unlinks = if owed.zeroes.is_empty() { &owed.unlinks[..] } else { &[] };
        for f in unlinks {
            match self.unlink(f) {
                Ok(()) => done += 1,
                Err(e) => {
                    tracing::error!(error = %e, "a segment file out of the log could not be \
                        removed; every flush retries, and no segment is created before it is gone");
                    failed = Err(e);
                    break;
                }
            }
        }
        owed.unlinks.drain(..done);
        self.owes.store(!owed.zeroes.is_empty() || !owed.unlinks.is_empty(), Ordering::Release);
        failed
    }

    /// An error naming what is still owed, if anything.
    fn still_owed(&self) -> Result<()> {
        let owed = self.owed();
        if let Some((f, ..)) = owed.zeroes.first() {
            let why = std::io::Error::other("the zeroing past a cut is not durable yet");
            return Err(Error::io("msync", f.path(), why));
        }
        if let Some(f) = owed.unlinks.first() {
            let why = std::io::Error::other("a file a cut took out of the log is not removed yet");
            return Err(Error::io("remove", f.path(), why));
        }
        Ok(())
    }

    /// Before a segment file is created or renamed into place: does the owed unlinks and
    /// fails while any is left, naming it (a file created meanwhile could take an owed
    /// name, or, past an owed file, leave a gap on disk once that one goes).
    fn settle_unlinks(&self) -> Result<()> {
        if !self.owes() {
            return Ok(());
        }
        let mut owed = self.owed();
        self.settle_unlinks_locked(&mut owed)?;
        match owed.unlinks.first() {
            Some(f) => {
                let why = std::io::Error::other("waits for the zeroing past a cut");
                Err(Error::io("remove", f.path(), why))
            }
            None => Ok(()),
        }
    }

    /// How many durable steps of cuts are owed.
    #[cfg(test)]
    pub(crate) fn owed_len(&self) -> usize {
        let owed = self.owed();
        owed.zeroes.len() + owed.unlinks.len()
    }

    /// Prepares the segment after the last one as the ready spare, if there is none yet: created,
    /// allocated and synced under a `.prealloc` name, renamed into place, published. Called by
    /// the store thread, off the write path, after a flush a put waits for and before anything
    /// else.
    /// Returns whether a spare was made. Its pages are faulted in later
    /// ([`MappedFileQueue::warm_ahead`]): that is the long part (about half a second for
    /// 256 MiB on a quiet disk, far longer on a thread at a low priority beside busy writers),
    /// and a roll that came before it ended would otherwise create and sync a file of its own
    /// on the writer's path, where that took 5-55 ms in the benchmarks.
    pub(crate) fn prepare_next(&self) -> Result<bool> {
        let _prep = self.prep();
        let next = {
            let ready = self.ready();
            let Some(last) = self.last() else { return Ok(false) };
            if ready.as_ref().is_some_and(|s| s.from_offset() == last.end_offset()) {
                return Ok(false);
            }
            last.end_offset()
        };
        self.discard_ready();
        self.settle_unlinks()?;
        let path = self.dir.join(format!("{}{SPARE_SUFFIX}", file_name(next)));
        if path.exists() {
            self.fs.remove(&path).map_err(|e| Error::io("remove", &path, e))?;
        }
        let spare =
            MappedFile::create_at(Arc::clone(&self.fs), path.clone(), next, self.segment_size)?;
        self.publish_spare(spare, &path, next)
    }

    /// Renames the prepared `spare` (at `path`, starting at `next`) to its final name and makes
    /// it the ready spare, unless the last file changed meanwhile: then the spare is removed
    /// (defensive: every change of the last file other than a roll takes the preparation lock,
    /// which the caller holds, and a roll needs a ready spare). Returns whether it was
    /// published. The caller holds the preparation lock.
    fn publish_spare(&self, spare: MappedFile, path: &Path, next: u64) -> Result<bool> {
        let wanted = self.last().map(|l| l.end_offset()) == Some(next);
        if !wanted || self.ready().is_some() {
            drop(spare);
            return match self.fs.remove(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io("remove", path, e))
                }
                _ => Ok(false),
            };
        }
        let spare = Arc::new(spare.rename_to(self.dir.join(file_name(next)))?);
        let mut ready = self.ready();
        // Every other change of the last file takes the preparation lock, except a roll, which
        // needs a ready spare: none was ready.
        debug_assert_eq!(self.last().map(|l| l.end_offset()), Some(next));
        *ready = Some(spare);
        Ok(true)
    }

    /// Faults in for writing, ahead of the writer, the rest of the last file if it was never
    /// warmed (the store's first segment, or one a roll created with no spare ready), then the
    /// ready spare if it was not. Called by the store thread, without any lock:
    /// `MADV_POPULATE_WRITE` changes no byte, so appends may go on in either file meanwhile
    /// (a roll may take the spare while it is faulted in; a removal leaves its mapping valid
    /// while this holds it). Returns how many files it finished; the first refusal ends it, and
    /// so does `pending` work for the store thread ([`MappedFile::populate_rest`]), after which
    /// the next call goes on where it stopped.
    pub(crate) fn warm_ahead(
        &self,
        turns: &WarmTurns,
        pending: &dyn Fn() -> bool,
    ) -> std::io::Result<usize> {
        let mut warmed = 0;
        if let Some(last) = self.last().filter(|f| !f.is_warmed()) {
            if !last.populate_rest(turns, pending)? {
                return Ok(warmed);
            }
            warmed += 1;
        }
        let spare = self.ready().as_ref().filter(|f| !f.is_warmed()).map(Arc::clone);
        if let Some(spare) = spare {
            #[cfg(test)]
            if let Some(hook) = self.before_warm.lock().unwrap_or_else(|e| e.into_inner()).take() {
                (hook.0)();
            }
            if spare.populate_rest(turns, pending)? {
                warmed += 1;
            }
        }
        Ok(warmed)
    }

    /// Takes an all-zero last file (not the only one) out of the list as the ready spare: the
    /// store thread prepared it before a crash, or a roll created it and nothing reached it.
    /// It holds no data, so it is neither data lost nor corruption. Not when the checkpoint
    /// says bytes below `claimed` are in it: then its zeros are damage for the scan to find.
    /// For recovery, before the scan; the check reads the whole file. Returns its path.
    /// With `known_zero` (after a clean stop, nothing past `claimed` is non-zero) the file is
    /// not read.
    pub(crate) fn adopt_spare(&self, claimed: u64, known_zero: bool) -> Option<PathBuf> {
        let files = self.files();
        let last = files.last()?;
        if files.len() < 2 || claimed > last.from_offset() || !(known_zero || last.is_all_zero()) {
            return None;
        }
        let spare = self.write_files().pop()?;
        let path = spare.path().to_path_buf();
        *self.ready() = Some(spare);
        Some(path)
    }

    /// Whether a spare is ready and its pages were faulted in.
    #[cfg(test)]
    pub(crate) fn ready_is_warmed(&self) -> bool {
        self.ready().as_ref().is_some_and(|f| f.is_warmed())
    }

    /// The start of the ready spare, if one is ready.
    #[cfg(test)]
    pub(crate) fn ready_offset(&self) -> Option<u64> {
        self.ready().as_ref().map(|f| f.from_offset())
    }

    /// The last file when it has room, else a new one after it (or at `start_offset`, aligned
    /// down, when the queue is empty).
    pub(crate) fn last_or_create(&self, start_offset: u64) -> Result<Arc<MappedFile>> {
        match self.last() {
            Some(f) if !f.is_full() => Ok(f),
            Some(f) => self.create(f.end_offset()),
            None => self.create(start_offset - start_offset % self.segment_size as u64),
        }
    }

    /// Cuts the log at `offset`: the file holding it keeps `[start, offset)` (zeroing the rest),
    /// later files are removed. An `offset` at a file's start removes that file too, except that
    /// the first file is kept (empty) so the log keeps its start. Waits first (at most
    /// [`READER_WAIT`]) until no slice of the file it zeroes is alive, holding no list lock; a
    /// wait that ends with slices still alive changes nothing. Returns the removed paths (not
    /// those whose unlink is owed: see the module docs). (The commitlog's cut is
    /// [`MappedFileQueue::truncate_with_intent`].)
    #[cfg(test)]
    pub(crate) fn truncate(&self, offset: u64) -> Result<Vec<PathBuf>> {
        self.cut(offset, Some(READER_WAIT), u64::MAX, &mut || Ok(()))
    }

    /// [`MappedFileQueue::truncate`] that calls `intent` once no reader holds the bytes cut,
    /// before the disk changes (a commitlog's cut stores its [`crate::store::cut_intent`]
    /// there); an error from it gives the cut up, changing nothing.
    pub(crate) fn truncate_with_intent(
        &self,
        offset: u64,
        intent: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<PathBuf>> {
        self.cut(offset, Some(READER_WAIT), u64::MAX, intent)
    }

    /// [`MappedFileQueue::truncate`] for recovery after a clean stop, when every byte from
    /// `zero_from` on is known to be zero: only `[offset, zero_from)` is zeroed (and read).
    pub(crate) fn truncate_known_zero(&self, offset: u64, zero_from: u64) -> Result<Vec<PathBuf>> {
        self.cut(offset, Some(READER_WAIT), zero_from, &mut || Ok(()))
    }

    /// [`MappedFileQueue::truncate`] of bytes never published (the undo of a failed append):
    /// no reader holds a slice of them, so it does not wait for readers (see
    /// [`MappedFile::begin_unpublished_cut`]).
    pub(crate) fn truncate_unpublished(&self, offset: u64) -> Result<Vec<PathBuf>> {
        self.cut(offset, None, u64::MAX, &mut || Ok(()))
    }

    /// [`MappedFileQueue::truncate`] waiting at most `wait` for readers (a cut on a write
    /// path, which must not stall for long).
    pub(crate) fn truncate_waiting(&self, offset: u64, wait: Duration) -> Result<Vec<PathBuf>> {
        self.cut(offset, Some(wait), u64::MAX, &mut || Ok(()))
    }

    /// Cuts at `offset`; `wait`: how long to wait for readers (`None`: bytes never published).
    /// Once the readers are drained the cut is done in memory whatever the disk does; what the
    /// disk fails is owed (see the module docs), so an error means nothing changed. Returns
    /// the paths unlinked.
    fn cut(
        &self,
        offset: u64,
        wait: Option<Duration>,
        zero_from: u64,
        intent: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<PathBuf>> {
        let _prep = self.prep();
        let files = self.files();
        let keep = files.iter().rposition(|f| f.from_offset() < offset).unwrap_or(0);
        let Some(holder) = files.get(keep) else { return Ok(Vec::new()) };
        let pos = offset.saturating_sub(holder.from_offset()).min(holder.size() as u64) as usize;
        let cut = match wait {
            Some(wait) => holder.begin_cut(pos, wait)?,
            None => holder.begin_unpublished_cut(pos),
        };
        // Dropped unfinished on an error, the cut puts the written position back.
        intent()?;
        // Nothing changes the list meanwhile: every caller holds the commitlog's writer lock
        // (rolls take it too) or runs alone (recovery); removals take the preparation lock.
        let later = self.write_files().split_off(keep + 1);
        debug_assert!(later.len() == files.len() - keep - 1);
        debug_assert!(later.iter().zip(&files[keep + 1..]).all(|(a, b)| Arc::ptr_eq(a, b)));
        let until = zero_from.min(holder.end_offset()).saturating_sub(holder.from_offset());
        let until = (until as usize).clamp(pos, holder.size());
        // Held across the zeroing: no settle rewrites the file meanwhile.
        let mut owed = self.owed();
        if let Err((e, from, to)) = cut.finish_until(until) {
            tracing::error!(error = %e, offset, "the zeroing past a cut could not be made \
                durable; every flush and append retries it, and appends are refused meanwhile");
            match owed.zeroes.iter_mut().find(|(g, ..)| Arc::ptr_eq(holder, g)) {
                Some((_, p, u)) => (*p, *u) = ((*p).min(from), (*u).max(to)),
                None => owed.zeroes.push((Arc::clone(holder), from, to)),
            }
        }
        let stale = {
            let mut ready = self.ready();
            if ready.as_ref().is_some_and(|s| s.from_offset() != holder.end_offset()) {
                ready.take()
            } else {
                None
            }
        };
        drop(files);
        Ok(self.unlink_taken(owed, stale, later))
    }

    /// Removes every file when none holds a byte (an empty log about to start elsewhere).
    /// Refuses, removing nothing, when any file holds data.
    pub(crate) fn remove_all_empty(&self) -> Result<Vec<PathBuf>> {
        let _prep = self.prep();
        let taken = {
            let mut files = self.write_files();
            if let Some(f) = files.iter().find(|f| f.wrote_pos() > 0) {
                return Err(Error::Corruption {
                    file: f.path().to_path_buf(),
                    offset: f.from_offset(),
                    reason: "refusing to remove a segment file that holds data".into(),
                });
            }
            std::mem::take(&mut *files)
        };
        Ok(self.remove_taken(taken))
    }

    /// Removes every file (a full resync). Returns the paths unlinked (not those owed).
    pub(crate) fn remove_all(&self) -> Result<Vec<PathBuf>> {
        let _prep = self.prep();
        let taken = std::mem::take(&mut *self.write_files());
        Ok(self.remove_taken(taken))
    }

    /// [`MappedFileQueue::unlink_taken`] of `taken` and the ready spare.
    fn remove_taken(&self, taken: Vec<Arc<MappedFile>>) -> Vec<PathBuf> {
        let stale = self.ready().take();
        self.unlink_taken(self.owed(), stale, taken)
    }

    /// Owes the unlink of the `stale` spare and of `taken` (files already out of the list, in
    /// offset order), farthest first, behind what is owed already, then does the ones it may
    /// ([`MappedFileQueue::settle_unlinks_locked`]); calls the removal hook when any file
    /// left. Returns the paths unlinked.
    fn unlink_taken(
        &self,
        mut owed: MutexGuard<'_, Owed>,
        stale: Option<Arc<MappedFile>>,
        taken: Vec<Arc<MappedFile>>,
    ) -> Vec<PathBuf> {
        let left = stale.is_some() || !taken.is_empty();
        owed.unlinks.extend(stale.into_iter().chain(taken.into_iter().rev()));
        let owed_paths: Vec<PathBuf> =
            owed.unlinks.iter().map(|f| f.path().to_path_buf()).collect();
        let _ = self.settle_unlinks_locked(&mut owed);
        let removed = owed_paths[..owed_paths.len() - owed.unlinks.len()].to_vec();
        drop(owed);
        if left {
            self.removed();
        }
        removed
    }

    /// Removes the first file. Never the last one (the file being written). A file that cannot
    /// be removed goes back into the list.
    pub(crate) fn remove_first(&self) -> Result<Option<PathBuf>> {
        let _prep = self.prep();
        let f = {
            let mut files = self.write_files();
            if files.len() < 2 {
                return Ok(None);
            }
            files.remove(0)
        };
        if let Err(e) = self.unlink(&f) {
            // Under the preparation lock only a roll changes the list, at its end.
            self.write_files().insert(0, f);
            return Err(e);
        }
        let path = f.path().to_path_buf();
        drop(f);
        self.removed();
        Ok(Some(path))
    }
}

#[cfg(test)]
mod tests {
    //! The queue of segment files: create, lookup, truncate, logs that start past 0.

    use std::sync::Arc;

    use super::MappedFileQueue;
    use crate::store::fs::{FileSystem, StdFs};
    use crate::store::mapped_file::file_name;

    const SEG: usize = 64 * 1024;

    fn fs() -> Arc<dyn FileSystem> {
        Arc::new(StdFs)
    }

    #[test]
    fn queue_creates_finds_and_rolls_from_a_non_zero_start() {
        let dir = tempfile::tempdir().unwrap();
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        assert!(q.is_empty());
        assert_eq!(q.min_offset(), None);
        let start = 5 * SEG as u64;
        let f = q.last_or_create(start + 123).unwrap();
        assert_eq!(f.from_offset(), start, "aligned down to the segment");
        f.append(&vec![1u8; SEG]);
        let g = q.last_or_create(0).unwrap();
        assert_eq!(g.from_offset(), start + SEG as u64);
        g.append(b"xyz");
        assert_eq!(q.min_offset(), Some(start));
        assert_eq!(q.max_offset(), Some(start + SEG as u64 + 3));
        assert_eq!(q.find(start).unwrap().from_offset(), start);
        assert_eq!(q.find(start + SEG as u64 - 1).unwrap().from_offset(), start);
        assert_eq!(q.find(start + SEG as u64).unwrap().from_offset(), start + SEG as u64);
        assert!(q.find(start - 1).is_none());
        assert!(q.find(start + 2 * SEG as u64).is_none());
        assert!(q.create(start + 7).is_err(), "unaligned start refused");
        // Reload finds the same files.
        drop((f, g, q));
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.min_offset(), Some(start));
    }

    #[test]
    fn queue_truncate_cuts_the_holding_file_and_removes_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        for _ in 0..3 {
            let f = q.last_or_create(0).unwrap();
            f.append(&vec![9u8; SEG]);
        }
        assert_eq!(q.len(), 3);
        let removed = q.truncate(SEG as u64 + 10).unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(q.len(), 2);
        assert_eq!(q.max_offset(), Some(SEG as u64 + 10));
        assert!(!dir.path().join(file_name(2 * SEG as u64)).exists());
        // Cutting at a file's start removes that file, keeps the previous one full.
        q.truncate(SEG as u64).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q.max_offset(), Some(SEG as u64));
        // The first file is kept (empty) so the log keeps its start.
        q.truncate(0).unwrap();
        assert_eq!((q.len(), q.max_offset()), (1, Some(0)));
    }

    #[test]
    fn queue_load_refuses_a_gap_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        {
            let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
            q.create(0).unwrap();
            q.create(SEG as u64).unwrap();
            q.create(2 * SEG as u64).unwrap();
        }
        std::fs::remove_file(dir.path().join(file_name(SEG as u64))).unwrap();
        let err = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap_err().to_string();
        assert!(err.contains("gap"), "{err}");
        assert!(err.contains(&file_name(2 * SEG as u64)), "{err}");
    }

    #[test]
    fn queue_remove_first_never_removes_the_last_file() {
        let dir = tempfile::tempdir().unwrap();
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        q.create(0).unwrap().append(&vec![1u8; SEG]);
        q.create(SEG as u64).unwrap();
        assert!(q.remove_first().unwrap().is_some());
        assert_eq!(q.min_offset(), Some(SEG as u64));
        assert!(q.remove_first().unwrap().is_none());
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn the_next_segment_is_prepared_ahead_under_its_final_name_and_moved_in() {
        let dir = tempfile::tempdir().unwrap();
        let final_name = dir.path().join(file_name(SEG as u64));
        {
            let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
            q.create(0).unwrap().append(&vec![1u8; SEG]);
            assert!(q.prepare_next().unwrap());
            assert!(!q.prepare_next().unwrap(), "one spare at a time");
            assert!(final_name.exists(), "renamed into place by the store thread");
            assert_eq!((q.len(), q.ready_offset()), (1, Some(SEG as u64)), "not in the list yet");
            let next = q.create(SEG as u64).unwrap();
            assert!(next.path().ends_with(file_name(SEG as u64)));
            assert_eq!((q.len(), q.ready_offset()), (2, None));
            next.append(b"x");
            assert!(q.prepare_next().unwrap());
            // A cut below the spare's start discards it.
            q.truncate(SEG as u64 + 1).unwrap();
            assert_eq!(q.ready_offset(), Some(2 * SEG as u64), "still follows the last file");
            q.truncate(10).unwrap();
            assert_eq!((q.len(), q.ready_offset()), (1, None));
            assert!(!final_name.exists() && !dir.path().join(file_name(2 * SEG as u64)).exists());
            assert!(q.prepare_next().unwrap());
        }
        // A spare left under its final name is an all-zero last file: adopted as the spare.
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.adopt_spare(SEG as u64, false), Some(final_name.clone()));
        assert_eq!((q.len(), q.ready_offset()), (1, Some(SEG as u64)));
        // A half-prepared spare (the `.prealloc` name) is removed at load.
        let tmp = dir.path().join(format!("{}.prealloc", file_name(5 * SEG as u64)));
        std::fs::write(&tmp, b"").unwrap();
        drop(q);
        MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        assert!(!tmp.exists());
    }

    /// A queue on a [`crate::store::fs::SimFs`]: a full first file, then 100 bytes in the second.
    fn full_file_and_100_bytes_on_sim()
    -> (tempfile::TempDir, Arc<crate::store::fs::SimFs>, MappedFileQueue) {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(crate::store::fs::SimFs::new());
        let q = MappedFileQueue::load(Arc::clone(&sim) as _, dir.path(), SEG).unwrap();
        q.create(0).unwrap().append(&vec![1u8; SEG]);
        q.create(SEG as u64).unwrap().append(&[2u8; 100]);
        (dir, sim, q)
    }

    /// A ready spare the cut discards but cannot unlink is owed, and so is the later file
    /// behind it, untried (unlinked first, it would leave a gap on disk before the spare, which
    /// refuses a start): the cut stands, and no segment takes either name while the spare's
    /// unlink fails (the error names the spare). A settle after the disk works removes both,
    /// farthest first. Before, the cut failed after it had zeroed the holder and taken the
    /// later files off the list, leaving them on disk.
    #[test]
    fn a_spare_the_cut_cannot_unlink_is_owed_with_the_files_before_it() {
        let (dir, sim, q) = full_file_and_100_bytes_on_sim();
        assert!(q.prepare_next().unwrap());
        let (later, spare) =
            (dir.path().join(file_name(SEG as u64)), dir.path().join(file_name(2 * SEG as u64)));
        let stuck = spare.clone();
        sim.fail_writes(move |p| p == stuck);
        let removed = q.truncate(10).expect("the cut stands");
        assert!(removed.is_empty(), "{removed:?}");
        assert_eq!((q.len(), q.max_offset(), q.ready_offset()), (1, Some(10), None));
        assert_eq!(q.owed_len(), 2);
        assert!(spare.exists() && later.exists(), "no gap on disk");
        // The log grows back to the later file's name: refused while the spare stays.
        q.last().unwrap().append(&vec![3u8; SEG - 10]);
        let e = q.create(SEG as u64).unwrap_err().to_string();
        assert!(e.contains(&file_name(2 * SEG as u64)), "{e}");
        assert!(q.settle().is_err());
        assert_eq!(q.owed_len(), 2, "nothing unlinked before the spare");
        sim.clear_write_failures();
        q.create(SEG as u64).unwrap().append(&vec![4u8; SEG]);
        assert_eq!(q.owed_len(), 0);
        assert!(!spare.exists());
        assert!(q.prepare_next().unwrap());
        assert_eq!(q.ready_offset(), Some(2 * SEG as u64));
        assert!(q.find(0).unwrap().raw(10, 10).iter().all(|&b| b == 3));
        assert!(q.find(SEG as u64).unwrap().raw(0, SEG).iter().all(|&b| b == 4));
    }

    /// After a wipe whose unlink of the first file fails, no segment is created anywhere
    /// until it is gone: one created past it would leave a gap on disk once it goes.
    #[test]
    fn no_segment_is_created_while_an_unlink_is_owed_even_with_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(crate::store::fs::SimFs::new());
        let q = MappedFileQueue::load(Arc::clone(&sim) as _, dir.path(), SEG).unwrap();
        for i in 0..3u64 {
            q.create(i * SEG as u64).unwrap().append(&[1u8; 10]);
        }
        let first = dir.path().join(file_name(0));
        let stuck = first.clone();
        sim.fail_writes(move |p| p == stuck);
        let removed = q.remove_all().unwrap();
        assert_eq!(removed.len(), 2, "the farther two go first: {removed:?}");
        assert_eq!((q.len(), q.owed_len()), (0, 1));
        let e = q.create(5 * SEG as u64).unwrap_err().to_string();
        assert!(e.contains(&file_name(0)), "{e}");
        sim.clear_write_failures();
        q.create(5 * SEG as u64).unwrap();
        assert!(!first.exists());
        drop(q);
        let q = MappedFileQueue::load(sim as _, dir.path(), SEG).unwrap();
        assert_eq!(q.min_offset(), Some(5 * SEG as u64), "no gap: the start is the new file");
    }

    /// A flush of a file that read its written position before a cut, and raises its flushed
    /// position after the cut, must not raise it past the cut: appends there later would be
    /// skipped by every flush. The cut runs while the flush is in its msync (from SimFs's
    /// flush failpoint, which fails nothing); it may wait for the flush (at most 2 s here).
    #[test]
    fn a_flush_racing_a_cut_does_not_raise_the_files_flushed_position_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(crate::store::fs::SimFs::new());
        let q = Arc::new(MappedFileQueue::load(Arc::clone(&sim) as _, dir.path(), SEG).unwrap());
        let f = q.create(0).unwrap();
        f.append(&[1u8; 5000]);
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (q2, a) = (Arc::clone(&q), Arc::clone(&armed));
        sim.fail_flushes(move |_, _, _| {
            if a.swap(false, std::sync::atomic::Ordering::SeqCst) {
                let q = Arc::clone(&q2);
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(q.truncate(100));
                });
                let _ = rx.recv_timeout(std::time::Duration::from_secs(2));
            }
            false
        });
        f.flush().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while f.wrote_pos() != 100 {
            assert!(std::time::Instant::now() < deadline, "the cut ran");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        while (q.len() != 1 || f.flushed_pos() > 100) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The cut's zeroing (after the flush let go) lowered it, and nothing raised it since.
        assert!(f.flushed_pos() <= 100, "flushed {} past the cut at 100", f.flushed_pos());
        f.append(&[2u8; 3000]);
        f.flush().unwrap();
        assert_eq!(f.flushed_pos(), 3100, "the appends after the cut were synced");
    }

    /// A zeroing whose msync fails is owed: the cut stands and `settle` retries the msync
    /// until it works.
    #[test]
    fn a_zeroing_whose_msync_fails_is_retried_by_settle() {
        let (dir, sim, q) = full_file_and_100_bytes_on_sim();
        sim.fail_flushes(|_, _, _| true);
        q.truncate(100).expect("the cut stands");
        // The later file waits for the zeroing: unlinked first, a restart would find the old
        // checkpoint's claims on a file no longer there.
        assert_eq!((q.len(), q.max_offset(), q.owed_len()), (1, Some(100), 2));
        let later = dir.path().join(file_name(SEG as u64));
        assert!(later.exists());
        assert!(q.find(0).unwrap().raw(100, SEG - 100).iter().all(|&b| b == 0));
        assert!(q.settle().unwrap_err().to_string().contains("msync"));
        assert_eq!(q.owed_len(), 2);
        assert!(q.create(SEG as u64).is_err(), "no segment while an unlink is owed");
        // The kernel dropped a page it held clean after the failed writeback and read the
        // old bytes back from the disk (modelled by writing them through the file).
        let path = dir.path().join(file_name(0));
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[1u8; 300], 5000).unwrap();
        sim.clear_write_failures();
        q.settle().unwrap();
        assert_eq!(q.owed_len(), 0);
        assert!(!later.exists(), "unlinked once the zeroing is durable");
        assert!(
            q.find(0).unwrap().raw(100, SEG - 100).iter().all(|&b| b == 0),
            "the retry writes the zeros again, not only the msync"
        );
        assert_eq!(sim.durable_len(&path), Some(SEG as u64));
    }

    /// The spare is published as soon as it is created and synced, before its pages are
    /// faulted in: a roll while the store thread warms it takes it (nothing created or synced
    /// on the writer's path, no wait for the warm), the appends go on during the warm, and
    /// the warm changes none of their bytes.
    #[test]
    fn a_roll_while_the_spare_warms_takes_the_spare_and_the_warm_keeps_its_appends() {
        let dir = tempfile::tempdir().unwrap();
        let q = Arc::new(MappedFileQueue::load(fs(), dir.path(), SEG).unwrap());
        q.create(0).unwrap().append(&vec![1u8; SEG]);
        let (warming_tx, warming_rx) = std::sync::mpsc::channel();
        let (rolled_tx, rolled_rx) = std::sync::mpsc::channel::<()>();
        *q.before_warm.lock().unwrap() = Some(super::WarmHook(Box::new(move || {
            warming_tx.send(()).unwrap();
            // The warm goes on only once the roll is done (at most 10 s: a roll that waits
            // for the warm would hold it up that long, and the test fails below).
            let _ = rolled_rx.recv_timeout(std::time::Duration::from_secs(10));
        })));
        let store_thread = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                let made = q.prepare_next().unwrap();
                q.warm_ahead(
                    &super::WarmTurns::open(&crate::config::WarmLock::Process).unwrap(),
                    &|| false,
                )
                .unwrap();
                made
            })
        };
        warming_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the warm starts");
        assert_eq!(q.ready_offset(), Some(SEG as u64), "published before its warm");
        let rolled = q.create(SEG as u64).unwrap();
        rolled.append(&[7u8; 3000]);
        let in_time = rolled_tx.send(()).is_ok();
        assert!(in_time, "the roll waited for the spare's warm");
        assert!(store_thread.join().unwrap(), "the spare was made, and taken by the roll");
        assert_eq!((q.len(), q.ready_offset()), (2, None));
        assert!(rolled.is_warmed(), "the warm went on after the roll took the spare");
        assert!(rolled.raw(0, 3000).iter().all(|&b| b == 7), "the warm kept the appends");
        rolled.append(&[9u8; 10]);
        assert!(rolled.raw(3000, 10).iter().all(|&b| b == 9));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(super::SPARE_SUFFIX)), "{names:?}");
        // The next preparation makes the spare after the new last file.
        assert!(q.prepare_next().unwrap());
        assert_eq!(q.ready_offset(), Some(2 * SEG as u64));
    }
}
