//! Real etcd servers for the coordinator's tests: one member or three on 127.0.0.1, data dirs
//! on tmpfs (/dev/shm), short raft timers, killed and removed on drop (also when the test
//! fails, printing the end of each member's log). A missing `etcd` binary fails the test,
//! naming the Debian package. [`EtcdProxy`] is a cuttable TCP proxy in front of a member.

use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hasync::coordinator::Error;
use hasync::coordinator::etcd::{EtcdCoordinator, EtcdOptions, EtcdTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Where Debian's `etcd-server` package puts the binary.
const ETCD: &str = "/usr/bin/etcd";
/// How often a cluster is started again on new ports after a port clash.
const PORT_ATTEMPTS: usize = 5;

/// The server side of TLS: etcd serves its clients with `cert`/`key` and requires client
/// certificates signed by `ca`.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One etcd process.
pub struct Member {
    pub name: String,
    pub client: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    tls: bool,
    dir: tempfile::TempDir,
}

fn etcd_binary() -> &'static str {
    assert!(
        Path::new(ETCD).exists(),
        "{ETCD} is missing: these tests run a real etcd; install the Debian package etcd-server \
         (apt-get install etcd-server)"
    );
    ETCD
}

/// Ports the OS hands out now (bound, then released: a clash is retried by the caller).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<StdListener> =
        (0..n).map(|_| StdListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

impl EtcdCluster {
    /// `n` members, plaintext.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, None, &[])
    }

    /// `n` members, serving clients over TLS when `tls` is given, with `extra` arguments.
    pub fn start_with(n: usize, tls: Option<&ServerTls>, extra: &[&str]) -> Self {
        let bin = etcd_binary();
        let root = if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = tempfile::Builder::new()
            .prefix("hasync-etcd-")
            .tempdir_in(root)
            .expect("a temp dir for etcd's data");
        let mut cluster = Self { members: Vec::new(), tls: tls.is_some(), dir };
        for attempt in 1..=PORT_ATTEMPTS {
            let ports = free_ports(2 * n);
            match cluster.spawn_all(bin, &ports, attempt, tls, extra) {
                Ok(()) => return cluster,
                Err(why) if attempt < PORT_ATTEMPTS => {
                    eprintln!("etcd did not start (attempt {attempt}): {why}; trying new ports");
                    cluster.stop_all();
                    cluster.members.clear();
                }
                Err(why) => panic!("etcd did not start after {PORT_ATTEMPTS} attempts: {why}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// One plaintext member serving clients on 127.0.0.1:`client` (a port picked earlier, for a
    /// process told of it before etcd runs; no retry on a clash).
    pub fn start_at(client: u16) -> Self {
        let bin = etcd_binary();
        let dir = tempfile::Builder::new()
            .prefix("hasync-etcd-")
            .tempdir_in(if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" })
            .expect("a temp dir for etcd's data");
        let mut cluster = Self { members: Vec::new(), tls: false, dir };
        let ports = [client, free_ports(1)[0]];
        if let Err(why) = cluster.spawn_all(bin, &ports, 1, None, &[]) {
            panic!("etcd did not start on 127.0.0.1:{client}: {why}");
        }
        cluster
    }

    fn spawn_all(
        &mut self,
        bin: &str,
        ports: &[u16],
        attempt: usize,
        tls: Option<&ServerTls>,
        extra: &[&str],
    ) -> Result<(), String> {
        let n = ports.len() / 2;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let initial: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
        let token = format!("hasync-{}-{attempt}-{}", std::process::id(), ports[0]);
        for i in 0..n {
            let name = format!("m{i}");
            let data = self.dir.path().join(format!("{name}-{attempt}"));
            let log = self.dir.path().join(format!("{name}-{attempt}.log"));
            let client_url = format!("{scheme}://127.0.0.1:{}", ports[2 * i]);
            let mut cmd = Command::new(bin);
            cmd.arg("--name").arg(&name).arg("--data-dir").arg(&data);
            cmd.args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url]);
            cmd.args(["--listen-peer-urls", &peer(i), "--initial-advertise-peer-urls", &peer(i)]);
            cmd.args(["--initial-cluster", &initial.join(",")]);
            cmd.args(["--initial-cluster-state", "new", "--initial-cluster-token", &token]);
            cmd.args(["--heartbeat-interval", "200", "--election-timeout", "2000"]);
            cmd.args(["--auto-compaction-mode", "revision", "--auto-compaction-retention", "1000"]);
            cmd.args(["--quota-backend-bytes", &(64u64 << 20).to_string()]);
            cmd.args(["--logger", "zap", "--log-outputs", "stderr"]);
            if let Some(t) = tls {
                cmd.arg("--cert-file").arg(&t.cert).arg("--key-file").arg(&t.key);
                cmd.arg("--trusted-ca-file").arg(&t.ca).arg("--client-cert-auth");
            }
            cmd.args(extra);
            let out = std::fs::File::create(&log).expect("create etcd's log file");
            cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec. An
            // etcd outlives no test binary that is killed.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    let kill = rustix::process::Signal::KILL;
                    rustix::process::set_parent_process_death_signal(Some(kill))
                        .map_err(std::io::Error::from)
                });
            }
            let child = cmd.spawn().map_err(|e| format!("spawn {bin}: {e}"))?;
            let client = SocketAddr::from(([127, 0, 0, 1], ports[2 * i]));
            self.members.push(Member { name, client, log, child: Some(child) });
        }
        // Each member listens for clients (or died: a port clash, most likely).
        let deadline = Instant::now() + Duration::from_secs(20);
        for m in &mut self.members {
            loop {
                if let Some(status) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    return Err(format!("{} exited ({status}):\n{}", m.name, tail(&m.log, 15)));
                }
                if std::net::TcpStream::connect(m.client).is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{} does not listen on {}", m.name, m.client));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Every member's client endpoint (`host:port`; the scheme follows the client's TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.to_string()).collect()
    }

    /// Options for a client of every member.
    pub fn options(&self, timeout: Duration) -> EtcdOptions {
        let endpoints = self.endpoints();
        EtcdOptions { endpoints, timeout, tls: None, user: None }
    }

    /// Kills member `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Whether the members serve TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
        if std::thread::panicking() {
            for m in &self.members {
                eprintln!("--- the end of etcd {} ({}):\n{}", m.name, m.client, tail(&m.log, 30));
            }
        }
    }
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Connects once etcd answers (a fresh member elects itself first), within `secs`.
pub async fn connect_when_ready(opts: EtcdOptions, secs: u64) -> EtcdCoordinator {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match EtcdCoordinator::connect(opts.clone()).await {
            Ok(c) => return c,
            Err(e @ Error::Unavailable { .. }) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("etcd at {:?} did not answer within {secs}s: {e}", opts.endpoints),
        }
    }
}

