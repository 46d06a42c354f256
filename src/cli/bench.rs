//! `hasync bench`: end-to-end measurements, each next to a baseline measured in the same run.
//!
//! - `bench store`: 1 KiB appends (records/s, MiB/s) next to a raw copy of the same bytes into a
//!   freshly mapped file, and the recovery scan speed over a log of `--recovery-size` bytes.
//! - `bench cluster` (in [`crate::cli::bench_cluster`]): groups against one etcd, per group
//!   next to one group measured in the same run.

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
    /// Slave catch-up over loopback against a plain socket copy between mapped files.
    Replication(ReplicationBenchArgs),
    /// SYNC and ASYNC puts with 1, 16 and 64 writers against a live slave, next to a loopback
    /// TCP round trip.
    Sync(SyncBenchArgs),
    /// Puts over gRPC with 1 and 16 clients (a unary Put each), and on one PutStream with 1
    /// and 16 puts in flight ("writers"), next to the same puts through the node API in the
    /// same run (the cost of the control plane).
    Grpc(SyncBenchArgs),
    /// A full and an unchanged metadata pull with 10,000 topics and 100,000 consumer offsets.
    Metadata(MetadataBenchArgs),
    /// 1, 10 and 100 groups against one etcd: etcd's load and the controller's at rest per
    /// group, the failover times of 1 and of 10 groups at once, the topology stream's delay.
    Cluster(crate::cli::bench_cluster::ClusterBenchArgs),
    /// The costs that grow with the log: CPU seconds per GB and the slave's anonymous memory
    /// while it catches up (master and slave in processes of their own, next to a plain socket
    /// copy), start-up and recovery after kill -9 with 1, 10 and 100 segments.
    Costs(crate::cli::bench_costs::CostsBenchArgs),
}

/// Arguments of `hasync bench metadata`.
#[derive(Debug, Clone, Args)]
pub struct MetadataBenchArgs {
    /// Topics in the table.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) topics: usize,
    /// Consumer offsets (spread over the topics, one group).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) offsets: usize,
}

/// Arguments of `hasync bench sync`.
#[derive(Debug, Clone, Args)]
pub struct SyncBenchArgs {
    /// How long each (mode, writers) run lasts.
    #[arg(long, default_value = "3s", value_parser = crate::config::units::parse_duration)]
    pub(crate) duration: Duration,
    /// Message body size.
    #[arg(long, default_value = "1KiB")]
    pub(crate) body: ByteSize,
    /// Concurrent writers, comma-separated.
    #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
    pub(crate) writers: Vec<usize>,
    /// Also run hasync and Redis side by side, each a master and a replica in processes of
    /// their own (Redis: `redis-server` when installed), with the same client harness.
    #[arg(long)]
    pub(crate) against_redis: bool,
    /// Write an HDR-style latency percentile plot (SVG) of the SYNC puts (and Redis's, with
    /// --against-redis) to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// `store.background-nice` of the in-process master and slave (the default when not
    /// given), to compare the tail with the store's background threads at other priorities.
    #[arg(long, value_name = "NICE", value_parser = clap::value_parser!(u8).range(0..=19))]
    pub(crate) background_nice: Option<u8>,
    /// `store.flush-interval` of the in-process master and slave (the default when not given),
    /// to see what the background flushes add to the tail.
    #[arg(long, value_name = "DURATION", value_parser = crate::config::units::parse_duration)]
    pub(crate) flush_interval: Option<Duration>,
    /// `store.segment-size` of the in-process master and slave, and of the hasync pair under
    /// --against-redis: how often a run rolls to a new segment (a 3 s run at 100 MB/s rolls
    /// about once at the default).
    #[arg(long, default_value = "256MiB")]
    pub(crate) segment_size: ByteSize,
    /// `store.warm-lock` of the in-process master and slave ("process" when not given: they
    /// take turns within the process), and of the hasync pair under --against-redis (when not
    /// given, a lock file of the pair's that both processes name): "none", "process" or an
    /// absolute path. To compare the tail with warms that do not take turns.
    #[arg(long, value_name = "LOCK", value_parser = parse_warm_lock)]
    pub(crate) warm_lock: Option<String>,
    /// Hold a CPU wake-up latency request of N µs (Linux PM QoS, `/dev/cpu_dma_latency`,
    /// machine-wide: Redis's processes under --against-redis get it too) for the whole run, as
    /// `node.cpu-dma-latency-us` does for a node: idle CPUs then wake within N µs (0: they
    /// poll). Needs root; a refusal ends the bench with the reason.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..=i64::from(crate::cli::cpu_latency::MAX_US)))]
    pub(crate) cpu_dma_latency_us: Option<i32>,
}

