//! The seam around file I/O (after raft-engine's `FileSystem` trait).
//!
//! Everything the store does to the disk goes through [`FileSystem`]: creating its directories,
//! creating a segment file with its space allocated, mapping it, making a range durable (msync),
//! renaming and removing it, writing small files (the checkpoint, the abort marker) atomically,
//! writing a large file in pieces (a truncated tail kept aside, [`FileSystem::write_file_with`]).
//! Reads of directories and small files (listing, stat, loading the checkpoint) do not. [`StdFs`] is the real thing. [`SimFs`] wraps it and remembers, per file, how
//! far the data was made durable, so that a test can model a power loss after the store is
//! dropped: everything past the durable position may be kept, lost (zeroed), garbled, or torn
//! page by page, as pages reach the disk out of order.
//!
//! Dropping a process without a flush is *not* a power loss (the page cache keeps the bytes);
//! crash tests must call [`SimFs::power_loss`]. [`SimFs::fail_writes`] makes the writes to chosen
//! paths fail, as a dying disk would, for failpoint tests. [`SimFs::pause_creates`] holds the
//! creation of chosen files until [`SimFs::resume_creates`], as a slow disk would, so that a
//! test can check who waits on a file being created.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use rand::{Rng, SeedableRng};
use rustix::fs::FallocateFlags;

/// The file operations the store needs. Implementations must be usable from several threads.
pub trait FileSystem: Debug + Send + Sync + 'static {
    /// Creates `path` with exactly `len` bytes whose space is really allocated (not sparse: a page
    /// fault on a full disk would kill the process with SIGBUS), then fsyncs the file and its
    /// directory. Fails if the file exists.
    fn create(&self, path: &Path, len: u64) -> io::Result<File>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<File>;
    /// Reads a whole (small) file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    /// Maps the whole file read-write (shared).
    fn map(&self, path: &Path, file: &File) -> io::Result<MmapRaw> {
        let _ = path;
        MmapRaw::map_raw(file)
    }
    /// Makes `[from, to)` of a mapped file durable.
    fn flush(&self, path: &Path, map: &MmapRaw, from: usize, to: usize) -> io::Result<()>;
    /// Told that the caller wrote `[from, to)` of a mapped file again through its mapping, so
    /// that the next flush writes those pages back: after a failed writeback the kernel holds
    /// them clean, and a flush writes back only dirty pages. Only [`SimFs`] keeps count.
    fn rewritten(&self, path: &Path, from: usize, to: usize) {
        let _ = (path, from, to);
    }
    /// Removes a file and fsyncs its directory.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Writes a small file atomically: temporary file, fsync, rename, directory fsync.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Creates or truncates `path`, writes `bytes` and fsyncs the file, not its directory: the
    /// caller renames it into place (with [`FileSystem::rename`], which fsyncs the directory).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// [`FileSystem::write_file`] for a file too large to hold in memory: creates or truncates
    /// `path`, lets `fill` write its bytes (in as many writes as it likes), then fsyncs the
    /// file, not its directory. A failure leaves whatever was written: the caller removes it.
    fn write_file_with(
        &self,
        path: &Path,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
        fill(&mut f)?;
        f.sync_all()
    }
    /// Fsyncs a directory so that creations, renames and removals in it are durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates a directory and any missing parents (no error if it exists).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    /// Renames a file within its directory and fsyncs the directory.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)?;
        self.sync_dir(parent(to))
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFs;

impl FileSystem for StdFs {
    fn create(&self, path: &Path, len: u64) -> io::Result<File> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        if let Err(e) = allocate(&file, len) {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        file.sync_all()?;
        self.sync_dir(parent(path))?;
        Ok(file)
    }

    fn open(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(path)
    }

