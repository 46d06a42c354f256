//! `hasync bench sync --against-redis`: hasync and Redis side by side, each as a master and a
//! replica in processes of their own on loopback, driven by the same compiled client harness
//! in this process (its own runtime): gRPC `Messages/Put` (SYNC, one replica) for hasync,
//! `SET` + `WAIT 1` over RESP for Redis, at the same numbers of clients, one connection each.
//! Beside the unary Put, two PutStream rows: one client with as many puts in flight, and as
//! many clients each on a PutStream of its own with one put at a time (Redis's shape); each
//! goal of the comparison is judged on all three.
//!
//! Both systems are then client process -> master process -> replica process, so neither pays
//! for sharing a runtime with the other parts. Redis is Debian's `redis-server` (PATH or
//! /usr/bin); without it the comparison says so and only hasync runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::cli::bench::SETTLE_LIMIT;
use crate::cli::bench::{SyncBenchArgs, pb_message, sample_message, stream_run};
use crate::cli::bench_cluster::probe::{HeldPort, ProcStat, Spawned, hold_ports};
use crate::cli::bench_costs::thread_cpu;
use crate::cli::bench_platform::{SettleLog, settle};
use crate::config::units::ByteSize;
use crate::control::pb;

/// How long a pair may take to start and connect.
const START_WAIT: Duration = Duration::from_secs(30);
/// Redis's WAIT timeout (ms): as hasync's default replication.slave-timeout.
const WAIT_TIMEOUT_MS: u64 = 3000;

/// One run's figures.
pub(crate) struct Run {
    pub(crate) label: String,
    pub(crate) hist: Histogram<u64>,
    pub(crate) not_ok: u64,
    pub(crate) duration: Duration,
    /// CPU seconds the run cost its three parts (none when they could not be read).
    pub(crate) cpu: Option<Cpu>,
    /// hasync: the master's segment rolls during the run (none for Redis).
    pub(crate) rolls: Option<u64>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.hist.len() as f64 / self.duration.as_secs_f64()
    }

    /// CPU microseconds per operation: the clients' thread, the master, the replica, in all.
    fn cpu_per_op(&self) -> Option<[f64; 4]> {
        let c = self.cpu?;
        let ops = self.hist.len() as f64;
        (ops > 0.0).then(|| {
            let per = |s: f64| s * 1e6 / ops;
            [per(c.client), per(c.master), per(c.replica), per(c.client + c.master + c.replica)]
        })
    }
}

/// CPU seconds of a run's three parts: the thread all clients run on (this one, for both
/// systems alike), the master process and the replica process (utime + stime from
/// `/proc/PID/stat`, in clock ticks: 10 ms each).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    client: f64,
    master: f64,
    replica: f64,
}

impl Cpu {
    /// The CPU seconds used so far by this thread and by the two processes.
    fn now(master: u32, replica: u32) -> anyhow::Result<Self> {
        Ok(Self {
            client: thread_cpu(),
            master: ProcStat::read(master)?.cpu_s,
            replica: ProcStat::read(replica)?.cpu_s,
        })
    }

    fn since(self, before: Self) -> Self {
        Self {
            client: self.client - before.client,
            master: self.master - before.master,
            replica: self.replica - before.replica,
        }
    }
}

/// Waits until every server process of the bench (`quiet`: both systems' masters and replicas,
/// so that one system's background work, such as hasync's segment warm, does not fall in the
/// other's run) is idle ([`settle`]), then runs `run` and adds the CPU its three parts used
/// meanwhile (the clients' thread and the measured system's `pids`); a CPU figure that cannot
/// be read leaves the run without one.
async fn metered(
    pids: (u32, u32),
    quiet: &[u32],
    settled: &mut SettleLog,
    run: impl Future<Output = anyhow::Result<Run>>,
) -> anyhow::Result<Run> {
    let all = || quiet.iter().map(|&p| ProcStat::read(p).ok().map(|s| s.cpu_s)).sum();
    // 300 ms windows: /proc counts CPU in 10 ms ticks.
    settled.add(settle(all, Duration::from_millis(300), SETTLE_LIMIT).await);
    let before = Cpu::now(pids.0, pids.1).ok();
    let mut out = run.await?;
    out.cpu = before.and_then(|b| Cpu::now(pids.0, pids.1).ok().map(|a| a.since(b)));
    Ok(out)
}

