//! `hasync bench cluster`: N broker groups against one etcd on this machine, for N in
//! `--groups` (1, 10, 100), each size on a fresh etcd.
//!
//! Per size: etcd (a child process, etcd's default timers and quota, its data in `--dir`),
//! the controller as a child process of its own (`hasync controller`, this executable), so
//! that its CPU and memory are its own, and `--members` lightweight nodes per group started
//! in this process through [`crate::app::App`] (coordinator mode with
//! `coordinator.controller = false`, SYNC with k = 1, 64 KiB segments, no pre-faulted spare
//! segment, no scrub, no metrics server). Once every group is stable and formed (both members
//! voters, k raised), it measures at rest for `--rest`: etcd's calls, writes and bytes per
//! second (from its Prometheus counters), watchers, keys, the CPU and memory of etcd, the
//! controller and this process (the members); then the same with one `WatchTopology` stream
//! open (its cost). Then it crashes ([`crate::app::App::crash`], as kill -9) the master of one
//! group, and then of `--burst` other groups at once, and takes each failover's times from
//! an independent watch of the groups' records: crash to the leader key gone (the lease's
//! TTL), to the epoch opened (the controller's decision), to the new master stable, and from
//! there to the CHANGE on the topology stream.
//!
//! The smallest size is the same run's baseline: the table sets every per-group figure
//! against it. Every process it starts is killed on every way out (a guard per child, and
//! the parent-death signal should this process be killed).

pub(crate) mod probe;
mod report;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures_util::StreamExt as _;

use self::probe::{Etcd, HaPorts, ProcStat, Spawned};
use self::report::{Failovers, Figures, Rates, Sample};
use self::watch::{Observer, Steps, Topology};
use crate::app::{App, Listeners, StartOptions};
use crate::config::units::ByteSize;
use crate::config::{Config, ReplicationMode, Role};
use crate::coordinator::Coordinator;
use crate::coordinator::etcd::{EtcdCoordinator, EtcdOptions};
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{self, GroupState, Phase};

/// The cluster's name and key prefix in the bench's etcd.
const CLUSTER: &str = "bench";
const PREFIX: &str = "/hasync/v1/";
/// Groups started at once.
const START_CONCURRENCY: usize = 8;
/// How long etcd and the controller may take to answer at the start.
const READY_WAIT: Duration = Duration::from_secs(30);
/// How long a failover may take beyond the TTL (per group failed at once, plus a base).
const FAILOVER_SLACK: Duration = Duration::from_secs(30);
const FAILOVER_SLACK_PER_GROUP: Duration = Duration::from_secs(3);
/// How long the topology stream may take to report a promotion etcd has.
const TOPOLOGY_WAIT: Duration = Duration::from_secs(10);
/// How long the controller gets to stop on SIGTERM.
const CONTROLLER_STOP: Duration = Duration::from_secs(5);

/// Arguments of `hasync bench cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterBenchArgs {
    /// Numbers of groups, each measured on a fresh etcd; comma-separated.
    #[arg(long, default_value = "1,10,100", value_delimiter = ',')]
    pub(crate) groups: Vec<usize>,
    /// Members per group (a master and its slaves; at least 2, so a group can fail over).
    #[arg(long, default_value_t = 2)]
    pub(crate) members: usize,
    /// How long each at-rest measurement lasts (one without, one with a topology stream).
    #[arg(long, default_value = "10s", value_parser = crate::config::units::parse_duration)]
    pub(crate) rest: Duration,
    /// coordinator.ttl of the members and the controller (the failover detection waits it).
    #[arg(long, default_value = "10s", value_parser = crate::config::units::parse_duration)]
    pub(crate) ttl: Duration,
    /// coordinator.renew-interval of the members (below ttl / 2).
    #[arg(long, default_value = "2s", value_parser = crate::config::units::parse_duration)]
    pub(crate) renew: Duration,
    /// The controller's coordinator.max-concurrent-failovers.
    #[arg(long, default_value_t = 4)]
    pub(crate) max_concurrent_failovers: u32,
    /// Groups whose masters crash at once in the second failover (at most N - 1: the first
    /// failover takes one group).
    #[arg(long, default_value_t = 10)]
    pub(crate) burst: usize,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    pub(crate) etcd: PathBuf,
    /// Directory for etcd's and the nodes' data (a temporary directory inside it is removed
    /// afterwards); default: the system's temporary directory.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