    fn flush(&self, _path: &Path, map: &MmapRaw, from: usize, to: usize) -> io::Result<()> {
        if to > from { map.flush_range(from, to - from) } else { Ok(()) }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)?;
        self.sync_dir(parent(path))
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = tmp_path(path);
        self.write_file(&tmp, bytes)?;
        std::fs::rename(&tmp, path)?;
        self.sync_dir(parent(path))
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// The temporary file [`FileSystem::write_atomic`] writes before renaming it over `path`.
fn tmp_path(path: &Path) -> PathBuf {
    path.with_extension("tmp")
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Allocates `len` bytes for `file`. Falls back to writing zeros where the file system has no
/// fallocate (tmpfs on old kernels, some overlay set-ups), so the space is never sparse.
fn allocate(file: &File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
            let mut f = file;
            let zeros = vec![0u8; 1 << 20];
            let mut left = len;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                f.write_all(&zeros[..n])?;
                left -= n as u64;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// What a power loss does to the bytes of a file past its durable position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Nothing is lost: the page cache happened to reach the disk.
    Keep,
    /// Everything past the durable position reads back as zeros.
    Zero,
    /// Everything past the durable position is replaced by random bytes.
    Garble,
    /// Each 4 KiB page past the durable position is independently kept, zeroed or garbled, as
    /// pages reach the disk out of order.
    Pages,
    /// The bytes survive up to a random point past the durable position; zeros after it.
    Torn,
}

#[derive(Debug, Default)]
struct SimState {
    /// Per file: how many bytes from its start are durable, and its length.
    files: BTreeMap<PathBuf, DurableFile>,
}

#[derive(Debug, Clone, Copy)]
struct DurableFile {
    durable_len: u64,
    /// A range whose writeback failed and that was not written again since
    /// ([`FileSystem::rewritten`]): as on Linux, the kernel holds its pages clean, so a later
    /// flush that succeeds does not make it durable, and a power loss damages it too.
    unwritten: Option<(u64, u64)>,
}

/// A [`FileSystem`] for tests: the real files, plus a record of what was made durable so that
/// [`SimFs::power_loss`] can damage what was not.
#[derive(Debug, Default)]
pub struct SimFs {
    inner: StdFs,
    state: Mutex<SimState>,
    disk_full: std::sync::atomic::AtomicBool,
    /// The paths [`SimFs::set_disk_full_for`] makes full.
    full_for: Mutex<Option<WriteFailure>>,
    failing: Mutex<Option<WriteFailure>>,
    /// The mapped files whose flushes (msync) fail ([`SimFs::fail_flushes`]).
    failing_flushes: Mutex<Option<FlushFailure>>,
    /// The paths whose atomic writes fail after the rename ([`SimFs::fail_after_rename`]).
    failing_after_rename: Mutex<Option<WriteFailure>>,
    pause: CreatePause,
}

/// Which paths a [`SimFs`] failpoint applies to.
type PathMatch = Box<dyn Fn(&Path) -> bool + Send + Sync>;

/// Which file creations [`SimFs`] holds, and which are held now.
#[derive(Default)]
struct PauseState {
    matches: Option<PathMatch>,
    /// The creations waiting right now.
    held: Vec<PathBuf>,
}

/// The pause point of [`SimFs::pause_creates`]: a state and the condition variable that both
/// the held creations and the test waiting for them wait on.
#[derive(Default)]
struct CreatePause {
    state: Mutex<PauseState>,
    cv: Condvar,
}

impl Debug for CreatePause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CreatePause(..)")
    }
}

impl CreatePause {
    fn lock(&self) -> std::sync::MutexGuard<'_, PauseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks while creations of `path` are paused.
    fn pass(&self, path: &Path) {
        let mut st = self.lock();
        if !st.matches.as_ref().is_some_and(|m| m(path)) {
            return;
        }
        st.held.push(path.to_path_buf());
        self.cv.notify_all();
        while st.matches.as_ref().is_some_and(|m| m(path)) {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.held.retain(|p| p != path);
    }
}

/// Which paths [`SimFs`] refuses to write (or, for [`SimFs::set_disk_full_for`], finds no
/// room for).
struct WriteFailure(Box<dyn Fn(&Path) -> bool + Send + Sync>);

impl Debug for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteFailure(..)")
    }
}

