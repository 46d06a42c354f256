//! Prometheus `/metrics`: a master and a slave in one process, each with its own registry and
//! HTTP listener; offsets, lag, put and data-plane counters move as data replicates, per-replica
//! series disappear with the replica, and every family has HELP and TYPE.
//!
//! Puts go through `Node::put`, which records them (status, latency by mode).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasync::config::{ReplicationMode, Role};
use hasync::metrics::{OPENMETRICS_TEXT, PROMETHEUS_TEXT};
use hasync::node::{Node, PutStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::ha::{Proxy, ProxyMode, node_config, slave_node_config, wait_until};
use crate::support::msg;
use crate::support::node::TestNode;

// ---- helpers shared with deploy.rs ------------------------------------------------------------

/// A node with its own metrics server on 127.0.0.1 (and its gRPC control plane).
pub struct Scraped {
    pub node: Arc<Node>,
    pub addr: SocketAddr,
    running: TestNode,
}

impl Scraped {
    pub async fn start(node: TestNode) -> Self {
        Self { node: Arc::clone(node.node()), addr: node.metrics_addr(), running: node }
    }

    /// The same: every node serves the gRPC control plane (slaves pull metadata from it).
    pub async fn start_with_api(node: TestNode) -> Self {
        Self::start(node).await
    }

    /// host:port of the control plane.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.running.grpc_addr()
    }

    pub async fn scrape(&self) -> Scrape {
        scrape(self.addr).await
    }

    /// Scrapes until `cond` holds, at most `secs` seconds; returns the scrape that satisfied it.
    pub async fn scrape_until(
        &self,
        secs: u64,
        what: &str,
        cond: impl Fn(&Scrape) -> bool,
    ) -> Scrape {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.scrape().await;
            if cond(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {what}\n{}", s.text);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops as `hasync serve` does: health NOT_SERVING, node shutdown, control plane,
    /// metrics server.
    pub async fn stop(self) {
        self.running.shutdown().await.unwrap();
    }
}

/// One HTTP/1.1 GET on a fresh connection: status, headers (lower-case names), body.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> (u16, HashMap<String, String>, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("HTTP response within 10s")
        .unwrap();
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
    let mut lines = head.lines();
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if headers.get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, headers, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

/// Scrapes `/metrics` (Prometheus text format), checking status and content type.
pub async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, headers, body) = http_get(addr, "/metrics", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers.get("content-type").map(String::as_str), Some(PROMETHEUS_TEXT));
    Scrape::parse(&body)
}

/// One sample line.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition in the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
    pub help: BTreeMap<String, String>,
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        let (mut help, mut types) = (BTreeMap::new(), BTreeMap::new());
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
                assert!(help.insert(name.to_owned(), h.to_owned()).is_none(), "two HELP {name}");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, t) = rest.split_once(' ').expect("TYPE name type");
                assert!(types.insert(name.to_owned(), t.to_owned()).is_none(), "two TYPE {name}");
            } else if line.starts_with('#') {
                continue;
            } else {
                samples.push(parse_sample(line));
            }
        }
        Self { text: text.to_owned(), samples, help, types }
    }

    /// The value of the sample `name` whose labels include `labels`, if exactly one matches.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
            })
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {} samples", found.len());
        found.first().copied()
    }

    /// Like [`Scrape::get`], panicking with the scrape when the sample is missing.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{}", self.text))
    }

    /// Samples named `name`.
    pub fn all(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// The family a sample belongs to: its own name, or without a histogram's suffix.
    pub fn family_of(&self, sample: &str) -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample.strip_suffix(suffix)
                && self.types.get(base).map(String::as_str) == Some("histogram")
            {
                return base.to_owned();
            }
        }
        sample.to_owned()
    }

    /// Every sample name and family name in the scrape.
    pub fn names(&self) -> BTreeSet<String> {
        let mut n: BTreeSet<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        n.extend(self.samples.iter().map(|s| self.family_of(&s.name)));
        n
    }
}

fn parse_sample(line: &str) -> Sample {
    let (name_labels, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
    };
    let (name, labels) = match name_labels.split_once('{') {
        None => (name_labels.to_owned(), BTreeMap::new()),
        Some((name, rest)) => {
            let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels {line:?}"));
            (name.to_owned(), parse_labels(inner))
        }
    };
    Sample { name, labels, value }
}

