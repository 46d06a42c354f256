//! deploy/ against the real thing: every metric the Grafana dashboard and the Prometheus rules
//! query exists in a scrape of a live master and slave (and of a node in coordinator mode, for
//! the controller's families), the dashboard shows every family, the example configs are valid
//! (each Kubernetes broker group's ConfigMap as its start script starts each pod, in its own
//! group of one cluster; the standalone controller's file as `hasync controller` reads it), and
//! the stop timeouts of systemd and Kubernetes leave room for `node.shutdown-timeout`.
//! (deploy/validate.sh runs the external validators.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser as _;
use hasync::config::Config;
use hasync::config::units::parse_duration;

use crate::metrics::{ALL_FAMILIES, Scrape, Scraped, full_scrapes, pair, put_observed};
use crate::support::node::TestNode;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

/// Every `hasync_...` metric name in `text` (alert names are CamelCase, recording rules use
/// colons, so neither matches).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("hasync_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// The `expr` of every panel target in the dashboard.
fn dashboard_exprs() -> Vec<String> {
    let json: serde_json::Value =
        serde_json::from_str(&read("grafana/hasync.json")).expect("hasync.json is JSON");
    let mut exprs = Vec::new();
    let mut stack = vec![&json];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(e)) = map.get("expr") {
                    exprs.push(e.clone());
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    exprs
}

