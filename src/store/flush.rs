//! The store thread: flushes (msync) and checkpoints off the async runtime.
//!
//! Async flush: every `flush-interval` the thread flushes what was appended. Sync flush (group
//! commit): a put asks for its end offset to be durable; the thread wakes, flushes up to the
//! current max offset in one pass, which covers every put that asked meanwhile, and publishes
//! the new flushed offset on a `watch` channel that the waiting puts observe. The thread writes
//! a checkpoint at most once per `flush-interval` (truncate, wipe, close and
//! `checkpoint_blocking` write their own), always after the data it covers was flushed. The
//! same thread runs retention (of segments and of the truncated tails kept aside) every
//! `retention-check-interval` and prepares the next segment
//! (at once when a roll used the prepared one).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::store::checkpoint::Checkpoint;
use crate::store::commitlog::Shared;
use crate::store::disk;
use crate::store::error::{Error, Result};
use crate::store::options::FlushPolicy;

/// A sync-flush put whose bytes did not become durable in time (FLUSH_DISK_TIMEOUT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("offset {offset} not flushed within {timeout:?} (store.sync-flush-timeout)")]
pub struct FlushTimeout {
    /// The offset that had to become durable.
    pub offset: u64,
    /// The timeout that passed.
    pub timeout: Duration,
}

#[derive(Debug, Default)]
struct Requests {
    /// The highest offset a sync-flush put asked for.
    requested: u64,
    stop: bool,
    /// Prepare the next segment and warm now: a roll used the prepared one, a writer created
    /// a segment, or the thread just started.
    prepare: bool,
}

#[derive(Debug)]
struct Signal {
    state: Mutex<Requests>,
    cv: Condvar,
}

/// Handle to the store thread.
#[derive(Debug)]
pub(crate) struct Flusher {
    signal: Arc<Signal>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    pub(crate) fn start(shared: Arc<Shared>) -> Result<Self> {
        // The first round runs at once, not an interval after the start: a reopened store's
        // last segment is warmed and the next one prepared before the first puts reach them.
        let signal = Arc::new(Signal {
            state: Mutex::new(Requests { prepare: true, ..Requests::default() }),
            cv: Condvar::new(),
        });
        let s = Arc::clone(&signal);
        let thread = std::thread::Builder::new()
            .name("hasync-store".into())
            .spawn(move || run(shared, s))
            .map_err(|e| Error::io("spawn store thread", "hasync-store", e))?;
        Ok(Self { signal, thread: std::sync::Mutex::new(Some(thread)) })
    }

    /// Asks the thread to make everything below `offset` durable now.
    pub(crate) fn request(&self, offset: u64) {
        let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
        if offset > st.requested {
            st.requested = offset;
            self.signal.cv.notify_one();
        }
    }

    /// Lowers what the thread was asked to flush to a cut at `offset` ([`CommitLog::lower_flushed`](crate::store::CommitLog)).
    pub(crate) fn clamp_requested(&self, offset: u64) {
        let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
        st.requested = st.requested.min(offset);
    }

    /// Asks the thread to prepare the next segment and warm now (a roll used the prepared one,
    /// or a writer created a segment), so the next roll finds it ready instead of creating it
    /// on the writer's thread, and the writers find its pages mapped.
    pub(crate) fn prepare_next(&self) {
        let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
        st.prepare = true;
        self.signal.cv.notify_one();
    }