/// Whether a flush of a path's byte range `[from, to)` fails.
type FlushMatch = Arc<dyn Fn(&Path, usize, usize) -> bool + Send + Sync>;

/// Which flushes (msync) [`SimFs`] fails: by path and byte range.
struct FlushFailure(FlushMatch);

impl Debug for FlushFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlushFailure(..)")
    }
}

/// The error a failing write returns: EIO, as from a dying disk.
fn injected_eio() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error())
}

impl SimFs {
    /// A new simulated file system over the real one.
    pub fn new() -> Self {
        Self::default()
    }

    /// While set, creating a file and writing a non-empty whole file (atomically or not, or
    /// in pieces through [`FileSystem::write_file_with`]) fail with ENOSPC, as on a full disk;
    /// an empty file (it needs no data blocks), renames, removals and writes into mapped space
    /// still work.
    pub fn set_disk_full(&self, full: bool) {
        self.disk_full.store(full, std::sync::atomic::Ordering::SeqCst);
    }

    /// As [`SimFs::set_disk_full`], but only for the paths for which `full` is true (a full
    /// quota on one directory, or a large file that does not fit where small ones still do);
    /// [`SimFs::clear_disk_full_for`] ends it.
    pub fn set_disk_full_for(&self, full: impl Fn(&Path) -> bool + Send + Sync + 'static) {
        *self.full_for.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(WriteFailure(Box::new(full)));
    }

