//! `hasync bench costs`: the costs that grow with the log, each next to a baseline measured in
//! the same run.
//!
//! - **Catch-up.** A master and an empty slave, each an `hasync serve` process of its own, the
//!   slave catching up a log of each `--sizes`: the CPU seconds per GB (10^9 bytes) each process
//!   spent (utime + stime from `/proc/PID/stat`), the slave's and the master's highest
//!   `RssAnon` (from `/proc/PID/status`: anonymous memory, mapped file pages do not count),
//!   sampled every 20 ms. Baseline: a plain socket copy of the same bytes over loopback, a
//!   sender thread that `read`s the segment files and `write`s the socket and a receiver
//!   thread that `read`s the socket and `write`s one file, each thread's CPU time measured on
//!   its own clock.
//! - **Start-up and recovery.** One `hasync serve` over a log of each `--segments` count: the
//!   time from spawn until `Replication/GetStatus` answers and the store's own open time
//!   (`hasync_store_recovery_duration_seconds`), after a clean stop and after a `kill -9`
//!   that followed a burst of puts. Baseline: the same start over an empty data dir.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use crate::cli::bench::sample_message;
use crate::cli::bench_cluster::probe::{HeldPort, ProcStat, Spawned, hold_ports};
use crate::config::units::ByteSize;
use crate::control::pb;
use crate::store::commitlog::COMMITLOG_DIR;
use crate::store::fs::{FileSystem, StdFs};
use crate::store::record::Message;
use crate::store::{CommitLog, StoreOptions};

/// How long a node may take to answer after its spawn, and a slave to catch up per GiB.
const READY_WAIT: Duration = Duration::from_secs(60);
const CATCH_UP_WAIT_PER_GIB: Duration = Duration::from_secs(60);
/// How long one status poll may take.
const POLL_WAIT: Duration = Duration::from_secs(2);
/// Free disk kept beyond what a catch-up run writes.
const DISK_MARGIN: u64 = 2 << 30;

/// The free space a run of `bytes` leaves untouched: [`DISK_MARGIN`], or as much as the run
/// itself (at least 256 MiB) when that is less, so that small runs fit small disks.
fn disk_margin(bytes: u64) -> u64 {
    DISK_MARGIN.min(bytes.max(256 << 20))
}

/// Puts written before the `kill -9` of a recovery run.
const PUTS_BEFORE_KILL: usize = 2_000;

/// Arguments of `hasync bench costs`.
#[derive(Debug, Clone, Args)]
pub struct CostsBenchArgs {
    /// Log sizes an empty slave catches up, comma-separated (a size the free disk cannot hold
    /// twice, with the size again (256 MiB to 2 GiB) to spare, is skipped with a line saying so).
    #[arg(long, default_value = "1GiB,10GiB", value_delimiter = ',')]
    pub(crate) sizes: Vec<ByteSize>,
    /// Segment counts of the logs the start-up and recovery runs open, comma-separated.
    #[arg(long, default_value = "1,10,100", value_delimiter = ',')]
    pub(crate) segments: Vec<usize>,
    /// Segment file size of every log (`store.segment-size`).
    #[arg(long, default_value = "64MiB")]
    pub(crate) segment_size: ByteSize,
    /// Message body size.
    #[arg(long, default_value = "1KiB")]
    pub(crate) body: ByteSize,
    /// Directory for the scratch data (a temporary directory inside it is removed afterwards).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

/// Set once SIGINT or SIGTERM arrived: the interrupt thread is cleaning up and will exit 130.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, SIGINT (Ctrl-C) or SIGTERM kills the nodes (this process's children), removes
/// the scratch directory `dir` and exits 130. The nodes go first: a node still starting would
/// see its files vanish, or create its data dir again.
fn remove_on_interrupt(dir: PathBuf) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Registered here, before the bench starts: a signal from now on is caught.
    let (mut int, mut term) = {
        let _in = rt.enter();
        (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?)
    };
    std::thread::Builder::new().name("bench-interrupt".into()).spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        kill_children(Duration::from_secs(5));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => eprintln!("hasync bench costs: interrupted; removed {}", dir.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("hasync bench costs: interrupted; {} was already removed", dir.display());
            }
            Err(e) => eprintln!(
                "hasync bench costs: interrupted; could not remove {}: {e}",
                dir.display()
            ),
        }
        std::process::exit(130);
    })?;
    Ok(())
}

