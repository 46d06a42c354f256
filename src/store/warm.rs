//! Turns for the page faults that warm segments (`store.warm-lock`): one warm call at a time.
//!
//! A warm's first write fault on a page of a new segment zero-fills a whole read-ahead window
//! in one page fault, which a `PREEMPT_NONE` kernel does not interrupt: on the benchmark VM,
//! 20-30 ms for 8 MiB of memory the host had taken back (docs/benchmarks.md, "The tail").
//! A master and a slave roll at the same offset, so on one machine their warms run at the same
//! time: two such faults then hold both vCPUs of a 2-vCPU machine, and every put waits. Turns
//! are taken per [`POPULATE_CHUNK`](crate::store::mapped_file::POPULATE_CHUNK) call. Within a
//! process, turns are handed over in the order they were asked for: a store that ends a call
//! and asks again waits behind the stores that asked meanwhile, so two stores' warms alternate
//! call by call, where before one warmed while the other waited out its give-up and then ran a
//! call beside it.
//!
//! Turns are taken among the stores of one process (`"process"`, the default: every node of
//! an in-process cluster, a bench, a test), or also among processes through a lock file that
//! they share (an absolute path: `flock(2)` on it, released by the kernel when a process
//! dies; among processes not in order); both are taken together or not at all, so a store
//! waiting for the lock file does not hold the process's turn meanwhile (it goes back to the
//! end of the process's line). After [`TURN_WAIT`] a warm goes on without its turn
//! (with the process's if it is free then), so a stuck holder (a warm blocked on a failing
//! disk) delays other stores' warms by that much per call. The store
//! thread that waits does not stop flushing: a wait ends as soon as it has other work
//! ([`WarmTurns::take`]), and the warm goes on after it from where it stopped.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::WarmLock;
use crate::store::error::{Error, Result};

/// How long a warm call waits for its turn before it goes on without one: far longer than one
/// call holds it (a read-ahead window's zero-fill: 20-30 ms on the slowest machine measured),
/// so that turns rarely overlap, and bounded, so that a holder stuck on a failing disk does not
/// stop other stores' warms for good. The store thread does not wait idle meanwhile: a flush,
/// a checkpoint or a new segment to prepare ends the wait ([`WarmTurns::take`]).
pub(crate) const TURN_WAIT: Duration = Duration::from_secs(1);

/// How often a waiter looks at its `pending` (and the lock file) while it waits.
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