    /// Ends [`SimFs::set_disk_full_for`].
    pub fn clear_disk_full_for(&self) {
        *self.full_for.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// From now on, every write to a path for which `fails` is true fails with EIO: creating,
    /// removing, renaming to or from it, writing it whole or in pieces, and writing it
    /// atomically (the temporary file is written; the rename that would replace the old file
    /// never happens, so the old file stays).
    pub fn fail_writes(&self, fails: impl Fn(&Path) -> bool + Send + Sync + 'static) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(WriteFailure(Box::new(fails)));
    }

    /// Ends [`SimFs::fail_writes`] (and [`SimFs::fail_flushes`]).
    pub fn clear_write_failures(&self) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.failing_after_rename.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.failing_flushes.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// From now on, an atomic write of a path for which `fails` is true renames the new file
    /// into place and then fails, as a failing directory fsync does: the caller sees an error
    /// while the new file is in place (ended by [`SimFs::clear_write_failures`]).
    pub fn fail_after_rename(&self, fails: impl Fn(&Path) -> bool + Send + Sync + 'static) {
        *self.failing_after_rename.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(WriteFailure(Box::new(fails)));
    }

    /// From now on, making the byte range `[from, to)` of a mapped file durable (msync) fails
    /// with EIO when `fails(path, from, to)` is true, as on a disk that fails to write those
    /// pages back; nothing of that range becomes durable. Other writes go on. As Linux does,
    /// the pages are clean after the failure, the range's and (since Linux reports a failed
    /// writeback of any page of the file to the next sync) every page before it not durable
    /// yet: a later flush that succeeds makes none of them durable unless they were written
    /// again ([`FileSystem::rewritten`]), and [`SimFs::power_loss`] damages them.
    pub fn fail_flushes(
        &self,
        fails: impl Fn(&Path, usize, usize) -> bool + Send + Sync + 'static,
    ) {
        *self.failing_flushes.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(FlushFailure(Arc::new(fails)));
    }

    /// From now on, creating a file for which `matches` is true (a segment's `create`, or a
    /// whole-file `write_file` such as a metadata table's) blocks before anything is written,
    /// until [`SimFs::resume_creates`]; a new call replaces the paths that pause.
    pub fn pause_creates(&self, matches: impl Fn(&Path) -> bool + Send + Sync + 'static) {
        self.pause.lock().matches = Some(Box::new(matches));
        self.pause.cv.notify_all();
    }

    /// Ends [`SimFs::pause_creates`]: every held creation goes on.
    pub fn resume_creates(&self) {
        self.pause.lock().matches = None;
        self.pause.cv.notify_all();
    }

    /// Waits at most `timeout` until a creation is held; returns its path.
    pub fn wait_for_held_create(&self, timeout: Duration) -> Option<PathBuf> {
        let deadline = Instant::now() + timeout;
        let mut st = self.pause.lock();
        loop {
            if let Some(p) = st.held.first() {
                return Some(p.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            st = self.pause.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Whether writes to `path` fail.
    fn write_fails(&self, path: &Path) -> bool {
        self.failing.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|f| (f.0)(path))
    }

    /// ENOSPC for `len` bytes (none needed for 0) written to `path` while
    /// [`SimFs::set_disk_full`] is set, or [`SimFs::set_disk_full_for`] matches `path`.
    fn check_space(&self, path: &Path, len: u64) -> io::Result<()> {
        let full_here = || {
            let full_for = self.full_for.lock().unwrap_or_else(|e| e.into_inner());
            full_for.as_ref().is_some_and(|m| (m.0)(path))
        };
        if len > 0 && (self.disk_full.load(std::sync::atomic::Ordering::SeqCst) || full_here()) {
            return Err(io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()));
        }
        Ok(())
    }

    /// EIO when writes to any of `paths` fail.
    fn check_writable(&self, paths: &[&Path]) -> io::Result<()> {
        if paths.iter().any(|p| self.write_fails(p)) { Err(injected_eio()) } else { Ok(()) }
    }

    /// How far `path` is durable, if the file is known.
    pub fn durable_len(&self, path: &Path) -> Option<u64> {
        self.lock().files.get(path).map(|f| f.durable_len)
    }

    /// Models a power loss: call after the store using this file system was dropped. Every file
    /// it created or opened has the bytes from its durable position to its end damaged as
    /// `damage` says.
    /// Returns how many files were damaged. `seed` makes the damage reproducible.
    pub fn power_loss(&self, damage: Damage, seed: u64) -> io::Result<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut state = self.lock();
        let mut damaged = 0;
        for (path, f) in state.files.iter_mut() {
            let Ok(mut data) = std::fs::read(path) else { continue };
            let durable = f.unwritten.map_or(f.durable_len, |(from, _)| from.min(f.durable_len));
            let start = (durable as usize).min(data.len());
            if start == data.len() {
                continue;
            }
            damage_range(&mut data[start..], damage, &mut rng);
            std::fs::write(path, &data)?;
            f.durable_len = data.len() as u64;
            f.unwritten = None;
            damaged += 1;
        }
        Ok(damaged)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, path: &Path, durable_len: u64) {
        let file = DurableFile { durable_len, unwritten: None };
        self.lock().files.insert(path.to_path_buf(), file);
    }
}

/// The writer [`SimFs::write_file_with`] hands out: every non-empty write checks, as it
/// comes, that the disk is not full and that writes to the file do not fail, so a disk that
/// fills up in the middle of a long file is modelled too.
struct SimWriter<'a> {
    fs: &'a SimFs,
    path: &'a Path,
    inner: &'a mut dyn Write,
}

impl Write for SimWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.fs.check_space(self.path, buf.len() as u64)?;
        self.fs.check_writable(&[self.path])?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn damage_range(bytes: &mut [u8], damage: Damage, rng: &mut impl Rng) {
    match damage {
        Damage::Keep => {}
        Damage::Zero => bytes.fill(0),
        Damage::Garble => rng.fill(bytes),
        Damage::Pages => {
            for page in bytes.chunks_mut(4096) {
                match rng.random_range(0..3) {
                    0 => {}
                    1 => page.fill(0),
                    _ => rng.fill(page),
                }
            }
        }
        Damage::Torn => {
            let cut = if bytes.is_empty() { 0 } else { rng.random_range(0..bytes.len()) };
            bytes[cut..].fill(0);
        }
    }
}

impl FileSystem for SimFs {
    fn create(&self, path: &Path, len: u64) -> io::Result<File> {
        self.check_space(path, len)?;
        self.check_writable(&[path])?;
        self.pause.pass(path);
        let f = self.inner.create(path, len)?;
        // A new file is all zeros and durable (created with fsync); writes make it dirty.
        self.track(path, 0);
        Ok(f)
    }

