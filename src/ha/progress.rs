//! The replica table: which replicas (slaves) are connected to this master, and for each one
//! everything the master knows of its progress — identity (address), where streaming started,
//! how far it was sent, how far it acknowledged, when, and at what rate — plus what follows from
//! that: the live watermark that `k` replicas have reached, `confirm_offset`, the in-sync count,
//! and lag in bytes and in time. It is the only per-replica record; the master's connection
//! bookkeeping (`ha::master`) keeps only what is about a connection (its id, its cancel token).
//!
//! Pure bookkeeping in the openraft manner: the connection tasks feed it events (`connect`,
//! `sent`, `ack`, `disconnect`) and read decisions back. It holds no clock (every call that needs
//! the time takes `now`), does no I/O and takes no lock. Its async owner is
//! [`super::group_transfer::SyncWaiters`].
//!
//! Definitions (reference §2.5, §8 items 1 and 13):
//!
//! - Only slaves are counted, never the master itself: `k = 1` means "one slave has it".
//! - A replica's ack counts only while its connection is open. [`AckTable::disconnect`] drops it
//!   at once, so the *live* watermark can fall. (Upstream's `push2SlaveMaxOffset` is a single max
//!   over all connections that is never reset; that is the bug this table exists to avoid.)
//! - Acks per replica never go backwards, and never go beyond what was sent on the replica's
//!   connection; such an ack is refused (the table is unchanged) and the caller closes the
//!   connection. What was sent never goes backwards either.
//! - An ack never counts beyond what its connection was sent, the first report included: a
//!   streamed replica's report (where it says its log ends) is kept as its ack offset for the
//!   status and the in-sync count, but it counts for no watermark until the replica acks a byte
//!   its connection was sent (an ack above where the stream started). From then on its ack
//!   counts whole: a slave's log is contiguous, so holding the bytes it was sent from the start
//!   on, it holds those below the start too. A reconnecting slave's report therefore confirms
//!   nothing by itself; what it already held is confirmed with the next bytes it is sent and
//!   acks (a put waiting on them meanwhile waits, or times out, it is never lost). A replica connected with
//!   [`AckTable::connect_stream`] (as the master does) has a sent offset; one connected with the
//!   plain `AckTable::connect` (watermark tests) has none, so only the backwards rule applies.
//! - `confirm_offset` is the highest live watermark ever observed, each observation using the `k`
//!   in force at that moment. It never decreases: not when a replica disconnects, and not when a
//!   mode switch raises `k` (the offset was confirmed under the rule of its time). When `k` is
//!   lowered it rises at the next observation. A fresh table starts at 0, or at a given value
//!   with `AckTable::with_confirm_offset` (a master term starts at the confirm offset its node
//!   knew, see `SyncWaiters::for_store`).
//! - "In sync" is [`is_in_sync`]; every caller (sync admission, status, metrics) uses it.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;
use std::time::Instant;

/// Identifies one replica in the table. The master assigns it (one per connection, or one per
/// peer IP with replica identity `ip`); the table treats it as opaque.
pub(crate) type ReplicaId = u64;

/// Why the table refused an event. Either way the table is unchanged and the caller should close
/// the offending connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProgressError {
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
    /// An ack beyond what was sent on the replica's connection: the report is forged or belongs
    /// to another stream.
    #[error("ack {offset} is beyond what this connection was sent ({sent_offset})")]
    BeyondSent {
        /// The replica that sent the ack.
        id: ReplicaId,
        /// What its connection was sent up to.
        sent_offset: u64,
        /// The refused ack.
        offset: u64,
    },
    /// A sent offset below the previous one (a bug in the caller: a stream only moves forward).
    #[error("replica {id} was sent up to {previous_offset}; {offset} would go backwards")]
    SentBackwards {
        /// The replica.
        id: ReplicaId,
        /// What was recorded as sent before.
        previous_offset: u64,
        /// The refused sent offset.
        offset: u64,
    },
}

/// How a replica's stream starts: the master's view of its first report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamStart {
    /// The slave's address (of this connection).
    pub(crate) address: SocketAddr,
    /// What the slave reported: it says it holds every byte below this offset (its ack offset
    /// until its next ack; it counts for no watermark, see the module docs).
    pub(crate) report: u64,
    /// Where the master starts sending (at or beyond the report).
    pub(crate) start: u64,
}

/// The window over which [`ReplicaView::bytes_per_sec`] is measured.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(1);

