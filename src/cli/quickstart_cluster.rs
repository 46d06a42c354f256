//! `hasync quickstart --cluster`: etcd (when installed) and three nodes in coordinator mode on
//! loopback, in temporary data directories. A producer puts SYNC messages to whichever node the
//! group's state names master; the demo shows the cluster status, kills the master as kill -9
//! would, shows the group promote a slave (and how long the first PUT_OK on the new master
//! took), restarts the old master and shows it rejoin as a slave, then checks that every
//! PUT_OK record is on the new master.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;

use crate::app::{App, Listeners, StartOptions};
use crate::cli::bench_cluster::probe::{HeldPort, hold_ports};
use crate::cli::client::cluster_view::status_table;
use crate::cli::client::{Client, Connection};
use crate::config::{Config, ReplicationMode, Role};
use crate::control::pb;
use crate::coordinator::Coordinator;
use crate::coordinator::etcd::{EtcdCoordinator, EtcdOptions};
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{self, GroupState, Phase};
use crate::node::PutStatus;
use crate::store::fs::StdFs;
use crate::store::record::{self, Message};

macro_rules! say {
    ($($arg:tt)*) => { crate::cli::logging::print_out(&format!("{}\n", format_args!($($arg)*))) };
}

const ETCD_PATHS: [&str; 2] = ["/usr/bin/etcd", "/usr/local/bin/etcd"];
const GROUP: &str = "demo";
const CLUSTER: &str = "quickstart";
/// The demo's lease TTL: etcd's floor with its default timers is 3 s.
const TTL: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(30);