fn parse_labels(mut s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"").expect("label key");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().expect("closing quote") {
                (_, '\\') => match chars.next().expect("escape").1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.insert(key.trim_start_matches(',').to_owned(), value);
        s = rest[end + 1..].trim_start_matches(',');
    }
    out
}

/// Puts one message (`Node::put` records it in the node's metrics).
pub async fn put_observed(m: &Scraped, body: &[u8]) -> hasync::node::PutOutcome {
    m.node.put(vec![msg("T", 0, body)]).await
}

/// A master (SYNC, k = 1, with its control plane) and a slave following it through a proxy
/// and pulling its metadata every 200 ms, both scraped.
pub async fn pair(md: &std::path::Path, sd: &std::path::Path) -> (Scraped, Scraped, Proxy) {
    let mut c = node_config(md, Role::Master);
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    let m = Scraped::start_with_api(TestNode::start(c).await).await;
    let proxy = Proxy::start(m.node.ha_addr().unwrap(), ProxyMode::Pass).await;
    let mut c = slave_node_config(sd, proxy.addr);
    c.slave.master_grpc = m.grpc_addr().to_string();
    c.metadata.sync_interval = Duration::from_millis(200);
    let s = Scraped::start(TestNode::start(c).await).await;
    (m, s, proxy)
}

/// Every family a node exports, as named in the Prometheus text format. Per-replica families
/// exist on a master with a replica, link and metadata-lag families on a slave.
pub const ALL_FAMILIES: &[&str] = &[
    "hasync_build_info",
    "hasync_controller_active",
    "hasync_coordinator_leader",
    "hasync_coordinator_lease_remaining_seconds",
    "hasync_coordinator_required_acks",
    "hasync_coordinator_sync_degraded",
    "hasync_data_dir_size_bytes",
    "hasync_data_fs_max_used_ratio",
    "hasync_data_fs_used_ratio",
    "hasync_disk_full",
    "hasync_disk_write_errors_total",
    "hasync_epoch",
    "hasync_failover_duration_seconds",
    "hasync_fenced",
    "hasync_grpc_connections",
    "hasync_grpc_connections_accepted_total",
    "hasync_grpc_connections_closed_total",
    "hasync_grpc_connections_refused_total",
    "hasync_ha_connections",
    "hasync_ha_connections_closed_total",
    "hasync_ha_connections_opened_total",
    "hasync_ha_received_bytes_total",
    "hasync_ha_received_frames_total",
    "hasync_ha_sent_bytes_total",
    "hasync_ha_sent_frames_total",
    "hasync_log_dropped_total",
    "hasync_log_write_errors_total",
    "hasync_master_link_lag_bytes",
    "hasync_master_link_last_frame_age_seconds",
    "hasync_master_link_up",
    "hasync_metadata_lag_seconds",
    "hasync_metadata_pulls_total",
    "hasync_put_duration_seconds",
    "hasync_puts_total",
    "hasync_replica_ack_offset_bytes",
    "hasync_replica_in_sync",
    "hasync_replica_info",
    "hasync_replica_lag_bytes",
    "hasync_replica_lag_seconds",
    "hasync_replication_confirm_offset_bytes",
    "hasync_replication_connected_replicas",
    "hasync_replication_in_sync_replicas",
    "hasync_replication_mode",
    "hasync_replication_sync_ack_replicas",
    "hasync_role",
    "hasync_scrub_checked_bytes_total",
    "hasync_scrub_checked_segments_total",
    "hasync_scrub_damaged_segments",
    "hasync_scrub_last_pass_timestamp_seconds",
    "hasync_scrub_passes_total",
    "hasync_scrub_rate_bytes_per_second",
    "hasync_slave_reconnects_total",
    "hasync_store_flush_duration_seconds",
    "hasync_store_flushed_offset_bytes",
    "hasync_store_max_offset_bytes",
    "hasync_store_min_offset_bytes",
    "hasync_store_recovery_clean",
    "hasync_store_recovery_duration_seconds",
    "hasync_store_recovery_scanned_bytes",
    "hasync_truncated_bytes_total",
    "hasync_truncated_files",
    "hasync_voters",
];