/// What the table knows about one connected replica (a copy, for status and metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ReplicaView {
    /// The replica.
    pub(crate) id: ReplicaId,
    /// The slave's address (`None` for a replica connected with the plain `AckTable::connect`).
    pub(crate) address: Option<SocketAddr>,
    /// Where streaming started on its current connection (the report, for a plain connect).
    pub(crate) first_offset: u64,
    /// The highest offset it has acknowledged (its reported max offset): it holds every byte
    /// below this offset.
    pub(crate) ack_offset: u64,
    /// What its connection has been sent up to, the frame being written included (`None` for a
    /// plain connect). Never below `ack_offset`.
    pub(crate) sent_offset: Option<u64>,
    /// When its latest ack (or its connection) was recorded.
    pub(crate) ack_time: Instant,
    /// When its latest ack after the connection was recorded (`None` before the first).
    pub(crate) last_ack: Option<Instant>,
    /// When its current connection was recorded.
    pub(crate) connected_since: Instant,
    /// Acked bytes per second over the last completed [`RATE_WINDOW`] (0 before the first).
    pub(crate) bytes_per_sec: f64,
}

#[derive(Debug, Clone, Copy)]
struct Replica {
    address: Option<SocketAddr>,
    first_offset: u64,
    ack_offset: u64,
    sent_offset: Option<u64>,
    ack_time: Instant,
    last_ack: Option<Instant>,
    connected_since: Instant,
    /// Start of the current rate window and the ack at that time.
    rate_since: (Instant, u64),
    bytes_per_sec: f64,
}

impl Replica {
    fn new(
        address: Option<SocketAddr>,
        first: u64,
        ack: u64,
        sent: Option<u64>,
        now: Instant,
    ) -> Self {
        Replica {
            address,
            first_offset: first,
            ack_offset: ack,
            sent_offset: sent,
            ack_time: now,
            last_ack: None,
            connected_since: now,
            rate_since: (now, ack),
            bytes_per_sec: 0.0,
        }
    }

    /// The ack the watermarks count: a streamed replica's only once it acked a byte its
    /// connection was sent (above where the stream started); a plain connect's always.
    fn counted_ack(&self) -> Option<u64> {
        match self.sent_offset {
            Some(_) if self.ack_offset <= self.first_offset => None,
            _ => Some(self.ack_offset),
        }
    }

    /// Closes the rate window when it is at least [`RATE_WINDOW`] old.
    fn advance_rate(&mut self, offset: u64, now: Instant) {
        let (since, from) = self.rate_since;
        let elapsed = now.saturating_duration_since(since);
        if elapsed >= RATE_WINDOW {
            self.bytes_per_sec = offset.saturating_sub(from) as f64 / elapsed.as_secs_f64();
            self.rate_since = (now, offset);
        }
    }
}

/// The ack table: per live replica its acked offset and ack time, plus `confirm_offset`.
/// See the module docs for the rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct AckTable {
    replicas: BTreeMap<ReplicaId, Replica>,
    confirm_offset: u64,
}

impl AckTable {
    /// An empty table with `confirm_offset` 0.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// An empty table whose `confirm_offset` starts at `confirm_offset` (e.g. from a checkpoint).
    pub(crate) fn with_confirm_offset(confirm_offset: u64) -> Self {
        Self { replicas: BTreeMap::new(), confirm_offset }
    }

    /// Records that replica `id` connected at `now`, holding every byte below `first_offset`
    /// (the offset it reported on connect; that report counts as its first ack). Nothing bounds
    /// its acks from above: the master uses [`Self::connect_stream`].
    ///
    /// If `id` is already connected, the newer connection wins: the old entry is replaced (its
    /// ack no longer counts) and returned.
    #[cfg(test)]
    pub(crate) fn connect(
        &mut self,
        id: ReplicaId,
        first_offset: u64,
        now: Instant,
    ) -> Option<ReplicaView> {
        let replica = Replica::new(None, first_offset, first_offset, None, now);
        self.replicas.insert(id, replica).map(|old| view(id, &old))
    }

