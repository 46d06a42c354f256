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
//! - An ack never counts beyond what was sent to its replica, the first report included (issue
//!   15). A replica counts as holding one contiguous run `[lo, ack)` of the log, nothing else:
//!   - A connection whose report is below where its stream starts (an empty slave started at
//!     the last file, `ha.empty-slave-start`) holds nothing below the start: `lo = start`.
//!   - Otherwise (report = start), if what its identity (the `ReplicaId`, which the master
//!     keeps per replica identity across connections) is still credited with covers the
//!     report (the run of an earlier connection starting at or below the report, and that
//!     identity was sent up to at least the report), the run goes on from there at once: `lo`
//!     is that run's. A slave that reconnects after its ack was lost confirms what it was sent.
//!   - Otherwise `lo = report`: a report of bytes the identity was never sent (a liar, or a
//!     slave that got them under another identity) counts for nothing below it.
//!   - A connection moved to another identity ([`AckTable::rekey`]) drops the credit it took
//!     as the one it was counted as (its run restarts at its own report and start) and may
//!     take the new identity's. Credit passed between identities ([`AckTable::inherit_unique`])
//!     goes only from one gone candidate whose credit alone covers the report.
//!   - Bytes below `term_start` (the log end when the master's term began) were sent in no
//!     connection of the term: a report at or below it counts from 0 once the replica acks a
//!     byte its connection was sent (it follows this stream; its log is contiguous). This is
//!     the one place a run may start below what the replica holds (a slave that joined an
//!     earlier term at the last file holds nothing below that start; a classic slave tells
//!     only its end): documented as an exception in docs/operations.md.
//!
//!   A streamed replica's run is empty until it acks above `lo`. A put completes when `k` runs
//!   each hold all of it ([`AckTable::holds`], [`AckTable::steps`]); `confirm_offset` rises
//!   only through bytes `k` runs hold without a gap from it ([`AckTable::live_watermark`]).
//!   What an identity is credited with after its connection went ([`HELD_CAP`] identities at
//!   most) lives as long as the table: one master term, in which the log is never truncated
//!   (a truncation ends the term, and the next term starts a new table). A replica connected
//!   with [`AckTable::connect_stream`] (as the master does) has a sent offset; one connected
//!   with the plain `AckTable::connect` (watermark tests) has none and holds from 0.
//! - `confirm_offset` is the highest live watermark ever observed, each observation using the `k`
//!   in force at that moment (with every run starting at 0, the `k`-th highest ack). It never
//!   decreases: not when a replica disconnects, and not when a mode switch raises `k` (the offset
//!   was confirmed under the rule of its time). When `k` is lowered it rises at the next
//!   observation. A fresh table starts at 0, or at a given value with [`AckTable::for_term`] (a
//!   master term starts at the confirm offset its node knew, see `SyncWaiters::for_store`).
//! - "In sync" is [`is_in_sync`]; every caller (sync admission, status, metrics) uses it.
//! - Voters (issue 17, invariant A): with a voter set ([`AckTable::set_voters`]) only the
//!   replicas in it count, for everything above (steps, `holds`, the watermarks and
//!   `confirm_offset`, the in-sync count); the others are kept and shown, their acks checked
//!   as any, but they complete no put. Which replica ids are voters is the master's to say (it
//!   knows the identities: a replica registered with a voter's data-dir id); it marks a new
//!   entry in the same step that creates or moves it ([`AckTable::mark_voter`]), so an entry
//!   never counts under its predecessor's mark. Without a set (`None`) every replica counts.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;
use std::time::Instant;

mod append_times;
pub(crate) use append_times::AppendTimes;

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
pub struct StreamStart {
    /// The slave's address (of this connection).
    pub address: SocketAddr,
    /// What the slave reported: it says it holds every byte below this offset (its ack offset
    /// until its next ack; what it counts for, see the module docs).
    pub report: u64,
    /// Where the master starts sending (at or beyond the report).
    pub start: u64,
}

/// The window over which [`ReplicaView::bytes_per_sec`] is measured.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(1);