/// Scrapes of a pair once every family has series: a replica on the master, a link and a
/// successful metadata pull on the slave.
pub async fn full_scrapes(m: &Scraped, s: &Scraped) -> (Scrape, Scrape) {
    let ms =
        m.scrape_until(10, "a replica", |x| !x.all("hasync_replica_lag_bytes").is_empty()).await;
    let ss = s
        .scrape_until(10, "a metadata pull", |x| {
            x.get("hasync_metadata_pulls_total", &[("outcome", "ok")]).is_some_and(|v| v >= 1.0)
                && x.all("hasync_master_link_up").iter().any(|l| l.value == 1.0)
                && !x.all("hasync_master_link_lag_bytes").is_empty()
        })
        .await;
    (ms, ss)
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_and_slave_metrics_move_as_data_replicates() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, proxy) = pair(md.path(), sd.path()).await;

    // Before any put: roles, empty offsets, zero counters, the slave's link.
    let before = m.scrape().await;
    assert_eq!(before.value("hasync_role", &[("role", "master")]), 1.0);
    assert_eq!(before.value("hasync_role", &[("role", "slave")]), 0.0);
    assert_eq!(before.value("hasync_replication_mode", &[("mode", "sync")]), 1.0);
    assert_eq!(before.value("hasync_replication_mode", &[("mode", "async")]), 0.0);
    assert_eq!(before.value("hasync_store_max_offset_bytes", &[]), 0.0);
    assert_eq!(before.value("hasync_puts_total", &[("status", "PUT_OK")]), 0.0);
    assert_eq!(before.value("hasync_put_duration_seconds_count", &[("mode", "sync")]), 0.0);
    let name = m.node.status().node_name;
    assert_eq!(before.value("hasync_build_info", &[("node", &name)]), 1.0);
    assert_eq!(before.value("hasync_replication_sync_ack_replicas", &[]), 1.0);
    let link = proxy.addr.to_string();
    let s0 = s.scrape().await;
    assert_eq!(s0.value("hasync_role", &[("role", "slave")]), 1.0);
    assert!(s0.get("hasync_master_link_up", &[("master", &link)]).is_some(), "{}", s0.text);
    // A master has no link series, a slave no replicas.
    assert!(before.all("hasync_master_link_up").is_empty());
    assert!(s0.all("hasync_replica_lag_bytes").is_empty());

    let connected = m
        .scrape_until(10, "one in-sync replica", |x| {
            x.get("hasync_replication_in_sync_replicas", &[]) == Some(1.0)
        })
        .await;
    assert_eq!(connected.value("hasync_replication_connected_replicas", &[]), 1.0);
    assert_eq!(connected.value("hasync_ha_connections", &[]), 1.0);
    assert!(connected.value("hasync_ha_connections_opened_total", &[]) >= 1.0);
    s.scrape_until(10, "slave link up", |x| {
        x.get("hasync_master_link_up", &[("master", &link)]) == Some(1.0)
    })
    .await;

    // 20 SYNC puts, each PUT_OK (so acked by the slave).
    for i in 0..20u8 {
        let out = put_observed(&m, &[i; 700]).await;
        assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    }
    let max = m.node.store().max_offset();
    assert!(max > 20 * 700);
    let after = m
        .scrape_until(10, "master flushed and replica acked everything", |x| {
            x.get("hasync_store_flushed_offset_bytes", &[]) == Some(max as f64)
        })
        .await;
    assert_eq!(after.value("hasync_store_max_offset_bytes", &[]), max as f64);
    assert_eq!(after.value("hasync_store_min_offset_bytes", &[]), 0.0);
    assert_eq!(after.value("hasync_replication_confirm_offset_bytes", &[]), max as f64);
    assert_eq!(after.value("hasync_puts_total", &[("status", "PUT_OK")]), 20.0);
    assert_eq!(after.value("hasync_puts_total", &[("status", "FLUSH_SLAVE_TIMEOUT")]), 0.0);
    assert_eq!(after.value("hasync_put_duration_seconds_count", &[("mode", "sync")]), 20.0);
    assert!(after.value("hasync_put_duration_seconds_sum", &[("mode", "sync")]) > 0.0);
    let replicas = after.all("hasync_replica_ack_offset_bytes");
    assert_eq!(replicas.len(), 1, "{}", after.text);
    let addr = replicas[0].labels["address"].clone();
    assert_eq!(replicas[0].value, max as f64);
    assert_eq!(after.value("hasync_replica_lag_bytes", &[("address", &addr)]), 0.0);
    assert_eq!(after.value("hasync_replica_lag_seconds", &[("address", &addr)]), 0.0);
    assert_eq!(after.value("hasync_replica_in_sync", &[("address", &addr)]), 1.0);
    assert!(after.value("hasync_ha_sent_bytes_total", &[]) >= max as f64);
    assert!(after.value("hasync_ha_sent_frames_total", &[]) >= 1.0);
    assert!(after.value("hasync_ha_received_bytes_total", &[]) >= 8.0, "slave reports");
    assert!(after.value("hasync_data_dir_size_bytes", &[]) > 0.0);
    let ratio = after.value("hasync_data_fs_used_ratio", &[]);
    assert!(ratio > 0.0 && ratio <= 1.0, "{ratio}");
    assert_eq!(after.value("hasync_store_recovery_clean", &[]), 1.0, "a fresh store is clean");

    let s1 = s
        .scrape_until(10, "slave caught up", |x| {
            x.get("hasync_store_max_offset_bytes", &[]) == Some(max as f64)
                && x.get("hasync_master_link_lag_bytes", &[("master", &link)]) == Some(0.0)
        })
        .await;
    assert!(s1.value("hasync_ha_received_bytes_total", &[]) >= max as f64);
    assert!(s1.value("hasync_ha_received_frames_total", &[]) >= 1.0);
    assert_eq!(s1.value("hasync_slave_reconnects_total", &[]), 0.0);
    assert!(s1.value("hasync_master_link_last_frame_age_seconds", &[("master", &link)]) < 10.0);

    // A stalled link: ASYNC puts go through, the replica's lag grows in bytes and seconds.
    m.node.set_replication_mode(ReplicationMode::Async, None).unwrap();
    proxy.set_mode(ProxyMode::Stall);
    for i in 0..5u8 {
        let out = put_observed(&m, &[i; 1000]).await;
        assert_eq!(out.status, PutStatus::PutOk, "{out:?}");
    }
    let max2 = m.node.store().max_offset();
    let lagging = m
        .scrape_until(10, "replica lag in seconds", |x| {
            x.get("hasync_replica_lag_seconds", &[("address", &addr)]).is_some_and(|v| v >= 0.2)
        })
        .await;
    assert_eq!(
        lagging.value("hasync_replica_lag_bytes", &[("address", &addr)]),
        (max2 - max) as f64
    );
    assert_eq!(lagging.value("hasync_replica_ack_offset_bytes", &[("address", &addr)]), max as f64);
    assert_eq!(lagging.value("hasync_replication_mode", &[("mode", "async")]), 1.0);
    assert_eq!(lagging.value("hasync_puts_total", &[("status", "PUT_OK")]), 25.0);
    assert_eq!(lagging.value("hasync_put_duration_seconds_count", &[("mode", "async")]), 5.0);
    assert_eq!(lagging.value("hasync_put_duration_seconds_count", &[("mode", "sync")]), 20.0);

    // The link recovers; the lag returns to 0 on both sides.
    proxy.set_mode(ProxyMode::Pass);
    m.scrape_until(10, "replica caught up again", |x| {
        x.get("hasync_replica_lag_bytes", &[("address", &addr)]) == Some(0.0)
    })
    .await;
    s.scrape_until(10, "slave caught up again", |x| {
        x.get("hasync_store_max_offset_bytes", &[]) == Some(max2 as f64)
    })
    .await;

    // Cutting the link: the master counts a closed connection, the slave a reconnect, and the
    // old connection's series are gone.
    let closed_before: f64 =
        m.scrape().await.all("hasync_ha_connections_closed_total").iter().map(|x| x.value).sum();
    proxy.cut();
    let s2 = s
        .scrape_until(10, "slave reconnected", |x| {
            x.get("hasync_slave_reconnects_total", &[]).is_some_and(|v| v >= 1.0)
                && x.get("hasync_master_link_up", &[("master", &link)]) == Some(1.0)
        })
        .await;
    assert!(s2.value("hasync_ha_received_bytes_total", &[]) >= max2 as f64);
    let m2 = m
        .scrape_until(10, "a new replica connection", |x| {
            let a = x.all("hasync_replica_ack_offset_bytes");
            a.len() == 1 && a[0].labels["address"] != addr
        })
        .await;
    let closed_after: f64 =
        m2.all("hasync_ha_connections_closed_total").iter().map(|x| x.value).sum();
    assert!(closed_after > closed_before, "{closed_before} -> {closed_after}\n{}", m2.text);
    assert!(m2.value("hasync_ha_connections_opened_total", &[]) >= 2.0);
    assert!(m2.get("hasync_replica_lag_bytes", &[("address", &addr)]).is_none());

    // The slave stops: every per-replica series disappears, counters stay.
    s.stop().await;
    let gone = m
        .scrape_until(10, "replica series gone", |x| x.all("hasync_replica_lag_bytes").is_empty())
        .await;
    for family in
        ["hasync_replica_ack_offset_bytes", "hasync_replica_lag_seconds", "hasync_replica_in_sync"]
    {
        assert!(gone.all(family).is_empty(), "{family} left after the replica went");
    }
    assert_eq!(gone.value("hasync_replication_connected_replicas", &[]), 0.0);
    assert_eq!(gone.value("hasync_replication_in_sync_replicas", &[]), 0.0);
    assert!(gone.value("hasync_ha_sent_bytes_total", &[]) >= max2 as f64);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_has_help_and_type_and_follows_the_naming_rules() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, _proxy) = pair(md.path(), sd.path()).await;
    put_observed(&m, b"x").await;
    let (ms, ss) = full_scrapes(&m, &s).await;
    let union: BTreeSet<&str> =
        ms.types.keys().chain(ss.types.keys()).map(String::as_str).collect();
    assert_eq!(union, ALL_FAMILIES.iter().copied().collect::<BTreeSet<_>>());
    for x in [&ms, &ss] {
        assert_eq!(
            x.help.keys().collect::<Vec<_>>(),
            x.types.keys().collect::<Vec<_>>(),
            "HELP and TYPE name the same families"
        );
        for (family, help) in &x.help {
            assert!(help.len() > 10, "{family}: HELP too short: {help:?}");
            assert!(!help.ends_with(".."), "{family}: {help:?}");
        }
        for (family, kind) in &x.types {
            assert!(family.starts_with("hasync_"), "{family}");
            assert!(
                family.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{family}"
            );
            assert!(!family.contains("total_total"), "{family}");
            match kind.as_str() {
                "counter" => assert!(family.ends_with("_total"), "counter {family}"),
                "gauge" | "histogram" => assert!(!family.ends_with("_total"), "{kind} {family}"),
                other => panic!("unexpected type {other} of {family}"),
            }
            // Units are base units.
            for bad in ["_milliseconds", "_ms", "_kb", "_mb", "_percent"] {
                assert!(!family.contains(bad), "{family} is not in base units");
            }
            if kind == "histogram" {
                assert!(family.ends_with("_seconds"), "{family}");
            }
        }
        // Every sample belongs to a described family.
        assert!(!x.samples.is_empty());
        for sample in &x.samples {
            let family = x.family_of(&sample.name);
            assert!(x.types.contains_key(&family), "{} has no TYPE", sample.name);
            assert!(x.help.contains_key(&family), "{} has no HELP", sample.name);
        }
        // Counters and closing reasons exist from the start, at 0 when nothing happened.
        for reason in [
            "housekeeping",
            "bad_report",
            "bad_ack",
            "allow_list",
            "limit",
            "peer_closed",
            "replaced",
            "shutdown",
            "offset_deleted",
            "no_report",
            "not_master",
        ] {
            assert!(
                x.get("hasync_ha_connections_closed_total", &[("reason", reason)]).is_some(),
                "{reason}"
            );
        }
        for outcome in ["ok", "failed"] {
            assert!(x.get("hasync_metadata_pulls_total", &[("outcome", outcome)]).is_some());
        }
    }
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoint_formats_and_404() {
    let dir = tempfile::tempdir().unwrap();
    let m = Scraped::start(TestNode::start(node_config(dir.path(), Role::Master)).await).await;
    // (`/` is the cluster console's: tests/it/console.rs.)
    let (status, _, _) = http_get(m.addr, "/nothing", None).await;
    assert_eq!(status, 404);
    let (status, _, _) = http_get(m.addr, "/metricsx", None).await;
    assert_eq!(status, 404);
    // What Prometheus sends: OpenMetrics preferred.
    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                  version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (status, headers, body) = http_get(m.addr, "/metrics", Some(accept)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], OPENMETRICS_TEXT);
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("# TYPE hasync_puts counter\n"), "{body}");
    assert!(body.contains("hasync_puts_total{status=\"PUT_OK\"} 0\n"), "{body}");
    // Plain text otherwise.
    let (_, headers, body) = http_get(m.addr, "/metrics", Some("text/plain")).await;
    assert_eq!(headers["content-type"], PROMETHEUS_TEXT);
    assert!(!body.contains("# EOF"));
    assert!(body.contains("# TYPE hasync_puts_total counter\n"), "{body}");
    // The server stops with its token.
    let addr = m.addr;
    m.stop().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still listening after stop");
}

