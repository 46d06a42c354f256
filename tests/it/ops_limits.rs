//! Operations under limits: the metrics port under a flood and at a stop, a refused start with
//! a full stderr pipe, a symlinked lock file, a client command whose stdout goes away.

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use hasync::control::pb;
use hasync::control::pb::messages_client::MessagesClient;
use tonic::transport::Channel;

use crate::support::grpc::pb_msg;
use crate::support::process::{Serve, serve_command};

fn master_toml() -> String {
    r#"[node]
name = "r4-master"
shutdown-timeout = "20s"
[store]
segment-size = "64KiB"
max-message-size = "16KiB"
flush-interval = "50ms"
[ha]
listen = "127.0.0.1:0"
heartbeat-interval = "200ms"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
"#
    .to_owned()
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("hasync.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Defect 5 (fd reservation): the metrics port takes every connection offered and keeps it
/// (no limit, no timeout), so a flood there takes the descriptors the store needs: puts that
/// need a new segment fail with "Too many open files", and so does the checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_port_flood_under_a_low_open_files_limit_starves_neither_store_nor_checkpoint() {
    const NOFILE: u64 = 160;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = write_config(tmp.path(), &master_toml());
    let mut cmd = serve_command(&config, &data);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let l = rustix::process::Rlimit { current: Some(NOFILE), maximum: Some(NOFILE) };
            rustix::process::setrlimit(rustix::process::Resource::Nofile, l)
                .map_err(std::io::Error::from)
        });
    }
    let mut served = Serve::spawn(cmd);
    let (grpc, _ha, metrics) = served.addresses();
    let ch = Channel::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let mut c = MessagesClient::new(ch);

    // The flood: bare TCP connections to the metrics port, far more than the process has
    // descriptors (a connect that does not complete ends it).
    let mut flood = Vec::new();
    for _ in 0..(2 * NOFILE) {
        let connect = tokio::net::TcpStream::connect(metrics);
        match tokio::time::timeout(Duration::from_secs(1), connect).await {
            Ok(Ok(s)) => flood.push(s),
            _ => break,
        }
    }
    // Let the server's accept loop take what it takes (no barrier is observable from outside:
    // the metrics port is the flooded one).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Puts that need new segments (64 KiB each: 40 x 8 KB needs several).
    let mut failures = Vec::new();
    for i in 0..40 {
        let mut body = format!("m{i}-").into_bytes();
        body.resize(8000, b'x');
        let put = c.put(pb::PutRequest { messages: vec![pb_msg("Ops", &body)] });
        match tokio::time::timeout(Duration::from_secs(30), put).await {
            Ok(Ok(r)) if r.get_ref().status() == pb::PutStatus::PutOk => {}
            other => failures.push(format!("put {i}: {other:?}")),
        }
    }
    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    drop(flood);
    let log = served.log();
    assert!(
        failures.is_empty(),
        "puts failed under a metrics-port flood:\n{}\n{log}",
        failures.join("\n")
    );
    assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
    assert!(!data.join("abort").exists(), "the checkpoint was written:\n{log}");
    assert!(!log.contains("Too many open files"), "{log}");
}

/// Defect 2: the last `error: ...` line is written straight to stderr, not through the lossy
/// queue, so a process whose stderr is a pipe that is full (its reader alive, not reading)
/// never exits: here a start refused at once (the data dir is a regular file) hangs forever
/// instead of exiting non-zero.
#[test]
fn a_refused_start_exits_although_its_stderr_pipe_is_full() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("data");
    std::fs::write(&not_a_dir, b"a file, not a directory").unwrap();
    let config = write_config(tmp.path(), &master_toml());

    // A pipe whose reader (this test) is alive and never reads, filled to the brim.
    let (reader, mut writer) = std::io::pipe().unwrap();
    rustix::fs::fcntl_setfl(&writer, rustix::fs::OFlags::NONBLOCK).unwrap();
    let chunk = [b'x'; 4096];
    let mut filled = 0usize;
    for _ in 0..10_000 {
        match writer.write(&chunk) {
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the pipe: {e}"),
        }
    }
    // Single bytes until even one does not fit.
    for _ in 0..10_000 {
        match writer.write(b"x") {
            Ok(n) => filled += n,
            Err(_) => break,
        }
    }
    assert!(filled > 0, "the pipe took nothing");
    rustix::fs::fcntl_setfl(&writer, rustix::fs::OFlags::empty()).unwrap();

    let mut cmd = serve_command(&config, &not_a_dir);
    cmd.stderr(Stdio::from(writer));
    let mut served = Serve::spawn_unread(cmd);
    let status = served.wait_exit(Duration::from_secs(20));
    drop(reader);
    let status = status.expect(
        "a refused start (data dir is a file) did not exit within 20s: its final error line \
         blocks on the full stderr pipe",
    );
    assert!(!status.success(), "{status:?}");
}