    /// Stops the thread and waits for it (no final flush: the caller decides).
    pub(crate) fn stop(&self) {
        {
            let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
            st.stop = true;
            self.signal.cv.notify_one();
        }
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(shared: Arc<Shared>, signal: Arc<Signal>) {
    // Puts wait for the flushes under sync flush, a master's SYNC puts for a slave's when its
    // acks wait for them: then the thread keeps the process's priority.
    if shared.opts.flush == FlushPolicy::Async && !shared.opts.acks_wait_for_flushes {
        lower_priority("hasync-store", shared.opts.background_nice);
    }
    let interval = shared.opts.flush_interval;
    let mut last_checkpoint = Instant::now();
    let mut last_retention = Instant::now();
    let mut last_flush = Instant::now();
    // When the last flush ended: an interval flush stops a warm only an interval after it, so
    // that a flush lasting an interval or more (an msync of a whole segment took up to 0.5 s
    // in the benchmarks) still leaves the warm its turn between flushes.
    let mut last_flush_end = Instant::now();
    loop {
        #[cfg(test)]
        shared.store_loops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (stop, asked) = {
            let st = signal.state.lock().unwrap_or_else(|e| e.into_inner());
            // Read at each wake, not once before the wait: a cut lowers it meanwhile
            // (`CommitLog::lower_flushed`), and a request below the old value is then work.
            let flushed = || *shared.flushed_tx.borrow();
            let wait = interval.saturating_sub(last_flush.elapsed());
            let (mut st, _) = signal
                .cv
                .wait_timeout_while(st, wait, |r| !r.stop && !r.prepare && r.requested <= flushed())
                .unwrap_or_else(|e| e.into_inner());
            st.prepare = false;
            (st.stop, st.requested > flushed())
        };
        if stop {
            return;
        }
        // A flush a put waits for (sync flush, acks that wait for flushes) comes first. Then
        // the next segment, before an interval's flush: a roll that finds no spare creates and
        // syncs a file on the writer's path, so making one must not wait behind an async flush
        // (the msync of a whole segment took up to half a second in the benchmarks) or a warm.
        // A wake only to prepare the next segment (a roll) does not flush: async flushing
        // happens every interval or when a put asks, not at each roll.
        let interval_due = last_flush.elapsed() >= interval;
        let mut flush = || {
            last_flush = Instant::now();
            flush_once(&shared, &mut last_checkpoint, interval);
            last_flush_end = Instant::now();
        };
        if asked {
            flush();
        }
        let prepared = shared.queue.prepare_next();
        shared.disk.record_all(disk::PREPARE, &prepared);
        if matches!(prepared, Ok(true)) {
            // A spare segment was made: an append that failed creating one would find it now,
            // so that failure is over too (without waiting for the next put to prove it). An
            // empty store has nothing to prepare: there the next append tells.
            shared.disk.succeeded(disk::APPEND);
        }
        if interval_due && !asked {
            flush();
        }
        // The warm stops for other work (it may wait for its turn behind other stores' warms,
        // store.warm-lock): a flush a put waits for, one due, a segment to prepare, a stop. The
        // loop then comes back at once, does that work, and the warm goes on where it stopped.
        let pending = || {
            let st = signal.state.lock().unwrap_or_else(|e| e.into_inner());
            st.stop
                || st.prepare
                || st.requested > *shared.flushed_tx.borrow()
                || last_flush_end.elapsed() >= interval
        };
        if shared.opts.warm_segments
            && let Err(e) = shared.queue.warm_ahead(&shared.warm_turns, &pending)
        {
            tracing::debug!(error = %e, "faulting segments in ahead of the writer failed");
        }
        if last_retention.elapsed() >= shared.opts.retention_check_interval {
            last_retention = Instant::now();
            match crate::store::retention::run(&shared, SystemTime::now()) {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(files = ?removed, "retention removed segment files");
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "retention failed"),
            }
            if let Err(e) = shared.tails.try_retention(shared.fs.as_ref(), SystemTime::now()) {
                tracing::error!(error = %e, "retention of the truncated tails failed");
            }
        }
    }
}

/// Lowers the calling thread's CPU priority by `nice` (0: unchanged) below the process's, at
/// most to nice 19, for the store's background threads: when the CPUs are busy, they yield to
/// the appending and replicating tasks, on whose path a put's latency lies. Raising one's own
/// nice value needs no privilege; should it fail anyway, the thread runs on at its priority.
pub(crate) fn lower_priority(thread: &str, nice: u8) {
    if nice == 0 {
        return;
    }
    // On Linux a nice value belongs to a thread: `None` (0) is the calling thread alone.
    let lowered = rustix::process::getpriority_process(None).and_then(|current| {
        let target = current.saturating_add(i32::from(nice)).min(19);
        if target > current { rustix::process::setpriority_process(None, target) } else { Ok(()) }
    });
    if let Err(e) = lowered {
        tracing::warn!(thread, nice, error = %e, "could not lower the thread's CPU priority (store.background-nice)");
    }
}

/// One flush; a checkpoint too when the last is an interval old. The flush and the checkpoint
/// write are reported as two kinds of write: a flush that works says nothing of the checkpoint
/// (on a full disk the segments, allocated ahead, still flush while the checkpoint file cannot
/// be written), so only a checkpoint written clears a checkpoint's failure.
fn flush_once(shared: &Shared, last_checkpoint: &mut Instant, interval: Duration) {
    let failed = if last_checkpoint.elapsed() >= interval {
        *last_checkpoint = Instant::now();
        match checkpoint_steps(shared) {
            Ok(_) => {
                shared.disk.succeeded(disk::FLUSH);
                shared.disk.succeeded(disk::CHECKPOINT);
                false
            }
            Err((kind, e)) => {
                if kind == disk::CHECKPOINT {
                    shared.disk.succeeded(disk::FLUSH);
                }
                shared.disk.failed(kind, &e, matches!(e, Error::DiskFull { .. }));
                true
            }
        }
    } else {
        let result = shared.flush_files();
        shared.disk.record_all(disk::FLUSH, &result);
        result.is_err()
    };
    // Both retried every interval; logged (rate-limited) and reported by the monitor.
    if failed {
        std::thread::sleep(interval.min(Duration::from_millis(100)));
    }
}

/// Takes a consistent snapshot, flushes at least up to it, then writes the checkpoint.
pub(crate) fn flush_and_checkpoint(shared: &Shared) -> Result<Checkpoint> {
    checkpoint_steps(shared).map_err(|(_, e)| e)
}

/// [`flush_and_checkpoint`], saying which write failed: [`disk::FLUSH`] or
/// [`disk::CHECKPOINT`].
fn checkpoint_steps(shared: &Shared) -> std::result::Result<Checkpoint, (&'static str, Error)> {
    let halted = shared.checkpoint_lock.lock().unwrap_or_else(|e| e.into_inner());
    if *halted {
        return Err((disk::CHECKPOINT, Error::Closed));
    }
    // A cut between the snapshot and the store would leave a checkpoint claiming the bytes it
    // cut: the steps run again (cuts are rare; the third try stores what it has, and the
    // cut's own checkpoint, which waits for this lock, follows).
    let mut tries = 0;
    let (dispatched, queue_offsets, confirm, flushed, cuts, cut_generation) = loop {
        tries += 1;
        let (dispatched, queue_offsets, cuts, cut_generation) = shared.checkpoint_snapshot();
        // Read before the flush: it is at most the max offset then, so the flush covers it.
        let confirm = shared.confirm_offset();
        let flushed = shared.flush_files().map_err(|e| (disk::FLUSH, e))?;
        let cut = shared.cuts.load(std::sync::atomic::Ordering::SeqCst) != cuts;
        if cut && tries < 3 {
            continue;
        }
        debug_assert!(cut || dispatched <= flushed || shared.queue.is_empty());
        debug_assert!(cut || confirm <= flushed.max(dispatched) || shared.queue.is_empty());
        break (dispatched, queue_offsets, confirm, flushed, cuts, cut_generation);
    };
    let cp = Checkpoint {
        flushed_offset: flushed.max(dispatched),
        dispatched_offset: dispatched,
        queue_offsets,
        confirm_offset: confirm.min(flushed.max(dispatched)),
        cut_generation,
    };
    cp.store(shared.fs.as_ref(), &shared.data_dir).map_err(|e| (disk::CHECKPOINT, e))?;
    // The checkpoint on disk no longer claims the bytes of the cuts it saw.
    shared.checkpointed_cuts.fetch_max(cuts, std::sync::atomic::Ordering::SeqCst);
    shared.checkpointed(cut_generation);
    Ok(cp)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    use crate::config::WarmLock;
    use crate::store::fs::StdFs;
    use crate::store::record::Message;
    use crate::store::warm::WarmTurns;
    use crate::store::{CommitLog, FlushPolicy, StoreOptions};

    fn msg(body: &[u8]) -> Message {
        crate::store::record::test_message("Warm", body)
    }

    /// A flush a put waits for (sync flush) is served while the store thread's warm waits for
    /// its turn behind another store's (`store.warm-lock`). Before, the thread waited for the
    /// turn at every 1 MiB call, giving it up after 100 ms each, before it flushed again: the
    /// warm of a 64 MiB segment held the flush about 6.4 s, and the put timed out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_is_served_while_the_warm_waits_for_its_turn() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            segment_size: 64 << 20,
            flush: FlushPolicy::Sync,
            sync_flush_timeout: Duration::from_secs(3),
            warm_segments: true,
            scrub_rate: 0,
            ..StoreOptions::default()
        };
        // Another store's turn, held for the whole test.
        let other =
            WarmTurns::open(&WarmLock::Process).unwrap().with_wait(Duration::from_secs(120));
        let turn = other.take(&|| false).unwrap();
        let log = CommitLog::open(Arc::new(StdFs), dir.path(), opts).unwrap();
        log.append(&[msg(b"first")]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while log.shared.warm_turns.waiting.load(SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the store thread's warm never waited for a turn");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let second = log.append(&[msg(b"second")]).unwrap();
        log.wait_flushed(second.end_offset)
            .await
            .expect("the flush waited for the warm's turn (FLUSH_DISK_TIMEOUT)");
        assert!(log.flushed_offset() >= second.end_offset);
        drop(turn);
        log.close().unwrap();
    }

    /// Waits (at most 10 s) until the store's last segment is warm and the next one is
    /// prepared and warm; panics naming `what` otherwise.
    async fn wait_for_warm_segments(log: &CommitLog, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let last_warm = log.shared.queue.last().is_some_and(|f| f.is_warmed());
            if last_warm && log.shared.queue.ready_is_warmed() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: after 10 s the last segment warm: {last_warm}, a warm spare: {}",
                log.shared.queue.ready_is_warmed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most 10 s) until the store thread has gone round once and waits for work.
    async fn wait_for_idle_store_thread(log: &CommitLog) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while log.shared.store_loops.load(SeqCst) < 2 {
            assert!(Instant::now() < deadline, "the store thread never went round");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn idle_store_opts() -> StoreOptions {
        StoreOptions {
            segment_size: 4 << 20,
            // The interval's wake never comes within the test.
            flush_interval: Duration::from_secs(600),
            warm_segments: true,
            // No turns: other tests of this process may hold the process's turn a while.
            warm_lock: WarmLock::None,
            scrub_rate: 0,
            ..StoreOptions::default()
        }
    }

    /// A store's first segment is warmed, and the next one prepared, as soon as a put creates
    /// it, whether the put is the master's or a replicated write. Before, the store thread
    /// only learned of it at its next interval's wake (500 ms by default): in the benchmarks
    /// the first puts after a start took the segment's page faults on the writers' path.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_warms_its_first_segment_and_prepares_the_next_as_soon_as_it_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let log = CommitLog::open(Arc::new(StdFs), dir.path(), idle_store_opts()).unwrap();
        wait_for_idle_store_thread(&log).await;
        log.append(&[msg(b"first")]).unwrap();
        wait_for_warm_segments(&log, "after the first put").await;
        log.close().unwrap();

        let replica_dir = tempfile::tempdir().unwrap();
        let replica =
            CommitLog::open(Arc::new(StdFs), replica_dir.path(), idle_store_opts()).unwrap();
        wait_for_idle_store_thread(&replica).await;
        let bytes = crate::store::record::encode(&msg(b"replicated"), 0, 8 << 20).unwrap();
        replica.append_at(8 << 20, &bytes).unwrap();
        wait_for_warm_segments(&replica, "after the first replicated write").await;
        replica.close().unwrap();
    }

    /// A reopened store warms its last segment and prepares the next one at once, not an
    /// interval after it opened.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reopened_store_warms_its_last_segment_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions { warm_segments: false, ..idle_store_opts() };
        let log = CommitLog::open(Arc::new(StdFs), dir.path(), opts).unwrap();
        log.append(&[msg(b"first")]).unwrap();
        log.close().unwrap();
        let log = CommitLog::open(Arc::new(StdFs), dir.path(), idle_store_opts()).unwrap();
        wait_for_warm_segments(&log, "after the reopen").await;
        log.close().unwrap();
    }