/// What the table knows about one connected replica (a copy, for status and metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaView {
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
    /// Whether its acks count (false only when a voter set leaves it out).
    pub(crate) voter: bool,
}

#[derive(Debug, Clone, Copy)]
struct Replica {
    address: Option<SocketAddr>,
    first_offset: u64,
    /// Its credited run starts here: it is counted as holding `[lo, ack_offset)` (nothing when
    /// `ack_offset <= lo`; a plain connect has `lo = 0`). See the module docs.
    lo: u64,
    /// What `lo` becomes at its first ack above `first_offset` (the connection then follows
    /// this stream): 0 for a report at or below the term's start (bytes no connection of the
    /// term was sent), else `lo` itself.
    lo_on_follow: u64,
    /// `(lo, lo_on_follow)` on its own, without any credit of an earlier connection: what
    /// [`AckTable::rekey`] restarts the run from when the credit was another identity's.
    own: (u64, u64),
    /// Its first report (where it said its log ends).
    report: u64,
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
        (first, lo, lo_on_follow): (u64, u64, u64),
        own: (u64, u64),
        ack: u64,
        sent: Option<u64>,
        now: Instant,
    ) -> Self {
        debug_assert!(lo_on_follow <= lo && own.1 <= own.0);
        Replica {
            address,
            first_offset: first,
            lo,
            lo_on_follow,
            own,
            report: ack,
            ack_offset: ack,
            sent_offset: sent,
            ack_time: now,
            last_ack: None,
            connected_since: now,
            rate_since: (now, ack),
            bytes_per_sec: 0.0,
        }
    }

    /// The run the watermarks count, `(lo, ack)`: the replica holds `[lo, ack)`. A streamed
    /// replica counts only with a run that is not empty; a plain connect always (from 0).
    fn counted(&self) -> Option<(u64, u64)> {
        match self.sent_offset {
            Some(_) if self.ack_offset <= self.lo => None,
            _ => Some((self.lo, self.ack_offset)),
        }
    }

    /// What its identity keeps of it when this connection goes.
    fn held(&self, seq: u64) -> Held {
        let sent = self.sent_offset.unwrap_or(self.ack_offset);
        Held { lo: self.lo, lo_on_follow: self.lo_on_follow, sent, seq }
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

/// What a replica identity is still credited with after its connection went (see the module
/// docs): its run started at `lo` (`lo_on_follow` once a connection follows) and it was sent
/// everything below `sent`. `seq` orders entries for eviction beyond [`HELD_CAP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    lo: u64,
    lo_on_follow: u64,
    sent: u64,
    seq: u64,
}

/// The most identities whose credit the table keeps after their connection went; beyond it the
/// one kept longest is forgotten (its next connection then starts from its report).
pub(crate) const HELD_CAP: usize = 1024;

/// The ack table: per live replica its acked offset and ack time, plus `confirm_offset`.
/// See the module docs for the rules.
#[derive(Debug, Clone, Default)]
pub struct AckTable {
    replicas: BTreeMap<ReplicaId, Replica>,
    confirm_offset: u64,
    /// The master's log end when its term began: bytes below it were not appended in this term.
    term_start: u64,
    /// Per identity whose connection went: what it is still credited with.
    held: BTreeMap<ReplicaId, Held>,
    held_seq: u64,
    /// The replicas whose acks count (None: every one). See the module docs.
    voters: Option<std::collections::BTreeSet<ReplicaId>>,
}

impl AckTable {
    /// An empty table with `confirm_offset` 0 and a term that began with an empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table for a master term that began with the log ending at `term_start`, whose
    /// `confirm_offset` starts at `confirm_offset` (e.g. from a checkpoint).
    pub fn for_term(confirm_offset: u64, term_start: u64) -> Self {
        Self { confirm_offset, term_start, ..Self::default() }
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
        let replica = Replica::new(None, (first_offset, 0, 0), (0, 0), first_offset, None, now);
        let old = self.replicas.insert(id, replica);
        old.map(|old| view(id, &old, self.counts(id)))
    }

