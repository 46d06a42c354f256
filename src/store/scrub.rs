//! The background scrub: a thread of its own re-reads every sealed segment (full, and not the
//! last file) at a bounded rate (`store.scrub-rate` bytes per second; 0 turns it off) and
//! checks every record as recovery would (CRC, structure, the end-of-file blank), so damage
//! below the checkpoint that no start-up verified is found while the node runs.
//!
//! It takes no lock a writer holds, and reads the files with plain reads of at most
//! [`integrity::CHUNK`] bytes ([`integrity::walk_segment`], [`integrity::read_chunk`]), not
//! through the mapping: it holds no slice a truncate would wait for, and the pages it reads are
//! not mapped into the process. A pass keeps only the segments' start offsets and looks each
//! file up when it gets to it, holding no [`MappedFile`] (so no mapping) while it reads: only
//! the open file it walks. A removal of segment files (retention, truncate, wipe) wakes the
//! scrub and waits, at most [`RELEASE_WAIT`], until it has closed a removed file it had open
//! ([`ScrubShared::released`], the queue's removal hook), so a removed segment gives its disk
//! space back before the removal returns (retention looks at the disk again after each). A
//! segment removed before or while the pass reads it is skipped: not damage, not checked.
//! A walk that a cut overlapped (the log's cut count moved, or the file is no longer full) is
//! dropped and the file checked again next pass. A failed read of a file still in the log is
//! damage.
//! What each pass found is kept per segment (damage found in a segment stays reported until a
//! later pass finds that segment intact, or it is no longer sealed: cut or removed) and shown
//! by [`ScrubStatus`].
//! Passes start at most every [`PASS_INTERVAL`]; the first one at open.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store::commitlog::Shared;
use crate::store::error::{Error, Result};
use crate::store::integrity::{self, Damage};
use crate::store::mapped_file::MappedFile;

/// The least time from the start of one pass to the start of the next.
pub(crate) const PASS_INTERVAL: Duration = Duration::from_secs(60);
/// How long a removal of segment files waits for the scrub to close a removed file it reads
/// (it answers after its current read of at most a chunk).
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// At most this many damaged segments are listed in [`ScrubStatus::damage`] (all are counted).
pub const MAX_LISTED_DAMAGE: usize = 16;

/// What the scrub has done and found since the store opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubStatus {
    /// `store.scrub-rate` in bytes per second; 0 when the scrub is off.
    pub rate_bytes_per_sec: u64,
    /// Passes completed over every sealed segment.
    pub passes: u64,
    /// Segment checks completed (all passes).
    pub segments_checked: u64,
    /// Bytes checked (all passes).
    pub bytes_checked: u64,
    /// Records checked (all passes).
    pub records_checked: u64,
    /// The commitlog offset the current pass has checked up to (0 before the first).
    pub position: u64,
    /// When the last pass completed, Unix ms (0 before the first).
    pub last_pass_unix_ms: i64,
    /// Segments whose last check found damage.
    pub damaged_segments: u64,
    /// The first damage of each damaged segment, by offset (at most [`MAX_LISTED_DAMAGE`]).
    pub damage: Vec<Damage>,
}

/// What [`CommitLog::scrub_now`](crate::store::CommitLog::scrub_now) found in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubPass {
    /// Segments checked.
    pub segments: u64,
    /// Records checked.
    pub records: u64,
    /// Damage found, one per damaged segment.
    pub damage: Vec<Damage>,
}

#[derive(Debug, Default)]
struct State {
    status: ScrubStatus,
    /// Per segment start: the damage its last check found.
    damaged: BTreeMap<u64, Damage>,
    stop: bool,
    /// Removals of segment files so far (bumped by the queue's removal hook).
    removals: u64,
    /// The walks that hold a segment file open, by id: the removal count each has seen (and
    /// checked its file against).
    holds: BTreeMap<u64, u64>,
    next_hold: u64,
}

