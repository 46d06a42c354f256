//! The ack table: which replicas (slaves) are connected to this master, how far each one has
//! acknowledged, and what follows from that — the live watermark that `k` replicas have reached,
//! `confirm_offset`, the in-sync count, and lag in bytes and in time.
//!
//! Pure bookkeeping in the openraft manner: the connection tasks feed it events (`connect`, `ack`,
//! `disconnect`) and read decisions back. It holds no clock (every call that needs the time takes
//! `now`), does no I/O and takes no lock. Its async owner is
//! [`super::group_transfer::SyncWaiters`].
//!
//! Definitions (reference §2.5, §8 items 1 and 13):
//!
//! - Only slaves are counted, never the master itself: `k = 1` means "one slave has it".
//! - A replica's ack counts only while its connection is open. [`AckTable::disconnect`] drops it
//!   at once, so the *live* watermark can fall. (Upstream's `push2SlaveMaxOffset` is a single max
//!   over all connections that is never reset; that is the bug this table exists to avoid.)
//! - Acks per replica never go backwards; a backwards ack is refused and the caller closes the
//!   connection. Checking "not beyond what was sent on this connection" is the caller's job: the
//!   table does not know what was sent.
//! - `confirm_offset` is the highest live watermark ever observed, each observation using the `k`
//!   in force at that moment. It never decreases: not when a replica disconnects, and not when a
//!   mode switch raises `k` (the offset was confirmed under the rule of its time). When `k` is
//!   lowered it rises at the next observation. A fresh table starts at 0, or at a recovered value
//!   given to [`AckTable::with_confirm_offset`].

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::time::Duration;
use std::time::Instant;

/// Identifies one replica in the table. The master assigns it (one per connection, or one per
/// peer IP with replica identity `ip`); the table treats it as opaque.
pub type ReplicaId = u64;

/// Why the table refused an event. Either way the table is unchanged and the caller should close
/// the offending connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    /// An ack for a replica that is not connected (never connected, or already disconnected).
    #[error("replica {id} is not connected")]
    UnknownReplica {
        /// The replica named in the ack.
        id: ReplicaId,
    },
    /// An ack below the replica's previous ack: its log went backwards or the report is forged.
    #[error("replica {id} acked offset {offset}, below its previous ack {previous_offset}")]
    Backwards {
        /// The replica that sent the ack.
        id: ReplicaId,
        /// Its ack before this one.
        previous_offset: u64,
        /// The refused ack.
        offset: u64,
    },
}

/// What the table knows about one connected replica (a copy, for status and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaView {
    /// The replica.
    pub id: ReplicaId,
    /// The highest offset it has acknowledged (its reported max offset): it holds every byte
    /// below this offset.
    pub ack_offset: u64,
    /// When its latest ack (or its connection) was recorded.
    pub ack_time: Instant,
    /// When its current connection was recorded.
    pub connected_since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Replica {
    ack_offset: u64,
    ack_time: Instant,
    connected_since: Instant,
}

/// The ack table: per live replica its acked offset and ack time, plus `confirm_offset`.
/// See the module docs for the rules.
#[derive(Debug, Clone, Default)]
pub struct AckTable {
    replicas: BTreeMap<ReplicaId, Replica>,
    confirm_offset: u64,
}

impl AckTable {
    /// An empty table with `confirm_offset` 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose `confirm_offset` starts at `confirm_offset` (e.g. from a checkpoint).
    pub fn with_confirm_offset(confirm_offset: u64) -> Self {
        Self { replicas: BTreeMap::new(), confirm_offset }
    }

    /// Records that replica `id` connected at `now`, holding every byte below `first_offset`
    /// (the offset it reported on connect; that report counts as its first ack).
    ///
    /// If `id` is already connected, the newer connection wins: the old entry is replaced (its
    /// ack no longer counts) and returned.
    pub fn connect(
        &mut self,
        id: ReplicaId,
        first_offset: u64,
        now: Instant,
    ) -> Option<ReplicaView> {
        let replica = Replica { ack_offset: first_offset, ack_time: now, connected_since: now };
        self.replicas.insert(id, replica).map(|old| view(id, &old))
    }

