//! Black-box runs of the binary: serve starts and stops cleanly on SIGTERM; quickstart runs a
//! replicating pair in SYNC mode whose printed `hasync status` commands work while it runs;
//! a tiny `bench cluster` runs and leaves nothing behind.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("hasync")
}

#[test]
fn serve_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hasync.toml");
    std::fs::write(
        &cfg,
        "[store]\nsegment-size = \"64KiB\"\nmax-message-size = \"16KiB\"\n\
         [ha]\nlisten = \"127.0.0.1:0\"\n[grpc]\nlisten = \"127.0.0.1:0\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut grpc = None;
    loop {
        let line = lines.next().expect("serve exited before running").unwrap();
        if let Some(at) = line.find("grpc_listen=") {
            grpc = line[at + "grpc_listen=".len()..].split_whitespace().next().map(str::to_owned);
        }
        if line.contains("node running") {
            break;
        }
        assert!(Instant::now() < deadline, "serve did not start");
    }
    assert!(data.join("abort").exists(), "the abort marker is present while running");
    // A refused request is logged with its method, code and message.
    let Some(grpc) = grpc else {
        let _ = child.kill();
        panic!("the gRPC address is not logged");
    };
    let refused =
        Command::new(bin()).args(["read", "--from", "12345", "--grpc", &grpc]).output().unwrap();
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit {exit:?}: {rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("request refused")
            && l.contains("Read")
            && l.contains("OutOfRange")),
        "{rest:?}"
    );
    assert!(rest.iter().any(|l| l.contains("stopped cleanly")), "{rest:?}");
    assert!(!data.join("abort").exists(), "a clean stop removes the abort marker");
    assert!(data.join("checkpoint").exists());
}