/// Defect 1 (lock): the lock file is opened following symlinks and then truncated, so a
/// `lock` that is a symlink (planted, or left by a copied directory) destroys the file it
/// points at (as root, any file) and writes a pid into it.
#[test]
fn a_lock_file_that_is_a_symlink_does_not_truncate_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let victim = tmp.path().join("precious.txt");
    std::fs::write(&victim, b"precious contents\n").unwrap();
    std::os::unix::fs::symlink(&victim, data.join(hasync::store::lock::LOCK_FILE)).unwrap();
    let locked = hasync::store::DataDirLock::acquire(&data);
    let after = std::fs::read(&victim).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&after),
        "precious contents\n",
        "the lock's symlink target was overwritten (acquire: {locked:?})"
    );
}

/// Defect 5 (fd reservation): the fd reserve keeps two descriptors per `ha.max-connections`
/// (a live slave and one unreported connection per slot), but the HA port holds up to
/// `max-connections` live slaves plus `max(2 x max-connections, 16)` unreported connections:
/// with the default 64 that is 192 sockets against a reserve of 64 + 128 = 192, leaving the
/// store nothing once the gRPC port is full too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_grpc_and_ha_ports_under_a_low_open_files_limit_leave_the_store_its_descriptors() {
    use tokio::io::AsyncWriteExt as _;
    const NOFILE: u64 = 400;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Unreported HA connections are held 2 x heartbeat-interval (10 s), bare gRPC ones for
    // the handshake timeout (10 m here): both outlast the test.
    let text = master_toml()
        .replace("heartbeat-interval = \"200ms\"", "heartbeat-interval = \"5s\"")
        .replace(
            "[grpc]\nlisten = \"127.0.0.1:0\"\n",
            "[grpc]\nlisten = \"127.0.0.1:0\"\nhandshake-timeout = \"10m\"\nidle-timeout = \"10m\"\n",
        );
    let config = write_config(tmp.path(), &text);
    let mut cmd = serve_command(&config, &data);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let l = rustix::process::Rlimit { current: Some(NOFILE), maximum: Some(NOFILE) };
            rustix::process::setrlimit(rustix::process::Resource::Nofile, l)
                .map_err(std::io::Error::from)
        });
    }
    let mut served = Serve::spawn(cmd);
    let (grpc, ha, _metrics) = served.addresses();
    let ch = Channel::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let mut c = MessagesClient::new(ch);

    let connect = |addr| async move {
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
            .ok()
            .and_then(Result::ok)
    };
    let mut held = Vec::new();
    // 64 "slaves" that report offset 0 (each takes a slot), then unreported connections.
    // Each from an address of its own (all of 127/8 is loopback): a report from an address
    // that holds a slot replaces that slot's connection.
    for k in 0..64u8 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(std::net::SocketAddr::from(([127, 0, 1, k + 1], 0))).unwrap();
        let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(1), sock.connect(ha)).await
        else {
            break;
        };
        let _ = s.write_all(&0i64.to_be_bytes()).await;
        held.push(s);
    }
    for _ in 0..200 {
        let Some(s) = connect(ha).await else { break };
        held.push(s);
    }
    // Bounded attempts; a connect that does not complete in time is skipped.
    for _ in 0..NOFILE {
        if let Some(s) = connect(grpc).await {
            held.push(s);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut failures = Vec::new();
    for i in 0..40 {
        let mut body = format!("m{i}-").into_bytes();
        body.resize(8000, b'x');
        let put = c.put(pb::PutRequest { messages: vec![pb_msg("Ops", &body)] });
        match tokio::time::timeout(Duration::from_secs(30), put).await {
            Ok(Ok(r)) if r.get_ref().status() == pb::PutStatus::PutOk => {}
            other => failures.push(format!("put {i}: {other:?}")),
        }
    }
    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    drop(held);
    let log = served.log();
    let first = failures.first().cloned().unwrap_or_default();
    assert!(failures.is_empty(), "{} puts failed, first: {first}", failures.len());
    assert_eq!(status.code(), Some(0), "{status:?}");
    let emfile: Vec<&str> = log.lines().filter(|l| l.contains("Too many open files")).collect();
    assert!(
        emfile.is_empty(),
        "the process ran out of descriptors under the flood ({} lines), first: {}",
        emfile.len(),
        emfile[0]
    );
}

/// Defect 5 / shutdown: the metrics port has no header-read timeout, and its graceful stop
/// waits for every request in progress, so one client that sent half a request holds the
/// node's graceful stop until `node.shutdown-timeout` (exit 124 instead of 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_metrics_request_does_not_hold_the_graceful_stop() {
    use tokio::io::AsyncWriteExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let text = master_toml().replace("shutdown-timeout = \"20s\"", "shutdown-timeout = \"8s\"");
    let config = write_config(tmp.path(), &text);
    let mut served = Serve::spawn(serve_command(&config, &data));
    let (_grpc, _ha, metrics) = served.addresses();
    let mut half = tokio::net::TcpStream::connect(metrics).await.unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // The request line arrived once a whole scrape on another connection answers after it.
    assert!(crate::support::process::metric(metrics, "hasync_grpc_connections").await.is_some());
    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    drop(half);
    let log = served.log();
    let late: Vec<&str> = log.lines().filter(|l| l.contains("did not finish")).collect();
    assert_eq!(status.code(), Some(0), "{status:?}: {late:?}");
}

