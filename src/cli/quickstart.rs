//! `hasync quickstart`: a master and a slave on loopback with embedded defaults, in temporary
//! data directories, each with its gRPC control plane, replicating over real sockets. The
//! master runs in SYNC mode and takes sample messages through the real put path (`Node::put`);
//! the status table (the one `hasync status` prints) shows the slave keeping up, and the exact
//! `hasync status` commands for another terminal are printed. Runs until Ctrl-C or
//! `--duration`, then checks the slave is byte-identical and stops both nodes cleanly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;

use crate::app::{App, Listeners, StartOptions};
use crate::cli::client::status::render_table;
use crate::cli::client::{Client, Connection};
use crate::config::units::ByteSize;
use crate::config::{Config, ReplicationMode, Role};
use crate::control::pb;
use crate::node::{Node, PutStatus};
use crate::store::fs::StdFs;
use crate::store::record::{self, Message};

/// `println!` that ignores a stdout gone away (`hasync quickstart | head -1`) instead of
/// panicking: the nodes go on, and Ctrl-C or `--duration` still stops them cleanly.
macro_rules! say {
    () => { crate::cli::logging::print_out("\n") };
    ($($arg:tt)*) => { crate::cli::logging::print_out(&format!("{}\n", format_args!($($arg)*))) };
}

/// `print!` likewise (no newline; stdout flushed).
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        crate::cli::logging::print_out(&format!($($arg)*));
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }};
}

/// Messages per put, and the time between puts.
const BATCH: usize = 10;
const PUT_EVERY: Duration = Duration::from_millis(100);
/// Time between status tables.
const SHOW_EVERY: Duration = Duration::from_secs(2);
/// How long to wait for the slave to be in sync before putting anyway.
const IN_SYNC_WAIT: Duration = Duration::from_secs(10);

/// Arguments of `hasync quickstart`.
#[derive(Debug, Clone, Args)]
pub struct QuickstartArgs {
    /// Stop after this long instead of waiting for Ctrl-C (e.g. "10s").
    #[arg(long, value_parser = crate::config::units::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Three nodes in coordinator mode on a local etcd (Debian package etcd-server): shows
    /// the cluster status, kills the master, the group promoting a slave with no PUT_OK lost,
    /// and the old master rejoining.
    #[arg(long, conflicts_with = "duration")]
    pub(crate) cluster: bool,
}

/// A demo node's configuration: data under `dir/name`, small segments, every listener on an
/// OS-assigned loopback port (the cluster demo starts from it too).
pub(crate) fn node_config(dir: &std::path::Path, name: &str) -> Config {
    let mut c = Config::default();
    c.node.name = name.to_owned();
    c.node.data_dir = dir.join(name);
    c.store.segment_size = ByteSize::mib(64);
    c.store.max_message_size = ByteSize::kib(512);
    c.ha.listen = "127.0.0.1:0".parse().expect("literal address");
    c.grpc.listen = "127.0.0.1:0".parse().expect("literal address");
    c.metrics.listen = "127.0.0.1:0".parse().expect("literal address");
    c.slave.reconnect_backoff = Duration::from_millis(500);
    c
}

/// One node with its control plane.
struct Running {
    node: Arc<Node>,
    app: App,
}

impl Running {
    async fn start(config: Config) -> anyhow::Result<Self> {
        let mut listeners = Listeners::bind(&config).await?;
        listeners.metrics = None;
        let app = App::start(config, listeners, Arc::new(StdFs), StartOptions::default()).await?;
        Ok(Self { node: Arc::clone(app.node()), app })
    }

    fn grpc(&self) -> SocketAddr {
        self.app.grpc_addr()
    }
}

/// Runs the quickstart.
pub(crate) fn run(args: &QuickstartArgs) -> anyhow::Result<()> {
    if args.cluster {
        return crate::cli::quickstart_cluster::run();
    }
    let dir = tempfile::Builder::new().prefix("hasync-quickstart-").tempdir()?;
    crate::cli::logging::init(crate::config::LogFormat::Text, "warn")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let mut master_cfg = node_config(dir.path(), "master");
        master_cfg.replication.mode = ReplicationMode::Sync;
        let master = Running::start(master_cfg).await?;
        let ha = master.node.ha_addr().expect("a master listens");
        let mut slave_cfg = node_config(dir.path(), "slave");
        slave_cfg.node.role = Role::Slave;
        slave_cfg.slave.master_ha = ha.to_string();
        slave_cfg.slave.master_grpc = master.grpc().to_string();
        let slave = Running::start(slave_cfg).await?;
        introduce(dir.path(), ha, &master, &slave);
        let outcome = demonstrate(args, &master, &slave).await;
        for r in [&slave, &master] {
            r.app.set_not_serving().await;
        }
        slave.app.shutdown().await?;
        master.app.shutdown().await?;
        say!("stopped cleanly");
        let same = outcome?;
        anyhow::ensure!(same, "the slave's bytes differ from the master's");
        anyhow::Ok(())
    })
}