/// Why a [`ScrubShared::sleep_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The time came.
    Due,
    /// The scrub is stopping.
    Stop,
    /// Segment files were removed since the count the sleeper had seen (the new count).
    Removal(u64),
}

/// Shared between the store's handle and the scrub thread.
#[derive(Debug, Default)]
pub(crate) struct ScrubShared {
    state: Mutex<State>,
    cv: Condvar,
}

impl ScrubShared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The status as of now.
    pub(crate) fn status(&self) -> ScrubStatus {
        let st = self.lock();
        let mut status = st.status.clone();
        status.damaged_segments = st.damaged.len() as u64;
        status.damage = st.damaged.values().take(MAX_LISTED_DAMAGE).cloned().collect();
        status
    }

    /// Sleeps until `until`, a stop, or (with `seen`) a removal count other than `seen`.
    fn sleep_until(&self, until: Instant, seen: Option<u64>) -> Woke {
        let mut st = self.lock();
        loop {
            if st.stop {
                return Woke::Stop;
            }
            if seen.is_some_and(|s| s != st.removals) {
                return Woke::Removal(st.removals);
            }
            let Some(left) = until.checked_duration_since(Instant::now()) else { return Woke::Due };
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The queue's removal hook: segment files just left the log. Wakes the walks holding a
    /// file open and waits, at most [`RELEASE_WAIT`], until each has checked its file against
    /// this removal (and closed it if it was removed).
    pub(crate) fn released(&self) {
        let mut st = self.lock();
        st.removals += 1;
        let removal = st.removals;
        self.cv.notify_all();
        let deadline = Instant::now() + RELEASE_WAIT;
        while st.holds.values().any(|&seen| seen < removal) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                tracing::warn!(waited = ?RELEASE_WAIT, "the scrub did not let go of a removed segment file in time");
                return;
            };
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Registers a walk that opens a segment file; the hold ends when dropped.
    fn hold(&self) -> Hold<'_> {
        let mut st = self.lock();
        let (id, seen) = (st.next_hold, st.removals);
        st.next_hold += 1;
        st.holds.insert(id, seen);
        Hold { shared: self, id, seen }
    }
}

/// A walk's registration as holding a segment file open ([`ScrubShared::hold`]).
struct Hold<'a> {
    shared: &'a ScrubShared,
    id: u64,
    /// The removal count the walk has checked its file against.
    seen: u64,
}

impl Hold<'_> {
    /// The walk checked its file against removal count `removals` and still has it.
    fn seen(&mut self, removals: u64) {
        self.seen = removals;
        self.shared.lock().holds.insert(self.id, removals);
        self.shared.cv.notify_all();
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.shared.lock().holds.remove(&self.id);
        self.shared.cv.notify_all();
    }
}

