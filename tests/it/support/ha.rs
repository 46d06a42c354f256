//! Node configurations for master/slave tests, a poll helper and a fault proxy, all on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Polls `cond` every 10 ms until it holds or `secs` pass.
pub async fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
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
    /// Forward what the client sends; hold what the upstream answers (a reply in flight).
    StallReplies,
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
        Self::start_from(upstream, mode, None).await
    }

    /// As [`Proxy::start`], connecting upstream from `source` (e.g. 127.0.0.2, so that a master
    /// sees the proxied slave as another host).
    pub async fn start_from(
        upstream: SocketAddr,
        mode: ProxyMode,
        source: Option<std::net::IpAddr>,
    ) -> Self {
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
                let Ok(server) = connect_from(up, source).await else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let conn_cancel = k.lock().unwrap().child_token();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, Arc::clone(&m), conn_cancel.clone(), false));
                tokio::spawn(pump(sr, cw, Arc::clone(&m), conn_cancel, true));
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

async fn connect_from(
    addr: SocketAddr,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let Some(ip) = source else { return TcpStream::connect(addr).await };
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(addr).await
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<Mutex<ProxyMode>>,
    cancel: CancellationToken,
    replies: bool,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(if replies { 2 } else { 1 });
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
                ProxyMode::StallReplies if !replies => n - at,
                ProxyMode::OneByte => 1,
                ProxyMode::Random => rng.random_range(1..=97).min(n - at),
                ProxyMode::Stall | ProxyMode::StallReplies => {
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
    // Retention frees disk space by deleting the oldest segments once the file system is
    // fuller than this: a test's history must not depend on how full the runner's disk is.
    c.store.disk_max_used_ratio = 1.0;
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