/// Counters only grow, scrape after scrape, while the link is cut and re-made (that every data
/// plane shares the node's counter handles is unit-tested in `hasync::metrics`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_never_go_down_between_scrapes() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s, proxy) = pair(md.path(), sd.path()).await;
    full_scrapes(&m, &s).await;
    let mut last: BTreeMap<String, f64> = BTreeMap::new();
    for round in 0..3 {
        for i in 0..3u8 {
            put_observed(&m, &[i; 300]).await;
        }
        let reconnects = s.node.status().master_link.unwrap().reconnects;
        proxy.cut();
        wait_until(10, "link back up", || {
            s.node.status().master_link.is_some_and(|l| l.connected && l.reconnects > reconnects)
                && m.node.status().slaves.len() == 1
        })
        .await;
        for (who, x) in [("master", m.scrape().await), ("slave", s.scrape().await)] {
            for sample in &x.samples {
                if x.types.get(&x.family_of(&sample.name)).map(String::as_str) != Some("counter") {
                    continue;
                }
                let key = format!("{who} {}{:?}", sample.name, sample.labels);
                if let Some(prev) = last.insert(key.clone(), sample.value) {
                    assert!(
                        sample.value >= prev,
                        "round {round}: {key} went {prev} -> {}",
                        sample.value
                    );
                }
            }
        }
    }
    assert!(s.scrape().await.value("hasync_slave_reconnects_total", &[]) >= 3.0);
    s.stop().await;
    m.stop().await;
}

