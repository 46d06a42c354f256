//! Operations under bad luck, against real `hasync serve` processes: two processes on one
//! data dir, a log destination that fails (a pipe whose reader went away, /dev/full), bad
//! values in the log filter, the environment and TLS files, a client flood under a low
//! open-files limit.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hasync::control::pb;
use hasync::control::pb::messages_client::MessagesClient;
use hasync::control::pb::replication_client::ReplicationClient;
use tonic::transport::Channel;

use crate::support::grpc::pb_msg;
use crate::support::ha::{slave_node_config, wait_until};
use crate::support::node::TestNode;
use crate::support::process::{Serve, free_ports, metric, serve_command, wait_serving};

/// A master with 64 KiB segments (the tests' slave config's) on OS-assigned loopback ports.
fn master_toml(extra: &str) -> String {
    master_toml_with("", "", extra)
}

/// [`master_toml`] with more keys in `[grpc]` and `[ha]`.
fn master_toml_with(grpc: &str, ha: &str, extra: &str) -> String {
    format!(
        r#"[node]
name = "ops-master"
shutdown-timeout = "20s"
[store]
segment-size = "64KiB"
max-message-size = "16KiB"
flush-interval = "50ms"
[ha]
listen = "127.0.0.1:0"
heartbeat-interval = "200ms"
{ha}
[grpc]
listen = "127.0.0.1:0"
{grpc}
[metrics]
listen = "127.0.0.1:0"
{extra}"#
    )
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("hasync.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn client(url: &str) -> MessagesClient<Channel> {
    MessagesClient::new(Channel::from_shared(url.to_owned()).unwrap().connect().await.unwrap())
}

/// Puts `n` messages of `body_len` bytes one by one; every one must be PUT_OK. Returns the
/// last end offset.
async fn put_ok(c: &mut MessagesClient<Channel>, n: usize, body_len: usize) -> i64 {
    let mut end = 0;
    for i in 0..n {
        let mut body = format!("m{i}-").into_bytes();
        body.resize(body_len, b'x');
        let put = c.put(pb::PutRequest { messages: vec![pb_msg("Ops", &body)] });
        let r = tokio::time::timeout(Duration::from_secs(30), put)
            .await
            .unwrap_or_else(|_| panic!("put {i}: no answer within 30s"))
            .unwrap_or_else(|e| panic!("put {i}: {e:?}"))
            .into_inner();
        assert_eq!(r.status(), pb::PutStatus::PutOk, "put {i}: {r:?}");
        end = r.end_offset;
    }
    end
}

/// Every message from offset 0, read in batches.
async fn read_all(c: &mut MessagesClient<Channel>) -> Vec<pb::StoredMessage> {
    let mut out = Vec::new();
    let mut at = 0;
    for _ in 0..10_000 {
        let r = c
            .read(pb::ReadRequest {
                offset: at,
                max_bytes: 1 << 20,
                max_messages: 256,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if r.messages.is_empty() {
            return out;
        }
        at = r.next_offset;
        out.extend(r.messages);
    }
    panic!("reading never ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_running_nodes_data_dir_refuses_at_once_naming_it_and_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = write_config(tmp.path(), &master_toml(""));
    let mut first = Serve::spawn(serve_command(&config, &data));
    let (grpc, _, _) = first.addresses();
    let url = format!("http://{grpc}");
    let mut c = client(&url).await;
    put_ok(&mut c, 20, 100).await;

    let mut second = Serve::spawn(serve_command(&config, &data));
    let status = second.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!("a second process on the same data dir still runs:\n{}", second.log())
    });
    let log = second.log();
    assert!(!status.success(), "{status:?}:\n{log}");
    assert!(log.contains(&data.display().to_string()), "the refusal names the dir:\n{log}");
    assert!(log.contains(&format!("pid {}", first.child.id())), "and the holder:\n{log}");
    assert!(!log.contains("grpc_listen="), "it never got as far as serving:\n{log}");

    // The first node is untouched: it takes puts and has every acknowledged record.
    let end = put_ok(&mut c, 20, 100).await;
    let msgs = read_all(&mut c).await;
    assert_eq!(msgs.len(), 40, "every acknowledged record is there");
    let last = msgs.last().unwrap();
    assert_eq!(last.physical_offset + i64::from(last.size), end);
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(30)).expect("first node stops");
    assert!(status.success(), "{status:?}:\n{}", first.log());
}

/// `hasync verify` takes the same lock: on a running node's data dir it refuses, naming the
/// holder, and reads nothing; once the node stopped it checks the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hasync_verify_refuses_a_running_nodes_data_dir_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = write_config(tmp.path(), &master_toml(""));
    let mut node = Serve::spawn(serve_command(&config, &data));
    let (grpc, _, _) = node.addresses();
    let mut c = client(&format!("http://{grpc}")).await;
    put_ok(&mut c, 5, 100).await;
    let verify = || {
        std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"))
            .args(["verify", "--data-dir"])
            .arg(&data)
            .output()
            .expect("run hasync verify")
    };
    let out = verify();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify ran on a running node's dir: {err}");
    assert!(err.contains(&format!("pid {}", node.child.id())), "names the holder: {err}");
    assert!(out.stdout.is_empty(), "it checked nothing: {}", String::from_utf8_lossy(&out.stdout));
    node.signal("TERM");
    let status = node.wait_exit(Duration::from_secs(30)).expect("the node stops");
    assert!(status.success(), "{status:?}:\n{}", node.log());
    let out = verify();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_pipe_whose_reader_went_away_stops_neither_replication_nor_the_clean_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = write_config(tmp.path(), &master_toml(""));
    // The reader stops (closing the pipe) after the last address line: every later log line
    // meets a pipe with no reader.
    let mut served =
        Serve::spawn_reading_until(serve_command(&config, &data), Some("metrics_listen="));
    let (grpc, ha, metrics) = served.addresses();
    let url = format!("http://{grpc}");
    let mut c = client(&url).await;
    // Puts log nothing at info; a slave connecting logs on the master. Both after the close.
    put_ok(&mut c, 30, 4000).await;
    let sdir = tempfile::tempdir().unwrap();
    let slave = TestNode::start(slave_node_config(sdir.path(), ha)).await;
    let end = put_ok(&mut c, 30, 4000).await as u64;
    wait_until(20, "the slave replicates everything", || slave.store().max_offset() == end).await;
    let mut r =
        ReplicationClient::new(Channel::from_shared(url.clone()).unwrap().connect().await.unwrap());
    let st = r.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.slaves.len(), 1, "the master serves its slave: {st:?}");
    let lost = metric(metrics, "hasync_log_write_errors_total").await;
    assert!(lost.is_some_and(|n| n > 0.0), "lost log lines are counted: {lost:?}");

    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "a clean stop despite the closed log pipe: {status:?}");
    assert!(!data.join("abort").exists(), "the final flush and checkpoint ran (abort marker gone)");
    slave.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_on_a_full_device_neither_stops_the_start_nor_the_node() {
    let dev_full = Path::new("/dev/full");
    assert!(dev_full.exists(), "this test needs /dev/full (a device that answers ENOSPC)");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // The log is unreadable, so the ports are chosen here.
    let [grpc, ha, metrics] = free_ports::<3>();
    let text = master_toml("")
        .replace(
            "[grpc]\nlisten = \"127.0.0.1:0\"",
            &format!("[grpc]\nlisten = \"127.0.0.1:{grpc}\""),
        )
        .replace("[ha]\nlisten = \"127.0.0.1:0\"", &format!("[ha]\nlisten = \"127.0.0.1:{ha}\""))
        .replace(
            "[metrics]\nlisten = \"127.0.0.1:0\"",
            &format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\""),
        );
    let config = write_config(tmp.path(), &text);
    let full = std::fs::OpenOptions::new().write(true).open(dev_full).unwrap();
    let mut cmd = serve_command(&config, &data);
    cmd.stderr(Stdio::from(full));
    let mut served = Serve::spawn_unread(cmd);
    let url = format!("http://127.0.0.1:{grpc}");
    let serving = tokio::time::timeout(Duration::from_secs(30), wait_serving(&url, 30)).await;
    if serving.is_err() || served.child.try_wait().unwrap().is_some() {
        panic!("the node with stderr on /dev/full is not serving: {:?}", served.child.try_wait());
    }
    let mut c = client(&url).await;
    put_ok(&mut c, 20, 4000).await;
    let lost =
        metric(format!("127.0.0.1:{metrics}").parse().unwrap(), "hasync_log_write_errors_total")
            .await;
    assert!(lost.is_some_and(|n| n > 0.0), "lost log lines are counted: {lost:?}");
    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!data.join("abort").exists(), "the final checkpoint ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_pipe_nobody_reads_stalls_nothing_and_lines_are_dropped_instead() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let [grpc, ha, metrics] = free_ports::<3>();
    let text = master_toml("")
        .replace(
            "[grpc]\nlisten = \"127.0.0.1:0\"",
            &format!("[grpc]\nlisten = \"127.0.0.1:{grpc}\""),
        )
        .replace("[ha]\nlisten = \"127.0.0.1:0\"", &format!("[ha]\nlisten = \"127.0.0.1:{ha}\""))
        .replace(
            "[metrics]\nlisten = \"127.0.0.1:0\"",
            &format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\""),
        );
    let config = write_config(tmp.path(), &text);
    // stderr a pipe whose reader is alive (this process keeps the read end) but never reads;
    // trace logging fills the pipe's buffer within the first calls.
    let mut cmd = serve_command(&config, &data);
    cmd.env("RUST_LOG", "trace").stderr(Stdio::piped());
    let mut served = Serve::spawn_unread(cmd);
    let url = format!("http://127.0.0.1:{grpc}");
    tokio::time::timeout(Duration::from_secs(30), wait_serving(&url, 30))
        .await
        .expect("the node serves with a stalled log pipe");
    let mut c = client(&url).await;
    put_ok(&mut c, 200, 1000).await;
    let sdir = tempfile::tempdir().unwrap();
    let slave =
        TestNode::start(slave_node_config(sdir.path(), format!("127.0.0.1:{ha}").parse().unwrap()))
            .await;
    let end = put_ok(&mut c, 50, 1000).await as u64;
    wait_until(20, "the slave replicates everything", || slave.store().max_offset() == end).await;
    let metrics = format!("127.0.0.1:{metrics}").parse().unwrap();
    let dropped = metric(metrics, "hasync_log_dropped_total").await;
    assert!(dropped.is_some_and(|n| n > 0.0), "dropped lines are counted: {dropped:?}");
    slave.shutdown().await.unwrap();
    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!data.join("abort").exists(), "the final checkpoint ran");
}