fn names_in(scrapes: &[&Scrape]) -> BTreeSet<String> {
    scrapes.iter().flat_map(|s| s.names()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_query_only_metrics_a_node_exports() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "only {} dashboard queries", exprs.len());
    let dashboard: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let rules = metric_names(&read("prometheus/rules.yml"));
    assert!(rules.len() >= 8, "rules use only {rules:?}");

    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, _proxy) = pair(md.path(), sd.path()).await;
    put_observed(&m, b"deploy").await;
    let (ms, ss) = full_scrapes(&m, &s).await;
    let cd = tempfile::tempdir().unwrap();
    let c = coordinated_node(cd.path()).await;
    let cs = c
        .scrape_until(20, "the controller's families", |x| {
            !x.all("hasync_failovers_total").is_empty()
                && !x.all("hasync_promotion_blocked").is_empty()
                && x.get("hasync_controller_active", &[]) == Some(1.0)
        })
        .await;
    let exported = names_in(&[&ms, &ss, &cs]);

    let missing: Vec<_> = dashboard.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "grafana/hasync.json queries unknown metrics {missing:?}");
    let missing: Vec<_> = rules.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "prometheus/rules.yml queries unknown metrics {missing:?}");

    // The dashboard shows every family (directly or through a histogram's series).
    let unshown: Vec<_> = ALL_FAMILIES
        .iter()
        .filter(|f| {
            !dashboard
                .iter()
                .any(|d| d == *f || d.strip_prefix(*f).is_some_and(|x| x.starts_with('_')))
        })
        .collect();
    assert!(unshown.is_empty(), "families not on the dashboard: {unshown:?}");

    // promtool's own lint of the exposition, where promtool is installed (validate.sh installs
    // it; .ci/run runs validate.sh before the tests).
    for (who, scrape) in [("master", &ms), ("slave", &ss)] {
        if let Some(out) = promtool_check_metrics(&scrape.text) {
            assert!(
                out.status.success(),
                "promtool check metrics ({who}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    c.stop().await;
    s.stop().await;
    m.stop().await;
}

/// A node in coordinator mode on an in-memory engine, running the cluster's controller (which
/// declares the failover and blocked-promotion series).
async fn coordinated_node(dir: &Path) -> Scraped {
    let mut c = crate::support::ha::node_config(dir, hasync::config::Role::Master);
    c.node.name = "n1".into();
    c.coordinator.endpoints = vec!["127.0.0.1:2379".into()]; // unused: the engine is in memory
    c.coordinator.cluster = "c1".into();
    c.coordinator.group = "g1".into();
    let engine = hasync::coordinator::memory::MemoryCoordinator::new();
    let opts = hasync::app::StartOptions {
        coordinator: Some(std::sync::Arc::new(engine)),
        ..hasync::app::StartOptions::default()
    };
    let node = TestNode::try_start_with(c, std::sync::Arc::new(hasync::store::fs::StdFs), opts)
        .await
        .expect("start a coordinator-mode node");
    Scraped::start(node).await
}

fn promtool_check_metrics(text: &str) -> Option<std::process::Output> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let mut out = child.wait_with_output().unwrap();
    out.stdout.extend_from_slice(&out.stderr);
    Some(out)
}

#[test]
fn example_configs_are_valid_and_stop_timeouts_nest() {
    let mut bounds = Vec::new();
    for name in ["config/master.toml", "config/slave.toml"] {
        let c = Config::load(deploy(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        hasync::app::validate(&c).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(c.ha.listen.port(), 10912, "{name}");
        assert_eq!(c.grpc.listen.port(), 10920, "{name}");
        assert_eq!(c.metrics.listen.port(), 10921, "{name}");
        bounds.push((name, c.node.shutdown_timeout));
    }
    let master = Config::load(deploy("config/master.toml")).unwrap();
    let slave = Config::load(deploy("config/slave.toml")).unwrap();
    assert_eq!(master.node.role, hasync::config::Role::Master);
    assert_eq!(slave.node.role, hasync::config::Role::Slave);
    assert_eq!(master.store.segment_size, slave.store.segment_size, "segment sizes must match");
    assert_eq!(
        slave.slave.master_ha.rsplit_once(':').unwrap().1,
        master.ha.listen.port().to_string()
    );

    // The broker groups of deploy/kubernetes/, a file each: the TOML inside the group's
    // ConfigMap (a `|` block under `hasync.toml:`) starts each of its pods.
    let groups = group_files();
    let files: Vec<&str> = groups.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        files.len() >= 2 && files.contains(&"broker-a.yaml") && files.contains(&"broker-b.yaml"),
        "deploy/kubernetes/ shows the groups broker-a and broker-b, one file each: {files:?}"
    );
    let mut started = Vec::new();
    for (name, yaml) in &groups {
        let toml_text = yaml_block(yaml, "hasync.toml");
        let table: toml::Table =
            toml::from_str(&toml_text).unwrap_or_else(|e| panic!("{name}: hasync.toml: {e}"));
        let node = table["node"].as_table().unwrap();
        assert_eq!(node.get("fence-on-unclean-start").and_then(|v| v.as_bool()), Some(true));
        let k8s_timeout = parse_duration(node["shutdown-timeout"].as_str().unwrap()).unwrap();
        // Kubernetes waits longer than the bound before SIGKILL.
        let grace: u64 = line_value(yaml, "terminationGracePeriodSeconds:").parse().unwrap();
        assert!(
            Duration::from_secs(grace) > k8s_timeout + Duration::from_secs(5),
            "{name}: grace {grace}s"
        );
        started.push(group_starts_every_pod(name, yaml, &toml_text));
    }
    // One etcd and one controller: every group in the same cluster, on the same endpoints.
    let names: BTreeSet<&str> = started.iter().map(|c| c.coordinator.group.as_str()).collect();
    assert_eq!(names.len(), started.len(), "two group files name the same group: {names:?}");
    for c in &started {
        assert_eq!(c.coordinator.cluster, started[0].coordinator.cluster, "one cluster");
        assert_eq!(c.coordinator.endpoints, started[0].coordinator.endpoints, "one etcd");
        assert!(c.coordinator.controller, "{}: the nodes run the controller", c.node.name);
    }

    // The standalone controller's file, as `hasync controller` checks it, and its unit.
    let ctl = Config::load(deploy("config/controller.toml")).unwrap();
    hasync::cli::controller::validate(&ctl).unwrap_or_else(|e| panic!("controller.toml: {e}"));
    let unit = read("systemd/hasync-controller.service");
    assert_eq!(
        line_value(&unit, "ExecStart="),
        "/usr/local/bin/hasync controller --config /etc/hasync/controller.toml"
    );

    // systemd waits longer than either example config's bound before SIGKILL.
    let unit = read("systemd/hasync.service");
    let stop = line_value(&unit, "TimeoutStopSec=");
    let stop = parse_duration(&stop).unwrap();
    for (name, bound) in &bounds[..2] {
        assert!(
            stop > *bound + Duration::from_secs(5),
            "TimeoutStopSec {stop:?} vs {name} {bound:?}"
        );
    }
    // And docker's default of 10s is not enough: the Dockerfile says so.
    assert!(read("container/Dockerfile").contains("docker stop -t 45"));
}

/// The broker group files of deploy/kubernetes/ (those with a StatefulSet labelled
/// `hasync.io/group`): file name and text, by name.
fn group_files() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(deploy("kubernetes")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains("\nkind: StatefulSet\n") && text.contains("hasync.io/group:") {
            out.push((name, text));
        }
    }
    out.sort();
    out
}

/// The value of the env var `name` in a manifest (`- name: NAME` then `value: ...`).
fn env_value(yaml: &str, name: &str) -> String {
    let mut lines = yaml.lines().map(str::trim).skip_while(|l| *l != format!("- name: {name}"));
    lines.next().unwrap_or_else(|| panic!("no env {name}"));
    line_value(lines.next().unwrap_or(""), "value:")
}

/// A group file's ConfigMap TOML with the flags its StatefulSet's start script gives each pod:
/// pod `master-ordinal` master, the others its slaves: valid, in coordinator mode, labelling its
/// pod, in the group of the file's `hasync.io/group` labels; its master Service selects that
/// group's master only. Returns pod 0's effective configuration.
fn group_starts_every_pod(name: &str, yaml: &str, toml_text: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hasync.toml");
    std::fs::write(&file, toml_text).unwrap();
    for flag in ["--name", "--role", "--advertise-ha", "--advertise-grpc", "--master-ha"] {
        assert!(yaml.contains(&format!("{flag} \"$")), "{name}: the start script passes no {flag}");
    }
    // Every object and selector of the file names the same group.
    let labels: BTreeSet<String> = yaml
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.trim().strip_prefix("hasync.io/group:"))
        .map(|v| v.trim().to_owned())
        .collect();
    assert_eq!(labels.len(), 1, "{name}: hasync.io/group labels {labels:?}");
    let group = labels.into_iter().next().unwrap();
    // The master Service: the group's label and the role label in one selector.
    let master_svc = yaml
        .split("\n---\n")
        .find(|d| d.contains("\nkind: Service\n") && d.contains("hasync.io/role: master"))
        .unwrap_or_else(|| panic!("{name}: no Service selecting hasync.io/role: master"));
    let selector = master_svc.split("selector:").nth(1).unwrap().split("ports:").next().unwrap();
    assert!(
        selector.contains(&format!("hasync.io/group: {group}")),
        "{name}: the master Service selects other groups' masters too:{selector}"
    );

    let (sts, svc) = (env_value(yaml, "STATEFULSET"), env_value(yaml, "SERVICE"));
    let replicas: u32 = line_value(yaml, "replicas:").parse().unwrap();
    let master: u32 = line_value(yaml, "master-ordinal:").trim_matches('"').parse().unwrap();
    assert!(master < replicas, "{name}: master-ordinal {master} of {replicas} pods");
    let dns = |i: u32| format!("{sts}-{i}.{svc}.default.svc");
    let mut first = None;
    for i in 0..replicas {
        let role = if i == master { "master" } else { "slave" };
        let pod = format!("{sts}-{i}");
        let argv = [
            "hasync".to_owned(),
            "serve".into(),
            "--config".into(),
            file.display().to_string(),
            format!("--name={pod}"),
            format!("--role={role}"),
            format!("--advertise-ha={}:10912", dns(i)),
            format!("--advertise-grpc={}:10920", dns(i)),
            format!("--master-ha={}:10912", dns(master)),
            format!("--master-grpc={}:10920", dns(master)),
        ];
        let cli = hasync::cli::Cli::try_parse_from(&argv).expect("serve flags");
        let hasync::cli::Command::Serve(args) = cli.command else { panic!("not serve") };
        let c = args.effective_config().unwrap_or_else(|e| panic!("{name}: pod {pod}: {e}"));
        assert!(c.coordinator.enabled() && c.kubernetes.role_label, "{name}: pod {pod}");
        assert_eq!(c.coordinator.group, group, "{name}: pod {pod}'s coordinator.group");
        assert_eq!(c.node.name, pod);
        assert_eq!(c.node.advertise_grpc, format!("{}:10920", dns(i)));
        first.get_or_insert(c);
    }
    first.unwrap()
}

/// The value after `key` on its (first uncommented) line.
fn line_value(text: &str, key: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
        .to_owned()
}

/// The literal block `key: |` of a YAML mapping, de-indented.
fn yaml_block(yaml: &str, key: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let header = lines.next().unwrap_or_else(|| panic!("no `{key}: |` block"));
    let indent = header.len() - header.trim_start().len() + 2;
    let mut out = String::new();
    for l in lines {
        if !l.trim().is_empty() && l.len() - l.trim_start().len() < indent {
            break;
        }
        out.push_str(l.get(indent..).unwrap_or(""));
        out.push('\n');
    }
    out
}

#[test]
fn metric_name_extraction() {
    let names = metric_names(
        "rate(hasync_puts_total{status=\"PUT_OK\"}[5m]) / x_hasync_no + hasync:rule:sum \
         HasyncLag hasync_replica_lag_bytes>1",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["hasync_puts_total", "hasync_replica_lag_bytes"]
    );
}
