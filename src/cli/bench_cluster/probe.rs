//! What `hasync bench cluster` runs beside its nodes and what it reads of them: child processes
//! (etcd, the controller) killed on drop, etcd's Prometheus counters, a process's CPU time and
//! memory from `/proc`, the open-file limit, and the file system a directory lives on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How often etcd is started again on new ports after a clash.
const PORT_ATTEMPTS: usize = 3;
/// How long etcd may take to listen and answer.
const ETCD_START_WAIT: Duration = Duration::from_secs(20);
/// How long one scrape of etcd's metrics may take.
const SCRAPE_WAIT: Duration = Duration::from_secs(5);

/// A child process, killed (SIGKILL) and reaped on drop; [`Spawned::stop`] asks first.
pub(crate) struct Spawned {
    pub(super) name: &'static str,
    pub(super) log: PathBuf,
    child: Option<Child>,
}

impl Spawned {
    /// Spawns `cmd` with stdout and stderr into `log`. The child also dies with the thread
    /// that spawned it (PR_SET_PDEATHSIG): a bench killed by SIGKILL leaves no etcd behind.
    /// Call it from the thread that runs the bench (the runtime's `block_on`), which lives
    /// until the bench ends.
    pub(crate) fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let out = std::fs::File::create(&log)
            .with_context(|| format!("creating {name}'s log {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        // SAFETY: prctl is async-signal-safe, and nothing else runs between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                let kill = rustix::process::Signal::KILL;
                rustix::process::set_parent_process_death_signal(Some(kill))
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Self { name, log, child: Some(child) })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The exit status when it has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM, then SIGKILL when it has not exited within `grace`.
    pub(crate) fn stop(mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        let pid = rustix::process::Pid::from_raw(child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The last `n` lines of its log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }
}

/// The last `n` lines of a file (empty when unreadable).
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port on 127.0.0.1 kept from every other socket while this is held, for a child process
/// to listen on: bound with SO_REUSEADDR and never listening. Linux gives a bound port to no
/// `bind(0)` and to no outgoing connection, while a child that binds it with SO_REUSEADDR
/// (tokio, Rust's std, Redis and Go all set it) still can. Keep it as long as the child runs:
/// a port found free and then released could be taken before the child binds it.
#[derive(Debug)]
pub(crate) struct HeldPort {
    _socket: tokio::net::TcpSocket,
    /// The port.
    pub(crate) port: u16,
}

/// `n` ports the OS hands out now, each held ([`HeldPort`]).
pub(crate) fn hold_ports(n: usize) -> std::io::Result<Vec<HeldPort>> {
    (0..n)
        .map(|_| {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.set_reuseaddr(true)?;
            socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
            let port = socket.local_addr()?.port();
            Ok(HeldPort { _socket: socket, port })
        })
        .collect()
}

/// Ports below the kernel's ephemeral range for the nodes' HA listeners. A slave frees its
/// HA port and binds it again when promoted; an OS-assigned port is in the ephemeral range,
/// where any outgoing connection of this process (hundreds of nodes) may take it meanwhile
/// and the promotion fails "address in use". Ports below the range are never given to an
/// outgoing connection, as a deployment's fixed `ha.listen` (10912) is not.
pub(super) struct HaPorts {
    next: std::sync::atomic::AtomicU32,
    low: u16,
    high: u16,
}

impl HaPorts {
    /// The ports from 20000 (or lower, when the range starts lower) to the ephemeral range.
    pub(super) fn below_ephemeral() -> Self {
        let range =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let first: u16 =
            range.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32768);
        let high = first.saturating_sub(1).max(1025);
        let low = 20000.min(high / 2).max(1024);
        Self { next: std::sync::atomic::AtomicU32::new(0), low, high }
    }

    /// A listener on 127.0.0.1 at the next free port of the range.
    pub(super) async fn bind(&self) -> anyhow::Result<tokio::net::TcpListener> {
        let span = u32::from(self.high - self.low) + 1;
        for _ in 0..span {
            let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
            let port = self.low + i as u16;
            if let Ok(l) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                return Ok(l);
            }
        }
        anyhow::bail!("no free port in 127.0.0.1:{}..={} for an HA listener", self.low, self.high)
    }
}