    /// Records that replica `id` connected at `now` from `stream.address`, saying it holds
    /// every byte below `stream.report`, and that the master streams to it from `stream.start`
    /// (its sent offset until [`Self::sent`] moves it). The report is its ack offset but counts
    /// for no watermark until an ack above `stream.start` (see the module docs). Replaces and
    /// returns an old entry as `connect` (the plain form the watermark tests use) does.
    ///
    /// # Errors
    ///
    /// [`ProgressError::BeyondSent`] if the report is beyond the start (the table is unchanged).
    pub(crate) fn connect_stream(
        &mut self,
        id: ReplicaId,
        stream: StreamStart,
        now: Instant,
    ) -> Result<Option<ReplicaView>, ProgressError> {
        if stream.report > stream.start {
            return Err(ProgressError::BeyondSent {
                id,
                sent_offset: stream.start,
                offset: stream.report,
            });
        }
        let replica = Replica::new(
            Some(stream.address),
            stream.start,
            stream.report,
            Some(stream.start),
            now,
        );
        Ok(self.replicas.insert(id, replica).map(|old| view(id, &old)))
    }

    /// Records that replica `id`'s connection has been sent everything below `offset` (call
    /// before the frame is written, so an ack of it is never refused).
    ///
    /// # Errors
    ///
    /// [`ProgressError::UnknownReplica`] if `id` is not connected; [`ProgressError::SentBackwards`]
    /// if `offset` is below what was recorded. The table is unchanged in both cases.
    pub(crate) fn sent(&mut self, id: ReplicaId, offset: u64) -> Result<(), ProgressError> {
        let replica = self.replicas.get_mut(&id).ok_or(ProgressError::UnknownReplica { id })?;
        match replica.sent_offset {
            Some(previous_offset) if offset < previous_offset => {
                Err(ProgressError::SentBackwards { id, previous_offset, offset })
            }
            _ => {
                replica.sent_offset = Some(offset);
                debug_assert!(replica.ack_offset <= offset);
                Ok(())
            }
        }
    }

    /// Records that replica `id` acknowledged every byte below `offset` at `now`.
    ///
    /// An ack equal to the previous one (a heartbeat report) refreshes the ack time only.
    ///
    /// # Errors
    ///
    /// [`ProgressError::UnknownReplica`] if `id` is not connected; [`ProgressError::Backwards`]
    /// if `offset` is below its previous ack; [`ProgressError::BeyondSent`] if it is beyond what
    /// its connection was sent. The table is unchanged in every case.
    pub(crate) fn ack(
        &mut self,
        id: ReplicaId,
        offset: u64,
        now: Instant,
    ) -> Result<(), ProgressError> {
        let replica = self.replicas.get_mut(&id).ok_or(ProgressError::UnknownReplica { id })?;
        if offset < replica.ack_offset {
            return Err(ProgressError::Backwards {
                id,
                previous_offset: replica.ack_offset,
                offset,
            });
        }
        if let Some(sent_offset) = replica.sent_offset.filter(|&sent| offset > sent) {
            return Err(ProgressError::BeyondSent { id, sent_offset, offset });
        }
        replica.ack_offset = offset;
        replica.ack_time = now;
        replica.last_ack = Some(now);
        replica.advance_rate(offset, now);
        debug_assert!(replica.sent_offset.is_none_or(|sent| replica.ack_offset <= sent));
        Ok(())
    }

    /// Records, in one step, that replica `id`'s connection was sent everything below `sent`
    /// and that the replica acknowledged every byte below `offset` at `now` (the master's
    /// reader does this with each ack, handing over its writer's cursor).
    ///
    /// # Errors
    ///
    /// As [`AckTable::sent`] and [`AckTable::ack`], with the ack checked against `sent`. The
    /// table is unchanged in every case: nothing is recorded unless both are accepted.
    pub(crate) fn ack_sent(
        &mut self,
        id: ReplicaId,
        sent: u64,
        offset: u64,
        now: Instant,
    ) -> Result<(), ProgressError> {
        let replica = self.replicas.get(&id).ok_or(ProgressError::UnknownReplica { id })?;
        if let Some(previous_offset) = replica.sent_offset.filter(|&p| sent < p) {
            return Err(ProgressError::SentBackwards { id, previous_offset, offset: sent });
        }
        if offset >= replica.ack_offset && offset > sent {
            return Err(ProgressError::BeyondSent { id, sent_offset: sent, offset });
        }
        let before = *replica;
        self.sent(id, sent)?;
        let acked = self.ack(id, offset, now);
        if acked.is_err() {
            // Only `Backwards` is left, and it must change nothing.
            self.replicas.insert(id, before);
        }
        acked
    }

    /// Records that replica `id`'s connection closed: its ack stops counting at once. Returns
    /// whether it was connected (closing twice is harmless).
    pub(crate) fn disconnect(&mut self, id: ReplicaId) -> bool {
        self.replicas.remove(&id).is_some()
    }