/// Handle to the scrub thread (none when the rate is 0).
#[derive(Debug)]
pub(crate) struct Scrubber {
    shared: Arc<ScrubShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scrubber {
    /// Starts the scrub thread over `store` at `rate` bytes per second (no thread when 0).
    pub(crate) fn start(store: Arc<Shared>, rate: u64) -> Result<Self> {
        let shared = Arc::new(ScrubShared::default());
        shared.lock().status.rate_bytes_per_sec = rate;
        let hook = Arc::clone(&shared);
        store.queue.on_removal(Box::new(move || hook.released()));
        let thread = if rate == 0 {
            None
        } else {
            let s = Arc::clone(&shared);
            let t = std::thread::Builder::new()
                .name("hasync-scrub".into())
                .spawn(move || {
                    crate::store::flush::lower_priority("hasync-scrub", store.opts.background_nice);
                    run(&store, &s, rate)
                })
                .map_err(|e| Error::io("spawn scrub thread", "hasync-scrub", e))?;
            Some(t)
        };
        Ok(Self { shared, thread: Mutex::new(thread) })
    }

    pub(crate) fn status(&self) -> ScrubStatus {
        self.shared.status()
    }

    /// One pass now, on the caller's thread, at full speed.
    pub(crate) fn pass_now(&self, store: &Shared) -> ScrubPass {
        pass(store, &self.shared, &mut Pacer::unlimited()).unwrap_or_default()
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(store: &Shared, shared: &ScrubShared, rate: u64) {
    loop {
        let started = Instant::now();
        if pass(store, shared, &mut Pacer::new(rate)).is_none() {
            return;
        }
        if shared.sleep_until(started + PASS_INTERVAL, None) == Woke::Stop {
            return;
        }
    }
}

/// Keeps the bytes read at most `rate` per second on average over a pass.
struct Pacer {
    rate: u64,
    started: Instant,
    bytes: u64,
}

/// What [`Pacer::pace`] says the walk of a file does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paced {
    /// Read on.
    Go,
    /// The scrub is stopping.
    Stop,
    /// The file was removed from the log: close it, skip it.
    Gone,
}

impl Pacer {
    fn new(rate: u64) -> Self {
        Self { rate, started: Instant::now(), bytes: 0 }
    }

    fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// Accounts for `n` bytes just read and sleeps as long as the rate says, waking on a stop
    /// or a removal of segment files (then `still_there` says whether the walk's file is).
    fn pace(&mut self, hold: &mut Hold<'_>, n: usize, still_there: impl Fn() -> bool) -> Paced {
        self.bytes += n as u64;
        let due = if self.rate == u64::MAX {
            Instant::now()
        } else {
            self.started + Duration::from_secs_f64(self.bytes as f64 / self.rate as f64)
        };
        loop {
            match hold.shared.sleep_until(due, Some(hold.seen)) {
                Woke::Due => return Paced::Go,
                Woke::Stop => return Paced::Stop,
                Woke::Removal(_) if !still_there() => return Paced::Gone,
                Woke::Removal(removals) => hold.seen(removals),
            }
        }
    }
}

/// One sealed segment a pass checks, without its mapping: a removal frees it meanwhile.
struct Target {
    path: std::path::PathBuf,
    from: u64,
    size: usize,
    /// The file as the pass found it (to tell it from a later file at the same offset).
    file: Weak<MappedFile>,
}

impl Target {
    /// The file, while it is still in the log.
    fn in_log(&self, store: &Shared) -> Option<Arc<MappedFile>> {
        store.queue.find(self.from).filter(|f| std::ptr::eq(Arc::as_ptr(f), self.file.as_ptr()))
    }
}

/// How the check of one file ended.
enum Checked {
    Walked(integrity::SegmentWalk),
    Damaged(Damage),
    /// The file left the log before or while it was read.
    Gone,
}

/// Checks every sealed segment once; `None` when stopped before the end.
fn pass(store: &Shared, shared: &ScrubShared, pacer: &mut Pacer) -> Option<ScrubPass> {
    let starts: Vec<u64> = {
        let files = store.queue.files();
        let sealed = files.iter().rev().skip(1).rev().filter(|f| f.is_full());
        sealed.map(|f| f.from_offset()).collect()
    };
    let max_record = integrity::largest_record(store.opts.max_message_size);
    let mut found = ScrubPass::default();
    for &from in &starts {
        let Some(file) = store.queue.find(from).filter(|f| f.is_full()) else { continue };
        let target = Target {
            path: file.path().to_path_buf(),
            from,
            size: file.size(),
            file: Arc::downgrade(&file),
        };
        drop(file);
        let cuts = store.cuts.load(Ordering::SeqCst);
        let checked = check(store, &target, max_record, shared, pacer)?;
        // A cut lowers the file's written position before it zeroes anything, and bumps the
        // cut count first: a walk that overlapped one is dropped (checked again next pass).
        let kept = target.in_log(store).is_some_and(|f| f.is_full());
        if store.cuts.load(Ordering::SeqCst) != cuts || !kept {
            continue;
        }
        let (records, bytes, damage) = match checked {
            Checked::Gone => continue,
            Checked::Walked(w) if !w.sealed && w.stop.is_none() => continue,
            Checked::Walked(w) => {
                (w.records, w.bytes, w.stop.map(|s| integrity::damage_of(&target.path, &s)))
            }
            Checked::Damaged(d) => (0, 0, Some(d)),
        };
        record(shared, &target, (records, bytes), damage.as_ref());
        found.damage.extend(damage);
        found.segments += 1;
        found.records += records;
    }
    // Damage of a segment that is no longer sealed (cut, or removed) went with it.
    let mut st = shared.lock();
    st.damaged.retain(|from, _| starts.contains(from) && store.queue.find(*from).is_some());
    st.status.passes += 1;
    st.status.last_pass_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    Some(found)
}

/// Records one segment's check in the status.
fn record(
    shared: &ScrubShared,
    target: &Target,
    (records, bytes): (u64, u64),
    damage: Option<&Damage>,
) {
    let mut st = shared.lock();
    st.status.segments_checked += 1;
    st.status.bytes_checked += bytes;
    st.status.records_checked += records;
    st.status.position = target.from + target.size as u64;
    match damage {
        Some(d) => {
            if st.damaged.insert(target.from, d.clone()).as_ref() != Some(d) {
                tracing::error!(file = %d.file.display(), offset = d.offset, reason = %d.reason,
                    "scrub: damaged record in a sealed segment; reads of it answer DATA_LOSS");
            }
        }
        None => {
            st.damaged.remove(&target.from);
        }
    }
}

/// Walks one sealed file with plain reads; `None` when stopped. A failed read is damage where
/// it failed (a bad sector reads back as EIO), unless the file left the log.
fn check(
    store: &Shared,
    target: &Target,
    max_record: usize,
    shared: &ScrubShared,
    pacer: &mut Pacer,
) -> Option<Checked> {
    let mut hold = shared.hold();
    let gone = || target.in_log(store).is_none();
    let failed = |pos: usize, e: std::io::Error| {
        if gone() {
            return Checked::Gone;
        }
        let (file, offset) = (target.path.clone(), target.from + pos as u64);
        Checked::Damaged(Damage { file, offset, reason: format!("read failed: {e}") })
    };
    // Looked up again after the hold is registered: a removal from now on waits for this walk.
    if gone() {
        return Some(Checked::Gone);
    }
    let f = match std::fs::File::open(&target.path) {
        Ok(f) => f,
        Err(e) => return Some(failed(0, e)),
    };
    let (mut at, mut paced) = (0, Paced::Go);
    let read = |pos: usize, len: usize| {
        at = pos;
        integrity::read_chunk(&f, pos, len)
    };
    let walk = integrity::walk_segment(
        target.from,
        target.size,
        (integrity::CHUNK, max_record.min(target.size)),
        read,
        |n| {
            paced = pacer.pace(&mut hold, n, || !gone());
            paced == Paced::Go
        },
    );
    drop(f);
    match (walk, paced) {
        (_, Paced::Stop) => None,
        (_, Paced::Gone) => Some(Checked::Gone),
        (Ok(w), Paced::Go) => w.map(Checked::Walked),
        (Err(e), Paced::Go) => Some(failed(at, e)),
    }
}

impl crate::store::CommitLog {
    /// What the background scrub has done and found since the store opened.
    pub fn scrub_status(&self) -> ScrubStatus {
        self.scrub.status()
    }

    /// Runs one scrub pass now, on the caller's thread, at full speed (blocking): for tests and
    /// tools. Its findings show in [`CommitLog::scrub_status`](Self::scrub_status) too.
    pub fn scrub_now(&self) -> ScrubPass {
        self.scrub.pass_now(&self.shared)
    }
}
