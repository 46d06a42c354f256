//! Unit tests of `ha::progress`: the ack table and the append clock.

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
    assert_eq!(AckTable::for_term(42, 0).confirm_offset(), 42);
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

fn stream(report: u64, start: u64) -> StreamStart {
    StreamStart { address: "127.0.0.1:4000".parse().unwrap(), report, start }
}

#[test]
fn acks_beyond_what_was_sent_are_refused_and_change_nothing() {
    let base = Instant::now();
    let mut table = AckTable::new();
    assert_eq!(table.connect_stream(1, stream(100, 100), base), Ok(None));
    let err = table.ack(1, 101, at(base, 1)).unwrap_err();
    assert_eq!(err, ProgressError::BeyondSent { id: 1, sent_offset: 100, offset: 101 });
    assert_eq!(err.to_string(), "ack 101 is beyond what this connection was sent (100)");
    let view = table.replica(1).unwrap();
    assert_eq!((view.ack_offset, view.last_ack), (100, None));
    table.sent(1, 250).unwrap();
    table.ack(1, 250, at(base, 2)).unwrap();
    assert_eq!(table.replica(1).unwrap().sent_offset, Some(250));
    assert_eq!(
        table.ack(1, 251, at(base, 3)),
        Err(ProgressError::BeyondSent { id: 1, sent_offset: 250, offset: 251 })
    );
    assert_eq!(
        table.ack(1, 249, at(base, 3)),
        Err(ProgressError::Backwards { id: 1, previous_offset: 250, offset: 249 })
    );
    assert_eq!(table.replica(1).unwrap().last_ack, Some(at(base, 2)));
}

#[test]
fn sent_never_goes_backwards_and_a_report_beyond_the_start_is_refused() {
    let base = Instant::now();
    let mut table = AckTable::new();
    // An empty slave (report 0) streamed from the start of the last file.
    table.connect_stream(1, stream(0, 4096), base).unwrap();
    let view = table.replica(1).unwrap();
    assert_eq!((view.first_offset, view.ack_offset, view.sent_offset), (4096, 0, Some(4096)));
    assert_eq!(view.address, Some("127.0.0.1:4000".parse().unwrap()));
    assert_eq!(
        table.sent(1, 4095),
        Err(ProgressError::SentBackwards { id: 1, previous_offset: 4096, offset: 4095 })
    );
    assert_eq!(table.sent(9, 1), Err(ProgressError::UnknownReplica { id: 9 }));
    assert_eq!(
        table.connect_stream(2, stream(10, 5), base),
        Err(ProgressError::BeyondSent { id: 2, sent_offset: 5, offset: 10 })
    );
    assert!(table.replica(2).is_none());
    // A plain connect has no sent bound.
    table.connect(3, 0, base);
    table.ack(3, u64::MAX, at(base, 1)).unwrap();
    assert_eq!(table.replica(3).unwrap().sent_offset, None);
}

#[test]
fn rate_is_measured_over_whole_windows() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(1, stream(1000, 1000), base).unwrap();
    table.sent(1, 10_000).unwrap();
    table.ack(1, 3000, at(base, 500)).unwrap();
    assert_eq!(table.replica(1).unwrap().bytes_per_sec, 0.0, "window not complete");
    table.ack(1, 5000, at(base, 2000)).unwrap();
    assert_eq!(table.replica(1).unwrap().bytes_per_sec, 2000.0);
    table.ack(1, 6000, at(base, 2500)).unwrap();
    assert_eq!(table.replica(1).unwrap().bytes_per_sec, 2000.0, "until the next window");
    table.ack(1, 8000, at(base, 3000)).unwrap();
    assert_eq!(table.replica(1).unwrap().bytes_per_sec, 3000.0);
}

#[derive(Debug, Clone)]
enum Op {
    Connect { id: ReplicaId, report: u64, ahead: u64 },
    Sent { id: ReplicaId, to: u64 },
    Ack { id: ReplicaId, to: u64 },
    Disconnect { id: ReplicaId },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        1 => (0..3u64, 0..500u64, 0..50u64)
            .prop_map(|(id, report, ahead)| Op::Connect { id, report, ahead }),
        3 => (0..3u64, 0..1000u64).prop_map(|(id, to)| Op::Sent { id, to }),
        4 => (0..3u64, 0..1000u64).prop_map(|(id, to)| Op::Ack { id, to }),
        1 => (0..3u64).prop_map(|id| Op::Disconnect { id }),
    ]
}