/// The process's turns: who holds one and who waits, in the order they asked.
#[derive(Debug)]
struct Line {
    held: bool,
    /// Tickets of the waiting stores, the next to be served first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

static LINE: Mutex<Line> =
    Mutex::new(Line { held: false, waiting: VecDeque::new(), next_ticket: 0 });

/// Notified when the process's turn ends or the line changes.
static LINE_MOVED: Condvar = Condvar::new();

/// The process's line, also after a panic poisoned it (a panic leaves it consistent: every
/// change is one step).
fn line() -> MutexGuard<'static, Line> {
    LINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's turn, held until dropped.
#[derive(Debug)]
struct ProcessTurn(());

impl Drop for ProcessTurn {
    fn drop(&mut self) {
        line().held = false;
        LINE_MOVED.notify_all();
    }
}

/// A place in the process's line; leaving it (dropped) takes the ticket out if still there.
struct Ticket(u64);

impl Ticket {
    fn join() -> Self {
        let mut line = line();
        let t = line.next_ticket;
        line.next_ticket += 1;
        line.waiting.push_back(t);
        Self(t)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut line = line();
        if let Some(at) = line.waiting.iter().position(|&t| t == self.0) {
            line.waiting.remove(at);
            drop(line);
            LINE_MOVED.notify_all();
        }
    }
}

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
    /// or neither. `None` when `pending` turns true while it waits: the store thread then does
    /// that work first and comes back to the warm, at the end of the line. The wait's
    /// [`TURN_WAIT`] counts from the first of such waits, not from each: a store thread whose
    /// flushes fall due more often than that still gets to warm when the holder is stuck.
    pub(crate) fn take(&self, pending: &dyn Fn() -> bool) -> Option<Turn<'_>> {
        let since = *self
            .waiting_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
        let turn = self.take_until(since + self.wait, pending)?;
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Some(turn)
    }

    /// Waits in the process's line until its turn comes and the lock file (if any) is free,
    /// or until `deadline`, then goes on with whichever of them is free; `None` as soon as
    /// `pending` turns true.
    fn take_until(&self, deadline: Instant, pending: &dyn Fn() -> bool) -> Option<Turn<'_>> {
        if !self.process {
            return Some(Turn { _process: None, host: None });
        }
        #[cfg(test)]
        let _waiting = Counted::new(&self.waiting);
        let mut ticket = Ticket::join();
        let (process, host) = loop {
            let mut host_busy = false;
            {
                let mut line = line();
                if !line.held && line.waiting.front() == Some(&ticket.0) {
                    line.waiting.pop_front();
                    line.held = true;
                    drop(line);
                    let process = ProcessTurn(());
                    // Both turns together or neither: the process's turn is not held while the
                    // lock file is another process's (this process's other stores would wait
                    // out this wait too). The store goes back to the end of the line.
                    match self.host.as_ref().map(try_host) {
                        None => break (Some(process), None),
                        Some(Ok(host)) => break (Some(process), host),
                        Some(Err(())) => {
                            drop(process);
                            ticket = Ticket::join();
                            host_busy = true;
                        }
                    }
                }
            }
            if pending() {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                // Whichever of them is free now, out of the line's order.
                let process = {
                    let mut line = line();
                    (!line.held).then(|| {
                        line.held = true;
                        ProcessTurn(())
                    })
                };
                break (process, self.host.as_ref().and_then(|f| try_host(f).ok().flatten()));
            }
            let line = line();
            if host_busy || line.held || line.waiting.front() != Some(&ticket.0) {
                let _ = LINE_MOVED.wait_timeout(line, RETRY.min(deadline - now));
            }
        };
        drop(ticket);
        if process.is_none() || (self.host.is_some() && host.is_none()) {
            tracing::debug!(wait = ?self.wait, "a warm went on without its turn (store.warm-lock)");
        }
        Some(Turn { _process: process, host })
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
    _process: Option<ProcessTurn>,
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

    /// A store that ends its turn and asks for the next one at once (as a warm does after
    /// each call) waits behind a store that asked while it held the turn. Before, turns were
    /// not handed over in order: the holder nearly always took the next one at once, and the
    /// other waited out its whole give-up (1 s), then ran beside it.
    #[test]
    fn turns_are_handed_over_in_the_order_they_were_asked_for() {
        let long = Duration::from_secs(60);
        let holder = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let waiter = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let turn = holder.take(&|| false).unwrap();
        assert!(turn.holds_process());
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let t = waiter.take(&|| false).unwrap();
                order.lock().unwrap().push("the store that waited");
                drop(t);
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while waiter.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the other store never waited for its turn");
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(turn);
            let again = holder.take(&|| false).unwrap();
            order.lock().unwrap().push("the store that held the turn");
            drop(again);
            w.join().unwrap();
        });
        assert_eq!(
            *order.lock().unwrap(),
            ["the store that waited", "the store that held the turn"],
            "the turn's order"
        );
    }

    /// A store that leaves the line (its store thread has other work) does not hold up the
    /// stores behind it: the next one gets the turn when it ends, not at its give-up.
    #[test]
    fn a_store_that_leaves_the_line_does_not_hold_up_the_stores_behind_it() {
        let long = Duration::from_secs(60);
        let holder = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let leaver = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let behind = WarmTurns::open(&WarmLock::Process).unwrap().with_wait(long);
        let turn = holder.take(&|| false).unwrap();
        let leave = std::sync::atomic::AtomicBool::new(false);
        let wait_until_waiting = |turns: &WarmTurns, who: &str| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while turns.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "{who} never waited for its turn");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        std::thread::scope(|s| {
            let left = s.spawn(|| {
                leaver.take(&|| leave.load(std::sync::atomic::Ordering::SeqCst)).is_none()
            });
            wait_until_waiting(&leaver, "the store that leaves");
            let got = s.spawn(|| {
                let started = Instant::now();
                let t = behind.take(&|| false).unwrap();
                (t.holds_process(), started.elapsed())
            });
            wait_until_waiting(&behind, "the store behind it");
            leave.store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(left.join().unwrap(), "the store that left got a turn");
            drop(turn);
            let (held, waited) = got.join().unwrap();
            assert!(held, "the store behind got no turn");
            assert!(
                waited < Duration::from_secs(30),
                "the store behind waited {waited:?}, its give-up: it waited behind a store that left"
            );
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
