//! The slave's reconnect policy, as pure code: how long to wait before the next attempt, given
//! how the last session ended. No clock and no randomness of its own: the caller passes the
//! random draw, so tests pin every delay.
//!
//! - A session that got as far as its first report (the master accepted the connection and
//!   answered the report with a frame) resets the backoff: the next wait is `reconnect-backoff`.
//! - A transient failure (connect refused, timed out, the link closed before the master
//!   answered the report, e.g. closed at accept by the allow-list or the connection limit)
//!   doubles the step up to `reconnect-backoff-max`, so a master that restarts is found
//!   again within about that cap.
//! - A refusal the operator must fix (the master is behind this slave, no shared epoch,
//!   a segment-size mismatch, a log that needs a full resync) doubles the step up to
//!   [`REFUSED_BACKOFF_MAX`]: retrying fast cannot help, but the slave still retries at least
//!   that often, so it recovers on its own once the cause is fixed.
//!
//! Every wait is jittered down by up to [`JITTER`] of its step (never above it), so slaves
//! that lost the same master do not reconnect in lockstep, and no wait exceeds
//! [`REFUSED_BACKOFF_MAX`] whatever the configuration says.

use std::time::Duration;

/// The longest wait between two attempts, for any outcome and any configuration.
pub(crate) const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The share of a step a wait may be shortened by: a wait lies in `[step * (1 - JITTER), step]`.
pub(crate) const JITTER: f64 = 0.2;

/// How a session with the master ended, as far as the backoff is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The session got as far as its first report.
    Reported,
    /// It failed before that, for a reason that may pass by itself.
    Failed,
    /// The master or the epoch check refused it for a reason the operator must fix.
    Refused,
}

/// The reconnect backoff: the current step and its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A backoff starting at `first`, doubling up to `max` for transient failures (both at
    /// most [`REFUSED_BACKOFF_MAX`], `first` at most `max`).
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        let max = max.min(REFUSED_BACKOFF_MAX);
        let first = first.min(max);
        Self { first, max, step: first }
    }

    /// The wait before the next attempt after `outcome`; `draw` is a uniform random number in
    /// `[0, 1)` that picks the jitter.
    pub(crate) fn next(&mut self, outcome: Outcome, draw: f64) -> Duration {
        let cap = match outcome {
            Outcome::Reported => {
                self.step = self.first;
                self.max
            }
            Outcome::Failed => self.max,
            Outcome::Refused => REFUSED_BACKOFF_MAX,
        };
        // A transient failure after refusals comes back under the transient cap.
        let step = self.step.min(cap);
        self.step = step.saturating_mul(2).min(cap);
        let wait = step.mul_f64(1.0 - JITTER * draw.clamp(0.0, 1.0));
        debug_assert!(wait <= step && step <= REFUSED_BACKOFF_MAX);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn waits(b: &mut Backoff, outcome: Outcome, n: usize) -> Vec<Duration> {
        (0..n).map(|_| b.next(outcome, 0.0)).collect()
    }

    #[test]
    fn transient_failures_double_up_to_the_cap() {
        let mut b = Backoff::new(200 * MS, 2000 * MS);
        let w = waits(&mut b, Outcome::Failed, 7);
        assert_eq!(w, [200, 400, 800, 1600, 2000, 2000, 2000].map(|ms| ms * MS));
    }

    #[test]
    fn a_reported_session_resets_the_backoff() {
        let mut b = Backoff::new(200 * MS, 2000 * MS);
        waits(&mut b, Outcome::Failed, 5);
        assert_eq!(b.next(Outcome::Reported, 0.0), 200 * MS);
        assert_eq!(b.next(Outcome::Failed, 0.0), 400 * MS);
        waits(&mut b, Outcome::Refused, 10);
        assert_eq!(b.next(Outcome::Reported, 0.0), 200 * MS, "refusals are reset too");
    }

    #[test]
    fn refusals_back_off_longer_but_retry_at_least_every_30_seconds() {
        let mut b = Backoff::new(200 * MS, 2000 * MS);
        let w = waits(&mut b, Outcome::Refused, 12);
        assert!(w.windows(2).all(|p| p[0] <= p[1]), "{w:?}");
        assert!(w[5] > 2000 * MS, "beyond the transient cap: {w:?}");
        assert_eq!(w[11], REFUSED_BACKOFF_MAX);
        assert!(w.iter().all(|&d| d <= REFUSED_BACKOFF_MAX));
        // A transient failure after that is back under the transient cap.
        assert_eq!(b.next(Outcome::Failed, 0.0), 2000 * MS);
    }

    #[test]
    fn no_configuration_waits_longer_than_30_seconds() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(600));
        assert!(waits(&mut b, Outcome::Failed, 5).iter().all(|&d| d == REFUSED_BACKOFF_MAX));
        assert_eq!(Backoff::new(5000 * MS, 1000 * MS).next(Outcome::Failed, 0.0), 1000 * MS);
    }

    #[test]
    fn jitter_only_shortens_a_wait() {
        let mut b = Backoff::new(1000 * MS, 1000 * MS);
        assert_eq!(b.next(Outcome::Failed, 0.5), 900 * MS);
        let w = b.next(Outcome::Failed, 0.999_999);
        assert!(w >= 800 * MS && w < 801 * MS, "{w:?}");
        assert_eq!(b.next(Outcome::Failed, 7.0), 800 * MS, "draws are clamped");
    }

    /// The defaults bring a slave back within the transient cap of its master's return, however
    /// long the master was away; the policy before issue 14 (5 s doubling to 60 s) could wait
    /// a minute. Virtual time: the attempts of a slave whose master is away 90 s.
    #[tokio::test(start_paused = true)]
    async fn with_the_defaults_a_slave_is_back_within_seconds_of_a_long_outage() {
        let o = crate::ha::slave::SlaveOptions::default();
        let mut b = Backoff::new(o.reconnect_backoff, o.reconnect_backoff_max);
        let start = tokio::time::Instant::now();
        let back = start + Duration::from_secs(90);
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(attempts < 1000, "bounded");
            if tokio::time::Instant::now() >= back {
                break;
            }
            tokio::time::sleep(b.next(Outcome::Failed, 0.0)).await;
        }
        let late = tokio::time::Instant::now() - back;
        assert!(late <= o.reconnect_backoff_max, "reconnected {late:?} after the master was back");
        assert!(o.reconnect_backoff_max <= Duration::from_secs(5), "{o:?}");
    }
}