/// One etcd member on 127.0.0.1 with etcd's default timers and quota.
pub(super) struct Etcd {
    pub(super) process: Spawned,
    pub(super) client: SocketAddr,
    pub(super) metrics: SocketAddr,
    /// Its client, peer and metrics ports, held while it runs.
    _ports: Vec<HeldPort>,
}

impl Etcd {
    /// Starts `bin` with its data in `dir` (retried on new ports when a port was taken).
    pub(super) fn start(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        let mut last = String::new();
        for attempt in 1..=PORT_ATTEMPTS {
            let ports = hold_ports(3)?;
            let (client, peer, metrics) = (ports[0].port, ports[1].port, ports[2].port);
            let url = |p: u16| format!("http://127.0.0.1:{p}");
            let mut cmd = Command::new(bin);
            cmd.arg("--name").arg("bench");
            cmd.arg("--data-dir").arg(dir.join(format!("etcd-{attempt}")));
            cmd.args([
                "--listen-client-urls",
                &url(client),
                "--advertise-client-urls",
                &url(client),
            ]);
            cmd.args([
                "--listen-peer-urls",
                &url(peer),
                "--initial-advertise-peer-urls",
                &url(peer),
            ]);
            cmd.args(["--initial-cluster", &format!("bench={}", url(peer))]);
            cmd.args(["--listen-metrics-urls", &url(metrics), "--logger", "zap"]);
            let log = dir.join(format!("etcd-{attempt}.log"));
            let mut process = Spawned::spawn("etcd", cmd, log)?;
            let client = SocketAddr::from(([127, 0, 0, 1], client));
            let metrics = SocketAddr::from(([127, 0, 0, 1], metrics));
            let deadline = Instant::now() + ETCD_START_WAIT;
            loop {
                if let Some(status) = process.exited() {
                    last = format!("etcd exited ({status}):\n{}", process.log_tail(10));
                    break;
                }
                if std::net::TcpStream::connect(client).is_ok()
                    && std::net::TcpStream::connect(metrics).is_ok()
                {
                    return Ok(Self { process, client, metrics, _ports: ports });
                }
                if Instant::now() > deadline {
                    anyhow::bail!(
                        "etcd does not listen on {client} within {ETCD_START_WAIT:?}:\n{}",
                        process.log_tail(10)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        anyhow::bail!("etcd did not start after {PORT_ATTEMPTS} attempts: {last}")
    }
}

/// etcd's version line (`etcd Version: 3.4.23`), or what went wrong asking.
pub(super) fn etcd_version(bin: &Path) -> String {
    match Command::new(bin).arg("--version").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("etcd Version:").map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| "unknown".into()),
        Err(e) => format!("unknown ({e})"),
    }
}

/// What the bench reads of etcd's `/metrics`: counters (their deltas make rates) and gauges.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct EtcdMetrics {
    /// gRPC calls handled (streams count once, when they end), by method.
    pub(super) handled: BTreeMap<String, f64>,
    /// Bytes of gRPC requests etcd received from clients.
    pub(super) received_bytes: f64,
    /// Bytes of gRPC responses and watch events etcd sent to clients.
    pub(super) sent_bytes: f64,
    /// Raft proposals committed (every write: put, txn, lease grant/revoke; not a renewal).
    pub(super) proposals: f64,
    /// Lease renewals.
    pub(super) renewals: f64,
    /// WAL fsyncs, and the seconds they took.
    pub(super) fsyncs: f64,
    pub(super) fsync_seconds: f64,
    /// Watchers and watch streams open now.
    pub(super) watchers: f64,
    pub(super) watch_streams: f64,
    /// Keys in the key space now, the database file's size and the part of it in use.
    pub(super) keys: f64,
    pub(super) db_bytes: f64,
    pub(super) db_in_use_bytes: f64,
}

impl EtcdMetrics {
    /// Reads the Prometheus text exposition: `name{labels} value` lines; others are ignored.
    pub(super) fn parse(text: &str) -> Self {
        let mut m = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let slot = match name {
                "grpc_server_handled_total" => {
                    let method = label(labels, "grpc_method").unwrap_or("?").to_owned();
                    *m.handled.entry(method).or_default() += value;
                    continue;
                }
                "etcd_network_client_grpc_received_bytes_total" => &mut m.received_bytes,
                "etcd_network_client_grpc_sent_bytes_total" => &mut m.sent_bytes,
                "etcd_server_proposals_committed_total" => &mut m.proposals,
                "etcd_debugging_lease_renewed_total" => &mut m.renewals,
                "etcd_disk_wal_fsync_duration_seconds_count" => &mut m.fsyncs,
                "etcd_disk_wal_fsync_duration_seconds_sum" => &mut m.fsync_seconds,
                "etcd_debugging_mvcc_watcher_total" => &mut m.watchers,
                "etcd_debugging_mvcc_watch_stream_total" => &mut m.watch_streams,
                "etcd_debugging_mvcc_keys_total" => &mut m.keys,
                "etcd_mvcc_db_total_size_in_bytes" => &mut m.db_bytes,
                "etcd_mvcc_db_total_size_in_use_in_bytes" => &mut m.db_in_use_bytes,
                _ => continue,
            };
            *slot += value;
        }
        m
    }