/// Runs `run` as [`metered`] does, on the hasync pair, and counts the master's segment rolls
/// meanwhile.
async fn hasync_row(
    pair: &HasyncPair,
    pids: (u32, u32),
    quiet: &[u32],
    settled: &mut SettleLog,
    run: impl Future<Output = anyhow::Result<Run>>,
) -> anyhow::Result<Run> {
    let segment = pair.segment.0.max(1);
    let before = pair.max_offset().await?;
    let mut out = metered(pids, quiet, settled, run).await?;
    out.rolls = Some(pair.max_offset().await? / segment - before / segment);
    Ok(out)
}

/// An hasync master and slave as child processes of this binary (`hasync serve`).
struct HasyncPair {
    master: Spawned,
    slave: Spawned,
    grpc: String,
    /// Their `store.segment-size`.
    segment: ByteSize,
    /// The nodes' ports, held while they run.
    _ports: Vec<HeldPort>,
}

/// A node's config file: loopback listeners, SYNC, segments of `segment`, warms taking turns
/// as `warm_lock` says (`store.warm-lock`).
fn node_toml(
    name: &str,
    dir: &Path,
    (segment, warm_lock): (ByteSize, &str),
    ports: (u16, u16, u16),
    master_ha: Option<u16>,
) -> String {
    let (ha, grpc, metrics) = ports;
    let role = if master_ha.is_some() { "slave" } else { "master" };
    let slave = master_ha
        .map(|p| format!("\n[slave]\nmaster-ha = \"127.0.0.1:{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[node]\nname = \"{name}\"\nrole = \"{role}\"\ndata-dir = \"{}\"\n\n\
         [store]\nsegment-size = \"{segment}\"\nwarm-lock = {}\n\n[ha]\nlisten = \"127.0.0.1:{ha}\"\n\n\
         [grpc]\nlisten = \"127.0.0.1:{grpc}\"\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\n\
         [replication]\nmode = \"sync\"\n{slave}\n[log]\nfilter = \"warn\"\n",
        dir.join("data").display(),
        toml::Value::String(warm_lock.to_owned()),
    )
}

/// The lock file the pair's warms take turns through by default, in `base`: an absolute path
/// (`store.warm-lock` accepts no other), also when `TMPDIR` names a relative one.
fn pair_lock_path(base: &Path) -> std::io::Result<String> {
    Ok(std::path::absolute(base.join("warm.lock"))?.display().to_string())
}

impl HasyncPair {
    /// Starts the pair in `base`; its warms take turns as `warm_lock` says, by default through
    /// a lock file of its own that both name, as the in-process master and slave take turns
    /// within their process.
    async fn start(
        base: &Path,
        segment: ByteSize,
        warm_lock: Option<&str>,
    ) -> anyhow::Result<Self> {
        let shared_lock = pair_lock_path(base)?;
        let warm_lock = warm_lock.unwrap_or(&shared_lock);
        let bin = std::env::current_exe().context("the running binary")?;
        let spawn = |name: &'static str,
                     ports: &[HeldPort],
                     master_ha: Option<u16>|
         -> anyhow::Result<Spawned> {
            let dir = base.join(name);
            std::fs::create_dir_all(&dir)?;
            let ports = (ports[0].port, ports[1].port, ports[2].port);
            let file = dir.join("hasync.toml");
            std::fs::write(&file, node_toml(name, &dir, (segment, warm_lock), ports, master_ha))?;
            let mut cmd = Command::new(&bin);
            cmd.arg("serve").arg("--config").arg(&file);
            Spawned::spawn(name, cmd, dir.join("log"))
        };
        let ports = hold_ports(6)?;
        let (ha, grpc) = (ports[0].port, ports[1].port);
        let master = spawn("master", &ports[..3], None)?;
        let slave = spawn("slave", &ports[3..], Some(ha))?;
        let grpc = format!("http://127.0.0.1:{grpc}");
        let pair = Self { master, slave, grpc, segment, _ports: ports };
        pair.wait_in_sync().await?;
        Ok(pair)
    }

    /// Until the master shows one in-sync replica (bounded by [`START_WAIT`]).
    async fn wait_in_sync(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Ok(mut c) =
                pb::replication_client::ReplicationClient::connect(self.grpc.clone()).await
                && let Ok(st) = c.get_status(pb::GetStatusRequest {}).await
                && st.into_inner().in_sync_replicas >= 1
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the hasync pair did not connect within {START_WAIT:?}; master log:\n{}\nslave log:\n{}",
                self.master.log_tail(20),
                self.slave.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The master's log end.
    async fn max_offset(&self) -> anyhow::Result<u64> {
        let mut c = pb::replication_client::ReplicationClient::connect(self.grpc.clone()).await?;
        Ok(c.get_status(pb::GetStatusRequest {}).await?.into_inner().max_offset as u64)
    }

    async fn set_mode(&self, mode: pb::ReplicationMode) -> anyhow::Result<()> {
        let mut c = pb::replication_client::ReplicationClient::connect(self.grpc.clone()).await?;
        c.set_replication_mode(pb::SetReplicationModeRequest {
            mode: mode as i32,
            ..Default::default()
        })
        .await?;
        Ok(())
    }
}

/// A Redis master and replica (`redis-server`, no persistence) as child processes.
struct RedisPair {
    master: Spawned,
    replica: Spawned,
    addr: SocketAddr,
    /// Their ports, held while they run.
    _ports: Vec<HeldPort>,
}

/// Debian's redis-server, on PATH or at /usr/bin.
fn redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

impl RedisPair {
    async fn start(bin: &Path, base: &Path) -> anyhow::Result<Self> {
        let spawn =
            |name: &'static str, port: u16, master: Option<u16>| -> anyhow::Result<Spawned> {
                let dir = base.join(name);
                std::fs::create_dir_all(&dir)?;
                let mut cmd = Command::new(bin);
                cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", ""])
                    .args(["--appendonly", "no", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(&dir);
                if let Some(m) = master {
                    cmd.args(["--replicaof", "127.0.0.1", &m.to_string()]);
                }
                Spawned::spawn(name, cmd, dir.join("log"))
            };
        let ports = hold_ports(2)?;
        let (mp, rp) = (ports[0].port, ports[1].port);
        let master = spawn("redis-master", mp, None)?;
        let replica = spawn("redis-replica", rp, Some(mp))?;
        let addr: SocketAddr = ([127, 0, 0, 1], mp).into();
        let pair = Self { master, replica, addr, _ports: ports };
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Ok(mut c) = Resp::connect(addr).await
                && let Ok(info) = c.info_replication().await
                && info.contains("connected_slaves:1")
                && info.contains("state=online")
            {
                return Ok(pair);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the Redis pair did not connect within {START_WAIT:?}; replica log:\n{}",
                pair.replica.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A minimal RESP client: commands as arrays of bulk strings, one reply parsed per command.
struct Resp {
    reader: BufReader<tokio::io::ReadHalf<tokio::net::TcpStream>>,
    writer: tokio::io::WriteHalf<tokio::net::TcpStream>,
    line: String,
}

/// One RESP reply.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
}

/// Appends one RESP command (an array of bulk strings) to `out`.
pub(crate) fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A reply's first line (without CRLF) and, for a bulk string, its declared length.
pub(crate) fn parse_line(line: &str) -> anyhow::Result<Result<Reply, i64>> {
    let (kind, rest) = line.split_at_checked(1).context("an empty RESP line")?;
    Ok(match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(rest.parse().context("a RESP integer")?)),
        "$" => match rest.parse::<i64>().context("a RESP bulk length")? {
            -1 => Ok(Reply::Bulk(None)),
            n if n >= 0 => Err(n),
            n => anyhow::bail!("a negative RESP bulk length {n}"),
        },
        _ => anyhow::bail!("an unexpected RESP reply {line:?}"),
    })
}

impl Resp {
    async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let sock = tokio::net::TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let (r, w) = tokio::io::split(sock);
        Ok(Self { reader: BufReader::new(r), writer: w, line: String::new() })
    }

    async fn reply(&mut self) -> anyhow::Result<Reply> {
        self.line.clear();
        let n = self.reader.read_line(&mut self.line).await?;
        anyhow::ensure!(n > 0, "Redis closed the connection");
        let line = self.line.trim_end_matches(['\r', '\n']).to_owned();
        match parse_line(&line)? {
            Ok(reply) => Ok(reply),
            Err(len) => {
                let mut buf = vec![0u8; len as usize + 2];
                self.reader.read_exact(&mut buf).await?;
                buf.truncate(len as usize);
                Ok(Reply::Bulk(Some(buf)))
            }
        }
    }

    async fn info_replication(&mut self) -> anyhow::Result<String> {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"INFO", b"replication"]);
        self.writer.write_all(&out).await?;
        match self.reply().await? {
            Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => anyhow::bail!("INFO answered {other:?}"),
        }
    }
}

