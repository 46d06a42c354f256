//! When the master appended its bytes, so the replica table's lag can be told in time (see
//! [`AppendTimes`]).

use std::collections::VecDeque;
use std::time::Duration;
use std::time::Instant;

/// Default number of entries kept by [`AppendTimes::default`].
pub(crate) const APPEND_TIMES_CAPACITY_DEFAULT: usize = 4096;

/// Default coalescing window of [`AppendTimes::default`].
pub(crate) const APPEND_TIMES_RESOLUTION_DEFAULT: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy)]
struct AppendEntry {
    end_offset: u64,
    /// When the last append coalesced into this entry happened.
    time: Instant,
}

/// When the master appended its bytes, so lag can be told in time: "the age of the oldest byte a
/// replica has not acked" is `now - time_of_first_unacked(ack)`.
///
/// Bounded memory: at most `capacity` entries of (end offset, time). Appends within
/// `resolution` of the first append of the newest entry extend that entry (its time becomes the
/// later append's), so the defaults (4096 entries, 10 ms) remember at least the last ~41 s of
/// continuous appends, and much longer when appends come in bursts.
///
/// Accuracy: the reported lag never exceeds the true lag. It is within one `resolution` of it
/// while the replica's first unacked byte is still remembered; for a replica further behind, the
/// time of the newest forgotten entry is used, a lower bound.
#[derive(Debug, Clone)]
pub(crate) struct AppendTimes {
    entries: VecDeque<AppendEntry>,
    /// When the first append coalesced into the newest entry happened.
    newest_since: Option<Instant>,
    /// The newest entry dropped to respect `capacity`.
    evicted: Option<AppendEntry>,
    capacity: usize,
    resolution: Duration,
}

impl Default for AppendTimes {
    fn default() -> Self {
        Self::new(APPEND_TIMES_CAPACITY_DEFAULT, APPEND_TIMES_RESOLUTION_DEFAULT)
    }
}

impl AppendTimes {
    /// An empty ring of at most `capacity` entries (at least 1), coalescing appends that fall
    /// within `resolution` of each other.
    pub(crate) fn new(capacity: usize, resolution: Duration) -> Self {
        let capacity = capacity.max(1);
        Self {
            entries: VecDeque::with_capacity(capacity),
            newest_since: None,
            evicted: None,
            capacity,
            resolution,
        }
    }

    /// Records that the log grew to `end_offset` at `now`. An `end_offset` not beyond the newest
    /// one recorded is ignored (the log only grows).
    pub(crate) fn record(&mut self, end_offset: u64, now: Instant) {
        let newest_end = self.entries.back().or(self.evicted.as_ref()).map(|e| e.end_offset);
        if newest_end.is_some_and(|end| end_offset <= end) {
            return;
        }
        if let (Some(newest), Some(since)) = (self.entries.back_mut(), self.newest_since)
            && now < since + self.resolution
        {
            newest.end_offset = end_offset;
            newest.time = newest.time.max(now);
            return;
        }
        let time = self.entries.back().map_or(now, |e| e.time.max(now));
        self.entries.push_back(AppendEntry { end_offset, time });
        self.newest_since = Some(now);
        if self.entries.len() > self.capacity {
            self.evicted = self.entries.pop_front();
        }
        debug_assert!(self.entries.len() <= self.capacity);
    }

    /// When the first byte at or after `ack_offset` was appended (an upper bound, see the type's
    /// docs); `None` when `ack_offset` is at or beyond everything recorded (caught up).
    pub(crate) fn time_of_first_unacked(&self, ack_offset: u64) -> Option<Instant> {
        let index = self.entries.partition_point(|e| e.end_offset <= ack_offset);
        let entry = self.entries.get(index)?;
        if index == 0
            && let Some(evicted) = self.evicted.filter(|e| ack_offset < e.end_offset)
        {
            return Some(evicted.time);
        }
        Some(entry.time)
    }

    /// Lag in time of a replica acked at `ack_offset`: the age at `now` of the oldest byte it has
    /// not acked, in whole milliseconds; 0 when it is caught up.
    pub(crate) fn lag_ms(&self, ack_offset: u64, now: Instant) -> u64 {
        self.time_of_first_unacked(ack_offset).map_or(0, |time| {
            u64::try_from(now.saturating_duration_since(time).as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// The number of entries held (at most the capacity).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing has been recorded since creation or the last `clear`.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets everything.
    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.newest_since = None;
        self.evicted = None;
    }
}
