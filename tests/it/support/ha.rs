//! Masters, slaves, raw peers and a fault proxy for data-plane tests, all on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasync::config::AckMode;
use hasync::ha::group_transfer::SyncWaiters;
use hasync::ha::master::{Master, MasterOptions};
use hasync::ha::slave::{Slave, SlaveOptions};
use hasync::metrics::HaCounters;
use hasync::store::CommitLog;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::support::{open, opts};

/// Segment size of data-plane tests.
pub const SEG: usize = 64 * 1024;

/// Short timers for tests.
pub fn master_opts() -> MasterOptions {
    MasterOptions {
        heartbeat_interval: Duration::from_millis(200),
        housekeeping_interval: Duration::from_secs(2),
        ..MasterOptions::default()
    }
}

/// Short timers for tests; `master` is the HA address.
pub fn slave_opts(master: SocketAddr) -> SlaveOptions {
    SlaveOptions {
        master_ha: master.to_string(),
        read_buffer_size: 4 << 20,
        connect_timeout: Duration::from_secs(2),
        reconnect_backoff: Duration::from_millis(50),
        reconnect_backoff_max: Duration::from_millis(200),
        source_address: None,
        ack_mode: AckMode::Received,
        report_interval: Duration::from_millis(200),
        housekeeping_interval: Duration::from_secs(2),
    }
}

/// A running master.
pub struct MasterNode {
    pub store: Arc<CommitLog>,
    pub master: Arc<Master>,
    pub addr: SocketAddr,
    pub cancel: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl MasterNode {
    pub async fn start(dir: &Path, o: MasterOptions) -> Self {
        Self::start_with(Arc::new(open(dir, opts(SEG))), o).await
    }

    pub async fn start_with(store: Arc<CommitLog>, o: MasterOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let waiters = Arc::new(SyncWaiters::new(1));
        let master = Master::new(Arc::clone(&store), o, waiters, HaCounters::default());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&master).run(listener, cancel.clone()));
        Self { store, master, addr, cancel, task }
    }

    pub async fn stop(self) -> Arc<CommitLog> {
        self.cancel.cancel();
        self.task.await.unwrap();
        self.store
    }
}

/// A running slave.
pub struct SlaveNode {
    pub store: Arc<CommitLog>,
    pub slave: Arc<Slave>,
    pub cancel: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl SlaveNode {
    pub fn start(dir: &Path, o: SlaveOptions) -> Self {
        Self::start_with(Arc::new(open(dir, opts(SEG))), o)
    }

    pub fn start_with(store: Arc<CommitLog>, o: SlaveOptions) -> Self {
        let slave = Slave::new(Arc::clone(&store), o, HaCounters::default());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&slave).run(cancel.clone()));
        Self { store, slave, cancel, task }
    }

    pub async fn stop(self) -> Arc<CommitLog> {
        self.cancel.cancel();
        self.task.await.unwrap();
        self.store
    }
}

/// Polls `cond` every 10 ms until it holds or `secs` pass.
pub async fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Appends `n` messages with bodies of `body` bytes.
pub fn put(store: &CommitLog, n: usize, body: usize) -> u64 {
    let batch: Vec<_> =
        (0..n).map(|i| crate::support::msg("T", (i % 4) as i32, &vec![i as u8; body])).collect();
    store.append(&batch).unwrap().end_offset
}

/// Asserts the slave holds exactly the master's bytes over the slave's range.
pub fn assert_identical(master: &CommitLog, slave: &CommitLog) {
    assert_eq!(slave.max_offset(), master.max_offset(), "max offsets");
    let mut at = slave.min_offset();
    while at < slave.max_offset() {
        let s = slave.read(at, usize::MAX).unwrap().unwrap();
        let m = master.read(at, s.len()).unwrap().unwrap();
        assert_eq!(&s[..m.len()], &m[..], "bytes differ at {at}");
        at += m.len() as u64;
    }
}

/// How a [`Proxy`] forwards bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// As they come.
    Pass,
    /// One byte per write.
    OneByte,
    /// Random-size writes (1..=97 bytes).
    Random,
    /// Stop forwarding, keep the sockets open.
    Stall,
}

/// A TCP proxy on 127.0.0.1 that re-splits the stream or stalls it.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<Mutex<ProxyMode>>,
    upstream: Arc<Mutex<SocketAddr>>,
    cancel: CancellationToken,
    conns: Arc<Mutex<CancellationToken>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr, mode: ProxyMode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let upstream = Arc::new(Mutex::new(upstream));
        let cancel = CancellationToken::new();
        let conns = Arc::new(Mutex::new(CancellationToken::new()));
        let (m, u, c, k) =
            (Arc::clone(&mode), Arc::clone(&upstream), cancel.clone(), Arc::clone(&conns));
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    _ = c.cancelled() => return,
                    a = listener.accept() => a.unwrap(),
                };
                let up = *u.lock().unwrap();
                let Ok(server) = TcpStream::connect(up).await else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let conn_cancel = k.lock().unwrap().child_token();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, Arc::clone(&m), conn_cancel.clone(), 1));
                tokio::spawn(pump(sr, cw, Arc::clone(&m), conn_cancel, 2));
            }
        });
        Self { addr, mode, upstream, cancel, conns }
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn set_upstream(&self, addr: SocketAddr) {
        *self.upstream.lock().unwrap() = addr;
    }

    /// Closes every proxied connection (new ones are still accepted).
    pub fn cut(&self) {
        let mut k = self.conns.lock().unwrap();
        k.cancel();
        *k = CancellationToken::new();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.cut();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<Mutex<ProxyMode>>,
    cancel: CancellationToken,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            _ = cancel.cancelled() => return,
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
        };
        let mut at = 0;
        while at < n {
            let m = *mode.lock().unwrap();
            let step = match m {
                ProxyMode::Pass => n - at,
                ProxyMode::OneByte => 1,
                ProxyMode::Random => rng.random_range(1..=97).min(n - at),
                ProxyMode::Stall => {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
                    }
                }
            };
            let w = tokio::select! {
                _ = cancel.cancelled() => return,
                w = to.write_all(&buf[at..at + step]) => w,
            };
            if w.is_err() {
                return;
            }
            at += step;
        }
    }
}

/// A node configuration for tests: 64 KiB segments, loopback listeners on OS ports, short
/// timers.
pub fn node_config(dir: &Path, role: hasync::config::Role) -> hasync::config::Config {
    use hasync::config::units::ByteSize;
    let mut c = hasync::config::Config::default();
    c.node.role = role;
    c.node.data_dir = dir.to_path_buf();
    c.store.segment_size = ByteSize::kib(64);
    c.store.max_message_size = ByteSize::kib(16);
    c.store.flush_interval = Duration::from_millis(50);
    c.ha.listen = "127.0.0.1:0".parse().unwrap();
    c.ha.heartbeat_interval = Duration::from_millis(200);
    c.ha.housekeeping_interval = Duration::from_secs(2);
    c.grpc.listen = "127.0.0.1:0".parse().unwrap();
    c.metrics.listen = "127.0.0.1:0".parse().unwrap();
    c.slave.reconnect_backoff = Duration::from_millis(50);
    c.slave.reconnect_backoff_max = Duration::from_millis(200);
    c.replication.slave_timeout = Duration::from_secs(2);
    c
}

/// A slave node config following `master`.
pub fn slave_node_config(dir: &Path, master: SocketAddr) -> hasync::config::Config {
    let mut c = node_config(dir, hasync::config::Role::Slave);
    c.slave.master_ha = master.to_string();
    c
}