/// `--warm-lock`: a value `store.warm-lock` takes.
fn parse_warm_lock(s: &str) -> Result<String, String> {
    crate::config::WarmLock::parse(s).map(|_| s.to_owned()).map_err(str::to_owned)
}

/// Arguments of `hasync bench replication`.
#[derive(Debug, Clone, Args)]
pub struct ReplicationBenchArgs {
    /// Bytes the master holds before the slave starts.
    #[arg(long, default_value = "1GiB")]
    pub(crate) size: ByteSize,
    /// Message body size.
    #[arg(long, default_value = "1KiB")]
    pub(crate) body: ByteSize,
    /// Segment file size.
    #[arg(long, default_value = "128MiB")]
    pub(crate) segment_size: ByteSize,
    /// Frame body cap (ha.transfer-batch-size); also the baseline's write size.
    #[arg(long, default_value = "32KiB")]
    pub(crate) batch: ByteSize,
    /// Directory for the scratch data.
    #[arg(long)]
    pub(crate) dir: Option<std::path::PathBuf>,
}

/// Arguments of `hasync bench store`.
#[derive(Debug, Clone, Args)]
pub struct StoreBenchArgs {
    /// Bytes appended in the append test.
    #[arg(long, default_value = "512MiB")]
    pub(crate) size: ByteSize,
    /// Message body size.
    #[arg(long, default_value = "1KiB")]
    pub(crate) body: ByteSize,
    /// Size of the log the recovery scan reads.
    #[arg(long, default_value = "1GiB")]
    pub(crate) recovery_size: ByteSize,
    /// Segment file size.
    #[arg(long, default_value = "128MiB")]
    pub(crate) segment_size: ByteSize,
    /// Directory for the scratch data (a temporary directory inside it is removed afterwards).
    #[arg(long)]
    pub(crate) dir: Option<std::path::PathBuf>,
}

/// Runs a bench subcommand.
pub(crate) fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Store(args) => store(&args),
        BenchCommand::Replication(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(replication(&args))
        }
        BenchCommand::Sync(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(sync(&args, false))
        }
        BenchCommand::Metadata(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(metadata(&args))
        }
        BenchCommand::Cluster(args) => crate::cli::bench_cluster::run(&args),
        BenchCommand::Costs(args) => crate::cli::bench_costs::run(&args),
        BenchCommand::Grpc(mut args) => {
            if args.writers == [1, 16, 64] {
                args.writers = vec![1, 16];
            }
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(sync(&args, true))
        }
    }
}