fn introduce(dir: &std::path::Path, ha: SocketAddr, master: &Running, slave: &Running) {
    let (mg, sg) = (master.grpc(), slave.grpc());
    say!("hasync quickstart: two nodes on loopback, data in {}", dir.display());
    say!("  master  HA {ha}, gRPC {mg}; SYNC mode: a put answers PUT_OK once the slave acked it");
    say!("  slave   gRPC {sg}, following the master over the HA protocol");
    say!("From another terminal (in the source tree: cargo run --release -- status ...):");
    say!("  hasync status --grpc {mg}");
    say!("  hasync status --grpc {sg} --watch");
    say!("  hasync put --grpc {mg} --topic Demo --count 1000 --batch 10");
    say!("Ctrl-C stops both nodes.");
}

/// Puts sample messages until Ctrl-C or the duration, showing the status; returns whether the
/// slave ends byte-identical to the master.
async fn demonstrate(
    args: &QuickstartArgs,
    master: &Running,
    slave: &Running,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let over = |now: Instant| args.duration.is_some_and(|d| now >= started + d);
    let client = Client::connect(&Connection::to(master.grpc().to_string())).await?;
    let stop = crate::cli::serve::shutdown_signal();
    tokio::pin!(stop);
    say_raw!("waiting for the slave to be in sync ...");
    let deadline = Instant::now() + IN_SYNC_WAIT;
    while master.node.status().in_sync_replicas == 0 && Instant::now() < deadline {
        tokio::select! {
            _ = &mut stop => return finish(&client, master, slave, &[]).await,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    say!(
        " {} in-sync slave(s) after {}",
        master.node.status().in_sync_replicas,
        crate::cli::client::format::millis(started.elapsed().as_millis() as i64)
    );
    say!("putting {BATCH} messages every {PUT_EVERY:?} through the master's put path\n");
    let mut statuses: Vec<(PutStatus, u64)> = Vec::new();
    let mut tick = tokio::time::interval(PUT_EVERY);
    let mut shown = Instant::now();
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        if over(Instant::now()) {
            break;
        }
        let batch: Vec<Message> = (0..BATCH)
            .map(|_| {
                n += 1;
                sample(n, master.grpc())
            })
            .collect();
        let out = master.node.put(batch).await;
        match statuses.iter_mut().find(|(s, _)| *s == out.status) {
            Some((_, c)) => *c += 1,
            None => statuses.push((out.status, 1)),
        }
        if shown.elapsed() >= SHOW_EVERY {
            shown = Instant::now();
            say!(
                "--- {:.1}s: {n} messages put ({})",
                started.elapsed().as_secs_f64(),
                tally(&statuses)
            );
            let mut r = client.replication();
            if let Ok(s) = client.call("GetStatus", r.get_status(pb::GetStatusRequest {})).await {
                say!("{}", render_table(&s));
            }
        }
    }
    finish(&client, master, slave, &statuses).await
}

async fn finish(
    client: &Client,
    master: &Running,
    slave: &Running,
    statuses: &[(PutStatus, u64)],
) -> anyhow::Result<bool> {
    // Let the slave take the last batch, then show the final state of both nodes.
    let (m, s) = (master.node.store(), slave.node.store());
    let until = Instant::now() + Duration::from_secs(5);
    while s.max_offset() < m.max_offset() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let slave_client = Client::connect(&Connection::to(slave.grpc().to_string())).await?;
    for (name, c) in [("master", client), ("slave", &slave_client)] {
        let mut r = c.replication();
        let st = c.call("GetStatus", r.get_status(pb::GetStatusRequest {})).await?;
        say!("--- final status of the {name} ({})\n{}", c.url(), render_table(&st));
    }
    let puts = if statuses.is_empty() { "none".to_owned() } else { tally(statuses) };
    say!("puts of {BATCH} messages: {puts}");
    say!(
        "final offsets: master max_offset {}, slave max_offset {}",
        m.max_offset(),
        s.max_offset()
    );
    let same = identical(&master.node, &slave.node);
    say!(
        "slave holds {} of the master's {} bytes, byte-identical: {same}",
        s.max_offset() - s.min_offset(),
        m.max_offset() - m.min_offset()
    );
    Ok(same)
}

fn tally(statuses: &[(PutStatus, u64)]) -> String {
    let parts: Vec<String> = statuses.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    parts.join(", ")
}

/// Sample message number `n`: a readable body, tags and keys.
fn sample(n: u64, host: SocketAddr) -> Message {
    let key = format!("order-{n}");
    let properties = record::encode_properties(&[("KEYS", key.as_str()), ("TAGS", "quickstart")])
        .expect("valid literal properties");
    Message {
        topic: "QuickstartTopic".to_owned(),
        queue_id: (n % 4) as i32,
        flag: 0,
        body: Bytes::from(format!("quickstart message {n}: hello from hasync")),
        properties,
        sys_flag: 0,
        born_timestamp_ms: crate::ha::status::now_millis(),
        born_host: host,
        store_timestamp_ms: 0,
        store_host: host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

fn identical(master: &Node, slave: &Node) -> bool {
    let (m, s) = (master.store(), slave.store());
    if m.max_offset() != s.max_offset() {
        return false;
    }
    let mut at = s.min_offset();
    while let Ok(Some(b)) = s.read(at, usize::MAX) {
        match m.read(at, b.len()) {
            Ok(Some(mb)) if mb[..] == b[..] => at += b.len() as u64,
            _ => return false,
        }
    }
    at == s.max_offset()
}