/// SIGKILLs every child of this process and waits (at most `within`) until each is a zombie
/// or gone: none writes a file after this returns.
fn kill_children(within: Duration) {
    let me = std::process::id().to_string();
    // (state, ppid): fields 3 and 4 of /proc/PID/stat.
    let fields = |pid: &str| -> Option<(char, String)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let f = super::bench_cluster::probe::stat_fields(&stat)?;
        Some((f.first()?.chars().next()?, (*f.get(1)?).to_owned()))
    };
    let children: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| fields(pid).is_some_and(|(_, ppid)| ppid == me))
        .collect();
    for pid in &children {
        if let Some(pid) = pid.parse().ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    let deadline = Instant::now() + within;
    while Instant::now() < deadline
        && children.iter().any(|pid| fields(pid).is_some_and(|(state, _)| state != 'Z'))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `hasync bench costs`.
pub(crate) fn run(args: &CostsBenchArgs) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    remove_on_interrupt(base.path().to_path_buf())?;
    let result = run_in(args, &base);
    // Interrupted: the failure is the interrupt's doing (a node it killed). The interrupt
    // thread exits 130 once it has cleaned up; wait for that rather than exit first.
    let waited = Instant::now();
    while INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
        && waited.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    result
}

fn run_in(args: &CostsBenchArgs, base: &tempfile::TempDir) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    println!(
        "costs bench: segments {}, {}-byte bodies, scratch in {}",
        args.segment_size,
        args.body.0,
        base.path().display()
    );
    println!(
        "\ncatch-up: master and slave each an `hasync serve` process; baseline: a plain socket \
         copy of the same bytes (read+write threads of this process); CPU in s per GB (10^9 B)"
    );
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>13} {:>13} {:>8} {:>8}",
        "size",
        "master",
        "slave",
        "copy-send",
        "copy-recv",
        "ratio",
        "",
        "slave-RssAnon",
        "master-RssAn.",
        "catch-up",
        "copy"
    );
    for size in &args.sizes {
        let free = free_bytes(base.path())?;
        let need = 2 * size.0 + disk_margin(size.0);
        if free < need {
            println!(
                "{:>9} skipped: {:.1} GiB free in {}, the run needs {:.1} GiB",
                size.to_string(),
                gib(free),
                base.path().display(),
                gib(need)
            );
            continue;
        }
        let dir = base.path().join(format!("catch-up-{}", size.0));
        rt.block_on(catch_up(args, size.0, &dir))?;
        std::fs::remove_dir_all(&dir)?;
    }
    println!(
        "\nstart-up: one `hasync serve` until Replication/GetStatus answers (`ready`) and its store \
         open (`open`, hasync_store_recovery_duration_seconds); baseline: an empty data dir"
    );
    println!(
        "{:>9} {:>10} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "segments",
        "log",
        "clean-ready",
        "clean-open",
        "kill9-ready",
        "kill9-open",
        "kill9-scanned"
    );
    let log = base.path().join("start-up");
    let empty = rt.block_on(start_up(&log, args.segment_size, 0))?;
    print_start_up("empty", 0, &empty);
    let mut counts = args.segments.clone();
    counts.sort_unstable();
    for n in counts {
        let end = ((n as u64).saturating_sub(1) * args.segment_size.0) + args.segment_size.0 / 2;
        let free = free_bytes(base.path())?;
        let grow = end.saturating_sub(dir_bytes(&log));
        if free < grow + disk_margin(end) {
            println!(
                "{n:>9} skipped: {:.1} GiB free, the log needs {:.1} GiB more",
                gib(free),
                gib(grow)
            );
            continue;
        }
        let total = fill_log(&log, args, end)?;
        let r = rt.block_on(start_up(&log, args.segment_size, total))?;
        print_start_up(&n.to_string(), total, &r);
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let st = rustix::fs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Bytes of the segment files of the log in data dir `dir` (0 when it has none).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir.join(COMMITLOG_DIR)) else { return 0 };
    entries.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

