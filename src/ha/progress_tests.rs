//! `ha::progress` and `ha::group_transfer` through their public API: the async `SyncWaiters`
//! under paused tokio time, and a model-checked interleaving of connect/ack/disconnect/add/expire.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::task::Poll;
use std::task::Waker;
use std::time::Duration;
use std::time::Instant;

use crate::ha::group_transfer::Admission;
use crate::ha::group_transfer::GroupTransfer;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::group_transfer::TransferStatus;
use crate::ha::group_transfer::TransferWait;
use crate::ha::group_transfer::WaiterId;
use crate::ha::progress::AckTable;
use crate::ha::progress::ProgressError;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

const GAP_BYTES_MAX: u64 = 256 * 1024 * 1024;
const SLAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Polls once without a runtime: the outcome if it is already decided.
fn poll_now(wait: &mut TransferWait) -> Option<TransferStatus> {
    match Pin::new(wait).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(status) => Some(status),
        Poll::Pending => None,
    }
}

/// Awaits `wait`, failing (instead of hanging) if nothing decides it within a virtual minute.
async fn decided(wait: TransferWait) -> TransferStatus {
    let limit = Duration::from_secs(60);
    tokio::time::timeout(limit, wait).await.expect("the wait was never decided")
}

fn expect_wait(admission: Admission) -> TransferWait {
    match admission {
        Admission::Wait(wait) => wait,
        other => panic!("expected to wait, got {other:?}"),
    }
}

fn admit(waiters: &SyncWaiters, end_offset: u64, k: usize, master_max_offset: u64) -> Admission {
    waiters.admit(0..end_offset, k, SLAVE_TIMEOUT, master_max_offset, GAP_BYTES_MAX)
}

#[tokio::test(start_paused = true)]
async fn ack_completes_the_wait_in_the_same_call() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 0);
    let mut wait = expect_wait(admit(&waiters, 100, 1, 100));
    assert_eq!(poll_now(&mut wait), None);

    waiters.on_ack(1, 99).unwrap();
    assert_eq!(poll_now(&mut wait), None, "99 is below the end offset");
    waiters.on_ack(1, 100).unwrap();
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk));
    assert_eq!(waiters.pending_count(), 0);
    assert_eq!(waiters.confirm_offset(), 100);
}

#[tokio::test(start_paused = true)]
async fn too_few_in_sync_is_rejected_at_once() {
    let waiters = SyncWaiters::new(1);
    // No replica at all.
    assert_eq!(admit(&waiters, 100, 1, 100).outcome().await, TransferStatus::SlaveNotAvailable);
    // One replica, but k = 2.
    waiters.on_connect(1, 0);
    assert!(matches!(
        admit(&waiters, 100, 2, 100),
        Admission::Rejected(TransferStatus::SlaveNotAvailable)
    ));
    // One replica further behind than the gap: connected but not in sync.
    let master_max_offset = GAP_BYTES_MAX + 10;
    let admission = admit(&waiters, master_max_offset, 1, master_max_offset);
    assert!(matches!(admission, Admission::Rejected(TransferStatus::SlaveNotAvailable)));
    assert_eq!(waiters.pending_count(), 0, "a rejected put never waits");
}