/// `clients` Redis clients, each `SET key value` + `WAIT 1 timeout` (sent together, one round
/// trip, as a pipelining client does) until `duration` ends; ok when WAIT answers >= 1.
async fn redis_run(
    addr: SocketAddr,
    clients: usize,
    duration: Duration,
    body: usize,
) -> anyhow::Result<Run> {
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut r = Resp::connect(addr).await?;
            let mut cmd = Vec::new();
            let key = format!("bench:{c}");
            encode_command(&mut cmd, &[b"SET", key.as_bytes(), &vec![b'x'; body]]);
            encode_command(&mut cmd, &[b"WAIT", b"1", WAIT_TIMEOUT_MS.to_string().as_bytes()]);
            let (mut h, mut not_ok) = (Histogram::<u64>::new(3)?, 0u64);
            while Instant::now() < stop {
                let t = Instant::now();
                r.writer.write_all(&cmd).await?;
                let set = r.reply().await?;
                let wait = r.reply().await?;
                h.record(t.elapsed().as_micros() as u64)?;
                let ok = set == Reply::Simple("OK".into())
                    && matches!(wait, Reply::Integer(n) if n >= 1);
                not_ok += u64::from(!ok);
            }
            anyhow::Ok((h, not_ok))
        }));
    }
    gather(format!("Redis SET+WAIT {clients} clients"), tasks, duration).await
}

