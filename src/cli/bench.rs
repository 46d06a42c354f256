//! `hasync bench`: end-to-end measurements, each next to a baseline measured in the same run.
//!
//! - `bench store`: 1 KiB appends (records/s, MiB/s) next to a raw copy of the same bytes into a
//!   freshly mapped file, and the recovery scan speed over a log of `--recovery-size` bytes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand};

use crate::config::units::ByteSize;
use crate::store::fs::{FileSystem, StdFs};
use crate::store::mapped_file::MappedFile;
use crate::store::record::{self, Message};
use crate::store::{CommitLog, StoreOptions};

/// `hasync bench ...`
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Commitlog appends and recovery scan against a raw mapped-file copy.
    Store(StoreBenchArgs),
}

/// Arguments of `hasync bench store`.
#[derive(Debug, Clone, Args)]
pub struct StoreBenchArgs {
    /// Bytes appended in the append test.
    #[arg(long, default_value = "512MiB")]
    pub size: ByteSize,
    /// Message body size.
    #[arg(long, default_value = "1KiB")]
    pub body: ByteSize,
    /// Size of the log the recovery scan reads.
    #[arg(long, default_value = "1GiB")]
    pub recovery_size: ByteSize,
    /// Segment file size.
    #[arg(long, default_value = "128MiB")]
    pub segment_size: ByteSize,
    /// Directory for the scratch data (a temporary directory inside it is removed afterwards).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// Runs a bench subcommand.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Store(args) => store(&args),
    }
}

/// A sample message with a body of `body_len` bytes.
pub fn sample_message(topic: &str, queue_id: i32, body_len: usize) -> Message {
    Message {
        topic: topic.to_owned(),
        queue_id,
        flag: 0,
        body: Bytes::from(vec![b'x'; body_len]),
        properties: Bytes::from_static(b"KEYS\x01bench\x02TAGS\x01b\x02"),
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: "127.0.0.1:50000".parse().expect("literal address"),
        store_timestamp_ms: 1_700_000_000_000,
        store_host: "127.0.0.1:10911".parse().expect("literal address"),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn store(args: &StoreBenchArgs) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let seg = args.segment_size.0 as usize;
    let body = args.body.0 as usize;
    let msg = sample_message("BenchTopic", 0, body);
    let rec_len = record::encoded_len(&msg)?;
    let count = (args.size.0 as usize / rec_len).max(1);
    let total = (count * rec_len) as u64;

    // Baseline: the same bytes copied record by record into freshly created mapped files.
    // Both sides run three times, alternating, and the best run of each counts, so that page
    // cache warm-up favours neither.
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let encoded = record::encode(&msg, 0, 0)?;
    let opts = StoreOptions {
        segment_size: seg,
        flush_interval: Duration::from_secs(3600),
        ..StoreOptions::default()
    };
    let (mut raw, mut appends) = (Duration::MAX, Duration::MAX);
    let mut stored = 0;
    for round in 0..3 {
        let raw_dir = base.path().join(format!("raw{round}"));
        std::fs::create_dir_all(&raw_dir)?;
        let started = Instant::now();
        let mut file = MappedFile::create(Arc::clone(&fs), &raw_dir, 0, seg)?;
        for _ in 0..count {
            if file.remaining() < rec_len {
                file = MappedFile::create(Arc::clone(&fs), &raw_dir, file.end_offset(), seg)?;
            }
            file.append(&encoded);
        }
        raw = raw.min(started.elapsed());
        drop(file);
        std::fs::remove_dir_all(&raw_dir)?;

        // The commitlog: encode + CRC + queue offset + roll, one append call per record.
        let log_dir = base.path().join(format!("log{round}"));
        let log = CommitLog::open(Arc::clone(&fs), &log_dir, opts.clone())?;
        let started = Instant::now();
        for _ in 0..count {
            log.append(std::slice::from_ref(&msg))?;
        }
        appends = appends.min(started.elapsed());
        stored = log.max_offset();
        drop(log);
        std::fs::remove_dir_all(&log_dir)?;
    }

    println!(
        "store bench: {count} records of {rec_len} bytes ({body}-byte bodies), segment {seg} bytes"
    );
    println!(
        "  raw mapped copy : {:>10.0} records/s {:>8.1} MiB/s",
        count as f64 / raw.as_secs_f64(),
        mib_per_s(total, raw)
    );
    println!(
        "  commitlog append: {:>10.0} records/s {:>8.1} MiB/s  ({:.0}% of the raw copy)",
        count as f64 / appends.as_secs_f64(),
        mib_per_s(stored, appends),
        100.0 * raw.as_secs_f64() / appends.as_secs_f64()
    );

    // Recovery scan: a log of recovery_size bytes, no checkpoint, unclean stop: full scan.
    let rec_dir = base.path().join("recovery");
    let log = CommitLog::open(Arc::clone(&fs), &rec_dir, opts.clone())?;
    let batch: Vec<Message> = (0..64).map(|i| sample_message("BenchTopic", i % 8, body)).collect();
    while log.max_offset() < args.recovery_size.0 {
        log.append(&batch)?;
    }
    let size = log.max_offset();
    drop(log);
    std::fs::remove_file(rec_dir.join(crate::store::checkpoint::CHECKPOINT_FILE)).ok();
    let started = Instant::now();
    let log = CommitLog::open(Arc::clone(&fs), &rec_dir, opts)?;
    let scan = started.elapsed();
    let r = log.recovery_report().clone();
    anyhow::ensure!(log.max_offset() == size, "recovery lost data: {} != {size}", log.max_offset());
    println!(
        "  recovery scan   : {} records, {:.2} GiB in {:.3} s = {:.2} GiB/s",
        r.scanned_records,
        r.scanned_bytes as f64 / (1u64 << 30) as f64,
        scan.as_secs_f64(),
        r.scanned_bytes as f64 / (1u64 << 30) as f64 / scan.as_secs_f64()
    );
    Ok(())
}