proptest::proptest! {
    /// Whatever the master feeds it, every entry keeps ack <= sent, neither goes backwards
    /// on one connection, and a refused event changes nothing.
    #[test]
    fn ack_never_passes_sent_and_nothing_goes_backwards(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        let base = Instant::now();
        let mut table = AckTable::new();
        // Per id, the byte ranges its connections were sent (the last one growing).
        let mut sent_to: BTreeMap<ReplicaId, Vec<(u64, u64)>> = BTreeMap::new();
        for (step, op) in ops.into_iter().enumerate() {
            let now = at(base, step as u64);
            let before: Vec<ReplicaView> = table.replicas().collect();
            let (id, refused) = match op {
                Op::Connect { id, report, ahead } => {
                    let start = StreamStart { report, start: report + ahead, ..stream(0, 0) };
                    let refused = table.connect_stream(id, start, now).is_err();
                    if !refused {
                        sent_to.entry(id).or_default().push((start.start, start.start));
                    }
                    (id, refused)
                }
                Op::Sent { id, to } => {
                    let refused = table.sent(id, to).is_err();
                    if !refused {
                        sent_to.get_mut(&id).and_then(|r| r.last_mut()).expect("connected").1 = to;
                    }
                    (id, refused)
                }
                Op::Ack { id, to } => (id, table.ack(id, to, now).is_err()),
                Op::Disconnect { id } => (id, !table.disconnect(id)),
            };
            let after: Vec<ReplicaView> = table.replicas().collect();
            if refused {
                proptest::prop_assert_eq!(&before, &after);
            }
            for r in &after {
                let sent = r.sent_offset.expect("connected with a stream");
                proptest::prop_assert!(r.ack_offset <= sent, "{r:?}");
                proptest::prop_assert!(r.first_offset <= sent, "{r:?}");
            }
            let (was, now_) = (
                before.iter().find(|r| r.id == id),
                after.iter().find(|r| r.id == id),
            );
            if let (Some(was), Some(is)) = (was, now_)
                && was.connected_since == is.connected_since
            {
                proptest::prop_assert!(is.ack_offset >= was.ack_offset);
                proptest::prop_assert!(is.sent_offset >= was.sent_offset);
            }
            // Issue 15: what a replica counts as holding its identity was sent, every byte.
            for (id, r) in &table.replicas {
                if let Some((lo, ack)) = r.counted() {
                    let ranges = sent_to.get(id).map_or(&[][..], Vec::as_slice);
                    proptest::prop_assert!(covered(ranges, lo..ack), "{id}: {lo}..{ack} {ranges:?}");
                }
            }
            // The waiters completed are exactly the puts `holds` says k replicas hold.
            for k in 1..=2 {
                let mut waiters = crate::ha::group_transfer::GroupTransfer::new();
                let puts: Vec<Range<u64>> = (0..20u64).map(|i| i * 50..i * 50 + 50).collect();
                let ids: Vec<_> = puts.iter().map(|p| waiters.add_put(p.clone(), k, now)).collect();
                let done: std::collections::BTreeSet<_> =
                    waiters.on_progress(&table).into_iter().map(|(id, _)| id).collect();
                for (put, id) in puts.iter().zip(&ids) {
                    proptest::prop_assert_eq!(done.contains(id), table.holds(k, put), "{:?}", put);
                }
            }
            for k in 1..=3 {
                for (lo, watermark) in table.steps(k) {
                    let holding = table.replicas.values().filter_map(Replica::counted)
                        .filter(|&(l, a)| l <= lo && watermark <= a).count();
                    proptest::prop_assert!(holding >= k);
                }
            }
        }
    }
}

/// Whether the union of `ranges` covers every byte of `want`.
fn covered(ranges: &[(u64, u64)], want: Range<u64>) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut reach = want.start;
    for (start, end) in sorted {
        if start <= reach {
            reach = reach.max(end);
        }
    }
    reach >= want.end
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

