//! The master's replication bookkeeping: the replica table (`ha::progress::AckTable`), the pure
//! waiter queue (`ha::group_transfer::GroupTransfer`) and its locked owner (`SyncWaiters`, the
//! one the put path and the connection tasks call).
//!
//! Every ack a slave sends goes through `ack_sent` and a watermark observation, then through the
//! waiter queue, whether it completes a put or not; every sync put is admitted once and ends in
//! an ack or its deadline. Puts are 1 KiB each, back to back; 1, 16, 64 and 1000 of them pending.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;
use std::time::Instant;

use criterion::BatchSize;
use criterion::BenchmarkId;
use criterion::Criterion;
use criterion::Throughput;
use criterion::criterion_group;
use criterion::criterion_main;
use hasync::bench_api::AckTable;
use hasync::bench_api::Admission;
use hasync::bench_api::GroupTransfer;
use hasync::bench_api::StreamStart;
use hasync::bench_api::SyncWaiters;

const PUT_SIZE: u64 = 1024;
const PENDING: [u64; 4] = [1, 16, 64, 1000];
/// Slaves of one master: one (the usual pair), two, and a wide fan-out.
const REPLICAS: [u64; 3] = [1, 2, 8];
const TIMEOUT: Duration = Duration::from_secs(3);
/// `replication.max-gap-not-in-sync`'s order of magnitude: every replica here is in sync.
const GAP_BYTES_MAX: u64 = 256 * 1024 * 1024;

fn stream_start() -> StreamStart {
    let address: SocketAddr = "10.1.2.4:40001".parse().unwrap();
    StreamStart { address, report: 0, start: 0 }
}

/// A table of `n` streaming replicas (ids `0..n`), replica `i` acked at `acks(i)`.
fn table(n: u64, acks: impl Fn(u64) -> u64, now: Instant) -> AckTable {
    let mut table = AckTable::new();
    for id in 0..n {
        table.connect_stream(id, stream_start(), now).unwrap();
        table.ack_sent(id, acks(id), acks(id), now).unwrap();
    }
    table
}

fn put(i: u64) -> std::ops::Range<u64> {
    i * PUT_SIZE..(i + 1) * PUT_SIZE
}

fn ack_table(c: &mut Criterion) {
    // One ack: record it (checked against what was sent), then raise confirm_offset (k = 1).
    let mut group = c.benchmark_group("ack_table/ack_sent+observe");
    for n in REPLICAS {
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            let mut now = Instant::now();
            let mut t = table(n, |_| 0, now);
            let (mut offset, mut acks) = (0, 0u64);
            b.iter(|| {
                // Round robin: each replica acks the next put in turn.
                offset += PUT_SIZE;
                acks += 1;
                now += Duration::from_micros(100);
                t.ack_sent(acks % n, offset, offset, now).unwrap();
                t.observe_watermark(1)
            })
        });
    }
    group.finish();
    let mut group = c.benchmark_group("ack_table/steps");
    for n in [1, 2, 8, 64] {
        let t = table(n, |id| (id + 1) * PUT_SIZE, Instant::now());
        group.bench_function(BenchmarkId::from_parameter(n), |b| b.iter(|| black_box(&t).steps(1)));
    }
    group.finish();
}

/// A queue of `n` waiters for the puts `0..n`, k = 1.
fn queue(n: u64, base: Instant) -> GroupTransfer {
    let mut queue = GroupTransfer::new();
    for i in 0..n {
        queue.add_put(put(i), 1, base + TIMEOUT + Duration::from_micros(i));
    }
    queue
}