    /// Records that replica `id` acknowledged every byte below `offset` at `now`.
    ///
    /// An ack equal to the previous one (a heartbeat report) only refreshes the ack time.
    ///
    /// # Errors
    ///
    /// [`ProgressError::UnknownReplica`] if `id` is not connected; [`ProgressError::Backwards`]
    /// if `offset` is below its previous ack. The table is unchanged in both cases.
    pub fn ack(&mut self, id: ReplicaId, offset: u64, now: Instant) -> Result<(), ProgressError> {
        let replica = self.replicas.get_mut(&id).ok_or(ProgressError::UnknownReplica { id })?;
        if offset < replica.ack_offset {
            return Err(ProgressError::Backwards {
                id,
                previous_offset: replica.ack_offset,
                offset,
            });
        }
        replica.ack_offset = offset;
        replica.ack_time = now;
        Ok(())
    }

    /// Records that replica `id`'s connection closed: its ack stops counting at once. Returns
    /// whether it was connected (closing twice is harmless).
    pub fn disconnect(&mut self, id: ReplicaId) -> bool {
        self.replicas.remove(&id).is_some()
    }

    /// The highest offset that at least `k` live replicas have acknowledged: the `k`-th highest
    /// ack among connected replicas. `None` when fewer than `k` replicas are connected, and for
    /// `k = 0` (which asks for no ack at all, so no offset describes it).
    pub fn live_watermark(&self, k: usize) -> Option<u64> {
        if k == 0 || k > self.replicas.len() {
            return None;
        }
        let mut acks: Vec<u64> = self.replicas.values().map(|r| r.ack_offset).collect();
        let (_, kth, _) = acks.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        Some(*kth)
    }

    /// Recomputes the live watermark for `k` (the `k` in force now), raises `confirm_offset` to it
    /// if it is higher, and returns it. Call after every event that changes the table.
    pub fn observe_watermark(&mut self, k: usize) -> Option<u64> {
        let watermark = self.live_watermark(k);
        if let Some(offset) = watermark {
            self.confirm_offset = self.confirm_offset.max(offset);
        }
        debug_assert!(watermark.is_none_or(|offset| offset <= self.confirm_offset));
        watermark
    }

    /// The highest live watermark observed so far; never decreases (see the module docs).
    pub fn confirm_offset(&self) -> u64 {
        self.confirm_offset
    }

    /// How many connected replicas are in sync: `master_max_offset - ack < gap_bytes_max`.
    pub fn in_sync_count(&self, master_max_offset: u64, gap_bytes_max: u64) -> usize {
        self.replicas
            .values()
            .filter(|r| is_in_sync(master_max_offset, r.ack_offset, gap_bytes_max))
            .count()
    }

    /// The number of connected replicas.
    pub fn live_count(&self) -> usize {
        self.replicas.len()
    }

    /// The connected replica `id`, if any.
    pub fn replica(&self, id: ReplicaId) -> Option<ReplicaView> {
        self.replicas.get(&id).map(|r| view(id, r))
    }

    /// Every connected replica, in id order.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaView> + '_ {
        self.replicas.iter().map(|(&id, r)| view(id, r))
    }
}

fn view(id: ReplicaId, replica: &Replica) -> ReplicaView {
    ReplicaView {
        id,
        ack_offset: replica.ack_offset,
        ack_time: replica.ack_time,
        connected_since: replica.connected_since,
    }
}

/// Bytes the master holds that a replica acked at `ack_offset` has not: `master_max_offset -
/// ack_offset`, or 0 if the ack is ahead (which the caller should have refused).
pub fn lag_bytes(master_max_offset: u64, ack_offset: u64) -> u64 {
    master_max_offset.saturating_sub(ack_offset)
}

/// Whether a replica acked at `ack_offset` is within `gap_bytes_max` of the master (strictly
/// less, as upstream's `haMaxGapNotInSync`). Connection state is the caller's concern.
pub fn is_in_sync(master_max_offset: u64, ack_offset: u64, gap_bytes_max: u64) -> bool {
    lag_bytes(master_max_offset, ack_offset) < gap_bytes_max
}