/// A sample message with a body of `body_len` bytes.
pub(crate) fn sample_message(topic: &str, queue_id: i32, body_len: usize) -> Message {
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

async fn replication(args: &ReplicationBenchArgs) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let seg = args.segment_size.0 as usize;
    let batch_size = args.batch.0 as usize;
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let total = fill_master_log(args, &base.path().join("m"), &fs)?;
    println!(
        "replication bench: {:.2} GiB of {}-byte-body records, segment {seg}, batch {batch_size}",
        total as f64 / (1u64 << 30) as f64,
        args.body.0
    );
    let master_app = start_loopback(replication_config(args, &base.path().join("m"))).await?;
    let master_store = Arc::clone(master_app.node().store());
    let ha = master_app.ha_addr().expect("a master listens");

    // Baseline: the same bytes, read from the master's mapped files, written to a loopback
    // socket in batch-size writes, read and copied into fresh mapped files.
    let mut baseline = Duration::MAX;
    for round in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let dst_dir = base.path().join(format!("copy{round}"));
        std::fs::create_dir_all(&dst_dir)?;
        let fs2 = Arc::clone(&fs);
        let receiver = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut sock, _) = listener.accept().await?;
            sock.set_nodelay(true)?;
            let mut buf = vec![0u8; 4 << 20];
            let mut file = MappedFile::create(Arc::clone(&fs2), &dst_dir, 0, seg)?;
            let mut got = 0u64;
            while got < total {
                let n = sock.read(&mut buf).await?;
                anyhow::ensure!(n > 0, "baseline sender closed early");
                let mut at = 0;
                while at < n {
                    if file.is_full() {
                        file =
                            MappedFile::create(Arc::clone(&fs2), &dst_dir, file.end_offset(), seg)?;
                    }
                    let k = (n - at).min(file.remaining());
                    file.append(&buf[at..at + k]);
                    at += k;
                }
                got += n as u64;
            }
            anyhow::Ok(())
        });
        let started = Instant::now();
        let mut sock = tokio::net::TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let mut at = 0;
        while at < total {
            use tokio::io::AsyncWriteExt;
            let chunk = master_store.read(at, batch_size)?.expect("below max");
            sock.write_all(&chunk).await?;
            at += chunk.len() as u64;
        }
        receiver.await??;
        baseline = baseline.min(started.elapsed());
        std::fs::remove_dir_all(base.path().join(format!("copy{round}")))?;
    }

    // The protocol: an empty slave node catching up from the master's first byte.
    // Two rounds each with and without store.warm-segments (the slave's store thread faulting
    // the next segment in competes with a bulk catch-up); the best of each counts.
    let mut catch_up = [Duration::MAX; 2];
    for round in 0..4 {
        let warm = round % 2 == 1;
        let slave_dir = base.path().join(format!("s{round}"));
        let mut sc = replication_config(args, &slave_dir);
        sc.node.role = crate::config::Role::Slave;
        sc.slave.master_ha = ha.to_string();
        sc.store.warm_segments = warm;
        sc.slave.reconnect_backoff = Duration::from_millis(100);
        sc.slave.reconnect_backoff_max = Duration::from_secs(1);
        let started = Instant::now();
        let slave = start_loopback(sc).await?;
        let mut rx = slave.node().store().subscribe_max_offset();
        tokio::time::timeout(Duration::from_secs(600), rx.wait_for(|m| *m >= total)).await??;
        catch_up[usize::from(warm)] = catch_up[usize::from(warm)].min(started.elapsed());
        drop(rx);
        slave.shutdown().await?;
        drop(slave);
        std::fs::remove_dir_all(&slave_dir)?;
    }
    master_app.shutdown().await?;
    let b = mib_per_s(total, baseline);
    println!("  socket copy, mapped -> mapped : {b:>8.1} MiB/s ({:.3} s)", baseline.as_secs_f64());
    for (warm, d) in [(false, catch_up[0]), (true, catch_up[1])] {
        let c = mib_per_s(total, d);
        println!(
            "  slave catch-up, warm-segments {:<5}: {c:>8.1} MiB/s ({:.3} s)  = {:.0}% of the copy",
            warm,
            d.as_secs_f64(),
            100.0 * c / b
        );
    }
    Ok(())
}

/// Fills the master's log to `args.size` through the store (before the node starts on it).
fn fill_master_log(
    args: &ReplicationBenchArgs,
    dir: &std::path::Path,
    fs: &Arc<dyn FileSystem>,
) -> anyhow::Result<u64> {
    let opts = StoreOptions {
        segment_size: args.segment_size.0 as usize,
        flush_interval: Duration::from_secs(3600),
        ..StoreOptions::default()
    };
    let store = CommitLog::open(Arc::clone(fs), dir, opts)?;
    let batch: Vec<Message> =
        (0..64).map(|i| sample_message("BenchTopic", i % 8, args.body.0 as usize)).collect();
    while store.max_offset() < args.size.0 {
        store.append(&batch)?;
    }
    let total = store.max_offset();
    store.close()?;
    Ok(total)
}

/// A node of the replication bench: the bench's segment size and frame cap, an empty slave
/// starting at the master's first byte, no periodic flush in the way.
fn replication_config(args: &ReplicationBenchArgs, dir: &std::path::Path) -> crate::config::Config {
    let mut c = crate::config::Config::default();
    c.node.data_dir = dir.to_path_buf();
    c.store.segment_size = args.segment_size;
    c.store.flush_interval = Duration::from_secs(3600);
    c.ha.transfer_batch_size = args.batch;
    c.ha.empty_slave_start = crate::config::EmptySlaveStart::Earliest;
    c
}

/// Round trips of 8 bytes over a loopback TCP connection: p50 in microseconds.
async fn loopback_round_trip_us(count: usize) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 8];
        while s.read_exact(&mut b).await.is_ok() {
            s.write_all(&b).await?;
        }
        anyhow::Ok(())
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut b = [0u8; 8];
    for i in 0..count {
        let t = Instant::now();
        c.write_all(&(i as u64).to_be_bytes()).await?;
        c.read_exact(&mut b).await?;
        h.record(t.elapsed().as_micros() as u64)?;
    }
    drop(c);
    let _ = echo.await;
    Ok(h)
}