#[tokio::test(start_paused = true)]
async fn already_acked_is_done_without_waiting() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 500);
    assert!(matches!(admit(&waiters, 400, 1, 10_000), Admission::Done(TransferStatus::PutOk)));
    assert!(matches!(admit(&waiters, 900, 0, 10_000), Admission::Done(TransferStatus::PutOk)));
    assert_eq!(waiters.pending_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn timeout_is_flush_slave_timeout_at_the_deadline_and_not_before() {
    let waiters = Arc::new(SyncWaiters::new(1));
    let token = CancellationToken::new();
    let timer = tokio::spawn(waiters.clone().run_expiry(token.clone()));
    waiters.on_connect(1, 0);
    let start = tokio::time::Instant::now();
    let wait = expect_wait(admit(&waiters, 100, 1, 100));
    let outcome = tokio::spawn(async move { (decided(wait).await, tokio::time::Instant::now()) });

    tokio::time::sleep(SLAVE_TIMEOUT - Duration::from_millis(1)).await;
    assert!(!outcome.is_finished(), "no outcome 1 ms before the deadline");
    assert_eq!(waiters.pending_count(), 1);

    let (status, finished_at) = outcome.await.unwrap();
    assert_eq!(status, TransferStatus::FlushSlaveTimeout);
    let waited = finished_at - start;
    assert!(
        waited >= SLAVE_TIMEOUT && waited <= SLAVE_TIMEOUT + Duration::from_millis(1),
        "{waited:?}"
    );
    assert_eq!(waiters.pending_count(), 0);
    // A late ack changes nothing for it.
    waiters.on_ack(1, 100).unwrap();
    token.cancel();
    timer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_earlier_deadline_wakes_the_timer() {
    let waiters = Arc::new(SyncWaiters::new(1));
    let token = CancellationToken::new();
    let timer = tokio::spawn(waiters.clone().run_expiry(token.clone()));
    waiters.on_connect(1, 0);
    let start = tokio::time::Instant::now();
    let late = expect_wait(waiters.admit(0..200, 1, Duration::from_secs(10), 200, GAP_BYTES_MAX));
    tokio::task::yield_now().await; // let the timer go to sleep on the 10 s deadline
    let early = expect_wait(waiters.admit(0..100, 1, Duration::from_secs(1), 200, GAP_BYTES_MAX));

    assert_eq!(decided(early).await, TransferStatus::FlushSlaveTimeout);
    assert_eq!(tokio::time::Instant::now() - start, Duration::from_secs(1));
    assert_eq!(decided(late).await, TransferStatus::FlushSlaveTimeout);
    assert_eq!(tokio::time::Instant::now() - start, Duration::from_secs(10));
    token.cancel();
    timer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_resolves_pending_waits_and_refuses_new_puts() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 0);
    let mut first = expect_wait(admit(&waiters, 100, 1, 200));
    let mut second = expect_wait(admit(&waiters, 200, 1, 200));
    waiters.shutdown();
    assert_eq!(poll_now(&mut first), Some(TransferStatus::ServiceNotAvailable));
    assert_eq!(poll_now(&mut second), Some(TransferStatus::ServiceNotAvailable));
    assert!(waiters.is_closed());
    assert!(matches!(
        admit(&waiters, 300, 1, 300),
        Admission::Rejected(TransferStatus::ServiceNotAvailable)
    ));
    assert_eq!(waiters.pending_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_timer_shuts_down() {
    let waiters = Arc::new(SyncWaiters::new(1));
    let token = CancellationToken::new();
    let timer = tokio::spawn(waiters.clone().run_expiry(token.clone()));
    waiters.on_connect(1, 0);
    let wait = expect_wait(admit(&waiters, 100, 1, 100));
    token.cancel();
    timer.await.unwrap();
    assert_eq!(decided(wait).await, TransferStatus::ServiceNotAvailable);
    assert!(waiters.is_closed());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_owner_resolves_service_not_available() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 0);
    let wait = expect_wait(admit(&waiters, 100, 1, 100));
    drop(waiters);
    assert_eq!(decided(wait).await, TransferStatus::ServiceNotAvailable);
}

#[tokio::test(start_paused = true)]
async fn mode_switch_applies_to_new_puts_and_old_waiters_keep_their_k() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 0);
    waiters.on_connect(2, 0);
    let mut under_k1 = expect_wait(admit(&waiters, 100, 1, 100));
    waiters.set_sync_ack_replicas(2);
    let mut under_k2 = expect_wait(admit(&waiters, 100, 2, 100));

    waiters.on_ack(1, 100).unwrap();
    assert_eq!(poll_now(&mut under_k1), Some(TransferStatus::PutOk));
    assert_eq!(poll_now(&mut under_k2), None, "k = 2 needs a second replica");
    assert_eq!(waiters.confirm_offset(), 0, "confirm follows k = 2 now");

    waiters.on_ack(2, 100).unwrap();
    assert_eq!(poll_now(&mut under_k2), Some(TransferStatus::PutOk));
    assert_eq!(waiters.confirm_offset(), 100);
}

#[tokio::test(start_paused = true)]
async fn disconnect_stops_counting_but_confirm_offset_stays() {
    let waiters = SyncWaiters::new(1);
    waiters.on_connect(1, 0);
    waiters.on_connect(2, 0);
    waiters.on_ack(1, 300).unwrap();
    waiters.on_ack(2, 100).unwrap();
    assert_eq!(waiters.confirm_offset(), 300);
    assert!(waiters.on_disconnect(1));
    assert_eq!(waiters.read_table(|t| t.live_watermark(1)), Some(100));
    assert_eq!(waiters.confirm_offset(), 300);
    // A put at 200 is not acked by any live replica any more: it waits.
    let mut wait = expect_wait(admit(&waiters, 200, 1, 300));
    assert_eq!(poll_now(&mut wait), None);
    assert_eq!(waiters.on_ack(1, 400), Err(ProgressError::UnknownReplica { id: 1 }));
    assert_eq!(
        waiters.on_ack(2, 50),
        Err(ProgressError::Backwards { id: 2, previous_offset: 100, offset: 50 })
    );
    waiters.on_connect(1, 250);
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk));
}

