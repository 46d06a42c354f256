//! Sync-put waiters: a put in SYNC mode waits until `k` live replicas have acknowledged its end
//! offset, or until its own deadline.
//!
//! Two layers:
//!
//! - [`GroupTransfer`], pure: waiters indexed by `(k, end offset)` and by deadline. An ack
//!   completes every waiter whose put `k` live replicas hold, in one pass per step of the
//!   table ([`AckTable::steps`]: no head-of-line blocking, reference §8 item 4); each waiter
//!   expires on its own deadline. No clock: the caller passes `now`.
//! - [`SyncWaiters`], a thin async owner of the [`AckTable`] (the replica table) and the
//!   [`GroupTransfer`] behind one `std::sync::Mutex` (never held across an await). Connection
//!   tasks report connect, sent, ack and disconnect to it; each report completes the waiters it
//!   satisfies in the same call. One timer task ([`SyncWaiters::run_expiry`]) sleeps exactly
//!   until the earliest deadline. Nothing polls and nothing sleeps a fixed time (reference §8
//!   item 3).
//!
//! Time: the pure layer uses `std::time::Instant`. `SyncWaiters` reads `tokio::time::Instant`
//! (so tests can pause and advance time) and hands the pure layer its `into_std()`.
//!
//! Outcomes (reference §2.1, §2.7): `PutOk` once `k` live replicas hold the put (each has it in its
//! counted run, see [`super::progress`]: acked at or beyond its end, the run starting at or below
//! its start); `FlushSlaveTimeout` at the deadline; `SlaveNotAvailable` at once, without waiting,
//! when fewer than `k` replicas are in sync at admission; `ServiceNotAvailable` ("outcome unknown")
//! at shutdown, loss of the master role, or a re-promotion to a new epoch (its plane restarts).
//! A waiter keeps the `k` it was admitted with: a mode switch applies to new puts, and waiters
//! already waiting run to their own outcome.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::PoisonError;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;
use std::time::Instant;

use tokio::sync::Notify;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::progress::AckTable;
use super::progress::ProgressError;
use super::progress::ReplicaId;
use super::progress::ReplicaView;
use super::progress::StreamStart;

/// How a sync put's wait for replicas ended. In every case the message is stored on the master.
///
/// Each maps to RocketMQ's `PutMessageStatus` of the same name and to a response code
/// (`response_code`, pinned by the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferStatus {
    /// `k` live replicas acknowledged the put's end offset. `PUT_OK`, response code 0.
    PutOk,
    /// The deadline (`slave-timeout`) passed first. `FLUSH_SLAVE_TIMEOUT`, response code 12.
    FlushSlaveTimeout,
    /// Fewer than `k` replicas were in sync at admission, so the put did not wait.
    /// `SLAVE_NOT_AVAILABLE`, response code 11.
    SlaveNotAvailable,
    /// Shutdown or loss of the master role ended the wait: whether the replicas got the message is
    /// unknown. `SERVICE_NOT_AVAILABLE`, response code 14.
    ServiceNotAvailable,
}

impl TransferStatus {
    /// The RocketMQ remoting response code (`ResponseCode` / `SUCCESS`) for this status.
    #[cfg(test)]
    pub(crate) fn response_code(self) -> i32 {
        match self {
            Self::PutOk => 0,
            Self::SlaveNotAvailable => 11,
            Self::FlushSlaveTimeout => 12,
            Self::ServiceNotAvailable => 14,
        }
    }

    /// The RocketMQ `PutMessageStatus` name, e.g. `FLUSH_SLAVE_TIMEOUT`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::PutOk => "PUT_OK",
            Self::FlushSlaveTimeout => "FLUSH_SLAVE_TIMEOUT",
            Self::SlaveNotAvailable => "SLAVE_NOT_AVAILABLE",
            Self::ServiceNotAvailable => "SERVICE_NOT_AVAILABLE",
        }
    }
}

impl fmt::Display for TransferStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one waiter of a [`GroupTransfer`]; ids are issued in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(u64);

/// A waiter that finished, and how.
pub type Completion = (WaiterId, TransferStatus);

/// The waiters of one `k`: (end offset, id) -> (start offset, deadline).
type Group = BTreeMap<(u64, WaiterId), (u64, Instant)>;