    /// gRPC calls handled, all methods.
    pub(super) fn requests(&self) -> f64 {
        self.handled.values().sum()
    }
}

/// The value of label `key` in `a="x",b="y"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// Scrapes etcd's metrics endpoint once.
pub(super) async fn scrape(metrics: SocketAddr) -> anyhow::Result<EtcdMetrics> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(metrics).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n").await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        anyhow::Ok(body)
    };
    let body = tokio::time::timeout(SCRAPE_WAIT, get)
        .await
        .with_context(|| format!("etcd's metrics at {metrics} did not answer in {SCRAPE_WAIT:?}"))?
        .with_context(|| format!("scraping etcd's metrics at {metrics}"))?;
    anyhow::ensure!(body.starts_with("HTTP/1.1 200"), "etcd's metrics at {metrics}: {body:.80}");
    Ok(EtcdMetrics::parse(&body))
}

/// A process's CPU time so far and its memory now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ProcStat {
    /// User + system CPU seconds.
    pub(crate) cpu_s: f64,
    /// Resident set size.
    pub(crate) rss_bytes: u64,
    /// The highest resident set size so far.
    pub(crate) rss_peak_bytes: u64,
    /// Anonymous resident memory (`RssAnon`: heap and stacks; mapped file pages do not count).
    pub(crate) rss_anon_bytes: u64,
}

impl ProcStat {
    /// Reads `/proc/<pid>/stat` and `/proc/<pid>/status` (`pid` 0: this process).
    pub(crate) fn read(pid: u32) -> anyhow::Result<Self> {
        let dir = if pid == 0 { "/proc/self".to_owned() } else { format!("/proc/{pid}") };
        let stat = std::fs::read_to_string(format!("{dir}/stat"))
            .with_context(|| format!("reading {dir}/stat"))?;
        let status = std::fs::read_to_string(format!("{dir}/status"))
            .with_context(|| format!("reading {dir}/status"))?;
        let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
        let cpu_ticks = cpu_ticks(&stat).with_context(|| format!("{dir}/stat: {stat:.80}"))?;
        Ok(Self {
            cpu_s: cpu_ticks as f64 / ticks,
            rss_bytes: status_kib(&status, "VmRSS:").unwrap_or(0) * 1024,
            rss_peak_bytes: status_kib(&status, "VmHWM:").unwrap_or(0) * 1024,
            rss_anon_bytes: status_kib(&status, "RssAnon:").unwrap_or(0) * 1024,
        })
    }
}