fn group_transfer(c: &mut Criterion) {
    let base = Instant::now();
    let mut group = c.benchmark_group("group_transfer/add_put");
    for n in PENDING {
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(
                GroupTransfer::new,
                |mut q| {
                    for i in 0..n {
                        q.add_put(put(i), 1, base + TIMEOUT + Duration::from_micros(i));
                    }
                    q
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    // One ack that holds every pending put: all complete in one pass.
    let mut group = c.benchmark_group("group_transfer/on_progress_all");
    for n in PENDING {
        let all = table(1, |_| n * PUT_SIZE, base);
        assert_eq!(queue(n, base).on_progress(&all).len() as u64, n);
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(
                || queue(n, base),
                |mut q| {
                    let done = q.on_progress(&all);
                    (q, done)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    // An ack (or heartbeat report) below the first pending put: nothing completes, the cost every
    // ack pays while puts wait.
    let mut group = c.benchmark_group("group_transfer/on_progress_none");
    for n in PENDING {
        let below = table(1, |_| PUT_SIZE / 2, base);
        let mut q = queue(n, base);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| q.on_progress(black_box(&below)))
        });
        assert_eq!(q.len() as u64, n);
    }
    group.finish();
    let mut group = c.benchmark_group("group_transfer/expire_all");
    for n in PENDING {
        let late = base + TIMEOUT * 2;
        assert_eq!(queue(n, base).expire(late).len() as u64, n);
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(
                || queue(n, base),
                |mut q| {
                    let done = q.expire(late);
                    (q, done)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// A master term with one streaming slave (id 0) that has acked nothing yet.
fn waiters() -> SyncWaiters {
    let waiters = SyncWaiters::new(1);
    waiters.on_stream_start(0, stream_start(), true).unwrap();
    waiters
}

/// `n` admitted puts `0..n`, each waiting at most `timeout`.
fn admit(waiters: &SyncWaiters, n: u64, timeout: Duration) -> Vec<Admission> {
    let max_offset = n * PUT_SIZE;
    (0..n).map(|i| waiters.admit(put(i), 1, timeout, max_offset, GAP_BYTES_MAX)).collect()
}

/// Checks once, outside the measurements, that the fixtures do what the benches say.
fn check_fixtures() {
    let w = waiters();
    assert!(admit(&w, 2, TIMEOUT).iter().all(|a| matches!(a, Admission::Wait(_))));
    w.on_ack_sent(0, 2 * PUT_SIZE, 2 * PUT_SIZE).unwrap();
    assert_eq!(w.pending_count(), 0, "the ack completes every put");
    let w = waiters();
    let _admitted = admit(&w, 2, Duration::ZERO);
    assert_eq!((w.expire_due(), w.pending_count()), (None, 0), "every deadline has passed");
}

fn sync_waiters(c: &mut Criterion) {
    check_fixtures();
    let mut group = c.benchmark_group("sync_waiters/admit");
    for n in PENDING {
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(
                waiters,
                |w| {
                    let admitted = admit(&w, n, TIMEOUT);
                    (w, admitted)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    // The slave acks the last put: the table, the watermark, one pass, n oneshot sends.
    on_admitted(c, "sync_waiters/ack_completes_all", TIMEOUT, |w, n| {
        w.on_ack_sent(0, n * PUT_SIZE, n * PUT_SIZE).unwrap();
    });
    // The expiry timer fires once all deadlines have passed: n FLUSH_SLAVE_TIMEOUTs.
    on_admitted(c, "sync_waiters/expire_due_all", Duration::ZERO, |w, _| {
        std::hint::black_box(w.expire_due());
    });
}

/// A group measuring `routine` on a fresh master term with `n` puts admitted (each waiting at
/// most `timeout`), for each `n` of [`PENDING`]; the admissions are dropped outside the
/// measurement.
fn on_admitted(
    c: &mut Criterion,
    name: &str,
    timeout: Duration,
    routine: impl Fn(&SyncWaiters, u64),
) {
    let mut group = c.benchmark_group(name);
    for n in PENDING {
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(
                || {
                    let w = waiters();
                    let admitted = admit(&w, n, timeout);
                    (w, admitted)
                },
                |(w, admitted)| {
                    routine(&w, n);
                    (w, admitted)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, ack_table, group_transfer, sync_waiters);
criterion_main!(benches);