impl ClusterBenchArgs {
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.members >= 2,
            "--members {}: at least 2 (a master and a slave, so that a group can fail over)",
            self.members
        );
        anyhow::ensure!(
            !self.groups.is_empty() && self.groups.iter().all(|&n| n >= 1),
            "--groups: each at least 1"
        );
        anyhow::ensure!(
            self.renew * 2 < self.ttl,
            "--renew {:?} must be below --ttl / 2 ({:?})",
            self.renew,
            self.ttl / 2
        );
        anyhow::ensure!(
            self.etcd.exists(),
            "--etcd {}: no such file (the Debian package etcd-server installs /usr/bin/etcd)",
            self.etcd.display()
        );
        Ok(())
    }
}

/// Runs the bench on a runtime of its own. Its `block_on` thread spawns etcd and the
/// controller (their parent-death signal follows that thread).
pub(crate) fn run(args: &ClusterBenchArgs) -> anyhow::Result<()> {
    args.check()?;
    if std::env::var_os("RUST_LOG").is_some() {
        crate::cli::logging::init(crate::config::LogFormat::Text, "error")?;
    }
    let (before, after) = probe::raise_open_files();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(bench(args, (before, after)));
    // The nodes' tasks end with the runtime (also after an error).
    rt.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn bench(args: &ClusterBenchArgs, open_files: (u64, u64)) -> anyhow::Result<()> {
    let root = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let base = tempfile::Builder::new().prefix("hasync-bench-cluster-").tempdir_in(&root)?;
    println!(
        "cluster bench: etcd {} ({}), data on {} ({}); {} members per group (SYNC, k = 1), \
         ttl {}, renew {}, max-concurrent-failovers {}; {} at rest; {} cores; open files {} -> {}",
        probe::etcd_version(&args.etcd),
        args.etcd.display(),
        base.path().display(),
        probe::fs_type(base.path()),
        args.members,
        humantime::format_duration(args.ttl),
        humantime::format_duration(args.renew),
        args.max_concurrent_failovers,
        humantime::format_duration(args.rest),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        open_files.0,
        open_files.1
    );
    let mut all = Vec::new();
    for &n in &args.groups {
        let dir = base.path().join(format!("n{n}"));
        std::fs::create_dir_all(&dir)?;
        let f = one_size(args, n, &dir).await.with_context(|| format!("{n} groups"))?;
        for line in report::size_lines(&f) {
            println!("{line}");
        }
        all.push(f);
        std::fs::remove_dir_all(&dir).ok();
    }
    println!("\n{}", report::table(&all));
    Ok(())
}

/// The running members of one group.
struct Group {
    name: String,
    members: Vec<(String, Option<App>)>,
}

impl Group {
    fn running(&self) -> impl Iterator<Item = &str> {
        self.members.iter().filter(|m| m.1.is_some()).map(|m| m.0.as_str())
    }
}

/// Measures one size: `n` groups on a fresh etcd.
async fn one_size(args: &ClusterBenchArgs, n: usize, dir: &Path) -> anyhow::Result<Figures> {
    let etcd = Etcd::start(&args.etcd, dir)?;
    let engine: Arc<dyn Coordinator> = Arc::new(connect(etcd.client).await?);
    let keys = Keys::new(PREFIX, CLUSTER);
    let mut controller = start_controller(args, dir, &etcd)?;
    wait_controller(engine.as_ref(), &keys, &mut controller).await?;
    let mut f = Figures { groups: n, nodes: n * args.members, ..Figures::default() };

    let started = Instant::now();
    let mut groups = start_groups(args, n, dir, &etcd).await?;
    f.start = started.elapsed();
    let formed_at = Instant::now();
    let within = READY_WAIT + Duration::from_millis(500) * n as u32;
    wait_formed(engine.as_ref(), &keys, &groups, within).await?;
    f.formed = formed_at.elapsed();
    // What a group does right after forming (a raise of k, the first metadata pulls) passes.
    tokio::time::sleep(args.renew * 2).await;

    let pid = controller.pid();
    let window = Window { etcd: &etcd, controller: pid, rest: args.rest };
    let (quiet_from, quiet_to) = window.measure().await?;
    f.rest = Rates::between(&quiet_from, &quiet_to);
    f.etcd_keys = quiet_to.etcd.keys;
    f.db_bytes = quiet_to.etcd.db_bytes;
    f.open_files = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let (cluster, revision) = engine.get_prefix(keys.root()).await?;
    f.cluster_keys = cluster.len();
    let topology = window.with_stream(&groups, &mut f).await?;

    let observer = Observer::start(Arc::clone(&engine), &keys, revision + 1).await?;
    let controller_log = controller.log.clone();
    let scene =
        Scene { args, engine: engine.as_ref(), keys: &keys, observer, topology, controller_log };
    f.one = Some(scene.failover(&mut groups, &[0]).await?);
    let burst: Vec<usize> = (1..n).take(args.burst).collect();
    if !burst.is_empty() {
        f.many = Some(scene.failover(&mut groups, &burst).await?);
    }
    f.controller_rss_peak = ProcStat::read(pid).map_or(0, |p| p.rss_peak_bytes);
    drop(scene);
    // The keys by kind after the failovers, each of which left a history record.
    let (after, _) = engine.get_prefix(keys.root()).await?;
    f.kinds = key_kinds(&keys, &after);

    controller.stop(CONTROLLER_STOP);
    let apps: Vec<App> =
        groups.into_iter().flat_map(|g| g.members.into_iter().filter_map(|m| m.1)).collect();
    futures_util::future::join_all(apps.iter().map(App::crash)).await;
    drop(apps);
    etcd.process.stop(Duration::from_secs(5));
    Ok(f)
}

/// An at-rest measurement: two samples `rest` apart.
struct Window<'a> {
    etcd: &'a Etcd,
    controller: u32,
    rest: Duration,
}