#[tokio::test(start_paused = true)]
async fn a_streamed_replica_acks_only_what_it_was_sent() {
    use crate::ha::progress::StreamStart;
    let waiters = SyncWaiters::new(1);
    let address = "127.0.0.1:4000".parse().unwrap();
    assert_eq!(
        waiters.on_stream_start(1, StreamStart { address, report: 0, start: 0 }, true),
        Ok(None)
    );
    let mut wait = expect_wait(admit(&waiters, 100, 1, 100));
    waiters.on_sent(1, 60).unwrap();
    assert_eq!(poll_now(&mut wait), None, "sending completes nothing");
    assert_eq!(
        waiters.on_ack(1, 100),
        Err(ProgressError::BeyondSent { id: 1, sent_offset: 60, offset: 100 })
    );
    assert_eq!(poll_now(&mut wait), None, "a refused ack completes nothing");
    waiters.on_sent(1, 100).unwrap();
    waiters.on_ack(1, 100).unwrap();
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk));
    let replaced =
        waiters.on_stream_start(1, StreamStart { address, report: 100, start: 100 }, true);
    assert_eq!(replaced.unwrap().map(|old| old.ack_offset), Some(100));
    assert_eq!(waiters.read_table(|t| t.replica(1).map(|r| r.sent_offset)), Some(Some(100)));
}

// ---- model check of the pure layer ----

#[derive(Debug, Clone)]
enum Event {
    Connect { id: u64, offset: u64 },
    Ack { id: u64, delta: u64, backwards: bool },
    Disconnect { id: u64 },
    Add { end_offset: u64, k: usize, timeout_ms: u64 },
    Advance { ms: u64 },
    SetK { k: usize },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        1 => (0..4u64, 0..600u64).prop_map(|(id, offset)| Event::Connect { id, offset }),
        4 => (0..4u64, 0..150u64, proptest::bool::weighted(0.1))
            .prop_map(|(id, delta, backwards)| Event::Ack { id, delta, backwards }),
        1 => (0..4u64).prop_map(|id| Event::Disconnect { id }),
        3 => (0..1200u64, 1..=3usize, 0..400u64)
            .prop_map(|(end_offset, k, timeout_ms)| Event::Add { end_offset, k, timeout_ms }),
        2 => (0..250u64).prop_map(|ms| Event::Advance { ms }),
        1 => (1..=3usize).prop_map(|k| Event::SetK { k }),
    ]
}

/// The obvious model: live acks in a map, waiters in a map, everything recomputed by scanning.
struct Model {
    base: Instant,
    now_ms: u64,
    live: BTreeMap<u64, u64>,
    pending: HashMap<WaiterId, (u64, usize, Instant)>,
    finished: HashMap<WaiterId, TransferStatus>,
    k: usize,
    confirm_offset: u64,
}

impl Model {
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    fn watermark(&self, k: usize) -> Option<u64> {
        let mut acks: Vec<u64> = self.live.values().copied().collect();
        acks.sort_unstable_by(|a, b| b.cmp(a));
        k.checked_sub(1).and_then(|i| acks.get(i).copied())
    }

    fn acked_by(&self, end_offset: u64) -> usize {
        self.live.values().filter(|&&ack| ack >= end_offset).count()
    }

    fn finish(&mut self, done: Vec<(WaiterId, TransferStatus)>) -> Result<(), TestCaseError> {
        for (id, status) in done {
            let waiter = self.pending.remove(&id);
            prop_assert!(waiter.is_some(), "{id:?} completed twice or never added");
            prop_assert!(self.finished.insert(id, status).is_none());
            let (end_offset, k, deadline) = waiter.unwrap();
            match status {
                TransferStatus::PutOk => prop_assert!(self.acked_by(end_offset) >= k),
                TransferStatus::FlushSlaveTimeout => prop_assert!(deadline <= self.now()),
                other => prop_assert!(false, "unexpected {other} before shutdown"),
            }
        }
        Ok(())
    }
}

