//! One fixed-size segment file, memory-mapped read-write.
//!
//! Positions (all relative to the file's start):
//! - `wrote`: bytes appended so far; readers see `[0, wrote)`. Published with release ordering
//!   after the bytes are in the mapping, read with acquire ordering, so a reader that sees a
//!   position also sees the bytes before it.
//! - `flushed`: bytes made durable (msync) so far; `flushed <= wrote <= size`, except that a
//!   flush racing a [`MappedFile::truncate`] can leave `flushed` at the old `wrote`, past the
//!   cut (the store thread flushes without the writer lock; issue 14).
//!
//! There is one writer at a time (the commitlog's writer lock); readers run concurrently. A read
//! hands out a [`Bytes`] that keeps an `Arc` of the mapping alive, so memory is never unmapped
//! under a reader. Appends write only at and above `wrote`, which no [`MappedFile::read`] slice
//! reaches; [`MappedFile::raw`] slices past `wrote` are only taken while no writer runs
//! (recovery, or the queue-offset rebuild under the writer lock).
//!
//! Rewriting bytes below `wrote` ([`MappedFile::truncate`] zeroes `[pos, size)`) waits until no
//! slice that may cover them is alive: every slice is counted while it lives (the owner behind
//! its [`Bytes`] leaves the count on drop, so a master writer holding a frame across a socket
//! write is counted too). The count has two generations, as in RCU: a cut first lowers `wrote`
//! to `pos`, then switches new slices to the other generation and waits until the old one is
//! empty. A slice of the new generation read `wrote` after the cut lowered it, so it ends at or
//! below `pos` and the cut may run while it lives. A read costs two atomic increments and a
//! load (one decrement when dropped), never a lock. A cut waits at most [`READER_WAIT`]; when
//! slices outlive that, it puts `wrote` back, changes nothing and fails with
//! [`Error::ReadersHold`]; the next cut waits for those slices too, before its own switch.
//! Cuts of one file never overlap (the queue runs them one at a time). The undo of a failed
//! append cuts only bytes it appended and never published; readers are bounded by what the
//! commitlog published, so no slice covers them and that cut does not wait
//! ([`MappedFile::begin_unpublished_cut`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memmap2::MmapRaw;

use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::warm::WarmTurns;

/// File names are the start offset as 20 zero-padded decimal digits, as RocketMQ names them.
pub(crate) const FILE_NAME_DIGITS: usize = 20;

/// The file name of the segment starting at `offset`.
pub fn file_name(offset: u64) -> String {
    format!("{offset:0width$}", width = FILE_NAME_DIGITS)
}

/// Parses a segment file name back to its start offset; `None` for any other name.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    if name.len() == FILE_NAME_DIGITS && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

/// How much of a file [`MappedFile::populate_rest`] faults in per call (a multiple of any page
/// size): each call holds the memory-map lock for about 2 ms here.
pub(crate) const POPULATE_CHUNK: usize = 1 << 20;

/// How long a cut waits for the slices alive when it starts to be dropped.
pub(crate) const READER_WAIT: Duration = Duration::from_secs(5);

/// The live slices of one mapping, counted in two generations (see the module docs).
#[derive(Debug, Default)]
struct Readers {
    /// The generation (0 or 1) new slices count in.
    generation: AtomicUsize,
    alive: [AtomicUsize; 2],
    /// Set while a cut waits; the last slice of the old generation to go then wakes it.
    waiting: AtomicBool,
    lock: Mutex<()>,
    drained: Condvar,
}

impl Readers {
    /// Counts a new slice; returns its generation.
    fn enter(&self) -> usize {
        loop {
            let g = self.generation.load(Ordering::SeqCst);
            self.alive[g].fetch_add(1, Ordering::SeqCst);
            // Counted in `g` only if no cut switched generations meanwhile; else the cut may
            // not see this count: leave and count in the new generation.
            if self.generation.load(Ordering::SeqCst) == g {
                return g;
            }
            self.leave(g);
        }
    }

    fn leave(&self, g: usize) {
        if self.alive[g].fetch_sub(1, Ordering::SeqCst) == 1 && self.waiting.load(Ordering::SeqCst)
        {
            let _l = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.drained.notify_all();
        }
    }

    /// Switches new slices to the other generation and waits, at most `wait`, until no slice
    /// of the old one is alive. Returns the old generation, or how many of its slices are
    /// still alive. A cut that gave up leaves slices alive in the generation it drained, which
    /// new slices no longer join: they may cover any range, so this waits for them first.
    fn drain(&self, wait: Duration) -> std::result::Result<usize, usize> {
        let was_waiting = self.waiting.swap(true, Ordering::SeqCst);
        debug_assert!(!was_waiting, "cuts of one file never overlap");
        let deadline = Instant::now() + wait;
        let stale = self.generation.load(Ordering::SeqCst) ^ 1;
        let result = self.wait_empty(stale, deadline).and_then(|()| {
            let old = self.generation.fetch_xor(1, Ordering::SeqCst);
            self.wait_empty(old, deadline).map(|()| old)
        });
        self.waiting.store(false, Ordering::SeqCst);
        result
    }

