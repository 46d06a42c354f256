//! Turns for the page faults that warm segments (`store.warm-lock`): one warm call at a time.
//!
//! A warm's first write fault on a page of a new segment zero-fills a whole read-ahead window
//! in one page fault, which a `PREEMPT_NONE` kernel does not interrupt: on the benchmark VM,
//! 20-30 ms for 8 MiB of memory the host had taken back (docs/benchmarks.md, "The tail").
//! A master and a slave roll at the same offset, so on one machine their warms run at the same
//! time: two such faults then hold both vCPUs of a 2-vCPU machine, and every put waits. Turns
//! are taken per [`POPULATE_CHUNK`](crate::store::mapped_file::POPULATE_CHUNK) call. They are
//! not handed over in order: a store that ends a call usually takes the next one at once, so
//! one store warms while another waits, running a call beside it each time it gives up.
//!
//! Turns are taken among the stores of one process (`"process"`, the default: every node of
//! an in-process cluster, a bench, a test), or also among processes through a lock file that
//! they share (an absolute path: `flock(2)` on it, released by the kernel when a process
//! dies); both are taken together or not at all, so a store waiting for the lock file does
//! not hold the process's turn meanwhile. After [`TURN_WAIT`] a warm goes on without its turn
//! (with the process's if it is free then), so a stuck holder (a warm blocked on a failing
//! disk) delays other stores' warms by that much per call. The store
//! thread that waits does not stop flushing: a wait ends as soon as it has other work
//! ([`WarmTurns::take`]), and the warm goes on after it from where it stopped.

use std::fs::File;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::config::WarmLock;
use crate::store::error::{Error, Result};

/// How long a warm call waits for its turn before it goes on without one: far longer than one
/// call holds it (a read-ahead window's zero-fill: 20-30 ms on the slowest machine measured),
/// so that turns rarely overlap, and bounded, so that a holder stuck on a failing disk does not
/// stop other stores' warms for good. The store thread does not wait idle meanwhile: a flush,
/// a checkpoint or a new segment to prepare ends the wait ([`WarmTurns::take`]).
pub(crate) const TURN_WAIT: Duration = Duration::from_secs(1);

/// How long a waiter sleeps between tries.
const RETRY: Duration = Duration::from_millis(1);

/// The turns of one store (`Shared::warm_turns`).
#[derive(Debug)]
pub(crate) struct WarmTurns {
    process: bool,
    /// Its own open file description: `flock` locks belong to one, so this store's turns
    /// exclude other processes' (the process lock excludes this process's other stores).
    host: Option<File>,
    /// How long a call waits for its turn ([`TURN_WAIT`]; tests set their own).
    wait: Duration,
    /// When the current wait for a turn began: kept across the waits that other work ended
    /// ([`WarmTurns::take`]), so that a wait the store thread keeps leaving for its flushes
    /// still ends at [`TURN_WAIT`] in all.
    waiting_since: Mutex<Option<Instant>>,
    /// Tests: how many warm calls began.
    #[cfg(test)]
    pub(crate) began: std::sync::atomic::AtomicUsize,
    /// Tests: how many calls wait for their turn now.
    #[cfg(test)]
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
}

/// How a wait for a turn ended.
enum Waited<T> {
    Got(T),
    /// [`TURN_WAIT`] passed.
    TimedOut,
    /// The store thread has other work: it goes to it and warms on after.
    Pending,
}

/// The process's turn.
static PROCESS: Mutex<()> = Mutex::new(());

impl WarmTurns {
    /// Opens (creating it when missing) the lock file of [`WarmLock::Host`]: a path that
    /// cannot be opened is an error naming `store.warm-lock`, at start, rather than turns that
    /// silently never exclude anyone.
    pub(crate) fn open(lock: &WarmLock) -> Result<Self> {
        let host = match lock {
            WarmLock::Host(path) => Some(
                open_lock_file(path)
                    .map_err(|e| Error::io("open the lock file of store.warm-lock", path, e))?,
            ),
            WarmLock::None | WarmLock::Process => None,
        };
        Ok(Self {
            process: !matches!(lock, WarmLock::None),
            host,
            wait: TURN_WAIT,
            waiting_since: Mutex::new(None),
            #[cfg(test)]
            began: Default::default(),
            #[cfg(test)]
            waiting: Default::default(),
        })
    }

    /// Tests: turns that wait `wait` for their turn.
    #[cfg(test)]
    pub(crate) fn with_wait(self, wait: Duration) -> Self {
        Self { wait, ..self }
    }