fn run(events: Vec<Event>) -> Result<(), TestCaseError> {
    let base = Instant::now();
    let mut table = AckTable::new();
    let mut transfer = GroupTransfer::new();
    let mut model = Model {
        base,
        now_ms: 0,
        live: BTreeMap::new(),
        pending: HashMap::new(),
        finished: HashMap::new(),
        k: 1,
        confirm_offset: 0,
    };
    for event in events {
        let now = model.now();
        match event {
            Event::Connect { id, offset } => {
                table.connect(id, offset, now);
                model.live.insert(id, offset);
            }
            Event::Ack { id, delta, backwards } => {
                let previous = model.live.get(&id).copied();
                let offset = match previous {
                    Some(ack) if backwards => ack.saturating_sub(delta + 1),
                    Some(ack) => ack + delta,
                    None => delta,
                };
                let result = table.ack(id, offset, now);
                match previous {
                    None => prop_assert_eq!(result, Err(ProgressError::UnknownReplica { id })),
                    Some(ack) if offset < ack => prop_assert_eq!(
                        result,
                        Err(ProgressError::Backwards { id, previous_offset: ack, offset })
                    ),
                    Some(_) => {
                        prop_assert_eq!(result, Ok(()));
                        model.live.insert(id, offset);
                    }
                }
            }
            Event::Disconnect { id } => {
                prop_assert_eq!(table.disconnect(id), model.live.remove(&id).is_some());
            }
            Event::Add { end_offset, k, timeout_ms } => {
                let deadline = now + Duration::from_millis(timeout_ms);
                let id = transfer.add(end_offset, k, deadline);
                prop_assert!(model.pending.insert(id, (end_offset, k, deadline)).is_none());
            }
            Event::Advance { ms } => {
                model.now_ms += ms;
                let done = transfer.expire(model.now());
                model.finish(done)?;
            }
            Event::SetK { k } => model.k = k,
        }
        // What the master does after every event: observe, then complete.
        let previous_confirm = table.confirm_offset();
        prop_assert_eq!(table.observe_watermark(model.k), model.watermark(model.k));
        if let Some(watermark) = model.watermark(model.k) {
            model.confirm_offset = model.confirm_offset.max(watermark);
        }
        prop_assert!(table.confirm_offset() >= previous_confirm);
        prop_assert_eq!(table.confirm_offset(), model.confirm_offset);
        for k in 0..=4 {
            prop_assert_eq!(table.live_watermark(k), model.watermark(k));
        }
        let done = transfer.on_progress(&table);
        model.finish(done)?;

        // Nothing left pending that could have completed, or that is past its deadline (time
        // only moves in `Advance`, which expires every waiter that is due).
        for (end_offset, k, deadline) in model.pending.values() {
            prop_assert!(model.acked_by(*end_offset) < *k);
            prop_assert!(*deadline >= model.now());
        }
        prop_assert_eq!(transfer.len(), model.pending.len());
        let earliest = model.pending.values().map(|(_, _, deadline)| *deadline).min();
        prop_assert_eq!(transfer.next_deadline(), earliest);
    }

    let remaining = model.pending.len();
    let done = transfer.shutdown();
    prop_assert_eq!(done.len(), remaining);
    for (id, status) in done {
        prop_assert_eq!(status, TransferStatus::ServiceNotAvailable);
        prop_assert!(model.pending.remove(&id).is_some());
        prop_assert!(model.finished.insert(id, status).is_none());
    }
    prop_assert!(model.pending.is_empty());
    prop_assert!(transfer.is_empty());
    prop_assert_eq!(transfer.next_deadline(), None);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn waiters_and_acks_agree_with_the_model(events in proptest::collection::vec(event(), 1..80)) {
        run(events)?;
    }
}

/// What the master does with each ack: the writer's cursor and the ack recorded in one step;
/// an ack beyond the cursor is refused and completes nothing, a cursor going backwards too.
#[tokio::test]
async fn an_ack_is_checked_against_the_cursor_it_arrives_with() {
    use crate::ha::progress::StreamStart;
    let waiters = SyncWaiters::new(1);
    let address = "127.0.0.1:4000".parse().unwrap();
    waiters.on_stream_start(1, StreamStart { address, report: 0, start: 0 }, true).unwrap();
    let mut wait = expect_wait(admit(&waiters, 100, 1, 100));
    assert_eq!(
        waiters.on_ack_sent(1, 60, 100),
        Err(ProgressError::BeyondSent { id: 1, sent_offset: 60, offset: 100 })
    );
    assert_eq!(poll_now(&mut wait), None, "a refused ack completes nothing");
    let entry =
        |w: &SyncWaiters| w.read_table(|t| t.replica(1).map(|r| (r.sent_offset, r.ack_offset)));
    assert_eq!(entry(&waiters), Some((Some(0), 0)), "a refused ack records nothing");
    waiters.on_ack_sent(1, 120, 100).unwrap();
    assert_eq!(poll_now(&mut wait), Some(TransferStatus::PutOk));
    assert_eq!(
        waiters.on_ack_sent(1, 110, 110),
        Err(ProgressError::SentBackwards { id: 1, previous_offset: 120, offset: 110 })
    );
    assert_eq!(entry(&waiters), Some((Some(120), 100)));
    // A backwards ack with a newer cursor records neither.
    assert!(matches!(waiters.on_ack_sent(1, 200, 50), Err(ProgressError::Backwards { .. })));
    assert_eq!(entry(&waiters), Some((Some(120), 100)));
}