#[test]
fn rekey_moves_an_entry_with_its_progress_and_replaces_the_target() {
    let base = Instant::now();
    let mut table = three(base);
    let old = table.rekey(1, 2).unwrap().expect("2 had an entry");
    assert_eq!(old.ack_offset, 300);
    let moved = table.replica(2).unwrap();
    assert_eq!((moved.ack_offset, moved.ack_time), (100, at(base, 1)));
    assert!(table.replica(1).is_none());
    assert_eq!(table.live_count(), 2);
    assert_eq!(table.rekey(1, 5), Err(ProgressError::UnknownReplica { id: 1 }));
    assert_eq!(table.rekey(3, 9), Ok(None));
}

/// Issue 15: a first report (the slave's claim of what it holds) counts for nothing: a replica
/// counts as holding only what its identity was sent, from where its stream started.
#[test]
fn a_first_report_counts_only_for_what_its_identity_is_sent() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(1, stream(500, 500), base).unwrap();
    assert_eq!(table.replica(1).unwrap().ack_offset, 500, "the status keeps the report");
    assert_eq!(table.live_watermark(1), None, "a report of bytes never sent counted");
    assert_eq!(table.observe_watermark(1), None);
    assert!(!table.holds(1, &(400..500)));
    table.sent(1, 600).unwrap();
    table.ack(1, 500, at(base, 1)).unwrap();
    assert!(table.steps(1).is_empty(), "a repeat of the report is no ack of a sent byte");
    table.ack(1, 550, at(base, 2)).unwrap();
    assert_eq!(table.steps(1), [(500, 550)]);
    assert!(table.holds(1, &(500..550)));
    assert!(!table.holds(1, &(400..550)), "a put below its start was never sent to it");
    assert_eq!(table.observe_watermark(1), None, "its run does not reach back to 0");
    assert_eq!(table.confirm_offset(), 0);
    // A newer connection of the identity reporting what it was sent counts at once.
    table.connect_stream(1, stream(600, 600), at(base, 3)).unwrap();
    assert!(table.holds(1, &(500..600)));
    // Another replica holding from 0 on: the k-th highest over the runs that reach back.
    table.connect_stream(2, stream(0, 0), base).unwrap();
    table.ack_sent(2, 300, 300, at(base, 4)).unwrap();
    assert_eq!(table.steps(1), [(0, 300), (500, 600)]);
    assert_eq!(table.observe_watermark(1), Some(300));
    assert_eq!(table.steps(2), [(500, 300)]);
    assert_eq!(table.live_watermark(2), None);
    table.ack_sent(2, 700, 700, at(base, 5)).unwrap();
    assert_eq!(table.observe_watermark(1), Some(700));
    assert_eq!(table.observe_watermark(2), Some(600), "both hold [300, 600) and below");
}

/// Issue 15, R1 review: an empty slave (report 0) streamed from the last file's start holds
/// nothing below that start, whatever it acks above it.
#[test]
fn an_empty_slave_holds_nothing_below_its_start() {
    let base = Instant::now();
    let mut table = AckTable::for_term(0, 10_000);
    table.connect_stream(1, stream(0, 4096), base).unwrap();
    table.ack_sent(1, 5000, 5000, at(base, 1)).unwrap();
    assert_eq!(table.steps(1), [(4096, 5000)]);
    assert!(!table.holds(1, &(4000..4096)));
    assert!(!table.holds(1, &(4000..5000)), "a put across its start");
    assert!(table.holds(1, &(4096..5000)));
    assert_eq!(table.observe_watermark(1), None);
    assert_eq!(table.confirm_offset(), 0, "nothing below its start is confirmed by it");
}

