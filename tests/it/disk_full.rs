//! A full disk is reported, not hidden (issue 15, 9i): in status, in metrics and in a health
//! service of its own (`hasync.v1.Disk`), while overall health and replication readiness stay
//! as they are; its repeated log lines are rate-limited; it clears by itself once writes work.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hasync::config::Role;
use hasync::control::pb;
use hasync::store::fs::SimFs;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::grpc::{ApiNode, pb_msg};
use crate::support::ha::node_config;
use crate::support::node::TestNode;
use crate::support::tmpfs::Tmpfs;

const DISK_SERVICE: &str = "hasync.v1.Disk";

async fn health_at(url: &str, service: &str) -> Result<ServingStatus, tonic::Status> {
    let ch =
        tonic::transport::Channel::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let r = HealthClient::new(ch).check(HealthCheckRequest { service: service.into() }).await?;
    Ok(ServingStatus::try_from(r.into_inner().status).unwrap())
}

/// Puts 8 KiB messages until one is refused (at most `limit`); returns why.
async fn put_until_refused(url: &str, limit: usize) -> String {
    let mut c = pb::messages_client::MessagesClient::connect(url.to_owned()).await.unwrap();
    for _ in 0..limit {
        let put = pb::PutRequest { messages: vec![pb_msg("Full", &[b'x'; 8 << 10])] };
        let r = c.put(put).await.unwrap().into_inner();
        if r.status != pb::PutStatus::PutOk as i32 {
            assert!(!r.stored, "{r:?}");
            assert_eq!(r.status, pb::PutStatus::ServiceNotAvailable as i32, "{r:?}");
            return r.detail;
        }
    }
    panic!("no put refused after {limit}");
}