    /// Moves replica `from`'s entry (its stream, sent and acked offsets, times) to `to`: the
    /// same connection turned out to be another replica (its registration arrived after its
    /// first report). An entry `to` had (an older connection of that replica) is replaced and
    /// returned, as [`Self::connect_stream`] replaces one.
    ///
    /// # Errors
    ///
    /// [`ProgressError::UnknownReplica`] if `from` is not connected (the table is unchanged).
    pub(crate) fn rekey(
        &mut self,
        from: ReplicaId,
        to: ReplicaId,
    ) -> Result<Option<ReplicaView>, ProgressError> {
        let replica =
            self.replicas.remove(&from).ok_or(ProgressError::UnknownReplica { id: from })?;
        Ok(self.replicas.insert(to, replica).map(|old| view(to, &old)))
    }

    /// The highest offset that at least `k` live replicas have acknowledged: the `k`-th highest
    /// counted ack among connected replicas (a streamed replica's first report does not count,
    /// see the module docs). `None` when fewer than `k` replicas have an ack that counts, and
    /// for `k = 0` (which asks for no ack at all, so no offset describes it).
    pub(crate) fn live_watermark(&self, k: usize) -> Option<u64> {
        if k == 0 || k > self.replicas.len() {
            return None;
        }
        let mut acks: Vec<u64> = self.replicas.values().filter_map(Replica::counted_ack).collect();
        if k > acks.len() {
            return None;
        }
        let (_, kth, _) = acks.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        Some(*kth)
    }

    /// Recomputes the live watermark for `k` (the `k` in force now), raises `confirm_offset` to it
    /// if it is higher, and returns it. Call after every event that changes the table.
    pub(crate) fn observe_watermark(&mut self, k: usize) -> Option<u64> {
        let watermark = self.live_watermark(k);
        if let Some(offset) = watermark {
            self.confirm_offset = self.confirm_offset.max(offset);
        }
        debug_assert!(watermark.is_none_or(|offset| offset <= self.confirm_offset));
        watermark
    }

    /// The highest live watermark observed so far; never decreases (see the module docs).
    pub(crate) fn confirm_offset(&self) -> u64 {
        self.confirm_offset
    }

    /// How many connected replicas are in sync: `master_max_offset - ack < gap_bytes_max`.
    pub(crate) fn in_sync_count(&self, master_max_offset: u64, gap_bytes_max: u64) -> usize {
        self.replicas
            .values()
            .filter(|r| is_in_sync(master_max_offset, r.ack_offset, gap_bytes_max))
            .count()
    }

    /// The number of connected replicas.
    #[cfg(test)]
    pub(crate) fn live_count(&self) -> usize {
        self.replicas.len()
    }

    /// The connected replica `id`, if any.
    #[cfg(test)]
    pub(crate) fn replica(&self, id: ReplicaId) -> Option<ReplicaView> {
        self.replicas.get(&id).map(|r| view(id, r))
    }

    /// Every connected replica, in id order.
    pub(crate) fn replicas(&self) -> impl Iterator<Item = ReplicaView> + '_ {
        self.replicas.iter().map(|(&id, r)| view(id, r))
    }
}

fn view(id: ReplicaId, r: &Replica) -> ReplicaView {
    ReplicaView {
        id,
        address: r.address,
        first_offset: r.first_offset,
        ack_offset: r.ack_offset,
        sent_offset: r.sent_offset,
        ack_time: r.ack_time,
        last_ack: r.last_ack,
        connected_since: r.connected_since,
        bytes_per_sec: r.bytes_per_sec,
    }
}

/// Bytes the master holds that a replica acked at `ack_offset` has not: `master_max_offset -
/// ack_offset`, or 0 if the ack is ahead (which the caller should have refused).
pub(crate) fn lag_bytes(master_max_offset: u64, ack_offset: u64) -> u64 {
    master_max_offset.saturating_sub(ack_offset)
}

/// Whether a replica acked at `ack_offset` is within `gap_bytes_max` of the master (strictly
/// less, as upstream's `haMaxGapNotInSync`). Connection state is the caller's concern. The one
/// definition of "in sync": admission, the in-sync count, status and metrics all use it.
pub(crate) fn is_in_sync(master_max_offset: u64, ack_offset: u64, gap_bytes_max: u64) -> bool {
    lag_bytes(master_max_offset, ack_offset) < gap_bytes_max
}

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

#[cfg(test)]
#[path = "progress_unit_tests.rs"]
mod tests;