    /// Takes a turn (or gives up waiting after [`TURN_WAIT`]), runs `call`, and ends the turn.
    /// `None`, without running `call`, when `pending` says the store thread has other work
    /// while it waits (a flush, a checkpoint, a segment to prepare, a stop).
    pub(crate) fn run<R>(&self, pending: &dyn Fn() -> bool, call: impl FnOnce() -> R) -> Option<R> {
        let turn = self.take(pending)?;
        #[cfg(test)]
        self.began.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let out = call();
        drop(turn);
        Some(out)
    }

    /// Takes a turn: the process's and the host's together (the process's alone without a
    /// lock file). After [`TURN_WAIT`] in all it goes on with whichever of them is free then,
    /// or neither. `None` when `pending` turns true while it waits:
    /// the store thread then does that work first and comes back to the warm. The wait's
    /// [`TURN_WAIT`] counts from the first of such waits, not from each: a store thread whose
    /// flushes fall due more often than that still gets to warm when the holder is stuck.
    pub(crate) fn take(&self, pending: &dyn Fn() -> bool) -> Option<Turn<'_>> {
        if !self.process {
            return Some(Turn { _process: None, host: None });
        }
        #[cfg(test)]
        let _waiting = Counted::new(&self.waiting);
        let since = *self
            .waiting_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
        let deadline = since + self.wait;
        // Both turns together or neither: the process's turn is not held while the lock file
        // is another process's (this process's other stores would wait out this wait too).
        let (process, host) = match wait_for(deadline, pending, || {
            let process = try_process()?;
            match &self.host {
                None => Some((Some(process), None)),
                Some(f) => match try_host(f) {
                    Ok(host) => Some((Some(process), host)),
                    // The process's turn is let go until the file is free.
                    Err(()) => None,
                },
            }
        }) {
            Waited::Got(turns) => turns,
            // Whichever of them is free now.
            Waited::TimedOut => {
                (try_process(), self.host.as_ref().and_then(|f| try_host(f).ok().flatten()))
            }
            Waited::Pending => return None,
        };
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if process.is_none() || (self.host.is_some() && host.is_none()) {
            tracing::debug!(wait = ?self.wait, "a warm went on without its turn (store.warm-lock)");
        }
        Some(Turn { _process: process, host })
    }
}

/// The process's turn if it is free (also after a panic poisoned it).
fn try_process() -> Option<MutexGuard<'static, ()>> {
    match PROCESS.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The lock file's turn: `Ok(Some)` when taken, `Ok(None)` on a file system without `flock`
/// (no host turns, but the warm goes on), `Err` while another holder has it.
fn try_host(f: &File) -> std::result::Result<Option<&File>, ()> {
    use rustix::fs::{FlockOperation, flock};
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(()),
        Err(_) => Ok(None),
    }
}

/// Opens the lock file for reading (`flock` needs no more), so that processes of other users
/// can share a file one of them created, even where `fs.protected_regular` refuses them a
/// creating open of it in a sticky directory such as `/run/lock`; creates it (mode 0666 less
/// the umask) only when it is missing.
fn open_lock_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path),
        opened => opened,
    }
}

/// Tries `attempt` until it gives `Some`, `pending` turns true, or `deadline` passes.
fn wait_for<T>(
    deadline: Instant,
    pending: &dyn Fn() -> bool,
    mut attempt: impl FnMut() -> Option<T>,
) -> Waited<T> {
    loop {
        if let Some(got) = attempt() {
            return Waited::Got(got);
        }
        if pending() {
            return Waited::Pending;
        }
        if Instant::now() >= deadline {
            return Waited::TimedOut;
        }
        std::thread::sleep(RETRY);
    }
}

/// Tests: counts itself in a counter while it lives.
#[cfg(test)]
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl<'a> Counted<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(n)
    }
}

#[cfg(test)]
impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A turn taken; dropping it ends it.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    /// Held until the turn ends.
    _process: Option<MutexGuard<'static, ()>>,
    host: Option<&'a File>,
}

