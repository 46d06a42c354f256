//! The segment files of one commitlog, in offset order: load, roll, lookup, truncate, delete.
//!
//! Files are named by their 20-digit start offset, all exactly `segment_size` bytes, and
//! contiguous. The first file may start at any segment-aligned offset (an empty slave's first
//! file is the master's last one, not 0).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::mapped_file::{MappedFile, file_name, parse_file_name};
use crate::store::scan::{self, Step, Stop};

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

/// The ordered segment files of a commitlog directory.
#[derive(Debug)]
pub(crate) struct MappedFileQueue {
    dir: PathBuf,
    segment_size: usize,
    fs: Arc<dyn FileSystem>,
    files: RwLock<Vec<Arc<MappedFile>>>,
    /// The next segment, allocated ahead of time by the store thread so that a roll on the
    /// write path is a rename, not an allocation.
    spare: Mutex<Option<MappedFile>>,
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
            spare: Mutex::new(None),
        })
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

    /// Creates the file starting at `from_offset` and appends it. It must be segment-aligned
    /// and, unless the queue is empty, follow the last file exactly.
    pub(crate) fn create(&self, from_offset: u64) -> Result<Arc<MappedFile>> {
        if !from_offset.is_multiple_of(self.segment_size as u64) {
            return Err(Error::NotSegmentAligned {
                offset: from_offset,
                segment_size: self.segment_size as u64,
            });
        }
        let mut files = self.write_files();
        if let Some(last) = files.last() {
            assert_eq!(last.end_offset(), from_offset, "a new file must follow the last one");
        }
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        let f = match spare {
            Some(s) if s.from_offset() == from_offset => {
                s.rename_to(self.dir.join(file_name(from_offset)))?
            }
            other => {
                if let Some(stale) = other {
                    stale.remove()?;
                }
                MappedFile::create(Arc::clone(&self.fs), &self.dir, from_offset, self.segment_size)?
            }
        };
        let f = Arc::new(f);
        files.push(Arc::clone(&f));
        Ok(f)
    }

    /// Allocates the segment after the last one as a spare, if there is none yet (and, with
    /// `warm`, faults its pages in); called by the store thread, off the write path. Returns
    /// whether a spare was made.
    pub(crate) fn prepare_next(&self, warm: bool) -> Result<bool> {
        let Some(last) = self.last() else { return Ok(false) };
        let next = last.end_offset();
        if self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|s| s.from_offset() == next)
        {
            return Ok(false);
        }
        let path = self.dir.join(format!("{}{SPARE_SUFFIX}", file_name(next)));
        if path.exists() {
            self.fs.remove(&path).map_err(|e| Error::io("remove", &path, e))?;
        }
        let spare = MappedFile::create_at(Arc::clone(&self.fs), path, next, self.segment_size)?;
        if warm {
            spare.warm();
        }
        let old = self.spare.lock().unwrap_or_else(|e| e.into_inner()).replace(spare);
        if let Some(old) = old {
            old.remove()?;
        }
        Ok(true)
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
    /// the first file is kept (empty) so the log keeps its start. Returns the removed paths.
    pub(crate) fn truncate(&self, offset: u64) -> Result<Vec<PathBuf>> {
        let mut files = self.write_files();
        let mut removed = Vec::new();
        while let Some(last) = files.last() {
            let keep_empty_first = files.len() == 1;
            if last.from_offset() < offset || (keep_empty_first && last.from_offset() <= offset) {
                let pos = (offset.min(last.end_offset()) - last.from_offset()) as usize;
                last.truncate(pos)?;
                break;
            }
            last.remove()?;
            removed.push(last.path().to_path_buf());
            files.pop();
        }
        Ok(removed)
    }

    /// Removes every file when none holds a byte (an empty log about to start elsewhere).
    /// Refuses, removing nothing, when any file holds data.
    pub(crate) fn remove_all_empty(&self) -> Result<Vec<PathBuf>> {
        let mut files = self.write_files();
        if let Some(f) = files.iter().find(|f| f.wrote_pos() > 0) {
            return Err(Error::Corruption {
                file: f.path().to_path_buf(),
                offset: f.from_offset(),
                reason: "refusing to remove a segment file that holds data".into(),
            });
        }
        let mut removed = Vec::new();
        while let Some(f) = files.pop() {
            f.remove()?;
            removed.push(f.path().to_path_buf());
        }
        Ok(removed)
    }

    /// Removes every file (a full resync). Returns the removed paths.
    pub(crate) fn remove_all(&self) -> Result<Vec<PathBuf>> {
        let mut files = self.write_files();
        let mut removed = Vec::new();
        while let Some(f) = files.pop() {
            f.remove()?;
            removed.push(f.path().to_path_buf());
        }
        Ok(removed)
    }

    /// Removes the first file. Never the last one (the file being written).
    pub(crate) fn remove_first(&self) -> Result<Option<PathBuf>> {
        let mut files = self.write_files();
        if files.len() < 2 {
            return Ok(None);
        }
        let f = files.remove(0);
        if let Err(e) = f.remove() {
            files.insert(0, f);
            return Err(e);
        }
        Ok(Some(f.path().to_path_buf()))
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
    fn the_next_segment_is_allocated_ahead_and_renamed_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let spare = dir.path().join(format!("{}.prealloc", file_name(SEG as u64)));
        {
            let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
            q.create(0).unwrap().append(&vec![1u8; SEG]);
            assert!(q.prepare_next(true).unwrap());
            assert!(!q.prepare_next(true).unwrap(), "one spare at a time");
            assert!(spare.exists());
            let next = q.create(SEG as u64).unwrap();
            assert!(!spare.exists() && next.path().ends_with(file_name(SEG as u64)));
            next.append(b"x");
            assert!(q.prepare_next(true).unwrap());
        }
        // A spare left by an earlier run is removed at load, and never counts as a segment.
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        assert_eq!(q.len(), 2);
        assert!(
            std::fs::read_dir(dir.path()).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".prealloc"))
        );
    }
}