/// The pure waiter queue. See the module docs.
///
/// Waiters are grouped by the `k` they were admitted with (usually one group; two while a mode
/// switch drains), each group ordered by `(end offset, id)`, so completing is one `split_off` per
/// group and step of the table a range scan. A second index by `(deadline, id)` makes expiry a
/// pop from the front.
#[derive(Debug, Default)]
pub struct GroupTransfer {
    next_id: u64,
    /// k -> (end offset, id) -> (start offset, deadline).
    by_k: BTreeMap<usize, Group>,
    /// (deadline, id) -> (k, end offset).
    by_deadline: BTreeMap<(Instant, WaiterId), (usize, u64)>,
}

impl GroupTransfer {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a waiter for a put of the bytes `put` that needs `k` live replicas holding all of
    /// them, and gives up at `deadline`. A waiter with `k = 0` needs no ack and completes
    /// `PutOk` at the next progress call.
    pub fn add_put(&mut self, put: Range<u64>, k: usize, deadline: Instant) -> WaiterId {
        debug_assert!(put.start <= put.end);
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        self.by_k.entry(k).or_default().insert((put.end, id), (put.start, deadline));
        self.by_deadline.insert((deadline, id), (k, put.end));
        debug_assert_eq!(self.len(), self.by_k.values().map(BTreeMap::len).sum::<usize>());
        id
    }

    /// [`Self::add_put`] for the bytes `0..end_offset` (watermark tests).
    #[cfg(test)]
    pub(crate) fn add(&mut self, end_offset: u64, k: usize, deadline: Instant) -> WaiterId {
        self.add_put(0..end_offset, k, deadline)
    }

    /// Completes `PutOk` every waiter whose put `k` live replicas of `table` hold, for its own
    /// `k`. Call after every event that changes the table.
    pub fn on_progress(&mut self, table: &AckTable) -> Vec<Completion> {
        self.on_steps(|k| table.steps(k))
    }

    /// Like [`Self::on_progress`], with every replica's run starting at 0 and the watermark for
    /// each `k` given by `watermark(k)` (the highest offset at least `k` live replicas acked,
    /// `None` if fewer than `k` are live).
    #[cfg(test)]
    pub(crate) fn on_watermarks(
        &mut self,
        mut watermark: impl FnMut(usize) -> Option<u64>,
    ) -> Vec<Completion> {
        self.on_steps(|k| watermark(k).map(|w| vec![(0, w)]).unwrap_or_default())
    }

    /// Like [`Self::on_progress`], with the table's steps for each `k` given by `steps(k)`
    /// ([`AckTable::steps`]), asked once per distinct `k` among the waiters: a waiter completes
    /// when a step's `lo` is at or below its start and its end is at or below that step's
    /// watermark. Completions come by `k`, then step, then end offset.
    pub(crate) fn on_steps(
        &mut self,
        mut steps: impl FnMut(usize) -> Vec<(u64, u64)>,
    ) -> Vec<Completion> {
        let mut done = Vec::new();
        let Self { by_k, by_deadline, .. } = self;
        by_k.retain(|&k, group| {
            let steps = if k == 0 { vec![(0, u64::MAX)] } else { steps(k) };
            for (lo, watermark) in steps {
                // Puts ending at or above `lo` and at or below the watermark; those starting
                // below `lo` (at most one, as puts do not overlap) are not held by this step.
                let ready: Vec<(u64, WaiterId)> = group
                    .range((lo, WaiterId(0))..)
                    .take_while(|((end_offset, _), _)| *end_offset <= watermark)
                    .filter(|(_, (start, _))| *start >= lo)
                    .map(|(key, _)| *key)
                    .collect();
                for (end_offset, id) in ready {
                    let (_, deadline) = group.remove(&(end_offset, id)).expect("just seen");
                    let removed = by_deadline.remove(&(deadline, id));
                    debug_assert_eq!(removed, Some((k, end_offset)));
                    done.push((id, TransferStatus::PutOk));
                }
            }
            !group.is_empty()
        });
        done
    }