/// etcd as a child process, killed on drop.
struct Etcd {
    child: Child,
    client: SocketAddr,
    /// Its client and peer ports, held while it runs.
    _ports: Vec<HeldPort>,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcd_binary() -> anyhow::Result<PathBuf> {
    ETCD_PATHS.iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(|| {
        anyhow::anyhow!(
            "quickstart --cluster runs a real etcd, and none is installed ({}): install the \
             Debian package etcd-server (apt-get install etcd-server), or run `hasync \
             quickstart` without --cluster",
            ETCD_PATHS.join(", ")
        )
    })
}

fn start_etcd(dir: &Path) -> anyhow::Result<Etcd> {
    let bin = etcd_binary()?;
    let ports = hold_ports(2)?;
    let (client, peer) = (ports[0].port, ports[1].port);
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let child = Command::new(&bin)
        .args([
            "--name",
            "quickstart",
            "--data-dir",
            &dir.join("etcd").display().to_string(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("quickstart=http://127.0.0.1:{peer}"),
            "--heartbeat-interval",
            "200",
            "--election-timeout",
            "2000",
            "--auto-compaction-retention",
            "1",
        ])
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Etcd { child, client: SocketAddr::from(([127, 0, 0, 1], client)), _ports: ports })
}

fn node_config(dir: &Path, name: &str, etcd: SocketAddr) -> Config {
    let mut c = crate::cli::quickstart::node_config(dir, name);
    c.slave.reconnect_backoff = Duration::from_millis(100);
    c.slave.reconnect_backoff_max = Duration::from_millis(500);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.slave_timeout = Duration::from_secs(2);
    c.coordinator.endpoints = vec![etcd.to_string()];
    c.coordinator.cluster = CLUSTER.into();
    c.coordinator.group = GROUP.into();
    c.coordinator.ttl = TTL;
    c.coordinator.renew_interval = Duration::from_millis(500);
    c.coordinator.timeout = Duration::from_secs(1);
    c.coordinator.hold_down = Duration::from_secs(1);
    c
}

struct Member {
    name: String,
    config: Config,
    app: Option<App>,
}

/// Starts a demo node; n2 alone serves metrics (and the cluster console) on its loopback port.
async fn start(config: &Config) -> anyhow::Result<App> {
    let mut listeners = Listeners::bind(config).await?;
    if config.node.name != "n2" {
        listeners.metrics = None;
    }
    Ok(App::start(config.clone(), listeners, Arc::new(StdFs), StartOptions::default()).await?)
}

async fn state(engine: &EtcdCoordinator, keys: &Keys) -> Option<GroupState> {
    let (kv, _) = engine.get(&keys.state(GROUP)).await.ok()?;
    kv.and_then(|kv| records::decode(&kv.key, &kv.value).ok())
}

async fn wait_master(
    engine: &EtcdCoordinator,
    keys: &Keys,
    not: Option<&str>,
) -> anyhow::Result<GroupState> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = state(engine, keys).await
            && s.phase == Phase::Stable
            && s.master.as_deref().is_some_and(|m| Some(m) != not)
        {
            return Ok(s);
        }
        anyhow::ensure!(Instant::now() < deadline, "no master within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The producer's view of the members: each name with its node while it runs.
type Nodes = Vec<(String, Option<Arc<crate::node::Node>>)>;

/// What the producer saw: every PUT_OK (node, offset, body) and when the last one came.
#[derive(Default)]
struct Produced {
    acked: Vec<(String, u64, Bytes)>,
    /// The first PUT_OK on each master.
    first_ok: Vec<(String, Instant)>,
    statuses: Vec<(PutStatus, u64)>,
}

fn sample(n: u64) -> Message {
    let host = SocketAddr::from(([127, 0, 0, 1], 0));
    Message {
        topic: "QuickstartTopic".to_owned(),
        queue_id: (n % 4) as i32,
        flag: 0,
        body: Bytes::from(format!("quickstart --cluster message {n}")),
        properties: Bytes::new(),
        sys_flag: 0,
        born_timestamp_ms: crate::ha::status::now_millis(),
        born_host: host,
        store_timestamp_ms: 0,
        store_host: host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// Runs the demo.
pub(crate) fn run() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("hasync-quickstart-cluster-").tempdir()?;
    crate::cli::logging::init(crate::config::LogFormat::Text, "error")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(demo(dir.path()))
}

async fn demo(dir: &Path) -> anyhow::Result<()> {
    let etcd = start_etcd(dir)?;
    let opts = EtcdOptions {
        endpoints: vec![etcd.client.to_string()],
        timeout: Duration::from_secs(1),
        tls: None,
        user: None,
    };
    let deadline = Instant::now() + WAIT;
    let engine = loop {
        match EtcdCoordinator::connect(opts.clone()).await {
            Ok(e) => break e,
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!("etcd did not answer (log: {}): {e}", dir.join("etcd.log").display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let keys = Keys::new("/hasync/v1/", CLUSTER);
    say!(
        "hasync quickstart --cluster: etcd at {} and three nodes, data in {}",
        etcd.client,
        dir.display()
    );
    let mut members: Vec<Member> = Vec::new();
    for name in ["n1", "n2", "n3"] {
        let mut config = node_config(dir, name, etcd.client);
        if let Some(first) = members.first().and_then(|m| m.app.as_ref()) {
            config.node.role = Role::Slave;
            config.slave.master_ha =
                first.ha_addr().context("the master's HA address")?.to_string();
            config.slave.master_grpc = first.grpc_addr().to_string();
        }
        let app = start(&config).await?;
        members.push(Member { name: name.into(), config, app: Some(app) });
    }
    if let Some(addr) =
        members.iter().find(|m| m.name == "n2").and_then(|m| m.app.as_ref()?.metrics_addr())
    {
        say!("the cluster console (live, read-only): http://{addr}/ while the demo runs");
    }
    let first = wait_master(&engine, &keys, None).await?;
    let old = first.master.clone().unwrap_or_default();
    let grpc_of = |members: &[Member], name: &str| {
        members.iter().find(|m| m.name == name).and_then(|m| m.app.as_ref()).map(|a| a.grpc_addr())
    };
    let any = grpc_of(&members, "n2").context("n2 runs")?;
    let client = Client::connect(&Connection::to(any.to_string())).await?;
    let show = |title: &'static str| {
        let client = &client;
        async move {
            let mut c = client.cluster();
            if let Ok(s) = client
                .call(
                    "GetClusterStatus",
                    c.get_cluster_status(pb::GetClusterStatusRequest::default()),
                )
                .await
            {
                say!("--- {title}\n{}", status_table(&s));
            }
        }
    };

    // A producer that puts to whichever node the state names master.
    let produced = Arc::new(Mutex::new(Produced::default()));
    let nodes: Arc<Mutex<Nodes>> = Arc::new(Mutex::new(
        members
            .iter()
            .map(|m| (m.name.clone(), m.app.as_ref().map(|a| Arc::clone(a.node()))))
            .collect(),
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (produced, nodes, stop, engine, keys) =
            (Arc::clone(&produced), Arc::clone(&nodes), stop.clone(), engine.clone(), keys.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let master = state(&engine, &keys).await.and_then(|s| s.master);
                let node = master.as_ref().and_then(|m| {
                    nodes
                        .lock()
                        .unwrap()
                        .iter()
                        .find(|(name, _)| name == m)
                        .and_then(|(_, n)| n.clone())
                });
                let Some(node) = node else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                n += 1;
                let msg = sample(n);
                let body = msg.body.clone();
                let out = node.put(vec![msg]).await;
                let ok = out.status == PutStatus::PutOk;
                {
                    let mut p = produced.lock().unwrap();
                    match p.statuses.iter_mut().find(|(s, _)| *s == out.status) {
                        Some((_, c)) => *c += 1,
                        None => p.statuses.push((out.status, 1)),
                    }
                    if ok {
                        let name = master.clone().unwrap_or_default();
                        p.acked.push((name.clone(), out.records[0].offset, body));
                        if !p.first_ok.iter().any(|(n, _)| *n == name) {
                            p.first_ok.push((name, Instant::now()));
                        }
                    }
                }
                if !ok {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    show("the group serves (hasync cluster status)").await;
    let before = produced.lock().unwrap().acked.len();
    say!(
        "{before} PUT_OK so far on {old}; killing {old} as kill -9 would (its lease expires in {TTL:?})"
    );
    let killed = Instant::now();
    if let Some(m) = members.iter_mut().find(|m| m.name == old)
        && let Some(app) = m.app.take()
    {
        nodes.lock().unwrap().iter_mut().filter(|(n, _)| *n == old).for_each(|e| e.1 = None);
        app.crash().await;
    }
    let after = wait_master(&engine, &keys, Some(&old)).await?;
    let new = after.master.clone().unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    let first_ok = loop {
        let seen = produced.lock().unwrap().first_ok.iter().find(|(n, _)| *n == new).map(|e| e.1);
        if let Some(t) = seen {
            break t;
        }
        anyhow::ensure!(Instant::now() < deadline, "no PUT_OK on {new}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    say!(
        "{new} is master of epoch {} (was {} under {old}); first PUT_OK on it {:.1}s after the kill",
        after.epoch,
        first.epoch,
        first_ok.saturating_duration_since(killed).as_secs_f64()
    );
    show("after the failover").await;

    say!(
        "restarting {old}: it starts fenced, the controller points it at {new}, it truncates what {new} never had"
    );
    let m = members.iter_mut().find(|m| m.name == old).context("the old master")?;
    let app = start(&m.config).await?;
    let old_node = Arc::clone(app.node());
    m.app = Some(app);
    let deadline = Instant::now() + WAIT;
    while !(old_node.role() == Role::Slave && old_node.epoch() == after.epoch) {
        anyhow::ensure!(Instant::now() < deadline, "{old} did not rejoin");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let _ = producer.await;
    show("the old master rejoined as a slave").await;

    // Every PUT_OK record on the new master.
    let new_node = members
        .iter()
        .find(|m| m.name == new)
        .and_then(|m| m.app.as_ref())
        .map(|a| Arc::clone(a.node()))
        .context("the new master runs")?;
    let (acked, statuses) = {
        let p = produced.lock().unwrap();
        (p.acked.clone(), p.statuses.clone())
    };
    let mut held = 0;
    for (_, offset, body) in &acked {
        if let Ok(Some(b)) = new_node.store().read(*offset, 64 * 1024)
            && let Ok(record::Decoded::Message(m)) = record::decode(&b, *offset as i64)
            && m.body == &body[..]
        {
            held += 1;
        }
    }
    let tally: Vec<String> = statuses.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    say!("puts: {}", tally.join(", "));
    let lost = held != acked.len();
    say!(
        "{held} of {} PUT_OK records are on the new master {new}: {}",
        acked.len(),
        if lost { "PUT_OK RECORDS LOST" } else { "no PUT_OK lost" }
    );
    for m in &members {
        if let Some(a) = &m.app {
            a.shutdown().await?;
        }
    }
    drop(etcd);
    say!("stopped cleanly");
    anyhow::ensure!(!lost, "PUT_OK records were lost");
    Ok(())
}
