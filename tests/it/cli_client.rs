//! The client subcommands (`status`, `mode`, `put`, `read`, `health`) as a script runs them:
//! the built binary against live nodes started in this process on 127.0.0.1, checking output
//! and the documented exit codes.

use std::process::Stdio;
use std::time::Duration;

use hasync::cli::client::format::base64;
use hasync::cli::client::put::generated_body;
use hasync::config::{ReplicationMode, Role};
use serde_json::Value;
use std::io::{BufRead, BufReader};

use crate::support::grpc::ApiNode;
use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// Asserts the exit code and that stderr is one line holding each of `words`.
    fn fails(&self, code: i32, words: &[&str]) {
        assert_eq!(self.code, code, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line on stderr: {self:?}");
        assert!(self.stderr.starts_with("error: "), "{self:?}");
        for w in words {
            assert!(self.stderr.contains(w), "{w:?} in {:?}", self.stderr);
        }
    }

    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }
}

fn command(args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"));
    cmd.args(args).env_remove("HASYNC_GRPC").env_remove("HASYNC_TOKEN");
    cmd.env_remove("HASYNC_CA_CERT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `hasync ARGS` with extra environment variables (HASYNC_* client variables of the
/// test's own environment removed), on a blocking thread so the nodes in this process keep
/// serving; killed after 60 s.
async fn hasync_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let child = command(args, env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let wait = tokio::task::spawn_blocking(move || child.wait_with_output());
    let Ok(out) = tokio::time::timeout(Duration::from_secs(60), wait).await else {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        panic!("hasync {args:?} did not finish within 60 s");
    };
    let out = out.unwrap().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn hasync(args: &[&str]) -> Run {
    hasync_env(args, &[]).await
}

/// host:port of a node's gRPC listener.
fn addr(node: &ApiNode) -> String {
    node.url.trim_start_matches("http://").to_owned()
}

async fn master(dir: &std::path::Path, mode: ReplicationMode) -> ApiNode {
    let mut c = node_config(dir, Role::Master);
    c.node.name = "cli-master".into();
    c.replication.mode = mode;
    ApiNode::start(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_carries_the_pinned_fields() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Sync).await;
    let ha = m.node.ha_addr().unwrap().to_string();
    let mut sc = slave_node_config(sd.path(), m.node.ha_addr().unwrap());
    sc.node.name = "cli-slave".into();
    let s = ApiNode::start(sc).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    hasync(&["put", "--grpc", &m.url, "--topic", "S", "--count", "3"]).await.ok();
    let end = m.node.store().max_offset();
    assert!(end > 0);
    wait_until(10, "slave caught up", || s.node.store().max_offset() == end).await;

    let j = hasync(&["status", "--json", "--grpc", &addr(&m)]).await.ok().json();
    assert_eq!(j["node_name"], "cli-master");
    assert_eq!(j["role"], "ROLE_MASTER");
    assert_eq!(j["mode"], "REPLICATION_MODE_SYNC");
    assert_eq!((j["epoch"].as_u64(), j["sync_ack_replicas"].as_u64()), (Some(0), Some(1)));
    assert_eq!(j["max_offset"].as_u64(), Some(end));
    assert_eq!(j["confirm_offset"].as_u64(), Some(end));
    assert_eq!(j["min_offset"].as_u64(), Some(0));
    assert!(j["flushed_offset"].as_u64().unwrap() <= end);
    assert_eq!(j["in_sync_replicas"].as_u64(), Some(1));
    assert!(j["master_link"].is_null(), "{j}");
    assert!(j["time_unix_ms"].as_i64().unwrap() > 0);
    assert_eq!((j["fenced"].as_bool(), j["epoch_history_length"].as_u64()), (Some(false), Some(1)));
    let slaves = j["slaves"].as_array().unwrap();
    assert_eq!(slaves.len(), 1, "{j}");
    let sl = &slaves[0];
    assert_eq!((sl["ack_offset"].as_u64(), sl["lag_bytes"].as_u64()), (Some(end), Some(0)));
    assert_eq!((sl["in_sync"].as_bool(), sl["lag_millis"].as_u64()), (Some(true), Some(0)));
    for key in ["replica_id", "address", "last_ack_unix_ms", "bytes_per_sec", "first_offset"] {
        assert!(!sl[key].is_null(), "{key} in {sl}");
    }

    // The slave, addressed through HASYNC_GRPC in the http:// form.
    let j = hasync_env(&["status", "--json"], &[("HASYNC_GRPC", &s.url)]).await.ok().json();
    assert_eq!(
        (j["node_name"].as_str(), j["role"].as_str()),
        (Some("cli-slave"), Some("ROLE_SLAVE"))
    );
    assert_eq!(j["max_offset"].as_u64(), Some(end));
    assert_eq!(j["slaves"].as_array().map(Vec::len), Some(0));
    let link = &j["master_link"];
    assert_eq!((link["address"].as_str(), link["connected"].as_bool()), (Some(&*ha), Some(true)));
    assert_eq!(link["master_max_offset"].as_u64(), Some(end));

    // The table for people.
    let t = hasync(&["status", "--grpc", &addr(&s)]).await;
    let t = &t.ok().stdout;
    assert!(t.contains("role          slave (epoch 0, "), "{t}");
    assert!(t.contains(&format!("master link   {ha} connected")), "{t}");
    assert!(t.contains(&format!("max {end}")), "{t}");
    let t = hasync(&["status", "--grpc", &addr(&m)]).await;
    let row = t.stdout.lines().find(|l| l.starts_with("1 ") || l.contains("yes")).unwrap_or("");
    assert!(row.contains(&end.to_string()) && row.contains("0 B") && row.contains("yes"), "{t:?}");
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_streams_json_lines_until_ctrl_c() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let args = ["status", "--watch", "--json", "--interval", "100ms", "--grpc", &m.url];
    let mut child = command(&args, &[]).stdout(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut next = async || {
        let line = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        let line = line.expect("a status line within 10 s").expect("the watch ended");
        serde_json::from_str::<Value>(&line).unwrap()
    };
    let first = next().await;
    assert_eq!(first["role"], "ROLE_MASTER");
    assert_eq!(first["max_offset"].as_u64(), Some(0));
    hasync(&["put", "--grpc", &m.url, "--topic", "W", "--body", "x"]).await.ok();
    let mut last = first.clone();
    for _ in 0..30 {
        last = next().await;
        if last["max_offset"].as_u64() > Some(0) {
            break;
        }
    }
    assert_eq!(last["max_offset"].as_u64(), Some(m.node.store().max_offset()), "the put shows");
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let exit = tokio::task::spawn_blocking(move || child.wait());
    let exit = tokio::time::timeout(Duration::from_secs(10), exit).await.unwrap().unwrap().unwrap();
    assert_eq!(exit.code(), Some(0), "Ctrl-C ends a watch with success");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_then_read_round_trips_bodies() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let g = addr(&m);
    let r = hasync(&[
        "put", "--grpc", &g, "--topic", "RT", "--count", "5", "--size", "100", "--batch", "2",
    ])
    .await;
    let out = &r.ok().stdout;
    assert!(out.contains("put 5 message(s) to topic RT"), "{out}");
    assert!(out.contains("in 3 put(s)"), "{out}");
    assert!(
        out.lines().any(|l| l.trim().starts_with("PUT_OK") && l.contains("5 message(s)")),
        "{out}"
    );
    assert!(out.contains("latency per request"), "{out}");
    let text = "héllo wörld\twith a tab";
    let args = [
        "put",
        "--grpc",
        &g,
        "--topic",
        "RT",
        "--body",
        text,
        "--tags",
        "TagA",
        "--keys",
        "k1 k2",
        "--queue-id",
        "3",
    ];
    hasync(&args).await.ok();
    let end = m.node.store().max_offset();

    let j =
        hasync(&["read", "--grpc", &g, "--from", "0", "--max", "100", "--json"]).await.ok().json();
    let msgs = j["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 6, "{j}");
    assert_eq!((j["next_offset"].as_u64(), j["max_offset"].as_u64()), (Some(end), Some(end)));
    for (i, msg) in msgs[..5].iter().enumerate() {
        let body = generated_body(i as u64, 100);
        assert_eq!(msg["body"].as_str(), Some(base64(&body).as_str()), "message {i}");
        assert_eq!(msg["body_text"].as_str().map(str::as_bytes), Some(&body[..]));
        assert_eq!(
            (msg["topic"].as_str(), msg["queue_offset"].as_u64()),
            (Some("RT"), Some(i as u64))
        );
    }
    let last = &msgs[5];
    assert_eq!(last["body_text"].as_str(), Some(text));
    assert_eq!(last["body"].as_str(), Some(base64(text.as_bytes()).as_str()));
    assert_eq!((last["tags"].as_str(), last["keys"].as_str()), (Some("TagA"), Some("k1 k2")));
    assert_eq!((last["queue_id"].as_u64(), last["queue_offset"].as_u64()), (Some(3), Some(0)));

    // Paging: --max 2 from the start, then from the printed next offset.
    let page =
        hasync(&["read", "--grpc", &g, "--from", "0", "--max", "2", "--json"]).await.ok().json();
    assert_eq!(page["messages"].as_array().unwrap().len(), 2);
    let next = page["next_offset"].as_u64().unwrap().to_string();
    let t = hasync(&["read", "--grpc", &g, "--from", &next, "--max", "1"]).await;
    let out = &t.ok().stdout;
    assert!(out.contains("message 2 message 2"), "{out}");
    assert!(out.contains("1 message(s); next offset"), "{out}");
    let t = hasync(&["read", "--grpc", &g, "--from", &end.to_string()]).await;
    assert!(t.ok().stdout.contains(&format!("no messages at offset {end}")), "{t:?}");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_put_in_flight_ends_the_run_counting_the_puts_sent_after_it() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let g = addr(&m);
    // Put 1 (1200 messages) is over grpc.max-messages-per-put (1024) and refused; put 2 (100
    // messages) was already sent beside it and is stored: the summary counts it, the error
    // says so.
    let args = ["put", "--grpc", &g, "--topic", "IF", "--count", "1300", "--batch", "1200"];
    let r = hasync(&[&args[..], &["--in-flight", "2"]].concat()).await;
    r.fails(4, &["1200 messages in one put", "the 1 put(s) sent after it are counted above"]);
    assert!(
        r.stdout.lines().any(|l| l.trim().starts_with("PUT_OK") && l.contains("100 message(s)")),
        "{r:?}"
    );
    assert!(m.node.store().max_offset() > 0, "put 2 is stored");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_changes_what_put_returns() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Sync).await;
    let g = addr(&m);
    let put = ["put", "--grpc", &g, "--topic", "M", "--count", "3"];
    // SYNC with no slave: the first put answers SLAVE_NOT_AVAILABLE (stored) and the run stops.
    let r = hasync(&put).await;
    r.fails(
        6,
        &["put not OK", "SLAVE_NOT_AVAILABLE", "stored on the master", "2 message(s) not sent"],
    );
    assert!(r.stdout.contains("SLAVE_NOT_AVAILABLE"), "{r:?}");
    assert!(m.node.store().max_offset() > 0, "stored");
    let r = hasync(&["put", "--grpc", &g, "--topic", "M", "--count", "3", "--keep-going"]).await;
    r.fails(6, &["SLAVE_NOT_AVAILABLE"]);
    assert!(
        r.stdout.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["SLAVE_NOT_AVAILABLE", "3", "message(s)"]),
        "{r:?}"
    );

    let r = hasync(&["mode", "async", "--grpc", &g]).await;
    assert!(r.ok().stdout.contains("replication mode ASYNC"), "{r:?}");
    assert_eq!(m.node.replication().mode, ReplicationMode::Async);
    let r = hasync(&put).await;
    assert!(r.ok().stdout.contains("PUT_OK"), "{r:?}");

    let r = hasync(&["mode", "sync", "--sync-ack-replicas", "2", "--grpc", &g]).await;
    assert!(r.ok().stdout.contains("SYNC: a put waits for 2 slave ack(s)"), "{r:?}");
    assert_eq!(m.node.replication().sync_ack_replicas, 2);
    // k = 0 never reaches the node: a usage error.
    let r = hasync(&["mode", "sync", "--sync-ack-replicas", "0", "--grpc", &g]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(m.node.replication().sync_ack_replicas, 2);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_name_what_failed() {
    // Unreachable: nothing listens on a port just released.
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = free.local_addr().unwrap().to_string();
    drop(free);
    for cmd in [vec!["status"], vec!["put", "--topic", "T"], vec!["health"]] {
        let mut args = cmd.clone();
        args.extend(["--grpc", &gone]);
        hasync(&args).await.fails(3, &["unreachable", &gone]);
    }
    hasync(&["status", "--grpc", "no-port"]).await.fails(2, &["--grpc", "port"]);

    // Refused: a slave takes no put and no mode; a read outside the store.
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Async).await;
    let ha = m.node.ha_addr().unwrap().to_string();
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    let r = hasync(&["put", "--grpc", &addr(&s), "--topic", "T", "--body", "x"]).await;
    r.fails(4, &["refused", "FAILED_PRECONDITION", "slave", &ha]);
    assert!(r.stdout.is_empty(), "nothing put, no summary: {r:?}");
    hasync(&["mode", "sync", "--grpc", &addr(&s)]).await.fails(4, &["FAILED_PRECONDITION", &ha]);
    hasync(&["read", "--grpc", &addr(&m), "--from", "999999"])
        .await
        .fails(4, &["OUT_OF_RANGE", "valid range"]);
    assert_eq!(s.node.store().max_offset(), 0);
    s.stop().await;
    m.stop().await;

    // Unauthenticated: a master with a token.
    let td = tempfile::tempdir().unwrap();
    let mut c = node_config(td.path(), Role::Master);
    c.grpc.token = "s3cret".into();
    let t = ApiNode::start(c).await;
    let g = addr(&t);
    let put = ["put", "--grpc", &g, "--topic", "T", "--body", "x"];
    hasync(&put).await.fails(5, &["unauthenticated", "UNAUTHENTICATED", "HASYNC_TOKEN"]);
    let mut wrong = put.to_vec();
    wrong.extend(["--token", "nope"]);
    hasync(&wrong).await.fails(5, &["UNAUTHENTICATED", "the token given was refused"]);
    hasync(&["mode", "sync", "--grpc", &g]).await.fails(5, &["UNAUTHENTICATED"]);
    assert_eq!(t.node.store().max_offset(), 0, "refused calls wrote nothing");
    hasync_env(&put, &[("HASYNC_TOKEN", "s3cret")]).await.ok();
    assert!(t.node.store().max_offset() > 0);
    hasync(&["status", "--grpc", &g]).await.ok(); // reads stay open
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_slave_timeout_exits_6_naming_it() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = node_config(md.path(), Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.slave_timeout = Duration::from_millis(500);
    let m = ApiNode::start(c).await;
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let s = ApiNode::start(slave_node_config(sd.path(), proxy.addr)).await;
    wait_until(10, "slave in sync", || m.node.status().in_sync_replicas == 1).await;
    let g = addr(&m);
    hasync(&["put", "--grpc", &g, "--topic", "F", "--body", "before"]).await.ok();
    proxy.set_mode(ProxyMode::Stall);
    let started = std::time::Instant::now();
    let r = hasync(&["put", "--grpc", &g, "--topic", "F", "--body", "stalled"]).await;
    r.fails(6, &["FLUSH_SLAVE_TIMEOUT", "stored on the master", "not received within"]);
    assert!(started.elapsed() >= Duration::from_millis(500), "waited for the slave timeout");
    assert!(r.stdout.contains("FLUSH_SLAVE_TIMEOUT"), "{r:?}");
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_exit_codes_follow_the_role() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Sync).await;
    let g = addr(&m);
    // SYNC without a slave cannot answer PUT_OK: replication NOT_SERVING (evaluated every 200 ms).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = hasync(&["health", "--grpc", &g]).await;
    r.fails(
        7,
        &[
            "not serving",
            "hasync.v1.Replication is NOT_SERVING",
            "master, SYNC, 0 in-sync slave(s), k = 1",
        ],
    );
    assert!(
        r.stdout.lines().any(|l| l.starts_with("\"\" (the node)") && l.ends_with(" SERVING")),
        "{r:?}"
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("hasync.v1.Replication") && l.ends_with("NOT_SERVING"))
    );
    hasync(&["health", "--grpc", &g, "--service", ""]).await.ok();
    hasync(&["health", "--grpc", &g, "--service", "no.such.Service"])
        .await
        .fails(4, &["NOT_FOUND"]);
    hasync(&["mode", "async", "--grpc", &g]).await.ok();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = hasync(&["health", "--grpc", &g]).await;
        if r.code == 0 {
            assert!(r.stdout.lines().all(|l| l.ends_with(" SERVING")), "{r:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "ASYNC makes it SERVING: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_take_https_with_a_ca_certificate() {
    let md = tempfile::tempdir().unwrap();
    let (c, cert) = crate::support::grpc::tls_master_config(md.path(), &["localhost"]);
    let m = ApiNode::start(c).await;
    let https = format!("https://{}", addr(&m));
    let ca = cert.to_str().unwrap();
    let args = ["status", "--json", "--grpc", &https, "--ca-cert", ca, "--tls-domain", "localhost"];
    assert_eq!(hasync(&args).await.ok().json()["role"], "ROLE_MASTER");
    let r = hasync_env(
        &["put", "--grpc", &https, "--tls-domain", "localhost", "--topic", "T"],
        &[("HASYNC_CA_CERT", ca)],
    )
    .await;
    assert!(r.ok().stdout.contains("PUT_OK"), "{r:?}");
    hasync(&["status", "--grpc", &https]).await.fails(2, &["--ca-cert"]);
    // The certificate names localhost, not the IP address.
    hasync(&["status", "--grpc", &https, "--ca-cert", ca]).await.fails(3, &["unreachable"]);
    // Plaintext to the TLS port: the connection breaks (the node's TLS alert, read as HTTP/2
    // frames or as a broken connection), which is "unreachable", not another failure. Several
    // tries, as which of the two a call sees depends on timing.
    let plain = addr(&m);
    for _ in 0..4 {
        for cmd in [vec!["status"], vec!["put", "--topic", "T"], vec!["health"]] {
            let mut args = cmd.clone();
            args.extend(["--grpc", &plain]);
            hasync(&args).await.fails(3, &["unreachable"]);
        }
    }
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_and_metadata_commands() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut sc = slave_node_config(sd.path(), m.node.ha_addr().unwrap());
    sc.slave.master_grpc = addr(&m);
    sc.metadata.sync_interval = Duration::from_millis(200);
    let s = ApiNode::start(sc).await;
    let (ga, gs) = (addr(&m), addr(&s));
    hasync(&["topic", "create", "Orders", "--queues", "4", "--grpc", &ga]).await.ok();
    hasync(&["topic", "create", "Payments", "--grpc", &ga]).await.ok();
    hasync(&["topic", "create", "", "--grpc", &ga]).await.fails(4, &["INVALID_ARGUMENT"]);
    let on_slave = ["topic", "create", "X", "--no-follow", "--grpc", &gs];
    hasync(&on_slave).await.fails(4, &["FAILED_PRECONDITION"]);
    hasync(&["topic", "delete", "Payments", "--grpc", &ga]).await.ok();
    hasync(&["topic", "delete", "Payments", "--grpc", &ga]).await.fails(4, &["NOT_FOUND"]);
    let list = hasync(&["topic", "list", "--grpc", &ga]).await;
    assert!(list.ok().stdout.contains("Orders") && !list.stdout.contains("Payments"), "{list:?}");
    wait_until(10, "slave pulled the topics", || {
        s.node.metadata().version(hasync::metadata::Table::Topics)
            == m.node.metadata().version(hasync::metadata::Table::Topics)
    })
    .await;
    let on_slave = hasync(&["metadata", "--json", "--grpc", &gs]).await;
    let v = on_slave.ok().json();
    assert_eq!(v["topics"][0]["topic_name"], "Orders", "{v}");
    assert_eq!(v["topics"][0]["read_queue_nums"], 4);
    let summary = hasync(&["metadata", "--grpc", &ga]).await;
    assert!(summary.ok().stdout.contains("1 topics"), "{summary:?}");
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_and_epochs_commands() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut sc = slave_node_config(sd.path(), m.node.ha_addr().unwrap());
    sc.slave.master_grpc = addr(&m);
    let s = ApiNode::start(sc).await;
    let (ga, gs) = (addr(&m), addr(&s));
    // Promote the slave with epoch 1.
    let r = hasync(&["role", "master", "--epoch", "1", "--grpc", &gs]).await;
    assert!(r.ok().stdout.contains("now master at epoch 1"), "{r:?}");
    let e = hasync(&["epochs", "--json", "--grpc", &gs]).await;
    let v = e.ok().json();
    assert_eq!(v["entries"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["entries"][1]["master_name"], s.node.status().node_name, "{v}");
    assert_eq!(v["role"], "ROLE_MASTER");
    // Demote the old master with the same epoch, following the new one.
    let new_ha = s.node.ha_addr().unwrap().to_string();
    let r = hasync(&[
        "role",
        "slave",
        "--epoch",
        "1",
        "--master-ha",
        &new_ha,
        "--master-grpc",
        &gs,
        "--grpc",
        &ga,
    ])
    .await;
    assert!(r.ok().stdout.contains("now slave at epoch 1"), "{r:?}");
    // A stale epoch is refused with the reason.
    hasync(&["role", "master", "--epoch", "0", "--grpc", &ga])
        .await
        .fails(4, &["FAILED_PRECONDITION", "stale epoch"]);
    let table = hasync(&["epochs", "--grpc", &ga]).await;
    assert!(table.ok().stdout.contains("slave at epoch 1"), "{table:?}");
    s.stop().await;
    m.stop().await;
}

/// `hasync put` and the topic writes against a slave that knows its master's gRPC address land
/// on the master, saying so; `--no-follow` keeps the refusal (exit 4, naming the address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_slave_follow_it_to_its_master_once() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = master(md.path(), ReplicationMode::Async).await;
    let mut sc = slave_node_config(sd.path(), m.node.ha_addr().unwrap());
    sc.slave.master_grpc = addr(&m);
    let s = ApiNode::start(sc).await;
    let r = hasync(&["put", "--grpc", &addr(&s), "--topic", "F", "--count", "3"]).await;
    r.ok();
    assert!(r.stdout.contains("following its master at") && r.stdout.contains(&m.url), "{r:?}");
    assert!(r.stdout.contains(&format!("on {}", m.url)), "the summary names the master: {r:?}");
    assert!(m.node.store().max_offset() > 0, "stored on the master");
    assert_eq!(s.node.status().role, Role::Slave);

    let no = ["put", "--grpc", &addr(&s), "--topic", "F", "--body", "x", "--no-follow"];
    hasync(&no).await.fails(4, &["FAILED_PRECONDITION", "slave", &addr(&m)]);

    let r = hasync(&["topic", "create", "Followed", "--grpc", &addr(&s)]).await;
    r.ok();
    assert!(r.stdout.contains("following its master"), "{r:?}");
    let (_, t) = m.node.metadata().snapshot(hasync::metadata::Table::Topics);
    assert!(matches!(t, hasync::metadata::TableData::Topics(t) if t.contains_key("Followed")));
    hasync(&["topic", "delete", "Followed", "--grpc", &addr(&s)]).await.ok();
    s.stop().await;
    m.stop().await;
}

/// The cluster subcommands on a node without a coordinator, and their usage errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_say_when_the_node_has_no_coordinator() {
    let md = tempfile::tempdir().unwrap();
    let m = master(md.path(), ReplicationMode::Async).await;
    let g = addr(&m);
    let none = "this node runs without a coordinator";
    for cmd in [
        vec!["cluster", "status"],
        vec!["cluster", "status", "--group", "g1", "--json"],
        vec!["cluster", "history", "--group", "g1"],
        vec!["cluster", "pause"],
        vec!["cluster", "resume", "--group", "g1"],
        vec!["switchover", "--group", "g1", "--to", "n2", "--timeout", "2s"],
        vec!["failover", "--group", "g1", "--to", "n2", "--accept-data-loss"],
        vec!["cluster", "remove-group", "--group", "g1"],
    ] {
        let mut args = cmd.clone();
        args.extend(["--grpc", &g]);
        hasync(&args).await.fails(4, &["refused", "FAILED_PRECONDITION", none]);
    }
    m.stop().await;
    // Usage: failover without --accept-data-loss is refused before anything is sent (the
    // address is never dialled), and the parser's own errors.
    let r = hasync(&["failover", "--group", "g1", "--to", "n2", "--grpc", "127.0.0.1:9"]).await;
    r.fails(2, &["--accept-data-loss", "switchover"]);
    let r = hasync(&["switchover", "--to", "n2"]).await;
    assert_eq!(r.code, 2, "--group is required: {r:?}");
    let r = hasync(&["cluster", "history"]).await;
    assert_eq!(r.code, 2, "--group is required: {r:?}");
    let r = hasync(&["failover", "--group", "g1", "--accept-data-loss"]).await;
    assert_eq!(r.code, 2, "--to is required: {r:?}");
    let r = hasync(&["cluster", "remove-group"]).await;
    assert_eq!(r.code, 2, "--group is required: {r:?}");
}