/// The fields of a `/proc/<pid>/stat` line from field 3 (state) on. The command name (field 2)
/// may hold spaces and parentheses, so the fields are counted after its last `)`.
pub(crate) fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields = stat_fields(stat)?;
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`, in KiB.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

/// Raises this process's soft open-file limit to its hard limit: the limits before and after.
pub(super) fn raise_open_files() -> (u64, u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let old = getrlimit(Resource::Nofile);
    let before = old.current.unwrap_or(u64::MAX);
    let raised = Rlimit { current: old.maximum, maximum: old.maximum };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => (before, old.maximum.unwrap_or(u64::MAX)),
        Err(_) => (before, before),
    }
}

/// The file system type `path` lives on (the longest mount point of `/proc/self/mounts`
/// that holds it), or "unknown".
pub(super) fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mount_type(&mounts, &path).unwrap_or("unknown").to_owned()
}

fn mount_type<'a>(mounts: &'a str, path: &Path) -> Option<&'a str> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(at).then_some((at.len(), kind))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_metrics_sum_the_calls_by_method_and_read_the_named_series() {
        let handled = |code: &str, method: &str, v: &str| {
            format!(
                "grpc_server_handled_total{{grpc_code=\"{code}\",grpc_method=\"{method}\",\
                 grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}} {v}\n"
            )
        };
        let text = format!(
            "# HELP x\n{}{}{}\
             etcd_network_client_grpc_received_bytes_total 1024\n\
             etcd_network_client_grpc_sent_bytes_total 2048\n\
             etcd_debugging_mvcc_keys_total 12\n\
             etcd_mvcc_db_total_size_in_bytes 20480\n\
             etcd_mvcc_db_total_size_in_use_in_bytes 16384\n",
            handled("OK", "Range", "7"),
            handled("NotFound", "Range", "1"),
            handled("OK", "Txn", "2.5e+01"),
        );
        let m = EtcdMetrics::parse(&text);
        assert_eq!(m.handled.get("Range"), Some(&8.0));
        assert_eq!(m.handled.get("Txn"), Some(&25.0));
        assert_eq!(m.requests(), 33.0);
        assert_eq!((m.received_bytes, m.sent_bytes), (1024.0, 2048.0));
        assert_eq!((m.keys, m.db_bytes, m.db_in_use_bytes), (12.0, 20480.0, 16384.0));
        assert_eq!(EtcdMetrics::parse("garbage\n\n{}"), EtcdMetrics::default());
    }

    #[test]
    fn cpu_ticks_count_fields_after_the_last_parenthesis_of_the_name() {
        let stat = "4242 (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 30 12 0 0 20 0 9 0";
        assert_eq!(cpu_ticks(stat), Some(42));
        assert_eq!(cpu_ticks("1 (x) S 1"), None);
        let status = "Name:\tetcd\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(1024));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn the_file_system_is_the_longest_mount_point_holding_the_path() {
        let mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n";
        assert_eq!(mount_type(mounts, Path::new("/dev/shm/x")), Some("tmpfs"));
        assert_eq!(mount_type(mounts, Path::new("/tmp/x")), Some("ext4"));
        assert_eq!(mount_type(mounts, Path::new("/dev/shmoo")), Some("ext4"));
    }

    #[test]
    fn a_held_port_is_kept_from_other_binds_and_open_to_a_child_that_reuses_it() {
        let held = hold_ports(2).unwrap();
        assert_ne!(held[0].port, held[1].port);
        let addr = SocketAddr::from(([127, 0, 0, 1], held[0].port));
        // A bind without SO_REUSEADDR (as a stray socket would make) is refused while held.
        let stray = tokio::net::TcpSocket::new_v4().unwrap();
        let refused = stray.bind(addr).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse, "{refused}");
        // The child's listener (Rust's std sets SO_REUSEADDR, as tokio, Redis and Go do)
        // binds it, listens and accepts.
        let child = std::net::TcpListener::bind(addr).unwrap();
        let _conn = std::net::TcpStream::connect(addr).unwrap();
        child.accept().unwrap();
    }
}