/// Appends 1 KiB-body records (batches of 64) to the log in `dir` until it holds `end` bytes,
/// then stops it cleanly; the log's end offset.
fn fill_log(dir: &Path, args: &CostsBenchArgs, end: u64) -> anyhow::Result<u64> {
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let opts = StoreOptions {
        segment_size: args.segment_size.0 as usize,
        flush_interval: Duration::from_secs(3600),
        ..StoreOptions::default()
    };
    std::fs::create_dir_all(dir)?;
    let store = CommitLog::open(fs, dir, opts)?;
    let batch: Vec<Message> =
        (0..64).map(|i| sample_message("BenchTopic", i % 8, args.body.0 as usize)).collect();
    while store.max_offset() < end {
        store.append(&batch)?;
    }
    let total = store.max_offset();
    store.close()?;
    Ok(total)
}

/// A node's config file: loopback listeners, ASYNC, the bench's segment size (and a largest
/// message that fits it: at most the default 4 MiB, half a segment), default flush.
fn node_toml(
    dir: &Path,
    segment: ByteSize,
    ports: (u16, u16, u16),
    master_ha: Option<u16>,
) -> String {
    let (ha, grpc, metrics) = ports;
    let max_message = ByteSize((segment.0 / 2).min(4 << 20));
    let role = if master_ha.is_some() { "slave" } else { "master" };
    let slave = master_ha
        .map(|p| format!("\n[slave]\nmaster-ha = \"127.0.0.1:{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[node]\nname = \"bench-{role}\"\nrole = \"{role}\"\ndata-dir = \"{}\"\n\n[store]\nsegment-size = \"{segment}\"\nmax-message-size = \"{max_message}\"\n\n\
         [ha]\nlisten = \"127.0.0.1:{ha}\"\nempty-slave-start = \"earliest\"\n\n\
         [grpc]\nlisten = \"127.0.0.1:{grpc}\"\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\n\
         [replication]\nmode = \"async\"\n{slave}\n[log]\nfilter = \"warn\"\n",
        dir.display()
    )
}

/// A node process of the bench and its ports.
struct Node {
    name: &'static str,
    process: Spawned,
    ha: u16,
    grpc: String,
    metrics: u16,
    /// One connection for every status poll (a new one per poll would load the node).
    client: Option<pb::replication_client::ReplicationClient<tonic::transport::Channel>>,
    /// Its ports, held while it runs.
    _ports: Vec<HeldPort>,
}

impl Node {
    /// Spawns `hasync serve` over `data` (its config and log beside it in `home`).
    fn spawn(
        name: &'static str,
        home: &Path,
        data: &Path,
        segment: ByteSize,
        master_ha: Option<u16>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(home)?;
        let held = hold_ports(3)?;
        let ports = (held[0].port, held[1].port, held[2].port);
        let file = home.join(format!("{name}.toml"));
        std::fs::write(&file, node_toml(data, segment, ports, master_ha))?;
        let mut cmd = Command::new(std::env::current_exe().context("the running binary")?);
        cmd.arg("serve").arg("--config").arg(&file);
        let process = Spawned::spawn(name, cmd, home.join(format!("{name}.log")))?;
        Ok(Self {
            name,
            process,
            ha: ports.0,
            grpc: format!("http://127.0.0.1:{}", ports.1),
            metrics: ports.2,
            client: None,
            _ports: held,
        })
    }

    /// The node's status once Replication/GetStatus answers (bounded by [`READY_WAIT`]).
    async fn ready(&mut self) -> anyhow::Result<pb::ReplicationStatus> {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if let Some(st) = self.status().await {
                return Ok(st);
            }
            self.alive("before it answered")?;
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not answer within {READY_WAIT:?}; its log:\n{}",
                self.name,
                self.process.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// An error naming the node and `when`, with its log, once its process has exited.
    fn alive(&mut self, when: &str) -> anyhow::Result<()> {
        match self.process.exited() {
            None => Ok(()),
            Some(exit) => anyhow::bail!(
                "the {} exited ({exit}) {when}; its log:\n{}",
                self.name,
                self.process.log_tail(20)
            ),
        }
    }

    /// Replication/GetStatus over the node's one connection (made on first use); `None` when
    /// the node does not answer within [`POLL_WAIT`].
    async fn status(&mut self) -> Option<pb::ReplicationStatus> {
        let ask = async {
            if self.client.is_none() {
                let c = pb::replication_client::ReplicationClient::connect(self.grpc.clone());
                self.client = Some(c.await.ok()?);
            }
            let c = self.client.as_mut()?;
            match c.get_status(pb::GetStatusRequest {}).await {
                Ok(r) => Some(r.into_inner()),
                Err(_) => {
                    self.client = None;
                    None
                }
            }
        };
        tokio::time::timeout(POLL_WAIT, ask).await.ok().flatten()
    }

    /// One gauge of the node's metrics (`name` without labels).
    async fn gauge(&self, name: &str) -> anyhow::Result<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics)).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n").await?;
        let mut body = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut body))
            .await
            .context("the metrics port did not answer within 5 s")??;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .with_context(|| format!("no {name} in the node's metrics"))
    }
}

