//! Black-box runs of the binary: serve starts and stops cleanly on SIGTERM; quickstart runs a
//! replicating pair.

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
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = lines.next().expect("serve exited before running").unwrap();
        if line.contains("node running") {
            break;
        }
        assert!(Instant::now() < deadline, "serve did not start");
    }
    assert!(data.join("abort").exists(), "the abort marker is present while running");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit {exit:?}: {rest:?}");
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

#[test]
fn quickstart_runs_and_stops_cleanly() {
    let out = Command::new(bin()).args(["quickstart", "--duration", "1s"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("master (HA 127.0.0.1:"), "{stdout}");
    assert!(stdout.contains("byte-identical: true"), "{stdout}");
    assert!(stdout.contains("stopped cleanly"), "{stdout}");
}