#[test]
fn serve_refuses_a_bad_config_naming_the_key() {
    let out = Command::new(bin())
        .args(["serve", "--segment-size", "1000B", "--data-dir", "/nonexistent/never"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("store.segment-size"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line naming what failed: {err}");
}

/// Runs `hasync ARGS` (client variables of the test's environment removed).
fn client(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env_remove("HASYNC_GRPC")
        .env_remove("HASYNC_TOKEN")
        .env_remove("HASYNC_CA_CERT")
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[test]
fn quickstart_replicates_in_sync_mode_and_its_status_commands_work() {
    let mut child = Command::new(bin())
        .args(["quickstart", "--duration", "5s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut status_addrs = Vec::new();
    while status_addrs.len() < 2 {
        let line = lines.next().unwrap_or_else(|| panic!("quickstart ended early: {seen:?}"));
        let line = line.unwrap();
        if let Some(rest) = line.trim().strip_prefix("hasync status --grpc ") {
            status_addrs.push(rest.split_whitespace().next().unwrap().to_owned());
        }
        seen.push(line);
    }
    // While it runs, the printed commands work from "another terminal".
    let m = json_of(&client(&["status", "--json", "--grpc", &status_addrs[0]]));
    assert_eq!(
        (m["role"].as_str(), m["mode"].as_str()),
        (Some("ROLE_MASTER"), Some("REPLICATION_MODE_SYNC"))
    );
    let s = json_of(&client(&["status", "--json", "--grpc", &status_addrs[1]]));
    assert_eq!(s["role"], "ROLE_SLAVE");
    assert_eq!(s["master_link"]["connected"], true, "{s}");
    let ha = seen.iter().find_map(|l| l.trim().strip_prefix("master  HA ")).expect("master line");
    assert_eq!(s["master_link"]["address"].as_str(), ha.split(',').next(), "{s}");
    seen.extend(lines.map_while(Result::ok));
    let exit = child.wait().unwrap();
    let stdout = seen.join("\n");
    let stderr = drain.join().unwrap();
    assert!(exit.success(), "{stdout}\n{stderr}");
    // The status table showed replication while messages went in.
    assert!(stdout.contains("mode          SYNC: a put waits for 1 slave ack(s)"), "{stdout}");
    assert!(stdout.contains("master link   127.0.0.1:"), "{stdout}");
    let puts = seen.iter().find(|l| l.starts_with("puts of 10 messages: ")).expect("puts line");
    assert!(puts.contains("x PUT_OK"), "{puts}");
    let finals = seen.iter().find_map(|l| l.strip_prefix("final offsets: master max_offset "));
    let (master_max, slave_max) =
        finals.expect("final offsets line").split_once(", slave max_offset ").unwrap();
    let (master_max, slave_max): (u64, u64) =
        (master_max.parse().unwrap(), slave_max.parse().unwrap());
    assert!(master_max > 0, "messages were put: {stdout}");
    assert_eq!(slave_max, master_max, "the slave reached the master's offset: {stdout}");
    assert!(stdout.contains("byte-identical: true"), "{stdout}");
    assert!(stdout.ends_with("stopped cleanly"), "{stdout}");
}

/// `hasync controller` needs `[coordinator]` endpoints and a cluster: without endpoints it
/// refuses to start, naming the key (and the other missing keys with it).
#[test]
fn controller_refuses_a_config_without_endpoints_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("controller.toml");
    std::fs::write(&cfg, "[node]\nname = \"ctl1\"\n[coordinator]\ncluster = \"c1\"\n").unwrap();
    let out = Command::new(bin()).args(["controller", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("coordinator.endpoints"), "{err}");
    assert!(err.contains("hasync controller"), "{err}");
    // a cluster is required too; coordinator.group is not (a controller drives every group)
    std::fs::write(&cfg, "[node]\nname = \"ctl1\"\n[coordinator]\nendpoints = [\"127.0.0.1:1\"]\n")
        .unwrap();
    let out = Command::new(bin()).args(["controller", "--config"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("coordinator.cluster"), "{err}");
    assert!(!err.contains("coordinator.group"), "{err}");
    // a valid file: --print-config shows it without connecting
    std::fs::write(
        &cfg,
        "[node]\nname = \"ctl1\"\n[coordinator]\nendpoints = [\"127.0.0.1:1\"]\ncluster = \"c1\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["controller", "--print-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cluster = \"c1\""), "{out:?}");
}

/// `hasync bench cluster` checks its flags before it starts anything.
#[test]
fn bench_cluster_refuses_flags_that_cannot_work_naming_them() {
    for (args, flag) in [
        (&["--members", "1"][..], "--members"),
        (&["--ttl", "3s", "--renew", "2s"][..], "--renew"),
        (&["--groups", "0"][..], "--groups"),
        (&["--etcd", "/nonexistent/etcd"][..], "--etcd"),
    ] {
        let out = Command::new(bin()).args(["bench", "cluster"]).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// A tiny `hasync bench cluster` (two groups, short TTL) runs both failover scenarios, prints
/// the table, and leaves neither a process (etcd, the controller) nor a file behind.
#[test]
fn bench_cluster_runs_a_tiny_cluster_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "cluster", "--groups", "2", "--rest", "1s", "--ttl", "3s"])
        .args(["--renew", "1s", "--burst", "1", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for row in ["N=2", "etcd requests/s", "requests/s per group", "controller CPU", "crash->stable"]
    {
        assert!(text.contains(row), "no `{row}` in:\n{text}");
    }
    assert_eq!(text.matches("failover of 1 group(s) at once").count(), 2, "{text}");
    assert_nothing_left_in(dir.path());
}

/// No process names `dir` on its command line and `dir` is empty.
fn assert_nothing_left_in(dir: &std::path::Path) {
    let left = cmdlines_naming(dir);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "files left in --dir");
}

/// A tiny `hasync bench sync --against-redis` starts its hasync pair (and its Redis pair, when
/// `redis-server` is installed; otherwise it says so, and under CI the test fails), prints every
/// row of the comparison with every operation ok (at 2 clients also the row of 2 clients each on
/// a PutStream of its own) and each goal judged on every hasync row, and leaves neither a process
/// nor a file behind (its scratch directory is under TMPDIR).
#[test]
fn bench_sync_against_redis_prints_both_systems_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "sync", "--against-redis", "--writers", "1,2", "--duration", "200ms"])
        .args(["--segment-size", "8MiB"])
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    // Where the bench looks for it: PATH, then /usr/bin.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let redis = std::env::split_paths(&path)
        .chain([std::path::PathBuf::from("/usr/bin")])
        .any(|d| d.join("redis-server").is_file());
    assert!(
        redis || std::env::var_os("CI").is_none(),
        "redis-server is not installed (Debian: redis-server; .ci/run installs it), so the \
         comparison was not run (CI is set, so this fails)"
    );
    let mut labels = vec![
        "hasync ASYNC Put 1 clients",
        "hasync SYNC Put 1 clients",
        "hasync SYNC PutStream 1 in flight",
        "hasync SYNC Put 2 clients",
        "hasync SYNC PutStream 2 in flight",
        "hasync SYNC PutStream 2 packed",
        "hasync SYNC PutStream 2 clients",
    ];
    if redis {
        labels.extend(["Redis SET+WAIT 1 clients", "Redis SET+WAIT 2 clients"]);
        assert!(text.contains("hasync/Redis at 1: throughput"), "no ratio line in:\n{text}");
        for goal in ["goal at 1: p50 <= 1.2x Redis: ", "goal at 2: p99 <= Redis: "] {
            let line = text.lines().find(|l| l.contains(goal));
            let line = line.unwrap_or_else(|| panic!("no `{goal}` line in:\n{text}"));
            assert!(line.contains("unary Put ") && line.contains("PutStream in flight "), "{line}");
        }
        let line = text.lines().find(|l| l.contains("goal at 2: p99"));
        let named = |l: &str| l.contains("PutStream packed ") && l.contains("PutStream clients ");
        assert!(line.is_some_and(named), "{text}");
    } else {
        assert!(text.contains("redis-server is not installed"), "{text}");
    }
    for label in labels {
        let line = text.lines().find(|l| l.trim_start().starts_with(label));
        let line = line.unwrap_or_else(|| panic!("no `{label}` row in:\n{text}"));
        let cells: Vec<&str> =
            line[line.find(label).unwrap() + label.len()..].split_whitespace().collect();
        // ops/s, p50, p99, p999, not ok, rolls, CPU us/op = ...
        let ops: f64 = cells[0].parse().unwrap_or(0.0);
        assert!(ops > 0.0, "no operations in `{line}`");
        assert_eq!(cells[4], "0", "operations not ok in `{line}`");
        let rolls_counted = cells[5].parse::<u64>().is_ok();
        assert_eq!(rolls_counted, label.starts_with("hasync"), "rolls in `{line}`");
    }
    let left = cmdlines_naming(dir.path());
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files left in TMPDIR");
}

/// `quickstart --cluster` (a real etcd, three nodes, the master killed as kill -9 would, then
/// started again) ends on its own, every PUT_OK record on the new master, and leaves nothing
/// behind. The restarted master once failed to rejoin: the crashed node's store thread went on
/// writing checkpoints beside it.
#[test]
fn quickstart_cluster_fails_over_without_losing_a_put_ok_and_leaves_nothing_behind() {
    let etcd = ["/usr/bin/etcd", "/usr/local/bin/etcd"];
    assert!(
        etcd.iter().any(|p| std::path::Path::new(p).exists()),
        "etcd is missing ({etcd:?}): install the Debian package etcd-server"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["quickstart", "--cluster"])
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lost = text.lines().find(|l| l.contains("PUT_OK records are on the new master"));
    assert!(lost.is_some_and(|l| l.ends_with("no PUT_OK lost")), "{text}");
    assert!(text.contains("the old master rejoined as a slave"), "{text}");
    let left = cmdlines_naming(dir.path());
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files left in TMPDIR");
}

/// The command lines (NULs as spaces) of the processes whose command line names `dir`.
fn cmdlines_naming(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&*dir))
        .collect()
}

/// `hasync serve` processes whose command line names `dir` (the nodes a bench started there).
fn nodes_in(dir: &std::path::Path) -> usize {
    cmdlines_naming(dir).iter().filter(|c| c.contains(" serve ")).count()
}

/// `hasync bench costs` interrupted (SIGINT to the bench alone, its nodes running) removes its
/// scratch directory and its nodes, and exits 130.
#[test]
fn bench_costs_interrupted_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .args(["bench", "costs", "--sizes", "256MiB", "--segments", "3,1"])
        .args(["--segment-size", "4MiB", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_child(&child);
    let started = Instant::now();
    while nodes_in(dir.path()) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the bench ended before its nodes started");
        assert!(started.elapsed() < Duration::from_secs(60), "no node started within 60s");
        std::thread::sleep(Duration::from_millis(20));
    }
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the bench did not exit within 30s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}, stderr:\n{err}");
    assert!(err.contains("interrupted"), "{err}");
    // The bench killed its nodes; they are gone once it exited (reaped by init).
    let gone = Instant::now();
    while nodes_in(dir.path()) > 0 && gone.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_nothing_left_in(dir.path());
}