/// `clients` gRPC clients, each a unary `Messages/Put` of one message after another.
async fn grpc_run(
    url: &str,
    clients: usize,
    duration: Duration,
    body: usize,
    label: &str,
) -> anyhow::Result<Run> {
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for w in 0..clients {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut c = pb::messages_client::MessagesClient::new(
                crate::control::coalesce::connect(&tonic::transport::Endpoint::from_shared(url)?)
                    .await?,
            );
            let req = pb::PutRequest {
                messages: vec![pb_message(&sample_message("BenchTopic", (w % 8) as i32, body))],
            };
            let (mut h, mut not_ok) = (Histogram::<u64>::new(3)?, 0u64);
            while Instant::now() < stop {
                let t = Instant::now();
                let out = c.put(req.clone()).await?.into_inner();
                h.record(t.elapsed().as_micros() as u64)?;
                not_ok += u64::from(out.status() != pb::PutStatus::PutOk);
            }
            anyhow::Ok((h, not_ok))
        }));
    }
    gather(format!("hasync {label} {clients} clients"), tasks, duration).await
}

/// `clients` clients, each on a PutStream of its own (one connection each) with one put in
/// flight: Redis's clients' shape (one operation at a time per connection) on the streaming
/// put.
async fn streams_run(
    url: &str,
    clients: usize,
    duration: Duration,
    body: usize,
) -> anyhow::Result<Run> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move { stream_run(&url, 1, duration, body, false).await }));
    }
    gather(format!("hasync SYNC PutStream {clients} clients"), tasks, duration).await
}