/// A failover through ChangeRole: the promoted slave reports master series (role, epoch,
/// replicas) and drops its link series, the demoted master the reverse; counters of the
/// replaced data planes never go down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_role_change() {
    use hasync::node::role::RoleRequest;
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a =
        Scraped::start_with_api(TestNode::start(node_config(ad.path(), Role::Master)).await).await;
    let mut c = slave_node_config(bd.path(), a.node.ha_addr().unwrap());
    c.slave.master_grpc = a.grpc_addr().to_string();
    let b = Scraped::start_with_api(TestNode::start(c).await).await;
    a.scrape_until(10, "a replica", |x| !x.all("hasync_replica_lag_bytes").is_empty()).await;
    for i in 0..5u8 {
        assert_eq!(put_observed(&a, &[i; 500]).await.status, PutStatus::PutOk);
    }
    let max = a.node.store().max_offset();
    let b0 = b
        .scrape_until(10, "b caught up", |x| {
            x.get("hasync_store_max_offset_bytes", &[]) == Some(max as f64)
        })
        .await;
    let a0 = a.scrape().await;
    let received = b0.value("hasync_ha_received_bytes_total", &[]);
    let sent = a0.value("hasync_ha_sent_bytes_total", &[]);
    assert!(received >= max as f64 && sent >= max as f64);
    assert_eq!(a0.value("hasync_epoch", &[]), 0.0);

    // Promote B with epoch 1, then demote A to a slave of B.
    let promote = RoleRequest::master(1);
    b.node.change_role(promote).await.unwrap();
    let demote =
        RoleRequest::slave(1, b.node.ha_addr().unwrap().to_string(), b.grpc_addr().to_string());
    a.node.change_role(demote).await.unwrap();

    let b1 = b
        .scrape_until(10, "b serves a as its replica", |x| {
            x.get("hasync_role", &[("role", "master")]) == Some(1.0)
                && x.all("hasync_replica_lag_bytes").len() == 1
        })
        .await;
    assert_eq!(b1.value("hasync_epoch", &[]), 1.0);
    assert_eq!(b1.value("hasync_fenced", &[]), 0.0);
    assert!(b1.all("hasync_master_link_up").is_empty(), "{}", b1.text);
    assert!(b1.all("hasync_metadata_lag_seconds").is_empty(), "{}", b1.text);
    assert!(b1.value("hasync_ha_received_bytes_total", &[]) >= received, "counter went down");
    assert!(b1.value("hasync_ha_connections_opened_total", &[]) >= 1.0);
    let a1 = a
        .scrape_until(10, "a follows b", |x| {
            x.get("hasync_role", &[("role", "slave")]) == Some(1.0)
                && x.all("hasync_master_link_up").iter().any(|l| l.value == 1.0)
        })
        .await;
    assert_eq!(a1.value("hasync_epoch", &[]), 1.0);
    assert!(a1.all("hasync_replica_lag_bytes").is_empty(), "{}", a1.text);
    assert!(a1.value("hasync_ha_sent_bytes_total", &[]) >= sent, "counter went down");
    // B's promotion dropped its link to A (peer_closed on A) before A's data plane stopped:
    // the retired data plane's last counts are still exported.
    let closed: f64 = a1.all("hasync_ha_connections_closed_total").iter().map(|x| x.value).sum();
    assert!(closed >= 1.0, "the old master's closed connection is counted\n{}", a1.text);

    // B takes puts and A's lag goes back to 0 as seen from B.
    for i in 0..3u8 {
        assert_eq!(put_observed(&b, &[i; 500]).await.status, PutStatus::PutOk);
    }
    let max = b.node.store().max_offset();
    b.scrape_until(10, "a acked b's puts", |x| {
        x.all("hasync_replica_ack_offset_bytes").first().is_some_and(|s| s.value == max as f64)
    })
    .await;
    assert_eq!(b.scrape().await.value("hasync_puts_total", &[("status", "PUT_OK")]), 3.0);
    a.stop().await;
    b.stop().await;
}

