//! The commitlog record codec (`store::record`) and the CRC it computes: the put path encodes
//! every record (BODYCRC included), and recovery, the slave's checked write and the scrub decode
//! every record (BODYCRC checked again).
//!
//! Records as a producer sends them: a 1 KiB body, a 9-byte topic, IPv4 hosts and a typical
//! property set (UNIQ_KEY, KEYS, TAGS, WAIT), about 1.2 KiB each. Batches of 1 and 32 records.

use std::hint::black_box;
use std::net::SocketAddr;

use bytes::Bytes;
use criterion::BenchmarkId;
use criterion::Criterion;
use criterion::Throughput;
use criterion::criterion_group;
use criterion::criterion_main;
use hasync::store::record;
use hasync::store::record::Decoded;
use hasync::store::record::Message;

const BODY_SIZE: usize = 1024;
const BATCH_SIZES: [usize; 2] = [1, 32];
/// Where the first record of a batch sits in the commitlog (an arbitrary, not-aligned offset).
const BASE_OFFSET: i64 = 3 * 1024 * 1024 * 1024 + 4096;

/// Bytes that are not all alike (a CRC over zeros is no faster, but a body should look real).
fn body(size: usize) -> Vec<u8> {
    let mut x: u32 = 0x9E37_79B9;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn message(i: usize) -> Message {
    let uniq_key = format!("7F0000010A2B18B4AAC2{i:012X}");
    let keys = format!("order-{i:06}");
    let pairs =
        [("UNIQ_KEY", uniq_key.as_str()), ("KEYS", &keys), ("TAGS", "TagA"), ("WAIT", "true")];
    let host: SocketAddr = "10.1.2.3:52311".parse().unwrap();
    Message {
        topic: "TopicTest".to_owned(),
        queue_id: (i % 8) as i32,
        flag: 0,
        body: Bytes::from(body(BODY_SIZE)),
        properties: record::encode_properties(&pairs).unwrap(),
        sys_flag: 0,
        born_timestamp_ms: 1_767_225_600_000 + i as i64,
        born_host: host,
        store_timestamp_ms: 1_767_225_600_003 + i as i64,
        store_host: "10.1.2.10:10911".parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// `n` records laid out as the commitlog holds them from [`BASE_OFFSET`] on.
fn encoded_batch(messages: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, msg) in messages.iter().enumerate() {
        let offset = BASE_OFFSET + out.len() as i64;
        out.extend(record::encode(msg, i as i64, offset).unwrap());
    }
    out
}

fn crc(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32");
    // One body; a 32 KiB transfer batch (RocketMQ's default); a 1 MiB segment chunk.
    for size in [BODY_SIZE, 32 * 1024, 1024 * 1024] {
        let bytes = body(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &bytes, |b, bytes| {
            b.iter(|| crc32fast::hash(black_box(bytes)))
        });
    }
    group.finish();
}

fn encode(c: &mut Criterion) {
    let msg = message(0);
    // The size check validates the properties' shape byte by byte; without properties, what is
    // left is the rest of the checks.
    let mut group = c.benchmark_group("record/encoded_len");
    let bare = Message { properties: Bytes::new(), ..msg.clone() };
    for m in [&msg, &bare] {
        let id = BenchmarkId::from_parameter(format!("properties_{}B", m.properties.len()));
        group.bench_with_input(id, m, |b, m| b.iter(|| record::encoded_len(black_box(m))));
    }
    group.finish();
    let mut group = c.benchmark_group("record/encode_into");
    for n in BATCH_SIZES {
        let messages: Vec<Message> = (0..n).map(message).collect();
        let mut dst = encoded_batch(&messages);
        // Where each record goes, as the append path knows it before encoding.
        let mut slots = Vec::new();
        for msg in &messages {
            let start = slots.last().map_or(0, |&(_, end)| end);
            slots.push((start, start + record::encoded_len(msg).unwrap()));
        }
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &messages, |b, messages| {
            b.iter(|| {
                for (i, (msg, &(start, end))) in messages.iter().zip(&slots).enumerate() {
                    let offset = BASE_OFFSET + start as i64;
                    record::encode_into(msg, i as i64, offset, &mut dst[start..end]).unwrap();
                }
                black_box(&dst);
            })
        });
    }
    group.finish();
    c.bench_function("record/encode_vec/1", |b| {
        b.iter(|| record::encode(black_box(&msg), 0, BASE_OFFSET).unwrap())
    });
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("record/decode");
    for n in BATCH_SIZES {
        let messages: Vec<Message> = (0..n).map(message).collect();
        let bytes = encoded_batch(&messages);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &bytes, |b, bytes| {
            b.iter(|| {
                // A walk as recovery and the scan do: decode, check, step by TOTALSIZE.
                let mut pos = 0;
                while pos < bytes.len() {
                    let decoded =
                        record::decode(black_box(&bytes[pos..]), BASE_OFFSET + pos as i64);
                    let Ok(Decoded::Message(view)) = decoded else { panic!("{decoded:?}") };
                    pos += view.size();
                }
                pos
            })
        });
    }
    group.finish();
}

criterion_group!(benches, crc, encode, decode);
criterion_main!(benches);