    /// Records that replica `id` connected at `now` from `stream.address`, saying it holds
    /// every byte below `stream.report`, and that the master streams to it from `stream.start`
    /// (its sent offset until [`Self::sent`] moves it). The report is its ack offset; what it
    /// is counted as holding follows the module docs. An old entry of `id` is replaced and
    /// returned, as `connect` (the plain form the watermark tests use) does; what it was
    /// credited with is kept for `id` first.
    ///
    /// # Errors
    ///
    /// [`ProgressError::BeyondSent`] if the report is beyond the start (the table is unchanged).
    pub fn connect_stream(
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
        if let Some(old) = self.replicas.get(&id).copied() {
            self.keep_held(id, &old);
        }
        let run = self.run_for(id, stream);
        let (_, own_lo, own_follow) = self.own_run(stream);
        let replica = Replica::new(
            Some(stream.address),
            run,
            (own_lo, own_follow),
            stream.report,
            Some(stream.start),
            now,
        );
        let old = self.replicas.insert(id, replica);
        Ok(old.map(|old| view(id, &old, self.counts(id))))
    }

    /// Where a new stream's credited run starts, `(start, lo, lo_on_follow)`: see the module
    /// docs.
    fn run_for(&self, id: ReplicaId, stream: StreamStart) -> (u64, u64, u64) {
        let StreamStart { report, start, .. } = stream;
        if report < start {
            // It holds nothing of [report, start), and the run must be contiguous.
            return (start, start, start);
        }
        match self.held.get(&id) {
            Some(h) if h.lo <= report && report <= h.sent => (start, h.lo, h.lo_on_follow),
            _ => self.own_run(stream),
        }
    }

    /// Where a new stream's run starts on its own, without any identity's credit: as
    /// [`Self::run_for`] with nothing held.
    fn own_run(&self, stream: StreamStart) -> (u64, u64, u64) {
        let StreamStart { report, start, .. } = stream;
        if report < start {
            (start, start, start)
        } else if report <= self.term_start {
            (start, report, 0)
        } else {
            (start, report, report)
        }
    }

    /// Whether what `id` is still credited with (its connection went) covers a report of
    /// `report`: its run starts at or below it and `id` was sent up to at least it.
    fn covers(&self, id: ReplicaId, report: u64) -> bool {
        self.held.get(&id).is_some_and(|h| h.lo <= report && report <= h.sent)
    }

