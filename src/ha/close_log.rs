//! How a slave logs its link's closes without flooding the log: a close with a new reason is
//! logged at once; the same reason again (a full disk, a master that stays down: every
//! reconnect, at most `slave.reconnect-backoff-max` apart) is counted and summarised at most
//! once per [`SUMMARY_EVERY`]; a session that stored bytes (the link worked again) ends the
//! repeat, so its next close is logged at once. The link status keeps every close's exact
//! reason (`MasterLink.last_error`); only the log is rate-limited.

use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::store::disk::SUMMARY_EVERY;

/// What to do with one close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CloseLine {
    /// Log it: its reason differs from the last one logged, or the link worked in between.
    First,
    /// Log a summary: the same reason `repeats` times since the last line.
    Summary {
        /// Closes with this reason since the last line (this one included).
        repeats: u64,
    },
    /// Do not log it (counted for the next summary).
    Quiet,
}

/// The closes of one slave's link (see the module docs).
#[derive(Debug)]
pub(crate) struct CloseLog {
    every: Duration,
    /// The reason of the last close logged, while it repeats.
    last: Option<String>,
    last_logged: Instant,
    /// Closes not logged since the last line.
    suppressed: u64,
}

impl CloseLog {
    /// A log that summarises a repeated reason every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, last: None, last_logged: Instant::now(), suppressed: 0 }
    }

    /// A close with `reason` at `now`, after a session that did (`progressed`) or did not store
    /// bytes: what to log.
    pub(crate) fn close(&mut self, reason: &str, progressed: bool, now: Instant) -> CloseLine {
        if progressed || self.last.as_deref() != Some(reason) {
            self.last = Some(reason.to_owned());
            self.last_logged = now;
            self.suppressed = 0;
            return CloseLine::First;
        }
        self.suppressed += 1;
        if now.saturating_duration_since(self.last_logged) < self.every {
            return CloseLine::Quiet;
        }
        self.last_logged = now;
        CloseLine::Summary { repeats: std::mem::take(&mut self.suppressed) }
    }

    /// Closes of the current reason not logged yet.
    pub(crate) fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reason_repeating_every_1_4_s_for_a_minute_logs_once_and_two_summaries() {
        let mut log = CloseLog::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let full = "append failed: disk full";
        let mut lines = Vec::new();
        for i in 0..43u64 {
            let line = log.close(full, false, t0 + Duration::from_millis(1400 * i));
            if line != CloseLine::Quiet {
                lines.push(line);
            }
        }
        // At 0 s, at 30.8 s (the 22 closes since), then nothing until 60 s.
        assert_eq!(lines, [CloseLine::First, CloseLine::Summary { repeats: 22 }]);
        assert_eq!(log.suppressed(), 20);
        let t = t0 + Duration::from_secs(61);
        assert_eq!(log.close(full, false, t), CloseLine::Summary { repeats: 21 });
    }

    #[test]
    fn another_reason_or_a_session_that_stored_bytes_is_logged_at_once() {
        let mut log = CloseLog::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(log.close("a", false, t0), CloseLine::First);
        assert_eq!(log.close("a", false, t0), CloseLine::Quiet);
        assert_eq!(log.close("b", false, t0), CloseLine::First, "another reason");
        assert_eq!(log.close("b", false, t0), CloseLine::Quiet);
        assert_eq!(log.close("b", true, t0), CloseLine::First, "the link worked in between");
        assert_eq!(log.suppressed(), 0);
    }
}