    /// A truncate below what a put asked to be flushed leaves the store thread waiting for
    /// work, and a flush asked after it is still served. Before, the request past the cut
    /// could never be met: from its next wake on (the interval here), the thread went round
    /// at once, again and again (a loop at full CPU), until the log grew past it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_below_a_requested_flush_leaves_the_store_thread_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            segment_size: 1 << 20,
            flush_interval: Duration::from_millis(200),
            sync_flush_timeout: Duration::from_secs(30),
            warm_segments: false,
            scrub_rate: 0,
            ..StoreOptions::default()
        };
        let log = CommitLog::open(Arc::new(StdFs), dir.path(), opts).unwrap();
        let first = log.append(&[msg(b"first")]).unwrap();
        let last = log.append(&[msg(b"second"), msg(b"third")]).unwrap();
        log.wait_flushed(last.end_offset).await.unwrap();
        log.truncate(first.end_offset).unwrap();
        assert_eq!(log.flushed_offset(), first.end_offset);
        // Past the next interval's wake, then count: about one round per interval.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = log.shared.store_loops.load(SeqCst);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let loops = log.shared.store_loops.load(SeqCst) - before;
        assert!(loops <= 20, "the store thread went round {loops} times in 1 s with nothing to do");
        // A flush asked after the cut is still served.
        let next = log.append(&[msg(b"fourth")]).unwrap();
        log.wait_flushed(next.end_offset).await.unwrap();
        assert!(log.flushed_offset() >= next.end_offset);
        log.close().unwrap();
    }
}