    /// Completes `FlushSlaveTimeout` every waiter whose deadline is at or before `now`, earliest
    /// deadline first. Waiters with `now < deadline` stay.
    pub fn expire(&mut self, now: Instant) -> Vec<Completion> {
        let mut done = Vec::new();
        while let Some(entry) = self.by_deadline.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((deadline, id), (k, end_offset)) = entry.remove_entry();
            self.remove_from_group(k, end_offset, id, deadline);
            done.push((id, TransferStatus::FlushSlaveTimeout));
        }
        done
    }

    fn remove_from_group(&mut self, k: usize, end_offset: u64, id: WaiterId, deadline: Instant) {
        let group = self.by_k.get_mut(&k).expect("every waiter is in the group of its k");
        let removed = group.remove(&(end_offset, id));
        debug_assert_eq!(removed.map(|(_, d)| d), Some(deadline));
        if group.is_empty() {
            self.by_k.remove(&k);
        }
    }

    /// The earliest deadline among the waiters, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first_key_value().map(|((deadline, _), _)| *deadline)
    }

    /// Completes every remaining waiter `ServiceNotAvailable` (shutdown, or loss of the master
    /// role), earliest deadline first. The queue is empty afterwards.
    pub(crate) fn shutdown(&mut self) -> Vec<Completion> {
        self.by_k.clear();
        let done = std::mem::take(&mut self.by_deadline)
            .into_keys()
            .map(|(_, id)| (id, TransferStatus::ServiceNotAvailable))
            .collect();
        debug_assert!(self.is_empty());
        done
    }

    /// The number of waiters still waiting.
    pub fn len(&self) -> usize {
        self.by_deadline.len()
    }

    /// Whether no waiter is waiting.
    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }
}

/// The answer of [`SyncWaiters::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Already decided without waiting: `PutOk` (enough replicas had acked, or `k = 0`).
    Done(TransferStatus),
    /// Refused without waiting: `SlaveNotAvailable` (fewer than `k` in sync) or
    /// `ServiceNotAvailable` (shut down).
    Rejected(TransferStatus),
    /// Admitted: await the outcome.
    Wait(TransferWait),
}

impl Admission {
    /// The outcome, waiting if the put was admitted.
    pub(crate) async fn outcome(self) -> TransferStatus {
        match self {
            Self::Done(status) | Self::Rejected(status) => status,
            Self::Wait(wait) => wait.await,
        }
    }
}

/// The outcome of an admitted put. Resolves `ServiceNotAvailable` if the [`SyncWaiters`] is
/// dropped without completing it. Dropping it early is harmless: the waiter leaves the queue at
/// its own outcome (at latest its deadline).
#[derive(Debug)]
pub struct TransferWait {
    receiver: oneshot::Receiver<TransferStatus>,
}

impl Future for TransferWait {
    type Output = TransferStatus;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TransferStatus> {
        Pin::new(&mut self.receiver)
            .poll(cx)
            .map(|received| received.unwrap_or(TransferStatus::ServiceNotAvailable))
    }
}

#[derive(Debug)]
struct State {
    table: AckTable,
    transfer: GroupTransfer,
    senders: HashMap<WaiterId, oneshot::Sender<TransferStatus>>,
    /// The `k` in force, used to advance `confirm_offset`.
    confirm_k: usize,
    closed: bool,
}

impl State {
    /// After a table change: advance `confirm_offset` and take the satisfied waiters.
    fn progress(&mut self) -> Vec<(oneshot::Sender<TransferStatus>, TransferStatus)> {
        self.table.observe_watermark(self.confirm_k);
        let done = self.transfer.on_progress(&self.table);
        self.take_senders(done)
    }

    fn take_senders(
        &mut self,
        done: Vec<Completion>,
    ) -> Vec<(oneshot::Sender<TransferStatus>, TransferStatus)> {
        let senders = &mut self.senders;
        let ready: Vec<_> = done
            .into_iter()
            .map(|(id, status)| (senders.remove(&id).expect("one sender per waiter"), status))
            .collect();
        debug_assert_eq!(self.senders.len(), self.transfer.len());
        ready
    }
}

fn send_all(ready: Vec<(oneshot::Sender<TransferStatus>, TransferStatus)>) {
    for (sender, status) in ready {
        // The receiver may be gone (the put's caller gave up); nothing to do then.
        let _ = sender.send(status);
    }
}

/// Far enough in the future to mean "never", as tokio's own far-future sleeps.
const DEADLINE_NEVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The async owner of the ack table and the waiters. See the module docs.
///
/// One per master term: on shutdown or loss of the master role call [`Self::shutdown`]; a node
/// that becomes master again builds a new one.
#[derive(Debug)]
pub struct SyncWaiters {
    state: Mutex<State>,
    /// Where `confirm_offset` is published (and persisted), if anywhere: raised under the state
    /// lock, so a reader that saw the table's confirm offset sees the store's at least as high.
    store: Option<Arc<crate::store::CommitLog>>,
    /// Wakes the expiry task when a deadline earlier than every other is added.
    earlier_deadline: Notify,
}