async fn disk_gauge(addr: std::net::SocketAddr) -> Option<f64> {
    let s = crate::metrics::scrape(addr).await;
    s.samples.iter().find(|x| x.name == "hasync_disk_full").map(|x| x.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_shows_in_its_own_health_service_and_metrics_and_clears_by_itself() {
    let md = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let config = node_config(md.path(), Role::Master);
    let running = TestNode::start_with_fs(config, Arc::clone(&fs) as _).await;
    let metrics = running.metrics_addr();
    let m = ApiNode::from(running);
    assert_eq!(health_at(&m.url, DISK_SERVICE).await.unwrap(), ServingStatus::Serving);
    assert_eq!(disk_gauge(metrics).await, Some(0.0));
    let mut c = m.messages().await;
    c.put(pb::PutRequest { messages: vec![pb_msg("Full", b"first")] }).await.unwrap();

    fs.set_disk_full(true);
    let why = put_until_refused(&m.url, 100).await;
    assert!(why.contains("No space left"), "{why}");
    wait_health(&m.url, DISK_SERVICE, ServingStatus::NotServing, 10).await;
    // Its own service: the node as a whole and its replication readiness are not failed over.
    assert_eq!(health_at(&m.url, "").await.unwrap(), ServingStatus::Serving);
    let replication = hasync::control::REPLICATION_SERVICE;
    assert_eq!(health_at(&m.url, replication).await.unwrap(), ServingStatus::Serving);
    assert_eq!(disk_gauge(metrics).await, Some(1.0));
    let status = m.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap();
    let disk = status.into_inner().disk.expect("disk status");
    assert!(disk.full && disk.since_unix_ms > 0 && disk.failed_writes >= 1, "{disk:?}");
    assert!(disk.failing.iter().any(|f| f == "append"), "the put's segment ({why}): {disk:?}");
    assert!(disk.last_error.contains("No space left"), "{disk:?}");
    let s = crate::metrics::scrape(metrics).await;
    let errors = s.samples.iter().find(|x| x.name == "hasync_disk_write_errors_total");
    assert!(errors.is_some_and(|x| x.value >= 1.0), "{}", s.text);

    fs.set_disk_full(false);
    wait_health(&m.url, DISK_SERVICE, ServingStatus::Serving, 10).await;
    assert_eq!(disk_gauge(metrics).await, Some(0.0));
    let disk = m.node.status().disk;
    assert!(!disk.full && disk.failing.is_empty() && disk.since_unix_ms == 0, "{disk:?}");
    assert!(!disk.last_error.is_empty(), "the last error is kept: {disk:?}");
    c.put(pb::PutRequest { messages: vec![pb_msg("Full", b"again")] }).await.unwrap();
    m.stop().await;
}

/// Waits at most `secs` for `service` on `url` to answer `want`.
async fn wait_health(url: &str, service: &str, want: ServingStatus, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let now = health_at(url, service).await;
        if now.as_ref().ok() == Some(&want) {
            return;
        }
        assert!(Instant::now() < deadline, "{service} is {now:?}, not {want:?}, after {secs}s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `hasync serve` child whose stderr lines a thread collects; killed on drop.
struct Served {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Served {
    fn start(config: &Path, data: PathBuf) -> Self {
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("hasync"))
            .args(["serve", "--config"])
            .arg(config)
            .arg("--data-dir")
            .arg(data)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hasync serve");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                l.lock().unwrap().push((Instant::now(), line));
            }
        });
        Self { child, lines }
    }

    fn wait_line(&self, needle: &str, secs: u64) -> String {
        self.wait_line_at(needle, secs).1
    }

    /// Waits at most `secs` for a line holding `needle`; returns when it was read, and it.
    fn wait_line_at(&self, needle: &str, secs: u64) -> (Instant, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let found =
                self.lines.lock().unwrap().iter().find(|(_, l)| l.contains(needle)).cloned();
            if let Some(found) = found {
                return found;
            }
            assert!(Instant::now() < deadline, "no line with {needle:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The WARN and ERROR lines logged at or after `since`.
    fn problems_since(&self, since: Instant) -> Vec<String> {
        self.problems(|t| t >= since)
    }

    /// The WARN and ERROR lines logged after `since`.
    fn problems_after(&self, since: Instant) -> Vec<String> {
        self.problems(|t| t > since)
    }

    fn problems(&self, when: impl Fn(Instant) -> bool) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter(|(t, l)| when(*t) && (l.contains(" WARN ") || l.contains(" ERROR ")))
            .map(|(_, l)| l.clone())
            .collect()
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_full_tmpfs_is_reported_once_not_every_half_second() {
    let fs = Tmpfs::mount("1m");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("hasync.toml");
    std::fs::write(
        &config,
        r#"[store]
segment-size = "64KiB"
max-message-size = "16KiB"
flush-interval = "200ms"
[ha]
listen = "127.0.0.1:0"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
"#,
    )
    .unwrap();
    let served = Served::start(&config, fs.path().join("data"));
    let line = served.wait_line("grpc_listen=", 30);
    let at = line.find(" grpc_listen=").unwrap();
    let grpc = line[at + 13..].split_whitespace().next().unwrap().to_owned();
    let url = format!("http://{grpc}");

    put_until_refused(&url, 1000).await;
    let full_at = Instant::now();
    // Twenty flush intervals of a full disk: each failing kind of write is logged once (the
    // summaries come every 30 s), not at every interval.
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let problems = served.problems_since(full_at);
    assert!(
        problems.len() <= 4,
        "{} warnings/errors in {window:?}:\n{}",
        problems.len(),
        problems.join("\n")
    );
    wait_health(&url, DISK_SERVICE, ServingStatus::NotServing, 10).await;

    fs.resize("8m");
    wait_health(&url, DISK_SERVICE, ServingStatus::Serving, 10).await;
    served.wait_line("disk writes work again", 10);
    let mut c = pb::messages_client::MessagesClient::connect(url.clone()).await.unwrap();
    let r = c.put(pb::PutRequest { messages: vec![pb_msg("Full", b"again")] }).await.unwrap();
    assert_eq!(r.into_inner().status, pb::PutStatus::PutOk as i32);
}

/// A disk so full that only the checkpoint (a small file) fails, while the current segment
/// (allocated ahead) still takes puts. Under `store.flush = "sync"` every put wakes the store
/// thread for a flush of the mapped segment alone, which works: that must not clear the
/// checkpoint's failure ("disk writes work again", then "disk write failed" as a new first
/// failure at the next checkpoint), so `disk.full` and `hasync.v1.Disk` stay on while the disk
/// stays full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_checkpoint_stays_reported_while_the_disk_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let mut config = node_config(dir.path(), Role::Master);
    config.store.flush = hasync::config::FlushMode::Sync;
    config.store.flush_interval = Duration::from_millis(200);
    config.store.segment_size = hasync::config::units::ByteSize::mib(1);
    let m = ApiNode::from(TestNode::start_with_fs(config, fs.clone() as _).await);
    let mut c = m.messages().await;
    c.put(pb::PutRequest { messages: vec![pb_msg("Full", b"first")] }).await.unwrap();
    // The store thread prepares the spare segment after the first put.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(dir.path().join("commitlog")).unwrap().count() < 2 {
        assert!(Instant::now() < deadline, "no spare segment prepared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.node.status().disk, Default::default());
    fs.set_disk_full(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !m.node.status().disk.full {
        assert!(Instant::now() < deadline, "never reported full: {:?}", m.node.status().disk);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Small puts for 3 s (they fit in the current segment) while the disk stays full.
    let (mut samples, mut cleared, mut last) = (0, 0, None);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until && samples < 3000 {
        let r = c.put(pb::PutRequest { messages: vec![pb_msg("Full", b"x")] }).await.unwrap();
        let d = m.node.status().disk;
        samples += 1;
        if !d.full {
            cleared += 1;
        }
        last = Some((r.into_inner().status, d));
    }
    fs.set_disk_full(false);
    assert_eq!(cleared, 0, "reported not full in {cleared} of {samples} samples: {last:?}");
    wait_until_clear(&m).await;
    m.stop().await;
}

/// Waits at most 10 s for the disk condition to clear (the disk has room again).
async fn wait_until_clear(m: &ApiNode) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.node.status().disk.full {
        assert!(Instant::now() < deadline, "never cleared: {:?}", m.node.status().disk);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A slave whose disk fills while it follows its master: the store's own lines are
/// rate-limited, and so is the HA link's close, which has the same reason at every reconnect
/// (at most `slave.reconnect-backoff-max`, 1.5 s, apart): logged once, then summarised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_on_a_full_disk_does_not_repeat_a_warning_every_reconnect() {
    let md = tempfile::tempdir().unwrap();
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut c = m.messages().await;
    for _ in 0..200 {
        let put = pb::PutRequest { messages: vec![pb_msg("Full", &[b'x'; 8 << 10])] };
        c.put(put).await.unwrap();
    }
    let fs = Tmpfs::mount("1m");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("hasync.toml");
    let ha = m.node.ha_addr().unwrap();
    std::fs::write(
        &config,
        format!(
            "[node]\nrole = \"slave\"\n[store]\nsegment-size = \"64KiB\"\n\
             max-message-size = \"16KiB\"\n[slave]\nmaster-ha = \"{ha}\"\n[ha]\n\
             listen = \"127.0.0.1:0\"\nheartbeat-interval = \"200ms\"\n[grpc]\n\
             listen = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n"
        ),
    )
    .unwrap();
    let served = Served::start(&config, fs.path().join("data"));
    served.wait_line("HA link up", 30);
    // A new slave starts at the master's last segment: fill its disk from there.
    for _ in 0..200 {
        let put = pb::PutRequest { messages: vec![pb_msg("Full", &[b'x'; 8 << 10])] };
        c.put(put).await.unwrap();
    }
    let (full_at, _) = served.wait_line_at("disk write failed", 30);
    let window = Duration::from_secs(8);
    tokio::time::sleep(window).await;
    let problems = served.problems_after(full_at);
    let closes = served.log().matches("HA link closed").count();
    drop(served);
    m.stop().await;
    assert!(
        problems.len() <= 3,
        "{} warnings/errors in {window:?} on a full slave:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(closes >= 1, "the close is logged once");
}