    /// Waits until no slice of generation `g` is alive, at most until `deadline`; else returns
    /// how many are.
    fn wait_empty(&self, g: usize, deadline: Instant) -> std::result::Result<(), usize> {
        let mut l = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = self.alive[g].load(Ordering::SeqCst);
            if n == 0 {
                return Ok(());
            }
            let left = deadline.checked_duration_since(Instant::now()).ok_or(n)?;
            l = self.drained.wait_timeout(l, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A mapping and the count of its live slices.
#[derive(Debug)]
struct Mapping {
    map: MmapRaw,
    readers: Readers,
}

/// A counted slice of a mapping that keeps the mapping alive; the owner behind zero-copy
/// [`Bytes`]. It leaves the count when the last [`Bytes`] of it is dropped.
struct MapSlice {
    map: Arc<Mapping>,
    generation: usize,
    start: usize,
    len: usize,
}

impl MapSlice {
    /// Counts a slice of `map` before its range is known: the reader reads `wrote` after this.
    fn enter(map: &Arc<Mapping>) -> Self {
        let generation = map.readers.enter();
        Self { map: Arc::clone(map), generation, start: 0, len: 0 }
    }

    fn into_bytes(mut self, start: usize, len: usize) -> Bytes {
        debug_assert!(start + len <= self.map.map.len());
        (self.start, self.len) = (start, len);
        Bytes::from_owner(self)
    }
}

impl Drop for MapSlice {
    fn drop(&mut self) {
        self.map.readers.leave(self.generation);
    }
}

impl AsRef<[u8]> for MapSlice {
    fn as_ref(&self) -> &[u8] {
        debug_assert!(self.start + self.len <= self.map.map.len());
        // SAFETY: the range lies inside the mapping, which lives as long as `self.map`. Appends
        // never write into a `read` slice (it ends at `wrote`), nor into a `raw` slice (taken
        // while no writer runs). A cut rewrites `[pos, size)` only once no slice counted before
        // it lowered `wrote` to `pos` is alive; slices counted later end at or below `pos`
        // (see the module docs).
        unsafe { std::slice::from_raw_parts(self.map.map.as_ptr().add(self.start), self.len) }
    }
}

/// One segment file of the commitlog.
pub struct MappedFile {
    path: PathBuf,
    from_offset: u64,
    size: usize,
    map: Arc<Mapping>,
    wrote: AtomicUsize,
    flushed: AtomicUsize,
    /// Held by a flush from reading the written position to raising the flushed one, and by a
    /// cut's zeroing: a flush that read the position before a cut cannot raise the flushed
    /// position past the cut after it (appends there later would count as flushed). It holds
    /// the range of written bytes whose last msync failed, if any ([`MappedFile::flush`]).
    flush_lock: std::sync::Mutex<Option<(usize, usize)>>,
    /// Whether its pages were faulted in for writing ([`MappedFile::populate_rest`]).
    warmed: std::sync::atomic::AtomicBool,
    /// How far [`MappedFile::populate_rest`] got, for the next call after it stopped.
    warm_pos: AtomicUsize,
    fs: Arc<dyn FileSystem>,
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("wrote", &self.wrote_pos())
            .field("flushed", &self.flushed_pos())
            .finish()
    }
}

impl MappedFile {
    /// Creates the segment starting at `from_offset` in `dir`, `size` bytes, allocated and synced.
    pub(crate) fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        from_offset: u64,
        size: usize,
    ) -> Result<Self> {
        Self::create_at(fs, dir.join(file_name(from_offset)), from_offset, size)
    }

    /// Creates the segment starting at `from_offset` under an arbitrary path (a spare file
    /// prepared ahead of time, renamed into place by [`MappedFile::rename_to`]).
    pub(crate) fn create_at(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        from_offset: u64,
        size: usize,
    ) -> Result<Self> {
        debug_assert!(from_offset.is_multiple_of(size as u64));
        let file = fs.create(&path, size as u64).map_err(|e| Error::io("create", &path, e))?;
        let map = fs.map(&path, &file).map_err(|e| Error::io("map", &path, e))?;
        Ok(Self::from_parts(fs, path, from_offset, size, map, 0))
    }

    /// Opens an existing segment; its size must be exactly `size`. Positions start at 0 (wrote
    /// and flushed): recovery sets them.
    pub(crate) fn open(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        from_offset: u64,
        size: usize,
    ) -> Result<Self> {
        let file = fs.open(path).map_err(|e| Error::io("open", path, e))?;
        let len = file.metadata().map_err(|e| Error::io("stat", path, e))?.len();
        if len != size as u64 {
            return Err(Error::Corruption {
                file: path.to_path_buf(),
                offset: from_offset,
                reason: format!("file is {len} bytes, store.segment-size is {size}"),
            });
        }
        let map = fs.map(path, &file).map_err(|e| Error::io("map", path, e))?;
        Ok(Self::from_parts(fs, path.to_path_buf(), from_offset, size, map, 0))
    }

    fn from_parts(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        from_offset: u64,
        size: usize,
        map: MmapRaw,
        wrote: usize,
    ) -> Self {
        assert_eq!(map.len(), size, "mapping length must equal the segment size");
        Self {
            path,
            from_offset,
            size,
            map: Arc::new(Mapping { map, readers: Readers::default() }),
            wrote: AtomicUsize::new(wrote),
            flushed: AtomicUsize::new(wrote),
            flush_lock: std::sync::Mutex::new(None),
            warmed: std::sync::atomic::AtomicBool::new(false),
            warm_pos: AtomicUsize::new(0),
            fs,
        }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
    /// The commitlog offset of the file's first byte.
    pub fn from_offset(&self) -> u64 {
        self.from_offset
    }
    /// The commitlog offset just past the file's last byte.
    pub(crate) fn end_offset(&self) -> u64 {
        self.from_offset + self.size as u64
    }
    /// The file size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    /// Bytes appended so far (acquire).
    pub(crate) fn wrote_pos(&self) -> usize {
        self.wrote.load(Ordering::Acquire)
    }
    /// Bytes made durable so far.
    pub(crate) fn flushed_pos(&self) -> usize {
        self.flushed.load(Ordering::Acquire)
    }
    /// Bytes left in the file.
    pub(crate) fn remaining(&self) -> usize {
        self.size - self.wrote_pos()
    }
    /// Whether the file has no room left.
    pub(crate) fn is_full(&self) -> bool {
        self.wrote_pos() == self.size
    }
    /// Whether `offset` falls inside this file.
    pub(crate) fn contains(&self, offset: u64) -> bool {
        offset >= self.from_offset && offset < self.end_offset()
    }

    /// Appends `len` bytes produced by `fill`, which gets the destination inside the mapping.
    /// Only the single writer calls this. Returns the file position the bytes start at. The
    /// caller checks the bytes fit; a mistake here is a bug, so it panics before writing.
    pub(crate) fn append_with<R>(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> (usize, R) {
        let pos = self.wrote.load(Ordering::Relaxed);
        assert!(pos + len <= self.size, "append of {len} bytes at {pos} overruns {}", self.size);
        // SAFETY: [pos, pos+len) is inside the mapping and at or above `wrote`, which no `read`
        // slice reaches (`raw` slices are taken while no writer runs); the single writer is the
        // only one writing.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.map.map.as_mut_ptr().add(pos), len) };
        let r = fill(dst);
        self.wrote.store(pos + len, Ordering::Release);
        (pos, r)
    }

    /// Writes `len` bytes produced by `fill` and then marks the whole rest of the file as
    /// written: the end-of-file blank record, whose 8 bytes stand for all remaining space.
    pub(crate) fn close_with(&self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let pos = self.wrote.load(Ordering::Relaxed);
        assert!(pos + len <= self.size, "blank of {len} bytes at {pos} overruns {}", self.size);
        // SAFETY: as in `append_with`.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.map.map.as_mut_ptr().add(pos), len) };
        fill(dst);
        self.wrote.store(self.size, Ordering::Release);
    }

    /// Appends raw bytes (the slave's path). Returns the file position they start at.
    pub(crate) fn append(&self, bytes: &[u8]) -> usize {
        self.append_with(bytes.len(), |dst| dst.copy_from_slice(bytes)).0
    }

    /// A zero-copy slice `[pos, min(pos + max_len, wrote))`, or `None` when `pos >= wrote`.
    pub(crate) fn read(&self, pos: usize, max_len: usize) -> Option<Bytes> {
        // Counted first, bounded after: a cut lowers `wrote` before it waits (module docs).
        let slice = MapSlice::enter(&self.map);
        let wrote = self.wrote.load(Ordering::SeqCst);
        if pos >= wrote {
            return None;
        }
        let len = (wrote - pos).min(max_len);
        Some(slice.into_bytes(pos, len))
    }

    /// A zero-copy slice of `[pos, pos + len)` regardless of `wrote`: for the recovery scan,
    /// which reads what is on disk before any position is known.
    /// The caller makes sure no writer appends meanwhile (recovery, or under the writer lock).
    pub(crate) fn raw(&self, pos: usize, len: usize) -> Bytes {
        assert!(pos + len <= self.size, "raw read past the end of {}", self.path.display());
        MapSlice::enter(&self.map).into_bytes(pos, len)
    }

    /// Sets both positions after recovery found the valid end of this file.
    pub(crate) fn set_recovered(&self, wrote: usize, flushed: usize) {
        assert!(flushed <= wrote && wrote <= self.size);
        self.wrote.store(wrote, Ordering::Release);
        self.flushed.store(flushed, Ordering::Release);
    }

    /// Makes `[flushed, wrote)` durable; returns the new flushed position. Blocking (msync): the
    /// store calls it from its store thread and from blocking calls that the node runs under
    /// `spawn_blocking`. It does not take the writer lock, so it can race a truncate (see the
    /// module docs).
    ///
    /// A failed msync leaves its range owed, and the next flush writes every page of it again
    /// through the mapping before it syncs: after a failed writeback Linux holds the pages
    /// clean, and a bare msync retry would write none of them yet succeed (fsyncgate), so the
    /// bytes would count as flushed (a put under `store.flush = "sync"` acknowledged, a
    /// checkpoint claiming them) without being on the disk. Each page is stored with the byte
    /// it holds: nothing changes for a reader. (A page the kernel dropped after the failure
    /// reads the disk's old bytes back; those are then what is synced, and the start-up scan
    /// finds them. Nothing here can tell.)
    pub fn flush(&self) -> Result<usize> {
        let mut failed = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        let wrote = self.wrote_pos();
        let flushed = self.flushed_pos();
        if wrote <= flushed && failed.is_none() {
            return Ok(flushed);
        }
        // msync works on whole pages; start at the page holding `flushed`.
        let mut from = flushed - flushed % page_size();
        if let Some((start, end)) = *failed {
            // Below `wrote`: the single writer appends at and above it, and a cut lowering
            // it meanwhile zeroes these bytes only after this flush lets go of the lock.
            self.rewrite_pages(start, end.min(wrote), |at, _| {
                // SAFETY: `at` lies inside this live mapping, below `wrote` (above); the same
                // byte is stored back, so a reader of the page reads what it read before.
                unsafe { at.write_volatile(at.read_volatile()) }
            });
            from = from.min(start);
        }
        if let Err(e) = self.fs.flush(&self.path, &self.map.map, from, wrote) {
            *failed = Some(failed.map_or((from, wrote), |(a, b)| (a.min(from), b.max(wrote))));
            return Err(Error::io("msync", &self.path, e));
        }
        // What lies past `wrote` stays owed: a cut that lowered it while waiting for readers
        // may give up and put it back (nothing of that range was rewritten or synced).
        *failed = failed.filter(|&(_, b)| b > wrote).map(|(a, b)| (a.max(wrote), b));
        self.flushed.fetch_max(wrote, Ordering::AcqRel);
        Ok(self.flushed_pos())
    }

    /// Stores into every page of `[from, until)` through the mapping: `rewrite` gets a pointer to
    /// the first byte of the range in each page and the length of the range in that page. A
    /// store marks a page dirty, so the next msync writes it back even where the kernel held it
    /// clean; the file system is told ([`FileSystem::rewritten`]).
    fn rewrite_pages(&self, from: usize, until: usize, mut rewrite: impl FnMut(*mut u8, usize)) {
        let page = page_size();
        let mut at = from;
        while at < until {
            let end = (at - at % page + page).min(until);
            // SAFETY: `at < until <= size`: inside this live mapping.
            rewrite(unsafe { self.map.map.as_mut_ptr().add(at) }, end - at);
            at = end;
        }
        if from < until {
            self.fs.rewritten(&self.path, from, until);
        }
    }

    /// The retry of a cut's zeroing of `[pos, until)` whose msync failed: after a failed
    /// writeback the kernel may hold the pages clean (a bare msync would write nothing) or
    /// drop them and read the old bytes back from the disk, so every page is written again,
    /// zeroed where it is not zero and dirtied where it is, from the first byte at or past
    /// `pos` (never below the written position), and the range is synced. The caller
    /// guarantees that nothing appends to the file meanwhile (appends are refused while a
    /// zeroing is owed: see [`crate::store::mapped_file_queue`]); no slice covers the range
    /// (it lies past a cut).
    pub(crate) fn rezero(&self, pos: usize, until: usize) -> Result<()> {
        let mut failed = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        let (pos, until) = (pos.max(self.wrote_pos()), until.min(self.size));
        if pos >= until {
            return Ok(());
        }
        self.rewrite_pages(pos, until, |at, len| {
            // SAFETY: [at, at + len) lies inside this live mapping, past the written position,
            // where no slice is alive and nothing appends (see above).
            let chunk = unsafe { std::slice::from_raw_parts_mut(at, len) };
            if chunk.iter().any(|&b| b != 0) {
                chunk.fill(0);
            } else {
                // SAFETY: as above; a store dirties the page even of the value it holds.
                unsafe { at.write_volatile(0) };
            }
        });
        let from = pos - pos % page_size();
        self.fs.flush(&self.path, &self.map.map, from, until).map_err(|e| {
            self.owe_unsynced(&mut failed);
            Error::io("msync", &self.path, e)
        })
    }

    /// After a failed msync of a cut's zeroing: the error may be a failed writeback of any
    /// page of the file (Linux reports one per file, to whichever sync asks next), so the
    /// written bytes no flush synced yet are owed too, and the next flush writes them again.
    fn owe_unsynced(&self, failed: &mut Option<(usize, usize)>) {
        let (flushed, wrote) = (self.flushed_pos(), self.wrote_pos());
        if flushed < wrote {
            let from = flushed - flushed % page_size();
            *failed = Some(failed.map_or((from, wrote), |(a, b)| (a.min(from), b.max(wrote))));
        }
    }

    /// Cuts the file at `pos`: both positions move there and every non-zero page in
    /// `[pos, size)` is zeroed and made durable, so a stale record past the cut can never be
    /// read back as valid after a later crash. Waits first until no slice that may cover the
    /// cut range is alive, at most [`READER_WAIT`]; gives up changing nothing after that. (The
    /// queue runs the two halves itself, [`MappedFile::begin_cut`] and [`Cut::finish`].)
    #[cfg(test)]
    pub(crate) fn truncate(&self, pos: usize) -> Result<()> {
        self.begin_cut(pos, READER_WAIT)?.finish()
    }

    /// The first half of [`MappedFile::truncate`]: lowers `wrote` to `pos` and waits, at most
    /// `wait`, until no slice counted before is alive. The returned cut zeroes the range when
    /// finished; dropped unfinished, it puts `wrote` back (the bytes never changed).
    pub(crate) fn begin_cut(&self, pos: usize, wait: Duration) -> Result<Cut<'_>> {
        assert!(pos <= self.size);
        let old_wrote = self.wrote.swap(pos, Ordering::SeqCst);
        match self.map.readers.drain(wait) {
            Ok(drained) => {
                Ok(Cut { file: self, pos, old_wrote, drained: Some(drained), finished: false })
            }
            Err(readers) => {
                self.wrote.store(old_wrote, Ordering::SeqCst);
                Err(Error::ReadersHold { file: self.path.clone(), pos, readers, waited: wait })
            }
        }
    }

    /// A cut of bytes no reader was ever given: `[pos, wrote)` was appended but never
    /// published (an append that failed half-way is undone). Every reader's slice is bounded
    /// by what the commitlog published (`CommitLog::read` by the max offset, `records_from` by
    /// the dispatched offset), which is at or below `pos`, so no slice covers the range and the
    /// cut does not wait for readers.
    pub(crate) fn begin_unpublished_cut(&self, pos: usize) -> Cut<'_> {
        assert!(pos <= self.size);
        let old_wrote = self.wrote.swap(pos, Ordering::SeqCst);
        Cut { file: self, pos, old_wrote, drained: None, finished: false }
    }

    /// Zeroes the non-zero pages of `[pos, until)` and makes them durable (`[until, size)` is
    /// known to be zero already).
    fn zero_from(&self, pos: usize, until: usize) -> std::result::Result<(), ZeroFailed> {
        debug_assert!(until <= self.size);
        let mut failed = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.flushed.store(pos.min(self.flushed_pos()), Ordering::Release);
        // A failed flush's range past the cut is zeroed here (or owed as the zeroing).
        *failed = failed.map(|(a, b)| (a, b.min(pos))).filter(|(a, b)| a < b);
        let (mut first_dirty, mut last_dirty) = (usize::MAX, 0);
        let mut at = pos;
        while at < until {
            let end = (at - at % page_size() + page_size()).min(until);
            // SAFETY: [at, end) lies inside the mapping, and no slice of it is alive: the cut
            // waited for every slice counted before `wrote` came down to `pos`, and later ones
            // end at or below `pos` (see the module docs). The single writer runs this.
            let chunk = unsafe {
                std::slice::from_raw_parts_mut(self.map.map.as_mut_ptr().add(at), end - at)
            };
            if chunk.iter().any(|&b| b != 0) {
                chunk.fill(0);
                first_dirty = first_dirty.min(at);
                last_dirty = end;
            }
            at = end;
        }
        if last_dirty > 0 {
            let from = first_dirty - first_dirty % page_size();
            self.fs.flush(&self.path, &self.map.map, from, last_dirty).map_err(|e| {
                self.owe_unsynced(&mut failed);
                (Error::io("msync", &self.path, e), first_dirty.max(pos), last_dirty)
            })?;
        }
        // The flushed position stays where it came down to: the bytes below the cut that no
        // flush synced yet were not synced by this one either (it syncs the zeroed pages).
        Ok(())
    }

    /// Whether every byte of the file is zero (an unused spare segment).
    pub(crate) fn is_all_zero(&self) -> bool {
        self.raw(0, self.size).iter().all(|&b| b == 0)
    }

    /// Renames the (empty) file to `path`; the mapping is unchanged.
    pub(crate) fn rename_to(self, path: PathBuf) -> Result<Self> {
        debug_assert_eq!(self.wrote_pos(), 0, "only an unused spare file is renamed");
        self.fs.rename(&self.path, &path).map_err(|e| Error::io("rename", &self.path, e))?;
        Ok(Self { path, ..self })
    }

    /// Whether its pages were faulted in for writing.
    pub(crate) fn is_warmed(&self) -> bool {
        self.warmed.load(Ordering::Acquire)
    }

    /// Faults the pages from the wrote position to the end in for writing without touching
    /// their bytes (`MADV_POPULATE_WRITE`, Linux 5.14): safe while appends go on in the same
    /// file. For the spare the store thread prepares (published before this runs, so a roll
    /// may already append to it), and for a segment that became the last one unwarmed (the
    /// first segment of a store, or one created at a roll with no spare ready): without it,
    /// every fourth 1 KiB append takes a page fault on the write path, and a fault on ext4 can
    /// wait for a journal commit. Where the kernel refuses (older kernels, a full disk: an
    /// error, never SIGBUS), appends fault their pages as before; the error is returned.
    ///
    /// It goes [`POPULATE_CHUNK`] at a time: the kernel holds the process's memory-map lock
    /// (shared) for the whole of one call, and a 256 MiB call took about 0.5 s here, during
    /// which any thread of the process that maps, unmaps or grows its heap (a segment created,
    /// an allocator arena grown) waited, and the page faults queued behind it: in the
    /// benchmarks, SYNC puts waited up to 0.5 s. Each call takes its turn among the stores
    /// that share `turns` (`store.warm-lock`, [`crate::store::warm`]).
    ///
    /// Between calls, and while it waits for a turn, it stops when `pending` says the store
    /// thread has other work (a flush a put may wait for, a checkpoint, a segment to prepare):
    /// `Ok(false)`, and the next call goes on from where this one stopped. `Ok(true)` once the
    /// file is warm.
    pub(crate) fn populate_rest(
        &self,
        turns: &WarmTurns,
        pending: &dyn Fn() -> bool,
    ) -> std::io::Result<bool> {
        let page = page_size();
        let mut at = self.wrote_pos().max(self.warm_pos.load(Ordering::Acquire)) / page * page;
        let mut result = Ok(true);
        while at < self.size {
            let len = POPULATE_CHUNK.min(self.size - at);
            // SAFETY: the range lies inside this live mapping; MADV_POPULATE_WRITE changes no
            // byte of it (it maps the pages writable as a write fault would).
            let done = turns.run(pending, || unsafe {
                rustix::mm::madvise(
                    self.map.map.as_mut_ptr().add(at).cast(),
                    len,
                    rustix::mm::Advice::LinuxPopulateWrite,
                )
            });
            match done {
                None => return Ok(false),
                Some(Err(e)) => {
                    result = Err(std::io::Error::from(e));
                    break;
                }
                Some(Ok(())) => {}
            }
            at += len;
            self.warm_pos.store(at, Ordering::Release);
            if at < self.size && pending() {
                return Ok(false);
            }
        }
        // Tried once either way: a refusal is not retried at every store-thread wake.
        self.warmed.store(true, Ordering::Release);
        result
    }

    /// Deletes the file from disk. The mapping stays valid for readers still holding slices.
    pub(crate) fn remove(&self) -> Result<()> {
        self.fs.remove(&self.path).map_err(|e| Error::io("remove", &self.path, e))
    }
}

/// A cut's zeroing whose msync failed: the error and the range `[from, to)` it had zeroed.
pub(crate) type ZeroFailed = (Error, usize, usize);

/// A cut in progress: no slice of the range it rewrites is alive (see
/// [`MappedFile::begin_cut`]).
#[derive(Debug)]
pub(crate) struct Cut<'a> {
    file: &'a MappedFile,
    pos: usize,
    old_wrote: usize,
    /// The generation drained before the cut (`None`: a cut of unpublished bytes).
    drained: Option<usize>,
    finished: bool,
}

