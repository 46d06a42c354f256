//! The HA wire codec (`ha::codec`): the 8-byte slave report and the 12-byte transfer header,
//! encoded once per frame or report and decoded once per read.
//!
//! The frame walk is the slave's loop over its read buffer (`ha::slave`'s `apply_frames`:
//! check the header, wait for the body, take it, advance), without the store write: 32 frames
//! of 1 KiB (one small put each, the sync case) and one 32 KiB frame (RocketMQ's transfer batch).

use std::hint::black_box;

use criterion::BenchmarkId;
use criterion::Criterion;
use criterion::Throughput;
use criterion::criterion_group;
use criterion::criterion_main;
use hasync::bench_api::REPORT_SIZE;
use hasync::bench_api::TRANSFER_HEADER_SIZE;
use hasync::bench_api::TransferDecoder;
use hasync::bench_api::decode_reports;
use hasync::bench_api::encode_report;
use hasync::bench_api::encode_transfer_header;

/// A commitlog offset a few GiB in.
const OFFSET: i64 = 5 * 1024 * 1024 * 1024 + 123_456;

fn encode(c: &mut Criterion) {
    c.bench_function("ha_codec/encode_report", |b| b.iter(|| encode_report(black_box(OFFSET))));
    c.bench_function("ha_codec/encode_transfer_header", |b| {
        b.iter(|| encode_transfer_header(black_box(OFFSET), black_box(32 * 1024)))
    });
}

fn reports(c: &mut Criterion) {
    // One report per read (the usual case), or 64 queued up behind a slow master reader, with
    // 3 bytes of the next one: only the last complete report is taken.
    let mut group = c.benchmark_group("ha_codec/decode_reports");
    for n in [1usize, 64] {
        let mut buf: Vec<u8> = (0..n as i64).flat_map(|i| encode_report(OFFSET + i)).collect();
        buf.extend_from_slice(&[0, 0, 0]);
        assert_eq!(decode_reports(&buf), Some((OFFSET + n as i64 - 1, n * REPORT_SIZE)));
        group.bench_with_input(BenchmarkId::from_parameter(n), &buf, |b, buf| {
            b.iter(|| decode_reports(black_box(buf)))
        });
    }
    group.finish();
}

fn header(c: &mut Criterion) {
    let decoder = TransferDecoder::default();
    let header = encode_transfer_header(OFFSET, 32 * 1024);
    c.bench_function("ha_codec/decode_header", |b| {
        b.iter(|| decoder.decode_header(black_box(&header)))
    });
}

/// `count` frames of `body_size` bytes each, back to back, as the slave's read buffer holds them.
fn frames(count: usize, body_size: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(count * (TRANSFER_HEADER_SIZE + body_size));
    for i in 0..count {
        let offset = OFFSET + (i * body_size) as i64;
        buf.extend_from_slice(&encode_transfer_header(offset, body_size as i32));
        buf.resize(buf.len() + body_size, 0xA5);
    }
    buf
}

fn frame_walk(c: &mut Criterion) {
    let decoder = TransferDecoder::default();
    let mut group = c.benchmark_group("ha_codec/frame_walk");
    for (count, body_size) in [(32usize, 1024usize), (1, 32 * 1024)] {
        let buf = frames(count, body_size);
        group.throughput(Throughput::Bytes(buf.len() as u64));
        let id = BenchmarkId::from_parameter(format!("{count}x{body_size}"));
        group.bench_with_input(id, &buf, |b, buf| {
            b.iter(|| {
                let (mut pos, mut body_bytes) = (0, 0);
                while let Some(header) = decoder.decode_header(black_box(&buf[pos..])).unwrap() {
                    let frame = &buf[pos..pos + header.frame_len()];
                    body_bytes += black_box(&frame[TRANSFER_HEADER_SIZE..]).len();
                    pos += header.frame_len();
                }
                assert_eq!(pos, buf.len());
                body_bytes
            })
        });
    }
    group.finish();
}

criterion_group!(benches, encode, reports, header, frame_walk);
criterion_main!(benches);