impl Turn<'_> {
    /// Whether this turn holds the host's lock file.
    #[cfg(test)]
    pub(crate) fn holds_host(&self) -> bool {
        self.host.is_some()
    }

    /// Whether this turn holds the process's turn.
    #[cfg(test)]
    pub(crate) fn holds_process(&self) -> bool {
        self._process.is_some()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.host {
            // Closing the file would release it too; an unlock that fails leaves it to that.
            let _ = rustix::fs::flock(f, rustix::fs::FlockOperation::Unlock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{FlockOperation, flock};

    #[test]
    fn parses_the_three_forms_and_names_what_it_accepts() {
        assert_eq!(WarmLock::parse("none"), Ok(WarmLock::None));
        assert_eq!(WarmLock::parse("process"), Ok(WarmLock::Process));
        assert_eq!(
            WarmLock::parse("/run/lock/hasync-warm.lock"),
            Ok(WarmLock::Host("/run/lock/hasync-warm.lock".into()))
        );
        for bad in ["", "host", "relative/warm.lock", "Process"] {
            let e = WarmLock::parse(bad).unwrap_err();
            assert!(e.contains("\"none\", \"process\" or the absolute path"), "{bad:?}: {e}");
        }
    }

    /// Another process's lock on the file keeps this store's turn from holding it (the turn
    /// gives up on it after `TURN_WAIT`), and the turn holds it once the other lets go. While
    /// this store holds it, another open file description cannot lock it.
    #[test]
    fn a_host_turn_excludes_other_holders_of_the_lock_file_and_never_waits_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("warm.lock");
        let turns = WarmTurns::open(&WarmLock::Host(path.clone())).unwrap();
        // An open file description of its own, as another process would have.
        let other = File::open(&path).unwrap();
        flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        assert!(
            !turns.take(&|| false).unwrap().holds_host(),
            "the turn held the file another holder had locked"
        );
        flock(&other, FlockOperation::Unlock).unwrap();
        // Waits long enough for the process's turn, whatever this binary's other tests warm.
        let turns = WarmTurns::open(&WarmLock::Host(path.clone()))
            .unwrap()
            .with_wait(Duration::from_secs(60));
        let turn = turns.take(&|| false).unwrap();
        assert!(turn.holds_host());
        assert_eq!(
            flock(&other, FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK),
            "another holder locked the file during this store's turn"
        );
        drop(turn);
        flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
    }

    /// A store waiting for a lock file another process holds does not hold the process's turn
    /// meanwhile: this process's other stores still take turns. Before, it held the process's
    /// turn for its whole wait, and they waited with it.
    #[test]
    fn a_wait_for_the_lock_file_leaves_the_process_turn_to_the_processs_other_stores() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("warm.lock");
        let turns = WarmTurns::open(&WarmLock::Host(path.clone()))
            .unwrap()
            .with_wait(Duration::from_secs(30));
        // Another process's hold of the file, for the whole test.
        let other = File::open(&path).unwrap();
        flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        /// Ends the waiter's wait however this test ends.
        struct Done<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let turn = turns.take(&|| done.load(std::sync::atomic::Ordering::SeqCst));
                let got = turn.is_some();
                drop(turn);
                assert!(!got, "the store got a turn while the file was held");
            });
            let done_guard = Done(&done);
            let deadline = Instant::now() + Duration::from_secs(10);
            while turns.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the store never waited for its turn");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let it try the turns a while (it polls every millisecond).
            std::thread::sleep(Duration::from_millis(50));
            // Longer than this binary's other tests hold the process's turn, far shorter than
            // the waiting store's wait.
            let local =
                WarmTurns::open(&WarmLock::Process).unwrap().with_wait(Duration::from_secs(15));
            let turn = local.take(&|| false).unwrap();
            let got = turn.holds_process();
            drop(turn);
            drop(done_guard);
            waiter.join().unwrap();
            assert!(got, "the process's turn was held by a store waiting for the lock file");
        });
    }

    /// A wait that other work keeps ending (flushes due every 50 ms here) still gives the turn
    /// up once the waits add up to the give-up time, and the warm goes on without it.
    #[test]
    fn waits_cut_short_by_other_work_still_add_up_to_the_give_up() {
        let long = Duration::from_secs(60);
        let holder = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let _held = holder.take(&|| false).unwrap();
        let turns =
            WarmTurns::open(&WarmLock::Process).unwrap().with_wait(Duration::from_millis(300));
        let started = Instant::now();
        let mut ended_by_work = 0;
        let turn = loop {
            assert!(started.elapsed() < long, "the wait never gave the turn up");
            let since = Instant::now();
            match turns.take(&|| since.elapsed() >= Duration::from_millis(50)) {
                Some(turn) => break turn,
                None => ended_by_work += 1,
            }
        };
        assert!(!turn.holds_process(), "another store holds the process's turn");
        assert!(ended_by_work >= 2, "the waits were not cut short: {ended_by_work}");
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[test]
    fn a_lock_file_that_cannot_be_opened_is_an_error_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("warm.lock");
        let e = WarmTurns::open(&WarmLock::Host(path)).unwrap_err().to_string();
        assert!(e.contains("store.warm-lock"), "{e}");
        assert!(e.contains("missing-dir"), "{e}");
    }

    #[test]
    fn without_turns_nothing_is_held() {
        let turns = WarmTurns::open(&WarmLock::None).unwrap();
        let turn = turns.take(&|| true).expect("nothing to wait for, so nothing to give way to");
        assert!(!turn.holds_process() && !turn.holds_host());
    }
}