/// A tiny `hasync bench costs` (an 8 MiB catch-up, logs of 1 and 3 segments of 4 MiB) prints
/// a catch-up row with its socket-copy baseline and the start-up rows (empty baseline, 1, 3),
/// and leaves neither a process nor a file behind.
#[test]
fn bench_costs_runs_tiny_logs_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "costs", "--sizes", "8MiB", "--segments", "3,1"])
        .args(["--segment-size", "4MiB", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<Vec<&str>> =
        text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).collect();
    let catch_up = rows.iter().find(|r| r.first() == Some(&"8MiB")).unwrap_or_else(|| {
        panic!("no catch-up row in:\n{text}");
    });
    assert_eq!(catch_up.len(), 10, "{catch_up:?}");
    // A figure the bench read from the processes: a number with its unit, above zero.
    let positive = |cell: &str, unit: &str| {
        let v: f64 = cell.strip_suffix(unit).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        assert!(v > 0.0, "{cell:?} is not a positive figure in {unit}:\n{text}");
    };
    positive(catch_up[6], "MiB"); // the slave's RssAnon
    positive(catch_up[8], "s"); // the catch-up took time
    for start in ["empty", "1", "3"] {
        let row = rows.iter().find(|r| r.first() == Some(&start));
        let row = row.unwrap_or_else(|| panic!("no start-up row {start} in:\n{text}"));
        assert_eq!(row.len(), 7, "{row:?}");
        positive(row[6], "MiB"); // the kill -9 start recovered the 2,000 puts
    }
    assert_nothing_left_in(dir.path());
}

