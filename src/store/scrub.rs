//! The background scrub: a thread of its own re-reads every sealed segment (full, and not the
//! last file) at a bounded rate (`store.scrub-rate` bytes per second; 0 turns it off) and
//! checks every record as recovery would (CRC, structure, the end-of-file blank), so damage
//! below the checkpoint that no start-up verified is found while the node runs.
//!
//! It takes no lock a writer holds, and reads the files with plain reads of at most
//! [`integrity::CHUNK`] bytes ([`integrity::walk_segment`], [`integrity::read_chunk`]), not
//! through the mapping: it holds no slice a truncate would wait for, and the pages it reads are
//! not mapped into the process. A walk that a cut overlapped (the log's cut count moved, or the
//! file is no longer full) is dropped and the file checked again next pass. A failed read is
//! damage too.
//! What each pass found is kept per segment (damage found in a segment stays reported until a
//! later pass finds that segment intact, or it is no longer sealed: cut or removed) and shown
//! by [`ScrubStatus`].
//! Passes start at most every [`PASS_INTERVAL`]; the first one at open.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store::commitlog::Shared;
use crate::store::error::{Error, Result};
use crate::store::integrity::{self, Damage};
use crate::store::mapped_file::MappedFile;

/// The least time from the start of one pass to the start of the next.
pub(crate) const PASS_INTERVAL: Duration = Duration::from_secs(60);
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

    fn stopped(&self) -> bool {
        self.lock().stop
    }

    /// Sleeps until `until` or a stop; returns false on a stop.
    fn sleep_until(&self, until: Instant) -> bool {
        let mut st = self.lock();
        while !st.stop {
            let Some(left) = until.checked_duration_since(Instant::now()) else { return true };
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        false
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
        let thread = if rate == 0 {
            None
        } else {
            let s = Arc::clone(&shared);
            let t = std::thread::Builder::new()
                .name("hasync-scrub".into())
                .spawn(move || run(&store, &s, rate))
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
        if !shared.sleep_until(started + PASS_INTERVAL) {
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

impl Pacer {
    fn new(rate: u64) -> Self {
        Self { rate, started: Instant::now(), bytes: 0 }
    }

    fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// Accounts for `n` bytes just read and sleeps as long as the rate says; false on a stop.
    fn pace(&mut self, shared: &ScrubShared, n: usize) -> bool {
        self.bytes += n as u64;
        if self.rate == u64::MAX {
            return !shared.stopped();
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        shared.sleep_until(self.started + due)
    }
}

/// Checks every sealed segment once; `None` when stopped before the end.
fn pass(store: &Shared, shared: &ScrubShared, pacer: &mut Pacer) -> Option<ScrubPass> {
    let files = store.queue.files();
    let sealed: Vec<_> = files.iter().rev().skip(1).rev().filter(|f| f.is_full()).collect();
    let starts: std::collections::BTreeSet<u64> = sealed.iter().map(|f| f.from_offset()).collect();
    let mut found = ScrubPass::default();
    for file in sealed {
        let cuts = store.cuts.load(Ordering::SeqCst);
        let checked = check(file, shared, pacer)?;
        // A cut lowers the file's written position before it zeroes anything, and bumps the
        // cut count first: a walk that overlapped one is dropped (checked again next pass).
        if store.cuts.load(Ordering::SeqCst) != cuts || !file.is_full() {
            continue;
        }
        let (records, bytes, damage) = match checked {
            Ok(w) if !w.sealed && w.stop.is_none() => continue,
            Ok(w) => (w.records, w.bytes, w.stop.map(|s| integrity::damage_of(file.path(), &s))),
            Err(d) => (0, 0, Some(d)),
        };
        let mut st = shared.lock();
        st.status.segments_checked += 1;
        st.status.bytes_checked += bytes;
        st.status.records_checked += records;
        st.status.position = file.end_offset();
        match &damage {
            Some(d) => {
                if st.damaged.insert(file.from_offset(), d.clone()).as_ref() != Some(d) {
                    tracing::error!(file = %d.file.display(), offset = d.offset, reason = %d.reason,
                        "scrub: damaged record in a sealed segment; reads of it answer DATA_LOSS");
                }
                found.damage.push(d.clone());
            }
            None => {
                st.damaged.remove(&file.from_offset());
            }
        }
        found.segments += 1;
        found.records += records;
    }
    // Damage of a segment that is no longer sealed (cut, or removed) went with it.
    let mut st = shared.lock();
    st.damaged.retain(|from, _| starts.contains(from));
    st.status.passes += 1;
    st.status.last_pass_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    Some(found)
}

/// Walks one sealed file with plain reads; `None` when stopped. A failed read is damage where
/// it failed (a bad sector reads back as EIO).
fn check(
    file: &MappedFile,
    shared: &ScrubShared,
    pacer: &mut Pacer,
) -> Option<std::result::Result<integrity::SegmentWalk, Damage>> {
    let failed = |pos: usize, e: std::io::Error| Damage {
        file: file.path().to_path_buf(),
        offset: file.from_offset() + pos as u64,
        reason: format!("read failed: {e}"),
    };
    let f = match std::fs::File::open(file.path()) {
        Ok(f) => f,
        Err(e) => return Some(Err(failed(0, e))),
    };
    let mut at = 0;
    let read = |pos: usize, len: usize| {
        at = pos;
        integrity::read_chunk(&f, pos, len)
    };
    let walk =
        integrity::walk_segment(file.from_offset(), file.size(), integrity::CHUNK, read, |n| {
            pacer.pace(shared, n)
        });
    match walk {
        Ok(w) => w.map(Ok),
        Err(e) => Some(Err(failed(at, e))),
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