/// One client on one PutStream with `in_flight` puts in flight, packed or one per request.
async fn one_stream_run(
    url: &str,
    in_flight: usize,
    duration: Duration,
    body: usize,
    packed: bool,
) -> anyhow::Result<Run> {
    let (hist, not_ok) = stream_run(url, in_flight, duration, body, packed).await?;
    let shape = if packed { "packed" } else { "in flight" };
    let label = format!("hasync SYNC PutStream {in_flight} {shape}");
    Ok(Run { label, hist, not_ok, duration, cpu: None, rolls: None })
}

/// One client task: its latencies and how many answers were not ok.
type ClientTask = tokio::task::JoinHandle<anyhow::Result<(Histogram<u64>, u64)>>;

async fn gather(label: String, tasks: Vec<ClientTask>, duration: Duration) -> anyhow::Result<Run> {
    let mut hist = Histogram::<u64>::new(3)?;
    let mut not_ok = 0;
    for t in tasks {
        let (h, n) = t.await??;
        hist.add(&h)?;
        not_ok += n;
    }
    Ok(Run { label, hist, not_ok, duration, cpu: None, rolls: None })
}

fn row(r: &Run) -> String {
    let cpu = match r.cpu_per_op() {
        Some([client, master, replica, all]) => {
            format!("{all:>8.1} = {client:.1} + {master:.1} + {replica:.1}")
        }
        None => format!("{:>8}", "-"),
    };
    let rolls = r.rolls.map_or_else(|| "-".to_owned(), |n| n.to_string());
    format!(
        "  {:<34} {:>9.0} {:>8} {:>8} {:>9} {:>7} {rolls:>5} {cpu}",
        r.label,
        r.rate(),
        r.hist.value_at_quantile(0.5),
        r.hist.value_at_quantile(0.99),
        r.hist.value_at_quantile(0.999),
        r.not_ok
    )
}