impl SyncWaiters {
    /// An empty table and queue; `confirm_offset` follows the watermark for `sync_ack_replicas`.
    pub fn new(sync_ack_replicas: usize) -> Self {
        Self::with_table(AckTable::new(), sync_ack_replicas)
    }

    /// Like [`Self::new`] with a given table (e.g. one starting at a recovered `confirm_offset`).
    pub(crate) fn with_table(table: AckTable, sync_ack_replicas: usize) -> Self {
        let state = State {
            table,
            transfer: GroupTransfer::new(),
            senders: HashMap::new(),
            confirm_k: sync_ack_replicas,
            closed: false,
        };
        Self { state: Mutex::new(state), store: None, earlier_deadline: Notify::new() }
    }

    /// A master term's waiters: `confirm_offset` starts at the store's (what the node knew:
    /// persisted, or learned as a slave) and every raise is published to the store, which
    /// persists it with the checkpoint and caps reads in SYNC mode at it. The term starts at
    /// the store's max offset (see `AckTable::for_term`).
    pub(crate) fn for_store(store: Arc<crate::store::CommitLog>, sync_ack_replicas: usize) -> Self {
        let table = AckTable::for_term(store.confirm_offset(), store.max_offset());
        Self { store: Some(store), ..Self::with_table(table, sync_ack_replicas) }
    }