    /// Keeps what `replica` (the entry of `id` that is going) is credited with, for `id`'s
    /// next connection; forgets the entry kept longest beyond [`HELD_CAP`].
    fn keep_held(&mut self, id: ReplicaId, replica: &Replica) {
        if replica.sent_offset.is_none() {
            return;
        }
        self.held_seq += 1;
        self.held.insert(id, replica.held(self.held_seq));
        if self.held.len() > HELD_CAP
            && let Some((&oldest, _)) = self.held.iter().min_by_key(|(_, h)| h.seq)
        {
            self.held.remove(&oldest);
        }
        debug_assert!(self.held.len() <= HELD_CAP);
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
        if offset > replica.first_offset {
            // It acked a byte its connection was sent: it follows this stream.
            replica.lo = replica.lo_on_follow;
        }
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
    pub fn ack_sent(
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
        let Some(old) = self.replicas.remove(&id) else { return false };
        self.keep_held(id, &old);
        true
    }

    /// Moves replica `from`'s entry (its stream, sent and acked offsets, times) to `to`: the
    /// same connection turned out to be another replica (its registration arrived after its
    /// first report). An entry `to` had (an older connection of that replica) is replaced and
    /// returned, as [`Self::connect_stream`] replaces one. The moved entry drops any credit it
    /// took as `from` (that was `from`'s, another replica's): its run restarts where its own
    /// report and stream put it, and it takes what `to` is still credited with when that covers
    /// its report (as a new connection of `to` would).
    ///
    /// # Errors
    ///
    /// [`ProgressError::UnknownReplica`] if `from` is not connected (the table is unchanged).
    pub(crate) fn rekey(
        &mut self,
        from: ReplicaId,
        to: ReplicaId,
    ) -> Result<Option<ReplicaView>, ProgressError> {
        let mut replica =
            self.replicas.remove(&from).ok_or(ProgressError::UnknownReplica { id: from })?;
        let old = self.replicas.remove(&to);
        if let Some(old) = &old {
            self.keep_held(to, old);
        }
        let (own_lo, own_follow) = replica.own;
        replica.lo_on_follow = own_follow;
        replica.lo = if replica.ack_offset > replica.first_offset { own_follow } else { own_lo };
        self.credit_from(&mut replica, to);
        self.replicas.insert(to, replica);
        Ok(old.map(|old| view(to, &old, self.counts(to))))
    }

    /// Gives connected replica `to` what `from` (whose connection went) is still credited
    /// with, when that covers `to`'s report, as if `to` were a newer connection of `from`'s
    /// identity (the master does this for `ha.replica-identity = "connection"`, where every
    /// connection is its own replica, between connections of one address). Returns whether
    /// `to`'s run changed.
    pub(crate) fn inherit(&mut self, to: ReplicaId, from: ReplicaId) -> bool {
        let Some(mut replica) = self.replicas.get(&to).copied() else { return false };
        let lo = replica.lo;
        self.credit_from(&mut replica, from);
        self.replicas.insert(to, replica);
        replica.lo != lo
    }

    /// Gives connected replica `to` the credit of the one of `candidates` (replicas whose
    /// connection went) whose credit covers `to`'s report, when exactly one does; with none or
    /// several (two slaves whose runs both fit: which one `to` is cannot be told) nothing is
    /// given. Returns the candidate whose credit `to` took, if any.
    pub(crate) fn inherit_unique(
        &mut self,
        to: ReplicaId,
        candidates: &[ReplicaId],
    ) -> Option<ReplicaId> {
        let replica = self.replicas.get(&to)?;
        if replica.report < replica.first_offset {
            return None;
        }
        let report = replica.report;
        let mut covering = candidates.iter().copied().filter(|&c| self.covers(c, report));
        let (Some(from), None) = (covering.next(), covering.next()) else { return None };
        self.inherit(to, from);
        Some(from)
    }

    /// Lowers `replica`'s run start to what `id` is still credited with, if that covers its
    /// report (see [`Self::run_for`]); never raises it.
    fn credit_from(&self, replica: &mut Replica, id: ReplicaId) {
        let Some(address) = replica.address.filter(|_| self.held.contains_key(&id)) else {
            return;
        };
        let (report, start) = (replica.report, replica.first_offset);
        let (_, lo, lo_on_follow) = self.run_for(id, StreamStart { address, report, start });
        replica.lo_on_follow = replica.lo_on_follow.min(lo_on_follow);
        replica.lo =
            if replica.ack_offset > start { replica.lo_on_follow } else { replica.lo.min(lo) };
        debug_assert!(replica.lo_on_follow <= replica.lo);
    }

    /// Where at least `k` live replicas hold the log, as steps `(lo, watermark)` by ascending
    /// `lo`: `k` replicas each hold every byte of `[lo, watermark)` (each counted replica holds
    /// its run `[lo_i, ack_i)`, see the module docs; a step's watermark is the `k`-th highest
    /// ack among the replicas whose run starts at or below its `lo`). Watermarks never fall
    /// from one step to the next. Empty when fewer than `k` replicas count, and for `k = 0`.
    /// O(n log n) in the live replicas.
    pub fn steps(&self, k: usize) -> Vec<(u64, u64)> {
        if k == 0 || k > self.replicas.len() {
            return Vec::new();
        }
        let mut runs: Vec<(u64, u64)> = self.counting().filter_map(Replica::counted).collect();
        runs.sort_unstable();
        // The k highest acks among the runs seen so far; its minimum is the watermark.
        let mut top: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(k + 1);
        let mut steps: Vec<(u64, u64)> = Vec::new();
        for (i, &(lo, ack)) in runs.iter().enumerate() {
            top.push(Reverse(ack));
            if top.len() > k {
                top.pop();
            }
            let last_of_lo = runs.get(i + 1).is_none_or(|next| next.0 != lo);
            if let (true, true, Some(&Reverse(watermark))) =
                (last_of_lo, top.len() == k, top.peek())
            {
                debug_assert!(steps.last().is_none_or(|&(_, w)| w <= watermark));
                steps.push((lo, watermark));
            }
        }
        steps
    }

    /// Whether at least `k` live replicas each hold every byte of `put` (`k = 0` asks for no
    /// replica). O(n) in the live replicas.
    pub fn holds(&self, k: usize, put: &Range<u64>) -> bool {
        let holding = self
            .counting()
            .filter_map(Replica::counted)
            .filter(|&(lo, ack)| lo <= put.start && put.end <= ack)
            .count();
        holding >= k
    }

    /// The highest offset `k` live replicas hold without a gap from the confirm offset (or from
    /// below it) on: the highest watermark of a step whose run starts at or below what the
    /// steps before it reach. `None` when no step reaches back to the confirm offset. With
    /// every run starting at 0 (plain connects) it is the `k`-th highest ack.
    pub(crate) fn live_watermark(&self, k: usize) -> Option<u64> {
        let mut reach = self.confirm_offset;
        let mut watermark = None;
        for (lo, step) in self.steps(k) {
            if lo > reach {
                break;
            }
            reach = reach.max(step);
            watermark = Some(step);
        }
        watermark
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
    /// Only replicas whose acks count are counted (see [`Self::set_voters`]).
    pub(crate) fn in_sync_count(&self, master_max_offset: u64, gap_bytes_max: u64) -> usize {
        self.counting()
            .filter(|r| is_in_sync(master_max_offset, r.ack_offset, gap_bytes_max))
            .count()
    }

    /// The live replicas whose acks count.
    fn counting(&self) -> impl Iterator<Item = &Replica> + '_ {
        self.replicas.iter().filter(|(id, _)| self.counts(**id)).map(|(_, r)| r)
    }

    /// Whether replica `id`'s acks count: always without a voter set, else when it is in it.
    pub(crate) fn counts(&self, id: ReplicaId) -> bool {
        self.voters.as_ref().is_none_or(|v| v.contains(&id))
    }

    /// Restricts the replicas whose acks count to `voters` (None: every replica counts, the
    /// rule without a coordinator). Call [`Self::observe_watermark`] after it.
    pub(crate) fn set_voters(&mut self, voters: Option<std::collections::BTreeSet<ReplicaId>>) {
        self.voters = voters;
    }

    /// Marks replica id `id` as a voter or not; nothing without a voter set (every replica
    /// counts then).
    pub(crate) fn mark_voter(&mut self, id: ReplicaId, voter: bool) {
        if let Some(v) = &mut self.voters {
            if voter {
                v.insert(id);
            } else {
                v.remove(&id);
            }
        }
        debug_assert!(self.voters.is_none() || self.counts(id) == voter);
    }

    /// The number of connected replicas.
    #[cfg(test)]
    pub(crate) fn live_count(&self) -> usize {
        self.replicas.len()
    }

    /// The connected replica `id`, if any.
    #[cfg(test)]
    pub(crate) fn replica(&self, id: ReplicaId) -> Option<ReplicaView> {
        self.replicas.get(&id).map(|r| view(id, r, self.counts(id)))
    }

    /// Every connected replica, in id order.
    pub(crate) fn replicas(&self) -> impl Iterator<Item = ReplicaView> + '_ {
        self.replicas.iter().map(|(&id, r)| view(id, r, self.counts(id)))
    }
}

fn view(id: ReplicaId, r: &Replica, voter: bool) -> ReplicaView {
    ReplicaView {
        voter,
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

#[cfg(test)]
#[path = "progress_unit_tests.rs"]
mod tests;