/// Runs `hasync ARGS` with `env` set for at most 30 s (a process still running then is
/// killed and counts as not refusing); returns (success, stderr).
fn hasync(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    use std::io::Read as _;
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"));
    cmd.args(args).env_remove("RUST_LOG").env("NO_COLOR", "1");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = reader.join().unwrap();
    match status {
        Some(s) => (s.success(), text),
        None => (false, format!("STILL RUNNING after 30s, killed:\n{text}")),
    }
}

#[test]
fn a_log_filter_that_does_not_parse_is_refused_by_config_check_and_serve_naming_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let bad = write_config(tmp.path(), &master_toml("[log]\nfilter = \"=[[\"\n"));
    let bad = bad.to_str().unwrap();
    let (ok, err) = hasync(&["config", "check", bad], &[]);
    assert!(!ok && err.contains("log.filter") && err.contains("=[["), "config check: {err}");
    let d = data.to_str().unwrap();
    let (ok, err) = hasync(&["serve", "--config", bad, "--data-dir", d], &[]);
    assert!(!ok && err.contains("log.filter"), "serve: {err}");
    assert!(!err.starts_with("STILL RUNNING"), "serve: {err}");
    assert!(!data.join("abort").exists(), "serve refused before opening the store");

    // RUST_LOG, when set, wins: a bad one is refused the same way, named.
    let good = tmp.path().join("good.toml");
    std::fs::write(&good, master_toml("")).unwrap();
    let good = good.to_str().unwrap();
    let (ok, err) = hasync(&["config", "check", good], &[("RUST_LOG", "=[[")]);
    assert!(!ok && err.contains("RUST_LOG"), "config check with RUST_LOG: {err}");
    let (ok, err) = hasync(&["serve", "--config", good, "--data-dir", d], &[("RUST_LOG", "=[[")]);
    assert!(!ok && err.contains("RUST_LOG") && !err.starts_with("STILL"), "serve: {err}");
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable_not_the_flag() {
    let (ok, err) = hasync(&["serve", "--print-config"], &[("HASYNC_SEGMENT_SIZE", "lots")]);
    assert!(!ok, "{err}");
    assert!(err.contains("HASYNC_SEGMENT_SIZE") && err.contains("lots"), "{err}");
    // From the flag, the flag is named.
    let (ok, err) = hasync(&["serve", "--print-config", "--segment-size", "lots"], &[]);
    assert!(!ok && err.contains("--segment-size") && !err.contains("HASYNC_"), "{err}");
    // Every variable: an enum one too.
    let (ok, err) = hasync(&["serve", "--print-config"], &[("HASYNC_ROLE", "boss")]);
    assert!(!ok && err.contains("HASYNC_ROLE") && err.contains("boss"), "{err}");
}

