//! `hasync serve` child processes for tests that need a real process: its own data-dir lock,
//! its own stderr (a closed pipe, /dev/full), its own fd limit. Killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `hasync serve`.
pub struct Serve {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: Option<mpsc::Receiver<String>>,
}

/// The command for `hasync serve --config CONFIG --data-dir DATA`, stdin and stdout null.
pub fn serve_command(config: &Path, data: &Path) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("hasync"));
    cmd.args(["serve", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

impl Serve {
    /// Spawns `cmd` with stderr piped and read line by line by a thread.
    pub fn spawn(cmd: Command) -> Self {
        Self::spawn_reading_until(cmd, None)
    }

    /// Spawns `cmd` with stderr piped, read by a thread until a line containing `last`, after
    /// which the thread closes the pipe's read end.
    pub fn spawn_reading_until(mut cmd: Command, last: Option<&'static str>) -> Self {
        let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn hasync serve");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let l = Arc::clone(&lines);
        std::thread::spawn(move || read_lines(stderr, &l, &tx, last));
        Self { child, lines, rx: Some(rx) }
    }

    /// Spawns `cmd` as it is (its stderr set by the caller); no log lines are seen.
    pub fn spawn_unread(mut cmd: Command) -> Self {
        let child = cmd.spawn().expect("spawn hasync serve");
        Self { child, lines: Arc::default(), rx: None }
    }

    /// Waits for a log line containing `needle`; returns it.
    pub fn wait_line(&self, needle: &str, secs: u64) -> String {
        let rx = self.rx.as_ref().expect("stderr is read");
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no log line with {needle:?} within {secs}s:\n{}", self.log()),
            }
        }
    }

    /// The addresses a node logs at start: (gRPC, HA, metrics).
    pub fn addresses(&self) -> (SocketAddr, SocketAddr, SocketAddr) {
        let ha = field(&self.wait_line("ha_listen=", 30), "ha_listen");
        let ha = ha.trim_start_matches("Some(").trim_end_matches(')').parse().unwrap();
        let grpc = field(&self.wait_line("grpc_listen=", 30), "grpc_listen").parse().unwrap();
        let metrics =
            field(&self.wait_line("metrics_listen=", 30), "metrics_listen").parse().unwrap();
        (grpc, ha, metrics)
    }

    /// Every line read so far.
    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Sends a signal (`TERM`, `KILL`, ...).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits at most `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Reads lines until EOF, or until a line containing `last` (then drops the pipe's read end:
/// the process's next log write meets a pipe with no reader).
fn read_lines(
    stderr: ChildStderr,
    lines: &Mutex<Vec<String>>,
    tx: &mpsc::Sender<String>,
    last: Option<&str>,
) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { return };
        lines.lock().unwrap().push(line.clone());
        let done = last.is_some_and(|l| line.contains(l));
        let _ = tx.send(line);
        if done {
            return;
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of `key=` in a text log line.
pub fn field(line: &str, key: &str) -> String {
    let at = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key}= in {line}"));
    line[at + key.len() + 2..].split_whitespace().next().unwrap().to_owned()
}

/// Free loopback ports, for a process whose log cannot be read (the OS may hand a port out
/// again before the process binds it; tests use these only where the log is unreadable).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// Waits until `url` answers a gRPC health check (bounded).
pub async fn wait_serving(url: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(ch) =
            tonic::transport::Channel::from_shared(url.to_owned()).unwrap().connect().await
        {
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
            if h.check(tonic_health::pb::HealthCheckRequest { service: String::new() })
                .await
                .is_ok()
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{url} did not serve within {secs}s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum of the series of metric `name` at `metrics` (None: not exported, or no answer
/// within 5 s).
pub async fn metric(metrics: SocketAddr, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let scrape = async {
        let mut s = tokio::net::TcpStream::connect(metrics).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    let body = tokio::time::timeout(std::time::Duration::from_secs(5), scrape).await.ok()??;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}