/// A short `hasync bench grpc` prints each row it promises, the echo baseline (gRPC's floor)
/// and the packed PutStream rows included, with every put answered PUT_OK.
#[test]
fn bench_grpc_prints_the_echo_baseline_beside_the_put_rows() {
    let out = Command::new(bin())
        .args(["bench", "grpc", "--writers", "2", "--duration", "200ms", "--segment-size", "8MiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 10 && w[2] == "2")
        .collect();
    let labels: Vec<(&str, &str)> = rows.iter().map(|w| (w[0], w[1])).collect();
    assert_eq!(
        labels,
        [
            ("SYNC", "node"),
            ("SYNC", "grpc"),
            ("SYNC", "stream"),
            ("SYNC", "packed"),
            ("-", "echo"),
            ("-", "echo-pk"),
            ("ASYNC", "node"),
            ("ASYNC", "grpc"),
            ("ASYNC", "stream"),
            ("ASYNC", "packed"),
        ],
        "{text}"
    );
    for w in &rows {
        assert_eq!(w[8], "0", "puts not PUT_OK in {w:?}:\n{text}");
        assert!(w[3].parse::<f64>().unwrap() > 0.0, "no puts in {w:?}:\n{text}");
    }
    assert!(text.contains("echo: the same PutStream client"), "{text}");
    assert!(text.contains("packed, echo-pk: the same puts"), "{text}");
}