impl Window<'_> {
    async fn measure(&self) -> anyhow::Result<(Sample, Sample)> {
        let from = sample(self.etcd, self.controller).await?;
        tokio::time::sleep(self.rest).await;
        Ok((from, sample(self.etcd, self.controller).await?))
    }

    /// Opens one topology stream on the last member of the last group, measures at rest with
    /// it open, and returns it (the failovers' delays are read from it).
    async fn with_stream(&self, groups: &[Group], f: &mut Figures) -> anyhow::Result<Topology> {
        let host = groups
            .last()
            .and_then(|g| g.members.last())
            .and_then(|m| m.1.as_ref())
            .map(App::grpc_addr)
            .context("a member to host the topology stream")?;
        let topology = Topology::open(host).await?;
        f.snapshot_bytes = topology.snapshot_bytes;
        let got_from = topology.received();
        let (from, to) = self.measure().await?;
        let got_to = topology.received();
        let secs = to.at.saturating_duration_since(from.at).as_secs_f64().max(1e-3);
        f.watched = Rates::between(&from, &to);
        f.stream_updates = (got_to.updates - got_from.updates) as f64 / secs;
        f.stream_bytes = (got_to.bytes - got_from.bytes) as f64 / secs;
        Ok(topology)
    }
}

/// The cluster's keys by kind: the part after the group (`state`, `members`, `history` ...),
/// or the key under the root for the cluster's own (`controller`); count and value bytes.
fn key_kinds(
    keys: &Keys,
    kvs: &[crate::coordinator::KeyValue],
) -> std::collections::BTreeMap<String, (usize, usize)> {
    let mut out = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for kv in kvs {
        let kind = match keys.split_group(&kv.key) {
            Some((_, rest)) => rest.split('/').next().unwrap_or(rest),
            None => kv.key.strip_prefix(keys.root()).unwrap_or(&kv.key),
        };
        let e = out.entry(kind.to_owned()).or_default();
        e.0 += 1;
        e.1 += kv.value.len();
    }
    out
}