    /// Publishes the table's confirm offset to the store (under the state lock).
    fn publish_confirm(&self, state: &State) {
        if let Some(store) = &self.store {
            store.raise_confirm_offset(state.table.confirm_offset());
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a sync put of the bytes `put` that needs `k` live replicas holding them, waiting
    /// at most `timeout`. `master_max_offset` and `gap_bytes_max` decide which replicas are in
    /// sync.
    ///
    /// In order: after [`Self::shutdown`], `Rejected(ServiceNotAvailable)`; if `k = 0` or `k` live
    /// replicas already hold `put` ([`AckTable::holds`]), `Done(PutOk)`; if fewer than `k` replicas
    /// are in sync, `Rejected(SlaveNotAvailable)`; otherwise `Wait`. (Acked-already is checked
    /// before the in-sync count: a put that is on `k` replicas is replicated, however far the log
    /// has grown since.)
    pub fn admit(
        &self,
        put: Range<u64>,
        k: usize,
        timeout: Duration,
        master_max_offset: u64,
        gap_bytes_max: u64,
    ) -> Admission {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now + DEADLINE_NEVER).into_std();
        let mut state = self.lock();
        if state.closed {
            return Admission::Rejected(TransferStatus::ServiceNotAvailable);
        }
        if k == 0 || state.table.holds(k, &put) {
            return Admission::Done(TransferStatus::PutOk);
        }
        if state.table.in_sync_count(master_max_offset, gap_bytes_max) < k {
            return Admission::Rejected(TransferStatus::SlaveNotAvailable);
        }
        let earliest = state.transfer.next_deadline().is_none_or(|next| deadline < next);
        let id = state.transfer.add_put(put, k, deadline);
        let (sender, receiver) = oneshot::channel();
        state.senders.insert(id, sender);
        drop(state);
        if earliest {
            self.earlier_deadline.notify_one();
        }
        Admission::Wait(TransferWait { receiver })
    }

    fn update<R>(&self, change: impl FnOnce(&mut AckTable, Instant) -> R) -> R {
        let now = tokio::time::Instant::now().into_std();
        let (result, ready) = {
            let mut state = self.lock();
            let result = change(&mut state.table, now);
            let ready = state.progress();
            self.publish_confirm(&state);
            (result, ready)
        };
        send_all(ready);
        result
    }

    /// Replica `id` connected holding every byte below `first_offset` (`AckTable::connect`);
    /// completes the waiters this satisfies.
    #[cfg(test)]
    pub(crate) fn on_connect(&self, id: ReplicaId, first_offset: u64) {
        self.update(|table, now| table.connect(id, first_offset, now));
    }

    /// Replica `id` started streaming ([`AckTable::connect_stream`]), a voter or not (see
    /// [`AckTable::mark_voter`]; marked in the same step, so the new entry never counts under
    /// its predecessor's mark); completes the waiters this satisfies and returns the entry of
    /// an older connection it replaced.
    ///
    /// # Errors
    ///
    /// As [`AckTable::connect_stream`]; the caller should close the connection.
    pub fn on_stream_start(
        &self,
        id: ReplicaId,
        stream: StreamStart,
        voter: bool,
    ) -> Result<Option<ReplicaView>, ProgressError> {
        self.update(|table, now| {
            let started = table.connect_stream(id, stream, now);
            if started.is_ok() {
                table.mark_voter(id, voter);
            }
            started
        })
    }

    /// Replica `id`'s connection was sent everything below `offset` ([`AckTable::sent`]). No
    /// watermark depends on it, so no waiter completes.
    ///
    /// # Errors
    ///
    /// As [`AckTable::sent`].
    pub(crate) fn on_sent(&self, id: ReplicaId, offset: u64) -> Result<(), ProgressError> {
        self.lock().table.sent(id, offset)
    }

    /// Replica `id`'s connection was sent everything below `sent` and the replica acked
    /// `offset`: both recorded in one step ([`AckTable::sent`], then [`AckTable::ack`], which
    /// checks the ack against it); completes the waiters this satisfies.
    ///
    /// # Errors
    ///
    /// As [`AckTable::sent`] and [`AckTable::ack`]; the caller should close the connection. A
    /// refused `sent` records no ack.
    pub fn on_ack_sent(&self, id: ReplicaId, sent: u64, offset: u64) -> Result<(), ProgressError> {
        self.update(|table, now| table.ack_sent(id, sent, offset, now))
    }

    /// Replica `id` acked `offset` ([`AckTable::ack`]); completes the waiters this satisfies.
    ///
    /// # Errors
    ///
    /// As [`AckTable::ack`]; the caller should close the connection.
    #[cfg(test)]
    pub(crate) fn on_ack(&self, id: ReplicaId, offset: u64) -> Result<(), ProgressError> {
        self.update(|table, now| table.ack(id, offset, now))
    }

    /// Replica `id`'s connection closed ([`AckTable::disconnect`]); returns whether it was
    /// connected. Waiters keep waiting: the replica may come back before their deadlines.
    pub(crate) fn on_disconnect(&self, id: ReplicaId) -> bool {
        self.update(|table, _| table.disconnect(id))
    }

    /// Replica `from`'s connection is replica `to` ([`AckTable::rekey`]), a voter or not (marked
    /// in the same step); completes the waiters this satisfies (the entry may take its
    /// identity's credit) and returns the entry it replaced.
    ///
    /// # Errors
    ///
    /// As [`AckTable::rekey`].
    pub(crate) fn on_rekey(
        &self,
        from: ReplicaId,
        to: ReplicaId,
        voter: bool,
    ) -> Result<Option<ReplicaView>, ProgressError> {
        self.update(|table, _| {
            let moved = table.rekey(from, to);
            if moved.is_ok() {
                table.mark_voter(to, voter);
            }
            moved
        })
    }

    /// Marks replica `id` as a voter or not ([`AckTable::mark_voter`]); completes the waiters
    /// this satisfies.
    pub(crate) fn mark_voter(&self, id: ReplicaId, voter: bool) {
        self.update(|table, _| table.mark_voter(id, voter));
    }

    /// Restricts the replicas whose acks count to `voters` (None: every one counts, see
    /// [`AckTable::set_voters`]); completes the waiters this satisfies.
    pub(crate) fn set_voters(&self, voters: Option<std::collections::BTreeSet<ReplicaId>>) {
        self.update(|table, _| table.set_voters(voters));
    }

    /// Connected replica `to` takes the credit of the one of `candidates` whose credit covers
    /// its report, if exactly one does ([`AckTable::inherit_unique`]); completes the waiters
    /// this satisfies. Returns the candidate taken.
    pub(crate) fn on_inherit_unique(
        &self,
        to: ReplicaId,
        candidates: &[ReplicaId],
    ) -> Option<ReplicaId> {
        self.update(|table, _| table.inherit_unique(to, candidates))
    }

    /// Sets the `k` in force after a mode switch, for `confirm_offset` (waiters keep their own).
    pub(crate) fn set_sync_ack_replicas(&self, k: usize) {
        let mut state = self.lock();
        state.confirm_k = k;
        state.table.observe_watermark(k);
        self.publish_confirm(&state);
    }

    /// The highest offset `k` live replicas have acked, over time; never decreases.
    pub(crate) fn confirm_offset(&self) -> u64 {
        self.lock().table.confirm_offset()
    }

    /// Reads the table (for status and metrics) under the lock; keep `read` short.
    pub(crate) fn read_table<R>(&self, read: impl FnOnce(&AckTable) -> R) -> R {
        read(&self.lock().table)
    }

    /// The number of puts waiting.
    pub fn pending_count(&self) -> usize {
        self.lock().transfer.len()
    }

    /// Completes `FlushSlaveTimeout` every waiter whose deadline has passed; returns when the next
    /// one falls due. [`Self::run_expiry`] calls this; it is public for callers with their own
    /// timer.
    pub fn expire_due(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now().into_std();
        let (ready, next) = {
            let mut state = self.lock();
            let done = state.transfer.expire(now);
            (state.take_senders(done), state.transfer.next_deadline())
        };
        send_all(ready);
        next.map(tokio::time::Instant::from_std)
    }

    /// The expiry timer: sleeps until the earliest deadline (woken early when an earlier one is
    /// added), expires what is due, repeats. Run exactly one per `SyncWaiters`. When `shutdown`
    /// is cancelled it calls [`Self::shutdown`] and returns, so no waiter is left hanging.
    pub(crate) async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let next = self.expire_due();
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.earlier_deadline.notified() => {}
                () = sleep_until_or_forever(next) => {}
            }
        }
        self.shutdown();
    }

    /// Completes every waiter `ServiceNotAvailable` and makes later admits return
    /// `Rejected(ServiceNotAvailable)`. For process shutdown and for loss of the master role.
    /// Acks may still be reported; they change the table only.
    pub(crate) fn shutdown(&self) {
        let ready = {
            let mut state = self.lock();
            state.closed = true;
            let done = state.transfer.shutdown();
            state.take_senders(done)
        };
        send_all(ready);
    }

    /// Whether [`Self::shutdown`] was called.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