/// Runs the comparison (after the in-process figures of `bench sync`, whose node SYNC p50 at
/// one writer is `node_sync_p50_us`); writes the plot when asked.
pub(crate) async fn run(args: &SyncBenchArgs, node_sync_p50_us: Option<u64>) -> anyhow::Result<()> {
    let base = tempfile::tempdir()?;
    let body = args.body.0 as usize;
    let redis_bin = redis_server();
    println!();
    println!(
        "hasync next to Redis: master and replica each a process on loopback, {}-byte values, \
         {:?} per run, one connection per client",
        body, args.duration
    );
    let hasync = HasyncPair::start(
        &base.path().join("hasync"),
        args.segment_size,
        args.warm_lock.as_deref(),
    )
    .await?;
    let redis = match &redis_bin {
        Some(bin) => Some(RedisPair::start(bin, &base.path().join("redis")).await?),
        None => {
            println!(
                "  redis-server is not installed (PATH, /usr/bin): the Redis comparison is skipped (Debian: apt-get install redis-server)"
            );
            None
        }
    };
    if let Some(bin) = &redis_bin {
        let v = Command::new(bin).arg("--version").output().ok();
        let v = v.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
        println!("  {v}");
    }
    println!(
        "  CPU us/op: CPU microseconds per operation, in all = the clients' thread + the master \
         process + the replica process (/proc/PID/stat, 10 ms ticks); {} CPUs here",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!(
        "  rolls: the hasync master's segment rolls during the run ({} segments, --segment-size): \
         each starts the warm of a segment ahead in master and replica, whose first touch of \
         cold memory is where the tail's 20-30 ms stalls come from (docs/benchmarks.md, \"The tail\")",
        args.segment_size
    );
    println!(
        "  warms: {} (docs/benchmarks.md, \"Warms that take turns\")",
        match args.warm_lock.as_deref() {
            None => "master and replica take turns, one page-fault call at a time, through a \
                     lock file both name (store.warm-lock; --warm-lock to change)"
                .to_owned(),
            Some(v) => format!("store.warm-lock = {v:?} in master and replica (--warm-lock)"),
        }
    );
    println!(
        "  {:<34} {:>9} {:>8} {:>8} {:>9} {:>7} {:>5} {:>8}",
        "system / clients", "ops/s", "p50 us", "p99 us", "p999 us", "not ok", "rolls", "CPU us/op"
    );
    let hasync_pids = (hasync.master.pid(), hasync.slave.pid());
    let mut quiet = vec![hasync_pids.0, hasync_pids.1];
    quiet.extend(redis.iter().flat_map(|r| [r.master.pid(), r.replica.pid()]));
    let mut plotted = Vec::new();
    let mut settled = SettleLog::default();
    // The first put creates the first segment, whose warm then runs before the first run.
    let first = pb::messages_client::MessagesClient::connect(hasync.grpc.clone())
        .await?
        .put(pb::PutRequest { messages: vec![pb_message(&sample_message("BenchTopic", 0, body))] })
        .await?
        .into_inner();
    anyhow::ensure!(first.status() == pb::PutStatus::PutOk, "the first put: {first:?}");
    // ASYNC over gRPC at one client: the baseline of the SYNC-over-gRPC goal.
    hasync.set_mode(pb::ReplicationMode::Async).await?;
    let async1 = hasync_row(
        &hasync,
        hasync_pids,
        &quiet,
        &mut settled,
        grpc_run(&hasync.grpc, 1, args.duration, body, "ASYNC Put"),
    )
    .await?;
    println!("{}", row(&async1));
    hasync.set_mode(pb::ReplicationMode::Sync).await?;
    for &clients in &args.writers {
        let h = hasync_row(
            &hasync,
            hasync_pids,
            &quiet,
            &mut settled,
            grpc_run(&hasync.grpc, clients, args.duration, body, "SYNC Put"),
        )
        .await?;
        println!("{}", row(&h));
        let stream = |packed| one_stream_run(&hasync.grpc, clients, args.duration, body, packed);
        let s = hasync_row(&hasync, hasync_pids, &quiet, &mut settled, stream(false)).await?;
        println!("{}", row(&s));
        // Above one client: the same puts in flight packed into as few requests as their free
        // slots allow (a request then carries the puts whose answers came back together), and
        // as many clients each on a PutStream of its own, one put at a time.
        let (pk, m) = if clients > 1 {
            let pk = hasync_row(&hasync, hasync_pids, &quiet, &mut settled, stream(true)).await?;
            println!("{}", row(&pk));
            let m = hasync_row(
                &hasync,
                hasync_pids,
                &quiet,
                &mut settled,
                streams_run(&hasync.grpc, clients, args.duration, body),
            )
            .await?;
            println!("{}", row(&m));
            (Some(pk), Some(m))
        } else {
            (None, None)
        };
        let Some(redis) = &redis else {
            plotted.push(h);
            plotted.push(s);
            plotted.extend(pk);
            plotted.extend(m);
            continue;
        };
        let redis_pids = (redis.master.pid(), redis.replica.pid());
        let r = metered(
            redis_pids,
            &quiet,
            &mut settled,
            redis_run(redis.addr, clients, args.duration, body),
        )
        .await?;
        println!("{}", row(&r));
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let q = |run: &Run, p: f64| run.hist.value_at_quantile(p) as f64;
        println!(
            "    hasync/Redis at {clients}: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x, p999 {:.2}x; PutStream throughput {:.2}x, p50 {:.2}x, p99 {:.2}x Redis",
            ratio(h.rate(), r.rate()),
            ratio(q(&h, 0.5), q(&r, 0.5)),
            ratio(q(&h, 0.99), q(&r, 0.99)),
            ratio(q(&h, 0.999), q(&r, 0.999)),
            ratio(s.rate(), r.rate()),
            ratio(q(&s, 0.5), q(&r, 0.5)),
            ratio(q(&s, 0.99), q(&r, 0.99)),
        );
        let all = |run: &Run| run.cpu_per_op().map(|c| c[3]);
        if let (Some(put), Some(stream), Some(redis)) = (all(&h), all(&s), all(&r)) {
            println!(
                "    CPU per operation at {clients}: hasync Put {:.2}x Redis, PutStream {:.2}x Redis",
                ratio(put, redis),
                ratio(stream, redis)
            );
        }
        // Each goal judged on every hasync SYNC row of this size (the ratio lines above give
        // the unary Put and the stream in flight alone): the unary Put, one PutStream with as
        // many puts in flight, the same puts packed, and as many clients each on a PutStream
        // of its own (one put at a time, as each Redis client).
        let mut rows = vec![("unary Put", &h), ("PutStream in flight", &s)];
        rows.extend(pk.as_ref().map(|pk| ("PutStream packed", pk)));
        rows.extend(m.as_ref().map(|m| ("PutStream clients", m)));
        let verdicts = |met: &dyn Fn(&Run) -> bool, figure: &dyn Fn(&Run) -> f64| {
            let each = rows.iter().map(|(name, run)| {
                let verdict = if met(run) { "met" } else { "NOT met" };
                format!("{name} {verdict} ({:.2}x)", figure(run))
            });
            each.collect::<Vec<_>>().join(", ")
        };
        let p50 = |run: &Run| ratio(q(run, 0.5), q(&r, 0.5));
        let p99 = |run: &Run| ratio(q(run, 0.99), q(&r, 0.99));
        let rate = |run: &Run| ratio(run.rate(), r.rate());
        match clients {
            1 => println!(
                "    goal at 1: p50 <= 1.2x Redis: {}",
                verdicts(&|run| p50(run) <= 1.2, &p50)
            ),
            16 => println!(
                "    goal at 16: throughput >= Redis: {}",
                verdicts(&|run| rate(run) >= 1.0, &rate)
            ),
            _ => {}
        }
        println!("    goal at {clients}: p99 <= Redis: {}", verdicts(&|run| p99(run) <= 1.0, &p99));
        if clients == 1
            && let Some(node) = node_sync_p50_us
        {
            let sync1 = h.hist.value_at_quantile(0.5);
            let bound = async1.hist.value_at_quantile(0.5) + node + 20;
            println!(
                "    goal: SYNC Put p50 {sync1} us <= ASYNC Put p50 {} + node SYNC p50 {node} + 20 = {bound} us: {}",
                async1.hist.value_at_quantile(0.5),
                if sync1 <= bound { "met" } else { "NOT met" }
            );
        }
        plotted.push(h);
        plotted.push(s);
        plotted.extend(pk);
        plotted.extend(m);
        plotted.push(r);
    }
    println!("{}", settled.summary("both systems' masters and replicas"));
    if let Some(file) = &args.plot {
        let series: Vec<(&str, &Histogram<u64>)> =
            plotted.iter().map(|r| (r.label.as_str(), &r.hist)).collect();
        let title = format!(
            "SYNC put latency, one replica, {}-byte values, {:?} per run (hasync bench sync --against-redis)",
            body, args.duration
        );
        std::fs::write(file, crate::cli::bench_plot::svg(&title, &series))
            .with_context(|| format!("writing the plot {}", file.display()))?;
        println!("  plot written to {}", file.display());
    }
    drop(redis);
    drop(hasync);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a relative `TMPDIR` the pair's temp dir is relative; its default lock file must
    /// still be a value `store.warm-lock` takes (before, the pair refused to start).
    #[test]
    fn the_pairs_default_lock_file_is_absolute_under_a_relative_temp_dir() {
        let path = pair_lock_path(Path::new("relative/tmp/.tmpXYZ")).unwrap();
        assert!(
            matches!(crate::config::WarmLock::parse(&path), Ok(crate::config::WarmLock::Host(_))),
            "{path}"
        );
        assert!(path.ends_with("relative/tmp/.tmpXYZ/warm.lock"), "{path}");
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k", b"vv"]);
        encode_command(&mut out, &[b"WAIT", b"1", b"3000"]);
        assert_eq!(
            out,
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$4\r\n3000\r\n"
        );
    }

    #[test]
    fn reply_lines_parse() {
        assert_eq!(parse_line("+OK").unwrap().unwrap(), Reply::Simple("OK".into()));
        assert_eq!(parse_line(":1").unwrap().unwrap(), Reply::Integer(1));
        assert_eq!(parse_line("-ERR no").unwrap().unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(parse_line("$-1").unwrap().unwrap(), Reply::Bulk(None));
        assert_eq!(parse_line("$12").unwrap().unwrap_err(), 12);
        assert!(parse_line("").is_err());
        assert!(parse_line("$-5").is_err());
        assert!(parse_line("*2").is_err());
        assert!(parse_line(":x").is_err());
    }

    #[test]
    fn cpu_per_operation_divides_each_part_and_their_sum_by_the_operations() {
        let before = Cpu { client: 1.0, master: 10.0, replica: 100.0 };
        let after = Cpu { client: 1.5, master: 11.0, replica: 100.25 };
        let mut hist = Histogram::<u64>::new(3).unwrap();
        hist.record_n(100, 250_000).unwrap();
        let mut run = Run {
            label: "r".into(),
            hist,
            not_ok: 0,
            duration: Duration::from_secs(1),
            cpu: Some(after.since(before)),
            rolls: None,
        };
        // 0.5 s, 1 s and 0.25 s over 250,000 operations: 2, 4 and 1 us each, 7 us in all.
        let per = run.cpu_per_op().unwrap();
        for (got, want) in per.iter().zip([2.0, 4.0, 1.0, 7.0]) {
            assert!((got - want).abs() < 1e-9, "{per:?}");
        }
        assert!(row(&run).ends_with("7.0 = 2.0 + 4.0 + 1.0"), "{}", row(&run));
        run.cpu = None;
        assert_eq!(run.cpu_per_op(), None);
        assert!(row(&run).ends_with(" -"), "{}", row(&run));
        run.hist.reset();
        run.cpu = Some(after.since(before));
        assert_eq!(run.cpu_per_op(), None, "no operations: no figure");
    }

    #[test]
    fn node_configs_name_their_role_and_master() {
        let m = node_toml("m", Path::new("/d"), (ByteSize::mib(8), "none"), (1, 2, 3), None);
        assert!(
            m.contains("role = \"master\"") && m.contains("127.0.0.1:2") && !m.contains("[slave]")
        );
        let s = node_toml("s", Path::new("/d"), (ByteSize::mib(8), "/l/w"), (4, 5, 6), Some(1));
        assert!(s.contains("role = \"slave\"") && s.contains("master-ha = \"127.0.0.1:1\""));
        let c: crate::config::Config = toml::from_str(&s).unwrap();
        assert_eq!(c.slave.master_ha, "127.0.0.1:1");
        assert_eq!(c.store.segment_size, ByteSize::mib(8));
        assert_eq!(c.store.warm_lock, "/l/w");
        let c: crate::config::Config = toml::from_str(&m).unwrap();
        assert_eq!(c.store.warm_lock, "none");
    }
}