impl Cut<'_> {
    /// Zeroes `[pos, size)` and makes it durable.
    #[cfg(test)]
    pub(crate) fn finish(self) -> Result<()> {
        let size = self.file.size;
        self.finish_until(size).map_err(|(e, ..)| e)
    }

    /// Zeroes `[pos, until)` and makes it durable: the caller knows `[until, size)` is zero
    /// (recovery after a clean stop), so those bytes are not even read. When the msync fails
    /// the bytes are zero in memory all the same, and the error comes with the page range it
    /// covered (the pages that were not zero), for a retry ([`MappedFile::rezero`]).
    pub(crate) fn finish_until(mut self, until: usize) -> std::result::Result<(), ZeroFailed> {
        self.finished = true;
        let readers = &self.file.map.readers;
        debug_assert!(
            self.drained.is_none_or(|g| readers.alive[g].load(Ordering::SeqCst) == 0),
            "a slice counted before the cut is alive while the cut rewrites its range"
        );
        debug_assert!(self.file.wrote_pos() == self.pos, "nothing appends during a cut");
        self.file.zero_from(self.pos, until.clamp(self.pos, self.file.size))
    }
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.file.wrote.store(self.old_wrote, Ordering::SeqCst);
        }
    }
}

/// The OS page size.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    //! Segment files: create, read, flush, truncate, file names.

    use std::sync::Arc;
    use std::time::Duration;

    use super::{MappedFile, POPULATE_CHUNK, WarmTurns, file_name, parse_file_name};
    use crate::store::fs::{Damage, FileSystem, SimFs, StdFs};

    const SEG: usize = 64 * 1024;

    fn fs() -> Arc<dyn FileSystem> {
        Arc::new(StdFs)
    }

    #[test]
    fn file_names_are_20_digit_offsets() {
        assert_eq!(file_name(0), "00000000000000000000");
        assert_eq!(file_name(1_073_741_824), "00000000001073741824");
        assert_eq!(parse_file_name("00000000005368709120"), Some(5_368_709_120));
        assert_eq!(parse_file_name("0000000000536870912"), None);
        assert_eq!(parse_file_name("checkpoint"), None);
        assert_eq!(parse_file_name("0000000000536870912x"), None);
    }

    /// A file larger than one populate chunk, its data ending mid-chunk: every chunk after
    /// it is faulted in (resident), and no byte changes.
    #[test]
    fn populating_goes_chunk_by_chunk_to_the_end_of_a_file_larger_than_a_chunk() {
        let size = 3 * POPULATE_CHUNK;
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, size).unwrap();
        f.append(&vec![5u8; POPULATE_CHUNK + 12_345]);
        assert!(f.populate_rest(&turns(), &|| false).unwrap());
        assert!(f.is_warmed());
        // Every page is mapped now: the data's by the appends, the rest by the populate.
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let path = f.path().display().to_string();
        let at = smaps.find(&path).expect("the mapping is listed");
        let rss_kib: usize = smaps[at..]
            .lines()
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert_eq!(rss_kib * 1024, size, "resident bytes of the mapping");
        assert!(f.raw(0, POPULATE_CHUNK + 12_345).iter().all(|&b| b == 5));
        assert!(
            f.raw(POPULATE_CHUNK + 12_345, size - POPULATE_CHUNK - 12_345).iter().all(|&b| b == 0)
        );
    }

    fn turns() -> WarmTurns {
        WarmTurns::open(&crate::config::WarmLock::Process).unwrap()
    }

    /// Each populate call takes its turn among the process's stores (`store.warm-lock`): while
    /// another store holds it, no call begins; once that one ends, the populate goes on to the
    /// end of the file.
    #[test]
    fn a_populate_waits_while_another_store_holds_the_process_turn() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let f = Arc::new(MappedFile::create(fs(), dir.path(), 0, 2 * POPULATE_CHUNK).unwrap());
        // Both wait far longer than the test: neither goes on without its turn here, whatever
        // the other tests of this process warm meanwhile.
        let long = Duration::from_secs(60);
        let holder = turns().with_wait(long);
        let mine = Arc::new(turns().with_wait(long));
        let turn = holder.take(&|| false).unwrap();
        assert!(turn.holds_process());
        let warmer = {
            let (f, mine) = (Arc::clone(&f), Arc::clone(&mine));
            std::thread::spawn(move || f.populate_rest(&mine, &|| false))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(mine.began.load(SeqCst), 0, "a call began while another store had the turn");
        assert!(!f.is_warmed());
        drop(turn);
        assert!(warmer.join().unwrap().unwrap());
        assert!(f.is_warmed());
        assert_eq!(mine.began.load(SeqCst), 2, "one call per chunk");
    }

    /// Other work for the store thread ends a wait for a turn: the populate stops without a
    /// call and without calling the file warm, and the next one goes on from where the last
    /// stopped (here: the first chunk done, the second stopped).
    #[test]
    fn a_populate_stops_for_pending_work_and_goes_on_from_where_it_stopped() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let dir = tempfile::tempdir().unwrap();
        let f = Arc::new(MappedFile::create(fs(), dir.path(), 0, 3 * POPULATE_CHUNK).unwrap());
        let long = Duration::from_secs(60);
        let mine = Arc::new(turns().with_wait(long));
        let work = Arc::new(AtomicBool::new(false));
        // One chunk, then other work: it stops before the second.
        let after_one = {
            let (mine, work) = (Arc::clone(&mine), Arc::clone(&work));
            move || {
                let started = mine.began.load(SeqCst) >= 1;
                work.store(started, SeqCst);
                started
            }
        };
        assert!(!f.populate_rest(&mine, &after_one).unwrap(), "it went on past pending work");
        assert_eq!(mine.began.load(SeqCst), 1);
        assert!(!f.is_warmed());
        // Waiting for a turn another store holds, work comes: it stops without a call.
        let holder = turns().with_wait(long);
        let turn = holder.take(&|| false).unwrap();
        let warmer = {
            let (f, mine, work) = (Arc::clone(&f), Arc::clone(&mine), Arc::clone(&work));
            work.store(false, SeqCst);
            std::thread::spawn(move || f.populate_rest(&mine, &|| work.load(SeqCst)))
        };
        let deadline = std::time::Instant::now() + long;
        while mine.waiting.load(SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "the populate never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        work.store(true, SeqCst);
        assert!(!warmer.join().unwrap().unwrap(), "a wait for a turn outlasted pending work");
        assert_eq!(mine.began.load(SeqCst), 1, "no call without a turn");
        drop(turn);
        // Nothing pending: it goes on from the second chunk to the end.
        assert!(f.populate_rest(&mine, &|| false).unwrap());
        assert_eq!(mine.began.load(SeqCst), 3, "the first chunk was not faulted in again");
        assert!(f.is_warmed());
    }

    /// Appends made while another thread faults the same file in keep every byte (the
    /// store thread warms a spare a roll may already write to).
    #[test]
    fn appends_during_a_populate_keep_their_bytes() {
        let size = 16 * POPULATE_CHUNK;
        let dir = tempfile::tempdir().unwrap();
        let f = Arc::new(MappedFile::create(fs(), dir.path(), 0, size).unwrap());
        let warmer = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || f.populate_rest(&turns(), &|| false))
        };
        let mut n = 0u8;
        while !warmer.is_finished() && f.remaining() >= 1000 {
            n = n.wrapping_add(1).max(1);
            f.append(&[n; 1000]);
        }
        warmer.join().unwrap().unwrap();
        let wrote = f.wrote_pos();
        assert!(wrote > 0, "some appends ran during the populate");
        let mut want = 0u8;
        for (i, chunk) in f.raw(0, wrote).chunks(1000).enumerate() {
            want = want.wrapping_add(1).max(1);
            assert!(chunk.iter().all(|&b| b == want), "append {i} changed");
        }
        assert!(f.raw(wrote, size - wrote).iter().all(|&b| b == 0));
    }

    #[test]
    fn populating_the_rest_keeps_every_byte_and_appends_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        f.append(&[7u8; 5000]);
        assert!(!f.is_warmed());
        assert!(f.populate_rest(&turns(), &|| false).unwrap());
        assert!(f.is_warmed());
        assert!(f.raw(0, 5000).iter().all(|&b| b == 7), "the data before it is untouched");
        assert!(f.raw(5000, SEG - 5000).iter().all(|&b| b == 0), "the rest is still zero");
        f.append(&[9u8; 100]);
        assert_eq!(&f.raw(5000, 100)[..], &[9u8; 100][..]);
        f.flush().unwrap();
        drop(f);
        let bytes = std::fs::read(dir.path().join(file_name(0))).unwrap();
        assert_eq!(bytes.len(), SEG);
        assert!(bytes[..5000].iter().all(|&b| b == 7) && bytes[5000..5100].iter().all(|&b| b == 9));
        assert!(bytes[5100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn created_file_is_allocated_and_empty() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        let meta = std::fs::metadata(f.path()).unwrap();
        assert_eq!(meta.len(), SEG as u64);
        // Really allocated, not sparse: the blocks cover the whole file.
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 >= SEG as u64, "file is sparse: {} blocks", meta.blocks());
        assert_eq!((f.wrote_pos(), f.flushed_pos(), f.remaining()), (0, 0, SEG));
        assert!(f.read(0, 100).is_none());
    }

    #[test]
    fn append_read_flush_positions() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), SEG as u64, SEG).unwrap();
        assert_eq!(f.append(b"hello"), 0);
        assert_eq!(f.append(b"world"), 5);
        assert_eq!(&f.read(0, 100).unwrap()[..], b"helloworld");
        assert_eq!(&f.read(3, 4).unwrap()[..], b"lowo");
        assert!(f.read(10, 1).is_none());
        assert_eq!(f.flushed_pos(), 0);
        assert_eq!(f.flush().unwrap(), 10);
        assert_eq!(f.flushed_pos(), 10);
        // Bytes survive a reopen.
        let path = f.path().to_path_buf();
        drop(f);
        let g = MappedFile::open(fs(), &path, SEG as u64, SEG).unwrap();
        assert_eq!(&g.raw(0, 10)[..], b"helloworld");
    }

    #[test]
    fn reader_slice_outlives_the_file_handle() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        f.append(b"abc");
        let slice = f.read(0, 3).unwrap();
        f.remove().unwrap();
        drop(f);
        assert_eq!(&slice[..], b"abc", "the mapping stays alive while a reader holds it");
    }

    #[test]
    fn wrong_file_size_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(0));
        std::fs::write(&path, vec![0u8; 1000]).unwrap();
        let err = MappedFile::open(fs(), &path, 0, SEG).unwrap_err().to_string();
        assert!(err.contains("00000000000000000000") && err.contains("1000 bytes"), "{err}");
    }

    #[test]
    fn truncate_zeroes_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        f.append(&[7u8; 10_000]);
        f.truncate(100).unwrap();
        assert_eq!(f.wrote_pos(), 100);
        assert!(f.raw(100, SEG - 100).iter().all(|&b| b == 0));
        assert!(f.raw(0, 100).iter().all(|&b| b == 7));
    }

    #[test]
    fn truncate_waits_until_no_slice_of_the_file_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        let f = Arc::new(MappedFile::create(fs(), dir.path(), 0, SEG).unwrap());
        f.append(&[7u8; 10_000]);
        let slice = f.read(0, 10_000).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let cutter = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || tx.send(f.truncate(100)).unwrap())
        };
        // Up to 10 s (a loaded machine may not run the cutter soon), 10,000 polls.
        for _ in 0..10_000 {
            if f.map.readers.waiting.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(f.map.readers.waiting.load(std::sync::atomic::Ordering::SeqCst), "the cut waits");
        // A read that starts during the cut sees only what the cut keeps, and does not hold
        // it up.
        assert_eq!(f.read(0, usize::MAX).map(|b| b.len()), Some(100));
        // The cut may not go on while `slice` is alive: it must still be waiting.
        let early = rx.recv_timeout(std::time::Duration::from_millis(300));
        assert!(early.is_err(), "truncate finished while a slice of the cut range was alive");
        assert!(slice.iter().all(|&b| b == 7), "the bytes changed under their reader");
        drop(slice);
        let done = rx.recv_timeout(std::time::Duration::from_secs(10));
        done.expect("truncate finishes once the slice is dropped").unwrap();
        cutter.join().unwrap();
        assert!(f.raw(100, SEG - 100).iter().all(|&b| b == 0));
    }

    #[test]
    fn a_cut_gives_up_changing_nothing_when_a_slice_stays_alive() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        f.append(&[7u8; 10_000]);
        let slice = f.read(5_000, 10).unwrap();
        let err = f.begin_cut(100, std::time::Duration::from_millis(20)).unwrap_err();
        assert!(matches!(err, crate::store::Error::ReadersHold { readers: 1, pos: 100, .. }));
        assert!(err.to_string().contains("1 reader(s) still hold slices"), "{err}");
        assert_eq!(f.wrote_pos(), 10_000, "nothing changed");
        assert!(f.raw(0, 10_000).iter().all(|&b| b == 7) && slice.iter().all(|&b| b == 7));
        drop(slice);
        f.truncate(100).unwrap();
        assert_eq!(f.wrote_pos(), 100);
    }

    #[test]
    fn a_cut_after_one_that_gave_up_waits_for_the_slices_that_outlived_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
        f.append(&[7u8; 10_000]);
        let slice = f.read(5_000, 10).unwrap();
        let wait = std::time::Duration::from_millis(20);
        assert!(f.begin_cut(100, wait).is_err(), "the slice holds the first cut");
        // The slice was counted in the generation the first cut drained; the second cut
        // drains the other one, but must still wait for it.
        match f.begin_cut(100, wait) {
            Err(crate::store::Error::ReadersHold { readers: 1, .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
            Ok(cut) => {
                cut.finish().unwrap();
                panic!("second cut went on under a live slice: {:?}", &slice[..]);
            }
        }
        assert!(slice.iter().all(|&b| b == 7), "the bytes changed under their reader");
        assert_eq!(f.wrote_pos(), 10_000, "nothing changed");
        drop(slice);
        f.truncate(100).unwrap();
    }

    /// A segment on a [`crate::store::fs::SimFs`] holding `ones` bytes of 1 made durable, then
    /// 20,000 bytes of 2 whose flush failed (their pages are clean, owed by the next flush).
    fn a_failed_flush_after(ones: usize) -> (tempfile::TempDir, Arc<SimFs>, Arc<MappedFile>) {
        let (dir, sim, f) = flushed_then_not(ones, 20_000);
        sim.fail_flushes(|_, _, _| true);
        assert!(f.flush().is_err());
        sim.clear_write_failures();
        (dir, sim, f)
    }

    /// A segment on a [`SimFs`] holding `ones` bytes of 1 made durable, then `twos` bytes of 2.
    fn flushed_then_not(
        ones: usize,
        twos: usize,
    ) -> (tempfile::TempDir, Arc<SimFs>, Arc<MappedFile>) {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimFs::new());
        let fs: Arc<dyn FileSystem> = Arc::clone(&sim) as Arc<dyn FileSystem>;
        let f = Arc::new(MappedFile::create(fs, dir.path(), 0, SEG).unwrap());
        f.append(&vec![1u8; ones]);
        f.flush().unwrap();
        f.append(&vec![2u8; twos]);
        (dir, sim, f)
    }

    /// After a power loss, whether the first `wrote` bytes of `f`'s file are `ones` bytes of 1
    /// and then 2s.
    fn survives_power_loss(sim: &SimFs, f: Arc<MappedFile>, ones: usize) -> bool {
        let (path, wrote) = (f.path().to_path_buf(), f.wrote_pos());
        drop(f);
        sim.power_loss(Damage::Zero, 0).unwrap();
        let data = std::fs::read(path).unwrap();
        data[..wrote].iter().enumerate().all(|(i, &b)| b == if i < ones { 1 } else { 2 })
    }

    /// A flush that runs while a cut waits for readers (its written position lowered) and
    /// succeeds must leave the failed range past that position owed: the cut may give up and
    /// put the position back. It cleared the whole range, and the next flush was a bare msync
    /// over pages the kernel held clean (helper review 28).
    #[test]
    fn a_failed_flushs_range_stays_owed_past_a_cut_that_gives_up() {
        for (ones, cut_at) in [(100, 8192), (5000, 1000)] {
            let (_dir, sim, f) = a_failed_flush_after(ones);
            let wrote = f.wrote_pos();
            let slice = f.read(0, 10).unwrap();
            let flusher = {
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    // Up to 10 s, 10,000 polls: until the cut has lowered the position.
                    for _ in 0..10_000 {
                        if f.wrote_pos() == cut_at {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    f.flush().unwrap()
                })
            };
            let gave_up = f.begin_cut(cut_at, Duration::from_secs(2)).is_err();
            assert!(gave_up, "a reader holds the file: the cut gives up");
            flusher.join().unwrap();
            drop(slice);
            assert_eq!(f.wrote_pos(), wrote, "the position is back");
            assert_eq!(f.flush().unwrap(), wrote);
            assert!(
                survives_power_loss(&sim, f, ones),
                "{ones} {cut_at}: a byte counted flushed was lost"
            );
        }
    }

    /// A cut's zeroing syncs the pages it zeroes, not the appended bytes below the cut that no
    /// flush synced yet: it counted them flushed all the same (helper review 28).
    #[test]
    fn a_cut_does_not_count_the_unsynced_bytes_below_it_as_flushed() {
        let (_dir, sim, f) = flushed_then_not(10_000, 10_000);
        f.truncate(15_000).unwrap();
        assert_eq!(f.flushed_pos(), 10_000, "only what a flush synced counts");
        assert_eq!(f.flush().unwrap(), 15_000);
        assert!(survives_power_loss(&sim, f, 10_000), "a byte counted flushed was lost");
    }

    /// A cut's zeroing whose msync fails may carry the failed writeback of appended pages below
    /// the cut (Linux reports a file's writeback error to whichever sync asks next): the bytes
    /// below the cut that no flush synced are owed with it, and written again by the next flush.
    #[test]
    fn a_failed_zeroing_leaves_the_unsynced_bytes_below_the_cut_owed() {
        let (_dir, sim, f) = flushed_then_not(10_000, 10_000);
        sim.fail_flushes(|_, from, _| from >= 12_288); // only the zeroing's msync
        assert!(f.truncate(15_000).is_err());
        sim.clear_write_failures();
        f.rezero(15_000, SEG).unwrap();
        assert_eq!(f.flush().unwrap(), 15_000);
        assert!(survives_power_loss(&sim, f, 10_000), "a byte counted flushed was lost");
    }
}