/// How a bench run puts: through the node API, one unary gRPC Put per message and writer, or
/// one PutStream with `writers` puts in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via<'a> {
    Node,
    Grpc(&'a str),
    Stream(&'a str),
    /// One PutStream whose puts ready at once travel in one request (`more`).
    Packed(&'a str),
    /// PutStream on the do-nothing echo service ([`crate::cli::bench_echo`]): gRPC's floor.
    Echo(&'a str),
    /// The same, packed.
    EchoPacked(&'a str),
}

impl Via<'_> {
    fn label(self) -> &'static str {
        match self {
            Via::Node => "node",
            Via::Grpc(_) => "grpc",
            Via::Stream(_) => "stream",
            Via::Packed(_) => "packed",
            Via::Echo(_) => "echo",
            Via::EchoPacked(_) => "echo-pk",
        }
    }

    /// Whether this is the echo baseline: no node behind it, so no mode and nothing plotted.
    fn is_baseline(self) -> bool {
        matches!(self, Via::Echo(_) | Via::EchoPacked(_))
    }
}

/// The bench's gRPC message.
pub(crate) fn pb_message(msg: &Message) -> crate::control::pb::Message {
    crate::control::pb::Message {
        topic: msg.topic.clone(),
        queue_id: msg.queue_id,
        body: msg.body.clone(),
        tags: "b".into(),
        ..Default::default()
    }
}

/// One (mode, writers) run: puts for `duration`, through the node or over gRPC.
async fn put_run(
    master: &Arc<crate::node::Node>,
    via: Via<'_>,
    writers: usize,
    duration: Duration,
    body: usize,
) -> anyhow::Result<(hdrhistogram::Histogram<u64>, u64)> {
    use crate::control::pb;
    use crate::node::PutStatus;
    match via {
        Via::Stream(url) | Via::Echo(url) => {
            return stream_run(url, writers, duration, body, false).await;
        }
        Via::Packed(url) | Via::EchoPacked(url) => {
            return stream_run(url, writers, duration, body, true).await;
        }
        Via::Node | Via::Grpc(_) => {}
    }
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let m = Arc::clone(master);
        let url = match via {
            Via::Grpc(u) => Some(u.to_owned()),
            _ => None,
        };
        tasks.push(tokio::spawn(async move {
            let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
            let mut not_ok = 0u64;
            let msg = sample_message("BenchTopic", (w % 8) as i32, body);
            let mut client = match url {
                Some(u) => Some(pb::messages_client::MessagesClient::new(
                    crate::control::coalesce::connect(&tonic::transport::Endpoint::from_shared(u)?)
                        .await?,
                )),
                None => None,
            };
            let req = pb::PutRequest { messages: vec![pb_message(&msg)] };
            while Instant::now() < stop {
                let t = Instant::now();
                let ok = match client.as_mut() {
                    Some(c) => {
                        c.put(req.clone()).await?.into_inner().status() == pb::PutStatus::PutOk
                    }
                    None => m.put(vec![msg.clone()]).await.status == PutStatus::PutOk,
                };
                h.record(t.elapsed().as_micros() as u64)?;
                not_ok += u64::from(!ok);
            }
            anyhow::Ok((h, not_ok))
        }));
    }
    let mut all = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut not_ok = 0;
    for t in tasks {
        let (h, n) = t.await??;
        all.add(&h)?;
        not_ok += n;
    }
    Ok((all, not_ok))
}

/// One client on one PutStream keeping `in_flight` single-message puts ahead of their
/// answers for `duration`; each put's latency is from its send to its answer. `coalesce`: the
/// puts ready at once travel in one request (`PutStreamRequest.more`) and come back in one
/// response; else one request per put.
pub(crate) async fn stream_run(
    url: &str,
    in_flight: usize,
    duration: Duration,
    body: usize,
    coalesce: bool,
) -> anyhow::Result<(hdrhistogram::Histogram<u64>, u64)> {
    use crate::control::pb;
    let in_flight = in_flight.max(1);
    let mut client = pb::messages_client::MessagesClient::new(
        crate::control::coalesce::connect(&tonic::transport::Endpoint::from_shared(
            url.to_owned(),
        )?)
        .await?,
    );
    let (tx, rx) = tokio::sync::mpsc::channel(in_flight);
    let response = client.put_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await?;
    // A pack holds at most what the node says (none: one put per request), and about
    // PACK_BYTES of bodies, as `hasync put` packs.
    let most = response.metadata().get(crate::control::put_stream::PACKS_HEADER);
    let most = most.and_then(|v| v.to_str().ok()?.parse::<usize>().ok()).unwrap_or(1);
    let by_size = crate::cli::client::put::PACK_BYTES as usize / body.max(1);
    let pack = most.min(by_size).max(1);
    let mut answers = response.into_inner();
    let msg = pb_message(&sample_message("BenchTopic", 0, body));
    let put = |id| pb::PutStreamRequest { id, messages: vec![msg.clone()], more: Vec::new() };
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut sent = std::collections::VecDeque::with_capacity(in_flight);
    let (stop, mut id, mut not_ok) = (Instant::now() + duration, 0u64, 0u64);
    let mut tx = Some(tx);
    loop {
        while let Some(t) = tx.as_ref().filter(|_| sent.len() < in_flight) {
            let mut request = put(id);
            let room = if coalesce { (in_flight - sent.len()).min(pack) } else { 1 };
            request.more = (1..room as u64).map(|i| put(id + i)).collect();
            t.send(request).await.map_err(|_| anyhow::anyhow!("the put stream closed"))?;
            let at = Instant::now();
            sent.extend(std::iter::repeat_n(at, room));
            id += room as u64;
        }
        if Instant::now() >= stop {
            tx = None;
        }
        if sent.is_empty() {
            break;
        }
        let answer = answers.message().await?.ok_or_else(|| anyhow::anyhow!("stream ended"))?;
        let now = Instant::now();
        for a in std::iter::once(&answer).chain(&answer.more) {
            let at = sent.pop_front().ok_or_else(|| anyhow::anyhow!("an answer too many"))?;
            h.record(now.duration_since(at).as_micros() as u64)?;
            let ok = a.response.as_ref().is_some_and(|r| r.status() == pb::PutStatus::PutOk);
            not_ok += u64::from(!ok);
        }
    }
    Ok((h, not_ok))
}

async fn sync(args: &SyncBenchArgs, grpc: bool) -> anyhow::Result<()> {
    use crate::config::{ReplicationMode, Role};

    let latency = args
        .cpu_dma_latency_us
        .map(crate::cli::cpu_latency::CpuLatencyHold::request)
        .transpose()
        .map_err(|e| e.context("--cpu-dma-latency-us"))?;

    let base = tempfile::tempdir()?;
    let node_config = |name: &str| {
        let mut c = crate::config::Config::default();
        c.node.name = name.to_owned();
        c.node.data_dir = base.path().join(name);
        c.store.segment_size = args.segment_size;
        c.store.background_nice = args.background_nice.unwrap_or(c.store.background_nice);
        c.store.flush_interval = args.flush_interval.unwrap_or(c.store.flush_interval);
        c.store.warm_lock = args.warm_lock.clone().unwrap_or(c.store.warm_lock);
        c.ha.listen = "127.0.0.1:0".parse().expect("literal address");
        c.replication.mode = ReplicationMode::Sync;
        c
    };
    let master_app = start_loopback(node_config("master")).await?;
    let master = Arc::clone(master_app.node());
    let mut sc = node_config("slave");
    sc.node.role = Role::Slave;
    sc.slave.master_ha = master.ha_addr().expect("master listens").to_string();
    let slave_app = start_loopback(sc).await?;
    let url = grpc.then(|| format!("http://{}", master_app.grpc_addr()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while master.status().in_sync_replicas < 1 {
        anyhow::ensure!(Instant::now() < deadline, "the slave did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rtt = loopback_round_trip_us(20_000).await?;
    println!(
        "{} bench: {}-byte bodies, {:?} per run, slave on loopback, {} segments, \
         store.warm-lock = {:?}",
        if grpc { "grpc" } else { "sync" },
        args.body.0,
        args.duration,
        args.segment_size,
        master_app.node().config().store.warm_lock
    );
    println!(
        "  loopback TCP round trip (8 bytes): p50 {} us, p99 {} us",
        rtt.value_at_quantile(0.5),
        rtt.value_at_quantile(0.99)
    );
    // A blocking baseline: on its own threads, outside the runtime. A machine that refuses
    // pinning gets the reason in its place, not a failed bench.
    let wake =
        tokio::task::spawn_blocking(|| crate::cli::bench_platform::wake_up_line(20_000)).await?;
    println!(
        "{}",
        wake.unwrap_or_else(|e| format!("  thread wake-up round trip: not measured ({e:#})"))
    );
    println!("{}", crate::cli::bench_platform::idle_line());
    match &latency {
        Some(hold) => println!(
            "  held for the whole run: a {} us CPU latency request (--cpu-dma-latency-us; \
             machine-wide, Redis included)",
            hold.us()
        ),
        None => {
            println!("  no CPU latency request held (--cpu-dma-latency-us N holds one for the run)")
        }
    }
    println!(
        "  CPU us/op: this process's CPU microseconds per put (master, slave, clients, store \
         threads: all in it); {} CPUs here",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!(
        "  {:<6} {:<8} {:>7} {:>11} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}",
        "mode",
        "via",
        "writers",
        "puts/s",
        "p50 us",
        "p99 us",
        "p999 us",
        "max us",
        "not ok",
        "CPU us/op"
    );
    // The first put creates the first segment; its warm (and the spare's) then runs on the
    // store threads, and each run below starts once that is done.
    let first = master.put(vec![sample_message("BenchTopic", 0, args.body.0 as usize)]).await;
    anyhow::ensure!(first.status == crate::node::PutStatus::PutOk, "the first put: {first:?}");
    let process_cpu =
        || crate::cli::bench_costs::cpu_seconds(rustix::time::ClockId::ProcessCPUTime);
    let mut settled = crate::cli::bench_platform::SettleLog::default();
    // gRPC's floor: the same PutStream client against a service that stores nothing.
    let echo = if grpc { Some(crate::cli::bench_echo::EchoServer::start().await?) } else { None };
    let echo_url = echo.as_ref().map(crate::cli::bench_echo::EchoServer::url);
    let mut vias: Vec<Via<'_>> = match url.as_deref() {
        Some(u) => vec![Via::Node, Via::Grpc(u), Via::Stream(u), Via::Packed(u)],
        None => vec![Via::Node],
    };
    if let Some(u) = echo_url.as_deref() {
        vias.extend([Via::Echo(u), Via::EchoPacked(u)]);
    }
    let mut node_sync_p50 = None;
    let mut plotted = Vec::new();
    for mode in [ReplicationMode::Sync, ReplicationMode::Async] {
        master.set_replication_mode(mode, None)?;
        for &writers in &args.writers {
            for &via in &vias {
                // The echo stores nothing and has no mode: one run per number of writers.
                if via.is_baseline() && mode != ReplicationMode::Sync {
                    continue;
                }
                settled.add(
                    crate::cli::bench_platform::settle(
                        || Some(process_cpu()),
                        Duration::from_millis(100),
                        SETTLE_LIMIT,
                    )
                    .await,
                );
                let cpu_before = process_cpu();
                let (all, not_ok) =
                    put_run(&master, via, writers, args.duration, args.body.0 as usize).await?;
                let cpu_us_per_put =
                    (process_cpu() - cpu_before) * 1e6 / (all.len() as f64).max(1.0);
                if mode == ReplicationMode::Sync && !via.is_baseline() {
                    if via == Via::Node && writers == 1 {
                        node_sync_p50 = Some(all.value_at_quantile(0.5));
                    }
                    plotted.push((format!("SYNC {} {writers} writers", via.label()), all.clone()));
                }
                let mode_label = if via.is_baseline() {
                    "-".to_owned()
                } else {
                    format!("{mode:?}").to_uppercase()
                };
                println!(
                    "  {:<6} {:<8} {:>7} {:>11.0} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10.1}",
                    mode_label,
                    via.label(),
                    writers,
                    all.len() as f64 / args.duration.as_secs_f64(),
                    all.value_at_quantile(0.5),
                    all.value_at_quantile(0.99),
                    all.value_at_quantile(0.999),
                    all.max(),
                    not_ok,
                    cpu_us_per_put
                );
            }
        }
    }
    if let Some(echo) = echo {
        println!(
            "  echo: the same PutStream client against a gRPC service that stores nothing (tonic's \
             defaults, this process): what gRPC alone costs per put here"
        );
        println!(
            "  packed, echo-pk: the same puts, those ready at once sent in one request \
             (PutStreamRequest.more) and answered in one response"
        );
        echo.stop().await?;
    }
    println!("{}", settled.summary("this process"));
    slave_app.shutdown().await?;
    master_app.shutdown().await?;
    if args.against_redis {
        // The clients run on one thread of their own (a current-thread runtime), for both
        // systems alike: a client's own hops (its connection task, tonic's buffer) stay on
        // that thread instead of waking another one per request.
        let args = args.clone();
        let clients = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(crate::cli::bench_pair::run(&args, node_sync_p50))
        });
        return clients.join().map_err(|_| anyhow::anyhow!("the comparison's thread panicked"))?;
    }
    if let Some(file) = &args.plot {
        let series: Vec<(&str, &hdrhistogram::Histogram<u64>)> =
            plotted.iter().map(|(l, h)| (l.as_str(), h)).collect();
        let title = format!(
            "SYNC put latency in one process, slave on loopback, {}-byte bodies, {:?} per run",
            args.body.0, args.duration
        );
        std::fs::write(file, crate::cli::bench_plot::svg(&title, &series))?;
        println!("  plot written to {}", file.display());
    }
    Ok(())
}

/// How long a bench waits at most for its processes to go idle before a run.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// A node on loopback listeners with OS-assigned ports, without a metrics server.
async fn start_loopback(config: crate::config::Config) -> anyhow::Result<crate::app::App> {
    let mut listeners = crate::app::Listeners::loopback().await?;
    listeners.metrics = None;
    let fs = Arc::new(crate::store::fs::StdFs);
    Ok(crate::app::App::start(config, listeners, fs, crate::app::StartOptions::default()).await?)
}

async fn metadata(args: &MetadataBenchArgs) -> anyhow::Result<()> {
    use std::collections::BTreeMap;

    use crate::control::pb;
    use crate::metadata::{DataVersion, TableData, TopicConfig};
    use prost::Message as _;

    let base = tempfile::tempdir()?;
    let mut c = crate::config::Config::default();
    c.node.data_dir = base.path().join("master");
    c.ha.listen = "127.0.0.1:0".parse().expect("literal address");
    let app = start_loopback(c).await?;
    let store = Arc::clone(app.node().metadata());
    let (topics, offsets) = (args.topics.max(1), args.offsets);
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut t = BTreeMap::new();
        let mut o: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for i in 0..topics {
            let name = format!("BenchTopic{i:06}");
            t.insert(
                name.clone(),
                TopicConfig {
                    topic_name: name,
                    read_queue_nums: 8,
                    write_queue_nums: 8,
                    perm: 6,
                    topic_filter_type: "SINGLE_TAG".into(),
                    topic_sys_flag: 0,
                    order: false,
                },
            );
        }
        for j in 0..offsets {
            o.entry(format!("BenchGroup@BenchTopic{:06}", j % topics))
                .or_default()
                .insert((j / topics) as i32, j as i64);
        }
        let v = DataVersion { state_version: 0, timestamp_unix_ms: 1, counter: 1 };
        store.adopt(v, TableData::Topics(t))?;
        store.adopt(v, TableData::ConsumerOffsets(o))?;
        Ok(())
    })
    .await??;
    let mut client =
        pb::metadata_client::MetadataClient::connect(format!("http://{}", app.grpc_addr()))
            .await?
            .max_decoding_message_size(64 << 20);
    let mut held = pb::PullRequest::default();
    println!("metadata bench: {topics} topics, {offsets} consumer offsets");
    for pass in ["full", "unchanged"] {
        let started = Instant::now();
        let mut stream = client.pull(held).await?.into_inner();
        let (mut bytes, mut chunks) = (0usize, 0usize);
        while let Some(chunk) = stream.message().await? {
            bytes += chunk.encoded_len();
            chunks += 1;
            let v = chunk.version;
            match crate::control::metadata_wire::table_of(chunk.table) {
                Some(crate::metadata::Table::Topics) => held.topics = v,
                Some(crate::metadata::Table::ConsumerOffsets) => held.consumer_offsets = v,
                Some(crate::metadata::Table::DelayOffsets) => held.delay_offsets = v,
                Some(crate::metadata::Table::SubscriptionGroups) => held.subscription_groups = v,
                None => {}
            }
        }
        println!(
            "  {pass:<9} pull: {:>10} bytes in {:>4} chunks, {:>8.1} ms",
            bytes,
            chunks,
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    app.shutdown().await?;
    Ok(())
}