/// Issue 15: a newer connection of an identity counts at once for what the identity was sent
/// (an ack lost with the old connection costs nothing), never beyond it.
#[test]
fn a_reconnect_counts_at_once_up_to_what_its_identity_was_sent() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(1, stream(0, 0), base).unwrap();
    table.ack_sent(1, 1000, 400, at(base, 1)).unwrap();
    assert!(table.disconnect(1));
    table.connect_stream(1, stream(1000, 1000), at(base, 2)).unwrap();
    assert!(table.holds(1, &(0..1000)));
    assert_eq!(table.observe_watermark(1), Some(1000));
    // Beyond what it was sent, a report is a claim again: nothing below it counts.
    assert!(table.disconnect(1));
    table.connect_stream(1, stream(1200, 1200), at(base, 3)).unwrap();
    assert!(!table.holds(1, &(1000..1200)));
    table.ack_sent(1, 1300, 1300, at(base, 4)).unwrap();
    assert_eq!(table.steps(1), [(1200, 1300)]);
    // Another id has no such credit.
    table.connect_stream(2, stream(1000, 1000), at(base, 5)).unwrap();
    table.ack_sent(2, 1100, 1100, at(base, 6)).unwrap();
    assert!(!table.holds(1, &(0..1100)) && !table.holds(2, &(0..1100)));
}

/// What the log held before the master's term began was sent in no connection of the term: a
/// report of it counts once the replica acks a byte it was sent (as before issue 15's fix).
#[test]
fn bytes_before_the_term_count_once_the_replica_follows() {
    let base = Instant::now();
    let mut table = AckTable::for_term(100, 1000);
    table.connect_stream(1, stream(800, 800), base).unwrap();
    assert_eq!(table.observe_watermark(1), None);
    table.ack_sent(1, 900, 850, at(base, 1)).unwrap();
    assert_eq!(table.observe_watermark(1), Some(850));
    assert_eq!(table.confirm_offset(), 850);
    // A report above the term's start claims bytes of the term: they are not credited.
    table.connect_stream(2, stream(1200, 1200), base).unwrap();
    table.ack_sent(2, 1300, 1300, at(base, 2)).unwrap();
    assert_eq!(table.steps(1), [(0, 850), (1200, 1300)]);
}

/// A connection whose registration arrives after its first report moves to its identity's id
/// and takes what that identity is credited with.
#[test]
fn rekey_takes_what_the_target_identity_is_credited_with() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(7, stream(0, 0), base).unwrap();
    table.sent(7, 1000).unwrap();
    assert!(table.disconnect(7));
    table.connect_stream(3, stream(1000, 1000), base).unwrap();
    assert!(!table.holds(1, &(0..1000)));
    assert_eq!(table.rekey(3, 7), Ok(None));
    assert!(table.holds(1, &(0..1000)));
}

/// F4 (issue 15 review R3, registered mode): a connection whose registration arrives after its
/// first report was counted meanwhile as the identity last registered from its IP (7) and took
/// 7's credit at connect. Its registration names another identity (8): the credit was 7's, so
/// it is dropped, and its run restarts at its own report.
#[test]
fn rekey_to_another_identity_drops_the_credit_taken_as_the_provisional_one() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(7, stream(0, 0), base).unwrap();
    table.sent(7, 1000).unwrap();
    assert!(table.disconnect(7));
    // Another slave from 7's IP, counted as 7 until it registers: it takes 7's credit.
    table.connect_stream(7, stream(1000, 1000), at(base, 1)).unwrap();
    assert!(table.holds(1, &(0..1000)), "as 7 it goes on from 7's run");
    assert_eq!(table.rekey(7, 8), Ok(None));
    assert!(!table.holds(1, &(0..1000)), "8 holds nothing of what 7 was sent");
    table.ack_sent(8, 1500, 1500, at(base, 2)).unwrap();
    assert!(table.holds(1, &(1000..1500)));
    assert!(!table.holds(1, &(999..1500)), "its run starts at its own report");
    // A connection of 7's that reconnects later still finds 7's credit.
    table.connect_stream(7, stream(1000, 1000), at(base, 3)).unwrap();
    assert!(table.holds(1, &(0..1000)));
}