/// Writes a CA, a server certificate for 127.0.0.1 and a client certificate, both signed by
/// the CA, into `dir`. Returns the server's files and the client's TLS options.
pub fn tls_files(dir: &Path) -> (ServerTls, EtcdTls) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, base: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &issuer).unwrap();
        (
            write(&format!("{base}.pem"), cert.pem()),
            write(&format!("{base}-key.pem"), key.serialize_pem()),
        )
    };
    let ca_file = write("ca.pem", ca_cert.pem());
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let (cert, key) = leaf(names, ExtendedKeyUsagePurpose::ServerAuth, "server");
    let (client_cert, client_key) =
        leaf(vec!["hasync".to_owned()], ExtendedKeyUsagePurpose::ClientAuth, "client");
    let server = ServerTls { ca: ca_file.clone(), cert, key };
    let client = EtcdTls { ca_file, cert_file: Some(client_cert), key_file: Some(client_key) };
    (server, client)
}

/// A TCP proxy on 127.0.0.1 in front of one etcd member that can cut a client off.
pub struct EtcdProxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    stop: CancellationToken,
}

struct ProxyState {
    cut: bool,
    /// Cancels the forwarded connections.
    forwarded: CancellationToken,
    /// Cancels the connections held while cut.
    held: CancellationToken,
}

impl EtcdProxy {
    /// Forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the etcd proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState {
            cut: false,
            forwarded: CancellationToken::new(),
            held: CancellationToken::new(),
        }));
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, upstream, Arc::clone(&state), stop.clone()));
        Self { addr, state, stop }
    }

    /// Cuts the client off: closes every forwarded connection and blackholes new ones
    /// (accepted, read and dropped, never answered) until [`EtcdProxy::heal`].
    pub fn cut(&self) {
        let mut s = self.state.lock().unwrap();
        s.cut = true;
        s.forwarded.cancel();
        s.forwarded = CancellationToken::new();
    }

    /// Forwards again; the connections held while cut are closed (their bytes are gone).
    pub fn heal(&self) {
        let mut s = self.state.lock().unwrap();
        s.cut = false;
        s.held.cancel();
        s.held = CancellationToken::new();
    }
}

impl Drop for EtcdProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        let s = self.state.lock().unwrap();
        s.forwarded.cancel();
        s.held.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => match a { Ok((c, _)) => c, Err(_) => continue },
        };
        let (cut, token) = {
            let s = state.lock().unwrap();
            (s.cut, if s.cut { s.held.clone() } else { s.forwarded.clone() })
        };
        if cut {
            tokio::spawn(blackhole(client, token));
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else { continue };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        tokio::spawn(pump(cr, sw, token.clone()));
        tokio::spawn(pump(sr, cw, token));
    }
}

/// Reads and drops what a client sends until `token` is cancelled.
async fn blackhole(mut client: TcpStream, token: CancellationToken) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            r = client.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { return },
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    token: CancellationToken,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            () = token.cancelled() => return,
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
        };
        let w = tokio::select! {
            () = token.cancelled() => return,
            w = to.write_all(&buf[..n]) => w,
        };
        if w.is_err() {
            return;
        }
    }
}