/// Defect 2 / docs ("other commands whose stdout goes away end quietly"): `hasync quickstart`
/// prints with `println!`, which panics when stdout is a pipe whose reader went away
/// (`hasync quickstart | head -1`): exit 101, a panic message, and the temporary data dir
/// removed under two running nodes.
#[test]
fn quickstart_whose_stdout_goes_away_ends_without_a_panic() {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"))
        .arg("quickstart")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains("quickstart"), "{first}");
    drop(out);
    let stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut status = None;
    while std::time::Instant::now() < deadline {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if status.is_none() {
        let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while status.is_none() && std::time::Instant::now() < deadline {
            status = child.try_wait().unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if status.is_none() {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let err = err.join().unwrap();
    let panic = err.lines().find(|l| l.contains("panicked") || l.contains("failed printing"));
    assert!(panic.is_none(), "{status:?}: {panic:?}");
    assert_ne!(status.code(), Some(101), "{status:?}");
}

/// `node.worker-threads` sets the runtime's workers; at 0 tokio's default applies, which reads
/// `TOKIO_WORKER_THREADS`. The start log says how many run.
#[test]
fn worker_threads_come_from_the_config_else_from_tokio_worker_threads() {
    let tmp = tempfile::tempdir().unwrap();
    for (key, env, want) in
        [(Some(1), None, "1"), (Some(3), Some("2"), "3"), (None, Some("2"), "2")]
    {
        let mut text = master_toml();
        if let Some(n) = key {
            text = text.replacen("[node]\n", &format!("[node]\nworker-threads = {n}\n"), 1);
        }
        let dir = tmp.path().join(format!("{key:?}-{env:?}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = write_config(&dir, &text);
        let mut cmd = serve_command(&config, &dir.join("data"));
        cmd.env_remove("TOKIO_WORKER_THREADS");
        if let Some(e) = env {
            cmd.env("TOKIO_WORKER_THREADS", e);
        }
        let served = Serve::spawn(cmd);
        let line = served.wait_line("async runtime started", 30);
        assert_eq!(crate::support::process::field(&line, "workers"), want, "{line}");
        served.wait_line("node running", 30);
    }
}

/// The machine's CPU latency limit (PM QoS), `None` where the device cannot be read.
fn cpu_latency_limit() -> Option<i32> {
    let bytes = std::fs::read("/dev/cpu_dma_latency").ok()?;
    Some(i32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// `node.cpu-dma-latency-us` holds a PM QoS request while the node runs (the machine's limit
/// drops to it) and ends it with the process; where the device refuses (not root, no device),
/// the node says why and runs without it.
#[test]
fn a_cpu_latency_request_holds_while_the_node_runs_and_a_refusal_is_a_warning() {
    const ASKED: i32 = 123;
    let tmp = tempfile::tempdir().unwrap();
    let before = cpu_latency_limit();
    let text =
        master_toml().replacen("[node]\n", &format!("[node]\ncpu-dma-latency-us = {ASKED}\n"), 1);
    let config = write_config(tmp.path(), &text);
    let mut served = Serve::spawn(serve_command(&config, &tmp.path().join("data")));
    served.wait_line("node running", 30);
    let log = served.log();
    if log.contains("holding a CPU wake-up latency request") {
        let during = cpu_latency_limit().expect("the device was writable, so it is readable");
        assert!(during <= ASKED, "limit {during} µs while the node holds {ASKED} µs");
        served.signal("TERM");
        let status = served.wait_exit(Duration::from_secs(30)).expect("the node stops");
        assert!(status.success(), "{status:?}\n{}", served.log());
        let after = cpu_latency_limit().unwrap();
        if before.is_some_and(|b| b > ASKED) {
            assert!(after > ASKED, "limit {after} µs after the node exited (before: {before:?})");
        }
    } else {
        assert!(log.contains("the CPU latency request was refused"), "{log}");
        assert!(log.contains("/dev/cpu_dma_latency"), "the warning names the device:\n{log}");
    }
}
