//! `hasync controller` as a real process: started before etcd, it retries until etcd answers,
//! then becomes the cluster's active controller, which its `/metrics` shows; SIGTERM stops it.

use std::time::{Duration, Instant};

use crate::support::etcd::EtcdCluster;
use crate::support::process::{Serve, field, free_ports, metric};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_started_before_etcd_retries_and_becomes_active_in_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    // etcd's client port, told to the controller before etcd runs (nothing listens there yet).
    let [port] = free_ports::<1>();
    let cfg = dir.path().join("controller.toml");
    std::fs::write(
        &cfg,
        format!(
            "[node]\nname = \"ctl-1\"\n\n[coordinator]\nendpoints = [\"127.0.0.1:{port}\"]\n\
             cluster = \"c1\"\nttl = \"3s\"\nrenew-interval = \"500ms\"\ntimeout = \"500ms\"\n\
             retry = \"100ms\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n"
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"));
    cmd.args(["controller", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let mut ctl = Serve::spawn(cmd);
    let metrics = field(&ctl.wait_line("metrics_listen=", 20), "metrics_listen").parse().unwrap();
    // Two failed attempts, each logged with the endpoint; the process lives on and serves.
    for attempt in ["attempt=1", "attempt=2"] {
        let line = ctl.wait_line(attempt, 20);
        assert!(line.contains("cannot reach the coordinator"), "{line}");
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    }
    assert_eq!(ctl.child.try_wait().unwrap(), None, "the controller exited:\n{}", ctl.log());
    assert_eq!(metric(metrics, "hasync_controller_active").await, Some(0.0));

    let _etcd = EtcdCluster::start_at(port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(metrics, "hasync_controller_active").await != Some(1.0) {
        assert!(Instant::now() < deadline, "not active within 30s of etcd's start:\n{}", ctl.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for family in ["hasync_failovers_total", "hasync_promotion_blocked", "hasync_build_info"] {
        assert!(metric(metrics, family).await.is_some(), "{family} is not served");
    }
    assert!(metric(metrics, "hasync_failover_duration_seconds_count").await.is_some());

    ctl.signal("TERM");
    let status = ctl.wait_exit(Duration::from_secs(15)).expect("exits within 15s of SIGTERM");
    assert!(status.success(), "{status}:\n{}", ctl.log());
}
