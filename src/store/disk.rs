//! The disk's write health: which kinds of write fail now, whether because the disk is full,
//! since when, and how many failed in all. Status, metrics and the `hasync.v1.Disk` health
//! service read it; the condition clears by itself once each failing kind of write works again.
//!
//! It also keeps a failing write from flooding the log: the first failure of a kind is logged,
//! then at most one summary per [`SUMMARY_EVERY`] with the number of failures not logged, and
//! the recovery once.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::store::error::{Error, Result};

/// How often a write that keeps failing is summarised in the log.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(30);

/// Appending records (a put, or a slave's replicated bytes), which may create a segment.
pub(crate) const APPEND: &str = "append";
/// The store thread preparing the next segment ahead of time.
pub(crate) const PREPARE: &str = "prepare next segment";
/// The store thread's flush of the mapped segments (msync).
pub(crate) const FLUSH: &str = "flush";
/// The store thread's checkpoint write (a small file: on a full disk it fails while the flush
/// of the segments, allocated ahead, still works). Only a checkpoint written clears it.
pub(crate) const CHECKPOINT: &str = "checkpoint";

fn now_millis() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as i64)
}

/// The disk's write health, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskStatus {
    /// A write fails now because the disk (or the quota) is full.
    pub full: bool,
    /// Unix ms since which the disk is full (0 when it is not).
    pub since_unix_ms: i64,
    /// The last failed write and its error (kept after recovery; empty before the first).
    pub last_error: String,
    /// Writes that failed since the start, full disk or not.
    pub failed_writes: u64,
    /// The kinds of write failing now (e.g. "append", "checkpoint").
    pub failing: Vec<String>,
}

#[derive(Debug)]
struct Failing {
    full: bool,
    since_unix_ms: i64,
    last_logged: Instant,
    /// Failures since the last line logged.
    suppressed: u64,
    /// Failures since this kind began to fail.
    total: u64,
}

#[derive(Debug, Default)]
struct State {
    failing: BTreeMap<&'static str, Failing>,
    failed_writes: u64,
    last_error: String,
}

/// The write health of one data dir (see the module docs).
#[derive(Debug)]
pub struct DiskMonitor {
    /// Whether any kind fails: a success of a healthy kind is one atomic load.
    any_failing: AtomicBool,
    state: Mutex<State>,
    summary_every: Duration,
}

impl Default for DiskMonitor {
    fn default() -> Self {
        Self::new(SUMMARY_EVERY)
    }
}