/// A data plane retired before the first scrape still counts: the master's sent frames and
/// bytes and its accepted connection are exported by the first scrape after a ChangeRole to
/// slave. (When metrics read counters through the node at scrape time, an instance no scrape
/// had seen was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_of_a_data_plane_retired_before_any_scrape_are_exported() {
    use hasync::node::role::RoleRequest;
    let (ad, bd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(node_config(ad.path(), Role::Master)).await;
    let b = TestNode::start(slave_node_config(bd.path(), a.ha_addr().unwrap())).await;
    for i in 0..3u8 {
        a.put(vec![msg("T", 0, &[i; 500])]).await;
    }
    let max = a.store().max_offset();
    wait_until(10, "b caught up", || b.store().max_offset() == max).await;
    // A becomes a slave of a master that is not there; nothing scraped A so far.
    a.change_role(RoleRequest::slave(1, "127.0.0.1:1", "")).await.unwrap();
    let a = Scraped::start(a).await;
    let x = a.scrape().await;
    assert_eq!(x.get("hasync_role", &[("role", "slave")]), Some(1.0), "{}", x.text);
    assert!(x.value("hasync_ha_sent_bytes_total", &[]) >= max as f64, "{}", x.text);
    assert!(x.value("hasync_ha_sent_frames_total", &[]) >= 1.0, "{}", x.text);
    assert!(x.value("hasync_ha_connections_opened_total", &[]) >= 1.0, "{}", x.text);
    let closed: f64 = x.all("hasync_ha_connections_closed_total").iter().map(|s| s.value).sum();
    assert!(closed >= 1.0, "{}", x.text);
    b.shutdown().await.unwrap();
    a.stop().await;
}