/// Default number of entries kept by [`AppendTimes::default`].
pub const APPEND_TIMES_CAPACITY_DEFAULT: usize = 4096;

/// Default coalescing window of [`AppendTimes::default`].
pub const APPEND_TIMES_RESOLUTION_DEFAULT: Duration = Duration::from_millis(10);

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
pub struct AppendTimes {
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
    pub fn new(capacity: usize, resolution: Duration) -> Self {
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
    /// one recorded is ignored (the log only grows; after a truncation call [`Self::clear`]).
    pub fn record(&mut self, end_offset: u64, now: Instant) {
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
    pub fn time_of_first_unacked(&self, ack_offset: u64) -> Option<Instant> {
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
    pub fn lag_ms(&self, ack_offset: u64, now: Instant) -> u64 {
        self.time_of_first_unacked(ack_offset).map_or(0, |time| {
            u64::try_from(now.saturating_duration_since(time).as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// The number of entries held (at most the capacity).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing has been recorded since creation or the last [`Self::clear`].
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets everything (after a truncation or a change of role).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.newest_since = None;
        self.evicted = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// Three replicas acked at 100, 300 and 200.
    fn three(base: Instant) -> AckTable {
        let mut table = AckTable::new();
        table.connect(1, 0, base);
        table.connect(2, 0, base);
        table.connect(3, 0, base);
        table.ack(1, 100, at(base, 1)).unwrap();
        table.ack(2, 300, at(base, 2)).unwrap();
        table.ack(3, 200, at(base, 3)).unwrap();
        table
    }

    #[test]
    fn watermark_is_kth_highest_ack() {
        let table = three(Instant::now());
        assert_eq!(table.live_watermark(1), Some(300));
        assert_eq!(table.live_watermark(2), Some(200));
        assert_eq!(table.live_watermark(3), Some(100));
        assert_eq!(table.live_watermark(4), None);
        assert_eq!(table.live_watermark(0), None);
    }

    #[test]
    fn fewer_live_replicas_than_k_gives_none() {
        let base = Instant::now();
        let mut table = AckTable::new();
        assert_eq!(table.live_watermark(1), None);
        table.connect(7, 50, base);
        assert_eq!(table.live_watermark(1), Some(50));
        assert_eq!(table.live_watermark(2), None);
    }

    #[test]
    fn disconnect_lowers_live_watermark_but_not_confirm_offset() {
        let base = Instant::now();
        let mut table = three(base);
        assert_eq!(table.observe_watermark(1), Some(300));
        assert_eq!(table.confirm_offset(), 300);

        assert!(table.disconnect(2));
        assert_eq!(table.observe_watermark(1), Some(200));
        assert_eq!(table.live_watermark(3), None);
        assert_eq!(table.confirm_offset(), 300);
        assert!(!table.disconnect(2), "closing twice is harmless");
        assert_eq!(table.ack(2, 400, at(base, 9)), Err(ProgressError::UnknownReplica { id: 2 }));
    }

    #[test]
    fn confirm_offset_under_changing_k() {
        let mut table = three(Instant::now());
        assert_eq!(table.observe_watermark(2), Some(200));
        assert_eq!(table.confirm_offset(), 200);
        // Raising k lowers the watermark; what was confirmed stays confirmed.
        assert_eq!(table.observe_watermark(3), Some(100));
        assert_eq!(table.confirm_offset(), 200);
        // Lowering k raises it.
        assert_eq!(table.observe_watermark(1), Some(300));
        assert_eq!(table.confirm_offset(), 300);
        assert_eq!(AckTable::with_confirm_offset(42).confirm_offset(), 42);
    }

    #[test]
    fn backwards_ack_is_refused_and_changes_nothing() {
        let base = Instant::now();
        let mut table = three(base);
        let err = table.ack(2, 299, at(base, 10)).unwrap_err();
        assert_eq!(err, ProgressError::Backwards { id: 2, previous_offset: 300, offset: 299 });
        assert_eq!(err.to_string(), "replica 2 acked offset 299, below its previous ack 300");
        let view = table.replica(2).unwrap();
        assert_eq!((view.ack_offset, view.ack_time), (300, at(base, 2)));
        // An equal ack is a heartbeat: accepted, refreshes the time.
        table.ack(2, 300, at(base, 11)).unwrap();
        assert_eq!(table.replica(2).unwrap().ack_time, at(base, 11));
    }

    #[test]
    fn reconnect_replaces_the_old_entry() {
        let base = Instant::now();
        let mut table = three(base);
        let old = table.connect(2, 150, at(base, 20)).unwrap();
        assert_eq!(old.ack_offset, 300);
        let new = table.replica(2).unwrap();
        assert_eq!((new.ack_offset, new.connected_since), (150, at(base, 20)));
        assert_eq!(table.live_count(), 3);
        assert_eq!(table.live_watermark(1), Some(200));
        let ids: Vec<_> = table.replicas().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn in_sync_counts_connected_replicas_within_the_gap() {
        let mut table = three(Instant::now());
        // master at 400: lags are 300, 100, 200.
        assert_eq!(table.in_sync_count(400, 100), 0, "gap must be strictly less");
        assert_eq!(table.in_sync_count(400, 101), 1);
        assert_eq!(table.in_sync_count(400, 201), 2);
        assert_eq!(table.in_sync_count(400, 301), 3);
        table.disconnect(1);
        assert_eq!(table.in_sync_count(400, 301), 2);
        assert!(is_in_sync(256, 0, 257));
        assert!(!is_in_sync(256, 0, 256));
        assert_eq!(lag_bytes(400, 100), 300);
        assert_eq!(lag_bytes(100, 400), 0);
    }

    #[test]
    fn append_times_give_the_age_of_the_first_unacked_byte() {
        let base = Instant::now();
        let mut times = AppendTimes::new(16, Duration::from_millis(10));
        times.record(100, at(base, 0));
        times.record(200, at(base, 100));
        times.record(300, at(base, 200));
        assert_eq!(times.time_of_first_unacked(0), Some(at(base, 0)));
        assert_eq!(times.time_of_first_unacked(99), Some(at(base, 0)));
        assert_eq!(times.time_of_first_unacked(100), Some(at(base, 100)));
        assert_eq!(times.time_of_first_unacked(250), Some(at(base, 200)));
        assert_eq!(times.time_of_first_unacked(300), None);
        assert_eq!(times.lag_ms(100, at(base, 350)), 250);
        assert_eq!(times.lag_ms(300, at(base, 350)), 0);
        times.record(300, at(base, 400)); // not beyond the newest: ignored
        assert_eq!(times.len(), 3);
        times.clear();
        assert!(times.is_empty());
        assert_eq!(times.time_of_first_unacked(0), None);
    }

    #[test]
    fn append_times_coalesce_within_the_resolution() {
        let base = Instant::now();
        let mut times = AppendTimes::new(16, Duration::from_millis(10));
        times.record(100, at(base, 0));
        times.record(200, at(base, 5));
        times.record(300, at(base, 9));
        times.record(400, at(base, 10));
        assert_eq!(times.len(), 2);
        // Bytes of the coalesced entry report its last append: lag is never overstated.
        assert_eq!(times.time_of_first_unacked(50), Some(at(base, 9)));
        assert_eq!(times.time_of_first_unacked(300), Some(at(base, 10)));
    }

    #[test]
    fn append_times_stay_bounded_and_under_report_beyond_the_window() {
        let base = Instant::now();
        let mut times = AppendTimes::new(3, Duration::from_millis(1));
        for i in 1..=5 {
            times.record(i * 100, at(base, i * 10));
        }
        assert_eq!(times.len(), 3);
        // Entries 300, 400, 500 remain; 200 (t = 20) was the newest evicted.
        assert_eq!(times.time_of_first_unacked(250), Some(at(base, 30)));
        assert_eq!(times.time_of_first_unacked(150), Some(at(base, 20)));
        assert_eq!(times.time_of_first_unacked(0), Some(at(base, 20)));
        assert_eq!(times.time_of_first_unacked(450), Some(at(base, 50)));
    }
}