impl DiskMonitor {
    /// A monitor that summarises repeats every `summary_every`.
    pub(crate) fn new(summary_every: Duration) -> Self {
        Self { any_failing: AtomicBool::new(false), state: Mutex::default(), summary_every }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the outcome of a store write of kind `what`: an I/O error (full disk or not) is
    /// a failure; any other error (a refusal, a bad argument) says nothing about the disk.
    pub(crate) fn record<T>(&self, what: &'static str, result: &Result<T>) {
        match result {
            Ok(_) => self.succeeded(what),
            Err(e @ Error::DiskFull { .. }) => self.failed(what, e, true),
            Err(e @ Error::Io { .. }) => self.failed(what, e, false),
            Err(_) => {}
        }
    }

    /// Records the outcome of a write that only the disk can fail (the store thread's): every
    /// error is a failure.
    pub(crate) fn record_all<T>(&self, what: &'static str, result: &Result<T>) {
        match result {
            Ok(_) => self.succeeded(what),
            Err(e) => self.failed(what, e, matches!(e, Error::DiskFull { .. })),
        }
    }

    /// A write of kind `what` failed with `error` (`full`: the disk or quota is full).
    pub(crate) fn failed(&self, what: &'static str, error: &dyn Display, full: bool) {
        self.failed_at(what, error, full, Instant::now());
    }

    /// [`DiskMonitor::failed`] at `now`; returns whether a line was logged.
    fn failed_at(&self, what: &'static str, error: &dyn Display, full: bool, now: Instant) -> bool {
        let mut st = self.lock();
        st.failed_writes += 1;
        st.last_error = format!("{what}: {error}");
        self.any_failing.store(true, Ordering::Release);
        let every = self.summary_every;
        let Some(f) = st.failing.get_mut(what) else {
            let since_unix_ms = now_millis();
            let f = Failing { full, since_unix_ms, last_logged: now, suppressed: 0, total: 1 };
            st.failing.insert(what, f);
            tracing::error!(write = what, %error, disk_full = full,
                "disk write failed; while it keeps failing, one summary every {every:?}");
            return true;
        };
        f.total += 1;
        if f.full != full {
            f.full = full;
            f.since_unix_ms = now_millis();
        }
        if now.saturating_duration_since(f.last_logged) < every {
            f.suppressed += 1;
            return false;
        }
        let repeats = std::mem::take(&mut f.suppressed) + 1;
        f.last_logged = now;
        tracing::error!(write = what, %error, disk_full = full, repeats,
            "disk write still failing ({repeats} failures in the last {every:?})");
        true
    }

    /// A write of kind `what` worked: if it was failing, that ends (logged once).
    pub(crate) fn succeeded(&self, what: &'static str) {
        if !self.any_failing.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.lock();
        if let Some(f) = st.failing.remove(what) {
            tracing::info!(write = what, failures = f.total, "disk writes work again");
        }
        self.any_failing.store(!st.failing.is_empty(), Ordering::Release);
    }

    /// The write health now.
    pub fn status(&self) -> DiskStatus {
        let st = self.lock();
        let full: Vec<_> = st.failing.values().filter(|f| f.full).collect();
        DiskStatus {
            full: !full.is_empty(),
            since_unix_ms: full.iter().map(|f| f.since_unix_ms).min().unwrap_or(0),
            last_error: st.last_error.clone(),
            failed_writes: st.failed_writes,
            failing: st.failing.keys().map(|k| (*k).to_owned()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::*;

    /// Collects every formatted log line.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn a_write_failing_every_half_second_for_a_minute_logs_two_lines_and_its_recovery() {
        let lines = Lines::default();
        let l = lines.clone();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::fmt().with_writer(move || l.clone()).finish(),
        );
        // With exactly one dispatcher alive, tracing-core registers a callsite first hit on
        // another thread (another test's failing write, with no subscriber there) against that
        // thread's default only, and caches "never" for everyone: this test then sees no line.
        // A second dispatcher makes it ask all of them (as in tests/it/kube_label.rs). The
        // thread below is that other test.
        let _second = tracing::Dispatch::new(tracing_subscriber::registry());
        std::thread::spawn(|| {
            let elsewhere = DiskMonitor::new(Duration::from_secs(30));
            let now = Instant::now();
            elsewhere.failed_at(PREPARE, &"elsewhere", true, now);
            elsewhere.failed_at(PREPARE, &"elsewhere", true, now + Duration::from_secs(31));
            elsewhere.succeeded(PREPARE);
        })
        .join()
        .unwrap();
        let m = DiskMonitor::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let mut logged = 0;
        tracing::dispatcher::with_default(&dispatch, || {
            // 120 failures of each of two kinds, one every 500 ms (the flusher's cadence).
            for i in 0..120u64 {
                let now = t0 + Duration::from_millis(500 * i);
                logged += u64::from(m.failed_at(PREPARE, &"No space left", true, now));
                logged += u64::from(m.failed_at(CHECKPOINT, &"No space left", true, now));
            }
            let s = m.status();
            assert!(s.full && s.since_unix_ms > 0, "{s:?}");
            assert_eq!(s.failed_writes, 240);
            assert_eq!(s.failing, [CHECKPOINT, PREPARE]);
            m.succeeded(PREPARE);
            m.succeeded(PREPARE);
            m.succeeded(FLUSH);
            assert!(m.status().full, "the checkpoint still fails; a flush does not clear it");
            m.succeeded(CHECKPOINT);
        });
        let text = lines.text();
        // Per kind: the first failure, then a summary at 30 s (59 repeats) — not 120 lines.
        assert_eq!(logged, 4, "{text}");
        assert_eq!(text.matches("disk write failed").count(), 2, "{text}");
        assert_eq!(text.matches("disk write still failing (60 failures").count(), 2, "{text}");
        assert_eq!(text.matches("disk writes work again").count(), 2, "recovery once: {text}");
        let s = m.status();
        assert!(!s.full && s.failing.is_empty() && s.since_unix_ms == 0, "{s:?}");
        assert_eq!(s.last_error, "checkpoint: No space left", "kept after recovery");
    }

    #[test]
    fn only_io_errors_count_and_a_full_disk_is_told_apart() {
        let m = DiskMonitor::default();
        m.record::<()>(APPEND, &Err(Error::Fenced));
        assert_eq!(m.status(), DiskStatus::default(), "a refusal says nothing of the disk");
        let eio = std::io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error());
        m.record::<()>(APPEND, &Err(Error::io("write", "/d/f", eio)));
        let s = m.status();
        assert!(!s.full && s.failed_writes == 1 && s.failing == [APPEND], "{s:?}");
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        m.record::<()>(APPEND, &Err(Error::io("create", "/d/f", full)));
        assert!(m.status().full);
        m.record(APPEND, &Ok(()));
        assert!(!m.status().full);
    }
}