/// F4: credit by IP goes to a new connection only when exactly one gone connection's credit
/// covers its report; with two that both fit, which one it is cannot be told: none.
#[test]
fn inherit_unique_gives_credit_only_when_one_candidate_covers_the_report() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(1, stream(0, 0), base).unwrap();
    table.sent(1, 1000).unwrap();
    table.connect_stream(2, stream(0, 500), base).unwrap();
    table.sent(2, 1000).unwrap();
    assert!(table.disconnect(1) && table.disconnect(2));
    table.connect_stream(3, stream(1000, 1000), at(base, 1)).unwrap();
    assert_eq!(table.inherit_unique(3, &[1, 2]), None, "both cover 1000");
    assert!(!table.holds(1, &(500..1000)));
    table.connect_stream(4, stream(400, 400), at(base, 2)).unwrap();
    assert_eq!(table.inherit_unique(4, &[1, 2]), Some(1), "only 1's run reaches down to 400");
    table.ack_sent(4, 1000, 1000, at(base, 3)).unwrap();
    assert!(table.holds(1, &(0..1000)));
    assert_eq!(table.inherit_unique(9, &[1]), None, "no such replica");
}

/// What identities are credited with after their connection went stays bounded.
#[test]
fn held_credit_is_bounded() {
    let base = Instant::now();
    let mut table = AckTable::new();
    for id in 0..(HELD_CAP as u64 + 10) {
        table.connect_stream(id, stream(0, 0), base).unwrap();
        assert!(table.disconnect(id));
    }
    assert_eq!(table.held.len(), HELD_CAP);
    assert!(!table.held.contains_key(&0), "the one kept longest is forgotten first");
}

/// Under `ha.replica-identity = "connection"` every connection is its own replica: a newer
/// connection from the same address inherits what the gone one is credited with.
#[test]
fn a_connection_inherits_what_a_gone_one_is_credited_with() {
    let base = Instant::now();
    let mut table = AckTable::new();
    table.connect_stream(1, stream(0, 0), base).unwrap();
    table.ack_sent(1, 1000, 400, at(base, 1)).unwrap();
    table.connect_stream(2, stream(1000, 1000), at(base, 2)).unwrap();
    assert!(!table.inherit(2, 1), "1 is still connected: nothing is kept for it yet");
    assert!(table.disconnect(1));
    assert!(!table.holds(1, &(400..1000)));
    assert!(table.inherit(2, 1));
    assert!(table.holds(1, &(0..1000)));
    assert!(!table.inherit(9, 1), "no such replica");
}

/// R3 (issue 15 review): a slave that joined at the last file (`empty-slave-start =
/// "last-file"`) holds nothing below that start, so the confirm offset did not rise through it
/// in that term (`an_empty_slave_holds_nothing_below_its_start`). The master restarts (a new
/// term, same epoch): the same slave reports its end, which is at the new term's start, and
/// acks the next put. Its log is contiguous but does not start at 0, and the master cannot know
/// where it starts (a classic slave tells only its end). F4 (decision): this is the documented
/// exception (docs/operations.md, "What the log held when the master's term began"): a report
/// at or below the term's start counts from 0 once the slave follows, so the confirm offset
/// (the readable end) rises through [0, 4096) here. This test pins that documented behaviour;
/// R3 asked for `< 4096`.
#[test]
fn a_report_at_the_term_start_never_counts_below_where_the_slave_started() {
    let base = Instant::now();
    // Term 1: the slave joins at the last file, 4096; it acks up to 5000.
    let mut table = AckTable::for_term(0, 4500);
    table.connect_stream(1, stream(0, 4096), base).unwrap();
    table.ack_sent(1, 5000, 5000, at(base, 1)).unwrap();
    table.observe_watermark(1);
    assert_eq!(table.confirm_offset(), 0, "term 1 confirms nothing below its start");
    // Term 2 (the master restarted; the checkpoint's confirm offset is 0, the log ends at 5000).
    let mut table = AckTable::for_term(table.confirm_offset(), 5000);
    table.connect_stream(1, stream(5000, 5000), at(base, 2)).unwrap();
    table.observe_watermark(1);
    assert_eq!(table.confirm_offset(), 0, "the report alone confirms nothing");
    table.ack_sent(1, 5100, 5100, at(base, 3)).unwrap();
    table.observe_watermark(1);
    assert_eq!(
        table.confirm_offset(),
        5100,
        "the documented exception: a report at the term start counts from 0 once it follows"
    );
}