/// A master over a log of `size` bytes and an empty slave catching it up, next to a plain
/// socket copy of the same bytes; prints one row.
async fn catch_up(args: &CostsBenchArgs, size: u64, dir: &Path) -> anyhow::Result<()> {
    let master_data = dir.join("master");
    let total = fill_log(&master_data, args, size)?;
    let copy = socket_copy(&master_data, total, &dir.join("copy"))?;
    std::fs::remove_dir_all(dir.join("copy"))?;

    let mut master = Node::spawn("master", dir, &master_data, args.segment_size, None)?;
    master.ready().await?;
    let master_before = ProcStat::read(master.process.pid())?;
    let started = Instant::now();
    let mut slave =
        Node::spawn("slave", dir, &dir.join("slave"), args.segment_size, Some(master.ha))?;
    let slave_pid = slave.process.pid();
    let deadline = started + CATCH_UP_WAIT_PER_GIB.mul_f64(gib(total).max(1.0));
    let (mut slave_anon, mut master_anon) = (0u64, 0u64);
    let mut polled = Instant::now();
    loop {
        slave_anon = slave_anon.max(ProcStat::read(slave_pid)?.rss_anon_bytes);
        master_anon = master_anon.max(ProcStat::read(master.process.pid())?.rss_anon_bytes);
        if polled.elapsed() >= Duration::from_millis(100) {
            polled = Instant::now();
            if slave.status().await.is_some_and(|st| st.max_offset as u64 >= total) {
                break;
            }
        }
        slave.alive("during the catch-up")?;
        master.alive("during the catch-up")?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the slave did not catch up {total} bytes within {:?}; its log:\n{}",
            deadline - started,
            slave.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    let slave_cpu = ProcStat::read(slave_pid)?.cpu_s;
    let master_cpu = ProcStat::read(master.process.pid())?.cpu_s - master_before.cpu_s;
    slave.process.stop(Duration::from_secs(10));
    master.process.stop(Duration::from_secs(10));
    let gb = total as f64 / 1e9;
    let per = |s: f64| s / gb;
    println!(
        "{:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8.2}x {:>8} {:>10.1}MiB {:>10.1}MiB {:>7.2}s {:>7.2}s",
        ByteSize(size).to_string(),
        per(master_cpu),
        per(slave_cpu),
        per(copy.send_cpu),
        per(copy.recv_cpu),
        (master_cpu + slave_cpu) / (copy.send_cpu + copy.recv_cpu).max(1e-9),
        "",
        slave_anon as f64 / f64::from(1u32 << 20),
        master_anon as f64 / f64::from(1u32 << 20),
        took.as_secs_f64(),
        copy.elapsed.as_secs_f64(),
    );
    Ok(())
}

/// A plain socket copy's figures.
struct Copy {
    send_cpu: f64,
    recv_cpu: f64,
    elapsed: Duration,
}

/// This thread's CPU seconds so far.
pub(crate) fn thread_cpu() -> f64 {
    cpu_seconds(rustix::time::ClockId::ThreadCPUTime)
}

/// The CPU seconds a CPU-time clock (this thread's, this process's) reads.
pub(crate) fn cpu_seconds(clock: rustix::time::ClockId) -> f64 {
    let t = rustix::time::clock_gettime(clock);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Copies the first `total` bytes of the segment files of the data dir `log` over a loopback socket into
/// one file in `into`: the sender `read`s the files and `write`s the socket in 1 MiB chunks,
/// the receiver `read`s the socket and `write`s the file.
fn socket_copy(log: &Path, total: u64, into: &Path) -> anyhow::Result<Copy> {
    std::fs::create_dir_all(into)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(log.join(COMMITLOG_DIR))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    files.sort();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let out = into.join("copy");
    let receiver = std::thread::spawn(move || -> anyhow::Result<f64> {
        let (mut sock, _) = listener.accept()?;
        let mut file = std::fs::File::create(&out)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < total {
            let n = sock.read(&mut buf)?;
            anyhow::ensure!(n > 0, "the copy's sender closed early");
            file.write_all(&buf[..n])?;
            got += n as u64;
        }
        Ok(thread_cpu())
    });
    let started = Instant::now();
    let cpu_before = thread_cpu();
    let mut sock = std::net::TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = total;
    for f in &files {
        let mut file = std::fs::File::open(f)?;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            sock.write_all(&buf[..n])?;
            left -= n as u64;
        }
    }
    anyhow::ensure!(
        left == 0,
        "the segment files in {} hold less than {total} bytes",
        log.display()
    );
    let send_cpu = thread_cpu() - cpu_before;
    let recv_cpu =
        receiver.join().map_err(|_| anyhow::anyhow!("the copy's receiver panicked"))??;
    Ok(Copy { send_cpu, recv_cpu, elapsed: started.elapsed() })
}

/// One start-up row: a clean start, then a start after `kill -9`.
struct StartUp {
    clean_ready: Duration,
    clean_open: f64,
    kill_ready: Duration,
    kill_open: f64,
    kill_scanned: f64,
}

fn print_start_up(label: &str, total: u64, r: &StartUp) {
    println!(
        "{label:>9} {:>7.2}GiB {:>9.1}ms {:>9.1}ms {:>11.1}ms {:>11.1}ms {:>11.1}MiB",
        gib(total),
        r.clean_ready.as_secs_f64() * 1e3,
        r.clean_open * 1e3,
        r.kill_ready.as_secs_f64() * 1e3,
        r.kill_open * 1e3,
        r.kill_scanned / f64::from(1u32 << 20),
    );
}

/// Starts a master over the log in `log` (cleanly stopped), stops it, starts it again, puts
/// [`PUTS_BEFORE_KILL`] messages, kills it with SIGKILL and starts it once more.
async fn start_up(log: &Path, segment: ByteSize, total: u64) -> anyhow::Result<StartUp> {
    let home = log.with_extension("home");
    const OPEN: &str = "hasync_store_recovery_duration_seconds";
    let (clean_ready, clean_open) = {
        let started = Instant::now();
        let mut node = Node::spawn("start-up", &home, log, segment, None)?;
        let st = node.ready().await?;
        let ready = started.elapsed();
        anyhow::ensure!(
            st.max_offset as u64 == total,
            "the node opened {} of {total} bytes",
            st.max_offset
        );
        let open = node.gauge(OPEN).await?;
        node.process.stop(Duration::from_secs(10));
        (ready, open)
    };
    let mut node = Node::spawn("start-up", &home, log, segment, None)?;
    node.ready().await?;
    let mut c = pb::messages_client::MessagesClient::connect(node.grpc.clone()).await?;
    let msg = crate::cli::bench::pb_message(&sample_message("BenchTopic", 0, 1024));
    for i in 0..PUTS_BEFORE_KILL {
        let r = c.put(pb::PutRequest { messages: vec![msg.clone()] }).await?.into_inner();
        anyhow::ensure!(
            r.stored,
            "put {i} of {PUTS_BEFORE_KILL} before the kill -9 was refused: {:?} {}",
            r.status(),
            r.detail
        );
    }
    drop(c);
    drop(node); // SIGKILL
    let started = Instant::now();
    let mut node = Node::spawn("start-up", &home, log, segment, None)?;
    node.ready().await?;
    let kill_ready = started.elapsed();
    let kill_open = node.gauge(OPEN).await?;
    let kill_scanned = node.gauge("hasync_store_recovery_scanned_bytes").await?;
    node.process.stop(Duration::from_secs(10));
    Ok(StartUp { clean_ready, clean_open, kill_ready, kill_open, kill_scanned })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_margin_shrinks_with_the_run_but_never_below_256_mib() {
        assert_eq!(disk_margin(8 << 20), 256 << 20);
        assert_eq!(disk_margin(1 << 30), 1 << 30);
        assert_eq!(disk_margin(10 << 30), DISK_MARGIN);
    }
}