async fn sleep_until_or_forever(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn ids(done: &[Completion]) -> Vec<WaiterId> {
        done.iter().map(|(id, _)| *id).collect()
    }

    fn table_with(acks: &[(ReplicaId, u64)], now: Instant) -> AckTable {
        let mut table = AckTable::new();
        for &(id, offset) in acks {
            table.connect(id, offset, now);
        }
        table
    }

    #[test]
    fn one_ack_completes_every_waiter_at_or_below_the_watermark_in_one_pass() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        // Out-of-order arrival: 300, then 100, then 200, then 400 above the watermark.
        let w300 = waiters.add(300, 1, at(base, 5000));
        let w100 = waiters.add(100, 1, at(base, 1000));
        let w200 = waiters.add(200, 1, at(base, 9000));
        let w400 = waiters.add(400, 1, at(base, 100));
        let mut table = table_with(&[(1, 0)], base);
        assert!(waiters.on_progress(&table).is_empty());

        table.ack(1, 300, at(base, 1)).unwrap();
        let done = waiters.on_progress(&table);
        assert_eq!(ids(&done), [w100, w200, w300]);
        assert!(done.iter().all(|(_, status)| *status == TransferStatus::PutOk));
        assert_eq!(waiters.len(), 1);
        assert_eq!(waiters.next_deadline(), Some(at(base, 100)));
        assert!(waiters.on_progress(&table).is_empty(), "nothing completes twice");

        table.ack(1, 400, at(base, 2)).unwrap();
        assert_eq!(waiters.on_progress(&table), [(w400, TransferStatus::PutOk)]);
        assert!(waiters.is_empty());
        assert_eq!(waiters.next_deadline(), None);
    }

    #[test]
    fn a_slow_head_does_not_block_later_waiters() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let head = waiters.add(500, 1, at(base, 10));
        let behind = waiters.add(100, 1, at(base, 5000));
        let table = table_with(&[(1, 100)], base);
        assert_eq!(waiters.on_progress(&table), [(behind, TransferStatus::PutOk)]);
        assert_eq!(waiters.expire(at(base, 10)), [(head, TransferStatus::FlushSlaveTimeout)]);
    }

    #[test]
    fn expiry_is_at_the_deadline_and_not_before() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let early = waiters.add(100, 1, at(base, 1000));
        let late = waiters.add(50, 1, at(base, 2000));
        assert!(waiters.expire(at(base, 999)).is_empty());
        assert_eq!(waiters.expire(at(base, 1000)), [(early, TransferStatus::FlushSlaveTimeout)]);
        assert_eq!(waiters.next_deadline(), Some(at(base, 2000)));
        assert!(waiters.expire(at(base, 1999)).is_empty());
        assert_eq!(waiters.expire(at(base, 2500)), [(late, TransferStatus::FlushSlaveTimeout)]);
        assert!(waiters.is_empty());
        // An expired waiter is gone: progress cannot complete it again.
        assert!(waiters.on_progress(&table_with(&[(1, 1000)], base)).is_empty());
    }

    /// Issue 15: with runs that do not start at 0, a waiter completes only on a step whose run
    /// holds all of its put, never on an ack above a put that lies below a run's start.
    #[test]
    fn a_waiter_completes_only_on_a_step_that_holds_its_whole_put() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let low = waiters.add_put(0..100, 1, at(base, 1000));
        let gap = waiters.add_put(200..400, 1, at(base, 1000));
        let across = waiters.add_put(450..550, 1, at(base, 1000));
        let held = waiters.add_put(500..550, 1, at(base, 1000));
        let above = waiters.add_put(550..700, 1, at(base, 1000));
        let done = waiters.on_steps(|_| vec![(0, 300), (500, 600)]);
        assert_eq!(ids(&done), [low, held]);
        assert_eq!(waiters.len(), 3);
        let done = waiters.on_steps(|_| vec![(0, 300), (450, 700)]);
        assert_eq!(ids(&done), [across, above]);
        let done = waiters.expire(at(base, 1000));
        assert_eq!(done, [(gap, TransferStatus::FlushSlaveTimeout)]);
    }

    #[test]
    fn waiters_admitted_under_different_k_use_their_own_watermark() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let k1 = waiters.add(200, 1, at(base, 5000));
        let k2 = waiters.add(200, 2, at(base, 5000));
        let k2_low = waiters.add(100, 2, at(base, 5000));
        // One replica at 300, one at 150: watermark 300 for k = 1, 150 for k = 2.
        let mut table = table_with(&[(1, 300), (2, 150)], base);
        assert_eq!(
            waiters.on_progress(&table),
            [(k1, TransferStatus::PutOk), (k2_low, TransferStatus::PutOk)]
        );
        assert_eq!(waiters.len(), 1);
        table.ack(2, 199, at(base, 1)).unwrap();
        assert!(waiters.on_progress(&table).is_empty());
        table.ack(2, 200, at(base, 2)).unwrap();
        assert_eq!(waiters.on_progress(&table), [(k2, TransferStatus::PutOk)]);
    }

    #[test]
    fn k_zero_needs_no_ack() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let id = waiters.add(u64::MAX, 0, at(base, 1));
        assert_eq!(waiters.on_progress(&AckTable::new()), [(id, TransferStatus::PutOk)]);
    }

    #[test]
    fn watermark_at_u64_max_completes_everything() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let a = waiters.add(u64::MAX, 1, at(base, 1));
        let b = waiters.add(7, 1, at(base, 1));
        assert_eq!(ids(&waiters.on_watermarks(|_| Some(u64::MAX))), [b, a]);
    }

    #[test]
    fn shutdown_completes_all_with_service_not_available() {
        let base = Instant::now();
        let mut waiters = GroupTransfer::new();
        let a = waiters.add(100, 1, at(base, 300));
        let b = waiters.add(200, 2, at(base, 100));
        let c = waiters.add(300, 1, at(base, 200));
        let done = waiters.shutdown();
        assert_eq!(ids(&done), [b, c, a]);
        assert!(done.iter().all(|(_, s)| *s == TransferStatus::ServiceNotAvailable));
        assert!(waiters.is_empty());
        assert_eq!(waiters.next_deadline(), None);
        assert!(waiters.expire(at(base, 1000)).is_empty());
    }

    #[test]
    fn statuses_map_to_rocketmq_codes() {
        assert_eq!(TransferStatus::PutOk.response_code(), 0);
        assert_eq!(TransferStatus::SlaveNotAvailable.response_code(), 11);
        assert_eq!(TransferStatus::FlushSlaveTimeout.response_code(), 12);
        assert_eq!(TransferStatus::ServiceNotAvailable.response_code(), 14);
        assert_eq!(TransferStatus::FlushSlaveTimeout.to_string(), "FLUSH_SLAVE_TIMEOUT");
    }
}