    fn open(&self, path: &Path) -> io::Result<File> {
        let f = self.inner.open(path)?;
        // What was on disk at open is durable; the writer's first flush tells us more.
        self.track(path, f.metadata()?.len());
        Ok(f)
    }

    fn flush(&self, path: &Path, map: &MmapRaw, from: usize, to: usize) -> io::Result<()> {
        let failing = self.failing_flushes.lock().unwrap_or_else(|e| e.into_inner());
        // Called without the lock: a test's matcher may run another flush meanwhile.
        let fails = failing.as_ref().map(|f| Arc::clone(&f.0));
        drop(failing);
        if fails.is_some_and(|f| f(path, from, to)) {
            // Linux reports a failed writeback of any page of the file to whichever sync asks
            // next: every page not durable yet, up to the range's end, may have been written
            // back and failed, and is clean from now on.
            if let Some(e) = self.lock().files.get_mut(path) {
                let (a, b) = ((from as u64).min(e.durable_len), to as u64);
                e.unwritten = Some(e.unwritten.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
            }
            return Err(injected_eio());
        }
        self.inner.flush(path, map, from, to)?;
        // Only a file it knows (created or opened, not since removed): a mapping kept alive
        // past its file's removal says nothing of a new file under the same name.
        // A sync that starts past the durable prefix leaves a gap no sync covered: only the
        // prefix is counted (the bytes past the gap are counted lost too, to err safe).
        if let Some(e) = self.lock().files.get_mut(path).filter(|e| from as u64 <= e.durable_len) {
            e.durable_len = e.durable_len.max(to as u64);
        }
        Ok(())
    }

    fn rewritten(&self, path: &Path, from: usize, to: usize) {
        let mut state = self.lock();
        let Some(e) = state.files.get_mut(path) else { return };
        let Some((mut a, mut b)) = e.unwritten else { return };
        // A store dirties its whole page.
        let page = rustix::param::page_size() as u64;
        let (from, to) = (from as u64 / page * page, (to as u64).div_ceil(page) * page);
        // What is left of the range: a rewrite inside it leaves both ends (kept whole).
        if from <= a {
            a = a.max(to);
        }
        if to >= b {
            b = b.min(from);
        }
        e.unwritten = (a < b).then_some((a, b));
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.check_writable(&[path])?;
        self.inner.remove(path)?;
        self.lock().files.remove(path);
        Ok(())
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.check_space(path, bytes.len() as u64)?;
        let after_rename = self.failing_after_rename.lock().unwrap_or_else(|e| e.into_inner());
        if after_rename.as_ref().is_some_and(|f| (f.0)(path)) {
            drop(after_rename);
            self.inner.write_atomic(path, bytes)?;
            return Err(injected_eio());
        }
        drop(after_rename);
        if self.write_fails(path) {
            // The temporary file is written, then the disk fails before the rename.
            let tmp = tmp_path(path);
            std::fs::write(&tmp, bytes)?;
            return Err(injected_eio());
        }
        self.inner.write_atomic(path, bytes)
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.check_space(path, bytes.len() as u64)?;
        self.check_writable(&[path])?;
        self.pause.pass(path);
        self.inner.write_file(path, bytes)
    }

    fn write_file_with(
        &self,
        path: &Path,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check_writable(&[path])?;
        self.pause.pass(path);
        self.inner.write_file_with(path, &mut |w: &mut dyn Write| {
            fill(&mut SimWriter { fs: self, path, inner: w })
        })
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check_writable(&[from, to])?;
        self.inner.rename(from, to)?;
        let mut state = self.lock();
        if let Some(f) = state.files.remove(from) {
            state.files.insert(to.to_path_buf(), f);
        }
        Ok(())
    }
}