/// The bench's own etcd client, once etcd answers.
async fn connect(client: std::net::SocketAddr) -> anyhow::Result<EtcdCoordinator> {
    let opts = EtcdOptions {
        endpoints: vec![client.to_string()],
        timeout: Duration::from_secs(2),
        tls: None,
        user: None,
    };
    let deadline = Instant::now() + READY_WAIT;
    loop {
        match EtcdCoordinator::connect(opts.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => {
                return Err(e).context(format!("etcd at {client} did not answer"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn sample(etcd: &Etcd, controller: u32) -> anyhow::Result<Sample> {
    let metrics = probe::scrape(etcd.metrics).await?;
    Ok(Sample {
        at: Instant::now(),
        etcd: metrics,
        etcd_proc: ProcStat::read(etcd.process.pid())?,
        controller: ProcStat::read(controller)?,
        members: ProcStat::read(0)?,
    })
}

/// `hasync controller` (this executable) with a config file written into `dir`.
fn start_controller(args: &ClusterBenchArgs, dir: &Path, etcd: &Etcd) -> anyhow::Result<Spawned> {
    let file = dir.join("controller.toml");
    let toml = format!(
        "[node]\nname = \"bench-controller\"\n\n[coordinator]\nendpoints = [\"{}\"]\n\
         prefix = \"{PREFIX}\"\ncluster = \"{CLUSTER}\"\nttl = \"{}\"\nrenew-interval = \"{}\"\n\
         max-concurrent-failovers = {}\n\n[replication]\nmode = \"sync\"\nsync-ack-replicas = 1\n\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\n[log]\nfilter = \"info\"\n",
        etcd.client,
        humantime::format_duration(args.ttl),
        humantime::format_duration(args.renew),
        args.max_concurrent_failovers
    );
    std::fs::write(&file, toml).with_context(|| format!("writing {}", file.display()))?;
    let exe = std::env::current_exe().context("the path of this executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("controller").arg("--config").arg(&file);
    cmd.env("NO_COLOR", "1").env_remove("RUST_LOG").env_remove("HASYNC_CONFIG");
    Spawned::spawn("controller", cmd, dir.join("controller.log"))
}

/// Waits until the controller holds the campaign key (it runs and reaches etcd).
async fn wait_controller(
    engine: &dyn Coordinator,
    keys: &Keys,
    controller: &mut Spawned,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_WAIT;
    loop {
        if let Some(status) = controller.exited() {
            anyhow::bail!("{} exited ({status}):\n{}", controller.name, controller.log_tail(15));
        }
        if engine.get(&keys.controller()).await.is_ok_and(|(kv, _)| kv.is_some()) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller is not active within {READY_WAIT:?} (log {}):\n{}",
            controller.log.display(),
            controller.log_tail(15)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lightweight member: tiny segments, no spare segment faulted in, no scrub.
fn member_config(
    args: &ClusterBenchArgs,
    dir: &Path,
    etcd: &Etcd,
    group: &str,
    name: &str,
) -> Config {
    let mut c = Config::default();
    c.node.name = name.to_owned();
    c.node.data_dir = dir.join(name);
    let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
    c.ha.listen = loopback;
    c.grpc.listen = loopback;
    c.metrics.listen = loopback;
    c.store.segment_size = ByteSize::kib(64);
    c.store.max_message_size = ByteSize::kib(16);
    c.store.warm_segments = false;
    c.store.scrub_rate = ByteSize(0);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    c.coordinator.endpoints = vec![etcd.client.to_string()];
    c.coordinator.prefix = PREFIX.to_owned();
    c.coordinator.cluster = CLUSTER.to_owned();
    c.coordinator.group = group.to_owned();
    c.coordinator.ttl = args.ttl;
    c.coordinator.renew_interval = args.renew;
    c.coordinator.controller = false;
    c
}

/// Starts `n` groups, [`START_CONCURRENCY`] at a time: in each the first member is the master
/// and the others follow it. HA ports come from below the ephemeral range ([`HaPorts`]).
async fn start_groups(
    args: &ClusterBenchArgs,
    n: usize,
    dir: &Path,
    etcd: &Etcd,
) -> anyhow::Result<Vec<Group>> {
    let ports = HaPorts::below_ephemeral();
    let started: Vec<anyhow::Result<Group>> = futures_util::stream::iter(0..n)
        .map(|g| start_group(args, g, dir, etcd, &ports))
        .buffer_unordered(START_CONCURRENCY)
        .collect()
        .await;
    let mut groups = started.into_iter().collect::<anyhow::Result<Vec<Group>>>()?;
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(groups)
}

async fn start_group(
    args: &ClusterBenchArgs,
    g: usize,
    dir: &Path,
    etcd: &Etcd,
    ports: &HaPorts,
) -> anyhow::Result<Group> {
    let name = format!("g{g:03}");
    let mut members = Vec::new();
    let mut master = None;
    for i in 1..=args.members {
        let node = format!("{name}-n{i}");
        let mut c = member_config(args, dir, etcd, &name, &node);
        if let Some((ha, grpc)) = &master {
            c.node.role = Role::Slave;
            c.slave.master_ha = format!("{ha}");
            c.slave.master_grpc = format!("{grpc}");
        }
        let ha = ports.bind().await?;
        c.ha.listen = ha.local_addr()?;
        let grpc = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let listeners = Listeners { ha: Some(ha), grpc, metrics: None };
        let app =
            App::start(c, listeners, Arc::new(crate::store::fs::StdFs), StartOptions::default())
                .await
                .with_context(|| format!("starting {node}"))?;
        if master.is_none() {
            master = Some((app.ha_addr().context("the master's HA address")?, app.grpc_addr()));
        }
        members.push((node, Some(app)));
    }
    Ok(Group { name, members })
}

/// The groups' state records, by group.
async fn states(
    engine: &dyn Coordinator,
    keys: &Keys,
) -> anyhow::Result<std::collections::BTreeMap<String, GroupState>> {
    let (kvs, _) = engine.get_prefix(&keys.groups()).await?;
    let mut out = std::collections::BTreeMap::new();
    for kv in kvs {
        if let Some((group, "state")) = keys.split_group(&kv.key) {
            out.insert(group.to_owned(), records::decode(&kv.key, &kv.value)?);
        }
    }
    Ok(out)
}

/// Waits until every group is stable with a master, every running member a voter and k raised
/// as far as V allows towards the k the group aims for.
async fn wait_formed(
    engine: &dyn Coordinator,
    keys: &Keys,
    groups: &[Group],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let states = states(engine, keys).await?;
        let unformed: Vec<&str> = groups
            .iter()
            .filter(|g| !states.get(&g.name).is_some_and(|s| formed(s, g)))
            .map(|g| g.name.as_str())
            .collect();
        if unformed.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {} groups not stable and formed within {within:?} (first: {:?}, state {:?})",
            unformed.len(),
            groups.len(),
            unformed.first(),
            unformed.first().and_then(|g| states.get(*g))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn formed(s: &GroupState, g: &Group) -> bool {
    let others = u32::try_from(s.voters.len().saturating_sub(1)).unwrap_or(u32::MAX);
    let goal = s.wanted_k.unwrap_or(0).min(others);
    s.phase == Phase::Stable
        && s.master.is_some()
        && g.running().all(|m| s.is_voter(m))
        && s.k >= goal
}

/// What a failover scenario needs: the engine, the bench's watch, the topology stream.
struct Scene<'a> {
    args: &'a ClusterBenchArgs,
    engine: &'a dyn Coordinator,
    keys: &'a Keys,
    observer: Observer,
    topology: Topology,
    /// The controller's log, whose end a failover that does not finish shows.
    controller_log: PathBuf,
}

/// A crashed master: its group, its name, the epoch it was master of, its (crashed) node.
struct Victim {
    group: String,
    master: String,
    epoch: u64,
    app: App,
}

impl Scene<'_> {
    /// Crashes the masters of `which` groups at once and waits (bounded) until each group
    /// has another stable master, then for the topology stream to report each.
    async fn failover(&self, groups: &mut [Group], which: &[usize]) -> anyhow::Result<Failovers> {
        let states = states(self.engine, self.keys).await?;
        let mut victims = Vec::new();
        for &g in which {
            let group = &mut groups[g];
            let s = states.get(&group.name).with_context(|| format!("{}: no state", group.name))?;
            let master = s.master.clone().with_context(|| format!("{}: no master", group.name))?;
            let app = group
                .members
                .iter_mut()
                .find(|m| m.0 == master)
                .and_then(|m| m.1.take())
                .with_context(|| format!("{}: its master {master} is not running", group.name))?;
            victims.push(Victim { group: group.name.clone(), master, epoch: s.epoch, app });
        }
        let crashed = Instant::now();
        futures_util::future::join_all(victims.iter().map(|v| v.app.crash())).await;
        let steps = self.wait_stable(&victims, crashed).await?;
        let mut out = Failovers { groups: which.len(), ..Failovers::default() };
        let since =
            |t: Option<Instant>, from: Instant| t.map(|t| t.saturating_duration_since(from));
        for (v, s) in victims.iter().zip(&steps) {
            out.expire.extend(since(s.leader_gone, crashed));
            out.detect.extend(since(s.opened, crashed));
            out.total.extend(since(s.stable, crashed));
            if let (Some(o), Some(p), Some(st)) = (s.opened, s.promoting, s.stable) {
                out.fence.push(p.saturating_duration_since(o));
                out.promote.push(st.saturating_duration_since(p));
            }
            match self.topology_report(v).await {
                Some(t) => out.topology.push(t.saturating_duration_since(s.stable.unwrap_or(t))),
                None => out.topology_missing += 1,
            }
        }
        Ok(out)
    }

    /// Each victim's steps once every group has another stable master (bounded).
    async fn wait_stable(
        &self,
        victims: &[Victim],
        crashed: Instant,
    ) -> anyhow::Result<Vec<Steps>> {
        let within =
            self.args.ttl + FAILOVER_SLACK + FAILOVER_SLACK_PER_GROUP * victims.len() as u32;
        let deadline = crashed + within;
        loop {
            let steps: Vec<Steps> = victims
                .iter()
                .map(|v| self.observer.steps(&v.group, &v.master, v.epoch, crashed))
                .collect();
            if steps.iter().all(|s| s.stable.is_some()) {
                return Ok(steps);
            }
            if Instant::now() > deadline {
                let late: Vec<&str> = victims
                    .iter()
                    .zip(&steps)
                    .filter(|(_, s)| s.stable.is_none())
                    .map(|(v, _)| v.group.as_str())
                    .collect();
                anyhow::bail!(
                    "no new stable master within {within:?} of the crash: {late:?}; the end of \
                     the controller's log:\n{}",
                    probe::tail(&self.controller_log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// When the topology stream reported the victim's group's new master (None: not within
    /// [`TOPOLOGY_WAIT`]).
    async fn topology_report(&self, v: &Victim) -> Option<Instant> {
        let deadline = Instant::now() + TOPOLOGY_WAIT;
        loop {
            match self.topology.promoted(&v.group, &v.master, v.epoch) {
                Some(t) => return Some(t),
                None if Instant::now() > deadline => return None,
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}