#[test]
fn a_tls_file_that_is_not_pem_is_refused_naming_the_file_and_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "this is not a certificate\n").unwrap();
    let j = junk.display().to_string();
    let d = tmp.path().join("data");
    let d = d.to_str().unwrap();
    for (text, key) in [
        (
            master_toml_with(&format!("tls-cert-file = \"{j}\"\ntls-key-file = \"{j}\""), "", ""),
            "grpc.tls-cert-file",
        ),
        (
            master_toml(&format!("[slave]\nmaster-grpc-ca-file = \"{j}\"\n")),
            "slave.master-grpc-ca-file",
        ),
    ] {
        let config = tmp.path().join("tls.toml");
        std::fs::write(&config, text).unwrap();
        let (ok, err) =
            hasync(&["serve", "--config", config.to_str().unwrap(), "--data-dir", d], &[]);
        assert!(!ok && !err.starts_with("STILL RUNNING"), "{err}");
        assert!(err.contains(key) && err.contains(&j), "names {key} and the file: {err}");
        assert!(err.contains("PEM"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_under_a_low_open_files_limit_starves_neither_store_nor_data_plane() {
    const NOFILE: u64 = 160;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Bare TCP connections are held for the whole test (handshake-timeout), so the flood
    // holds every gRPC slot the budget allows and more.
    let config = write_config(
        tmp.path(),
        &master_toml_with(
            "handshake-timeout = \"10m\"\nidle-timeout = \"10m\"",
            "max-connections = 4",
            "",
        ),
    );
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
    let (grpc, ha, metrics) = served.addresses();
    let url = format!("http://{grpc}");
    let mut c = client(&url).await;
    put_ok(&mut c, 5, 100).await;

    // The flood: far more connections than the process has descriptors (until the server's
    // backlog is full, if it ever is: a connect that does not complete ends the flood).
    let mut flood = Vec::new();
    for _ in 0..(2 * NOFILE) {
        let connect = tokio::net::TcpStream::connect(grpc);
        match tokio::time::timeout(Duration::from_secs(1), connect).await {
            Ok(Ok(s)) => flood.push(s),
            _ => break,
        }
    }
    // Barrier: the server has seen the flood once it refused one (bounded; checked below).
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(metrics, "hasync_grpc_connections_refused_total").await.unwrap_or(0.0) == 0.0
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Puts that need new segments (64 KiB each: 40 x 8 KB needs several) still succeed.
    let end = put_ok(&mut c, 40, 8000).await as u64;
    // A slave still gets an HA slot and everything.
    let sdir = tempfile::tempdir().unwrap();
    let slave = TestNode::start(slave_node_config(sdir.path(), ha)).await;
    wait_until(30, "the slave replicates everything", || slave.store().max_offset() == end).await;
    slave.shutdown().await.unwrap();

    served.signal("TERM");
    let status = served.wait_exit(Duration::from_secs(30)).expect("exits after SIGTERM");
    drop(flood);
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", served.log());
    assert!(!data.join("abort").exists(), "the checkpoint was written:\n{}", served.log());
    assert!(!served.log().contains("Too many open files"), "{}", served.log());
    let refused = served.log().matches("gRPC connection refused").count();
    assert!(refused > 0, "the connections beyond the budget were refused:\n{}", served.log());
}
