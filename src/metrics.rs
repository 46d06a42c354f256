//! Prometheus metrics: one [`Metrics`] per node (an explicit prometheus-client `Registry`, no
//! global state, so a master and a slave can run in one process), served as text at `/metrics`
//! by [`serve`] on its own small HTTP/1.1 listener (`metrics.listen`).
//!
//! Two kinds of values:
//!
//! - Snapshots the node already keeps (offsets, replicas, lag, data-plane counters, metadata
//!   pulls, disk usage) are copied in by [`Metrics::refresh`] at scrape time. Per-replica and
//!   per-link series are cleared and re-filled, so a replica that disconnected disappears. The
//!   node's own counters restart at 0 when its data plane is rebuilt (a role change); the
//!   exported `_total` counters do not: each scrape adds what a counter grew since the last one,
//!   and a new data-plane instance counts from 0.
//! - Events are recorded as they happen by the code that sees them: [`Metrics::observe_put`],
//!   [`Metrics::observe_flush`], [`Metrics::set_recovery_duration`].
//!
//! Every name has the `hasync_` prefix and its unit in base units (`_bytes`, `_seconds`,
//! `_ratio`); counters are registered without `_total`, which the encoder appends.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::{ReplicationMode, Role};
use crate::ha::status::{CloseReason, now_millis};
use crate::node::Node;

/// Content type of the Prometheus text format 0.0.4 (the default answer).
pub const PROMETHEUS_TEXT: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// Content type of the OpenMetrics text format (answered when the scraper asks for it).
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every reason the master closes a slave connection (the `reason` label values).
pub const CLOSE_REASONS: [CloseReason; 9] = [
    CloseReason::Housekeeping,
    CloseReason::BadReport,
    CloseReason::BadAck,
    CloseReason::AllowList,
    CloseReason::Limit,
    CloseReason::PeerClosed,
    CloseReason::Replaced,
    CloseReason::Shutdown,
    CloseReason::OffsetDeleted,
];

/// The put statuses pre-created at 0, so rates and ratios exist before the first failure.
pub const PUT_STATUSES: [&str; 6] = [
    "PUT_OK",
    "FLUSH_DISK_TIMEOUT",
    "FLUSH_SLAVE_TIMEOUT",
    "SLAVE_NOT_AVAILABLE",
    "SERVICE_NOT_AVAILABLE",
    "MESSAGE_ILLEGAL",
];

/// The text formats [`Metrics::encode`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4 ([`PROMETHEUS_TEXT`]).
    Prometheus,
    /// OpenMetrics 1.0 text ([`OPENMETRICS_TEXT`]), ending in `# EOF`.
    OpenMetrics,
}

impl Format {
    /// The format a scraper asks for in its `Accept` header: OpenMetrics when it names it,
    /// else the Prometheus text format.
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// The `Content-Type` of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => PROMETHEUS_TEXT,
            Format::OpenMetrics => OPENMETRICS_TEXT,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AddressLabels {
    address: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MasterLabels {
    master: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn put_histogram() -> Histogram {
    // 100µs .. ~13s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

fn flush_histogram() -> Histogram {
    // 50µs .. ~13s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 19))
}

/// What the last refresh saw of one counter source (a master, slave or puller instance), so
/// that exported counters grow by deltas: a rebuilt data plane (role change) counts from 0 and
/// the retired one's last increments are still added. The strong reference keeps a retired
/// instance readable until the next refresh.
struct Seen<T> {
    source: Arc<T>,
    last: HashMap<&'static str, u64>,
}

/// Runs `count` on the instance of the last refresh if it was replaced (its final values), then
/// on `current`; `count` gets the instance's last-seen values to advance counters with.
fn follow<T>(
    slot: &mut Option<Seen<T>>,
    current: Option<&Arc<T>>,
    mut count: impl FnMut(&mut HashMap<&'static str, u64>, &T),
) {
    if let Some(mut retired) = slot.take_if(|s| current.is_none_or(|c| !Arc::ptr_eq(c, &s.source)))
    {
        count(&mut retired.last, &retired.source);
    }
    if let Some(c) = current {
        let seen = slot.get_or_insert_with(|| Seen { source: Arc::clone(c), last: HashMap::new() });
        count(&mut seen.last, c);
    }
}

/// Adds to `counter` what `current` grew since `last[key]`.
fn advance(
    counter: &Counter,
    last: &mut HashMap<&'static str, u64>,
    key: &'static str,
    current: u64,
) {
    let before = last.insert(key, current).unwrap_or(0);
    counter.inc_by(current.saturating_sub(before));
}

#[derive(Default)]
struct RefreshState {
    master: Option<Seen<crate::ha::master::Master>>,
    slave: Option<Seen<crate::ha::slave::Slave>>,
    puller: Option<Seen<crate::metadata::pull::Puller>>,
}

/// The metrics of one node.
pub struct Metrics {
    registry: Registry,
    /// Serialises refresh + encode, so two scrapes never see a half-filled family.
    state: Mutex<RefreshState>,
    created: Instant,

    build_info: Family<BuildLabels, Gauge>,
    role: Family<RoleLabels, Gauge>,
    epoch: Gauge,
    fenced: Gauge,
    replication_mode: Family<ModeLabels, Gauge>,
    sync_ack_replicas: Gauge,
    min_offset: Gauge,
    max_offset: Gauge,
    flushed_offset: Gauge,
    confirm_offset: Gauge,
    connected_replicas: Gauge,
    in_sync_replicas: Gauge,

    replica_ack_offset: Family<AddressLabels, Gauge>,
    replica_lag_bytes: Family<AddressLabels, Gauge>,
    replica_lag_seconds: Family<AddressLabels, FloatGauge>,
    replica_in_sync: Family<AddressLabels, Gauge>,

    master_link_up: Family<MasterLabels, Gauge>,
    master_link_lag_bytes: Family<MasterLabels, Gauge>,
    master_link_last_frame_age_seconds: Family<MasterLabels, FloatGauge>,

    puts: Family<StatusLabels, Counter>,
    put_duration: Family<ModeLabels, Histogram, fn() -> Histogram>,

    ha_sent_bytes: Counter,
    ha_sent_frames: Counter,
    ha_received_bytes: Counter,
    ha_received_frames: Counter,
    ha_connections_opened: Counter,
    ha_connections_closed: Family<ReasonLabels, Counter>,
    ha_connections: Gauge,
    slave_reconnects: Counter,

    metadata_pulls: Family<OutcomeLabels, Counter>,
    metadata_lag_seconds: Family<MasterLabels, FloatGauge>,

    flush_duration: Histogram,
    recovery_duration_seconds: FloatGauge,
    recovery_clean: Gauge,
    recovery_scanned_bytes: Gauge,

    data_dir_bytes: Gauge,
    disk_used_ratio: FloatGauge,
    disk_max_used_ratio: FloatGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family registered; counters and histograms at 0 until recorded,
    /// snapshot values at 0 until the first [`refresh`](Metrics::refresh).
    pub fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("hasync"),
            state: Mutex::default(),
            created: Instant::now(),
            build_info: Family::default(),
            role: Family::default(),
            epoch: Gauge::default(),
            fenced: Gauge::default(),
            replication_mode: Family::default(),
            sync_ack_replicas: Gauge::default(),
            min_offset: Gauge::default(),
            max_offset: Gauge::default(),
            flushed_offset: Gauge::default(),
            confirm_offset: Gauge::default(),
            connected_replicas: Gauge::default(),
            in_sync_replicas: Gauge::default(),
            replica_ack_offset: Family::default(),
            replica_lag_bytes: Family::default(),
            replica_lag_seconds: Family::default(),
            replica_in_sync: Family::default(),
            master_link_up: Family::default(),
            master_link_lag_bytes: Family::default(),
            master_link_last_frame_age_seconds: Family::default(),
            puts: Family::default(),
            put_duration: Family::new_with_constructor(put_histogram as fn() -> Histogram),
            ha_sent_bytes: Counter::default(),
            ha_sent_frames: Counter::default(),
            ha_received_bytes: Counter::default(),
            ha_received_frames: Counter::default(),
            ha_connections_opened: Counter::default(),
            ha_connections_closed: Family::default(),
            ha_connections: Gauge::default(),
            slave_reconnects: Counter::default(),
            metadata_pulls: Family::default(),
            metadata_lag_seconds: Family::default(),
            flush_duration: flush_histogram(),
            recovery_duration_seconds: FloatGauge::default(),
            recovery_clean: Gauge::default(),
            recovery_scanned_bytes: Gauge::default(),
            data_dir_bytes: Gauge::default(),
            disk_used_ratio: FloatGauge::default(),
            disk_max_used_ratio: FloatGauge::default(),
        };
        for s in PUT_STATUSES {
            let _ = m.puts.get_or_create(&StatusLabels { status: s.into() });
        }
        for r in CLOSE_REASONS {
            let _ =
                m.ha_connections_closed.get_or_create(&ReasonLabels { reason: r.as_str().into() });
        }
        for o in ["ok", "failed"] {
            let _ = m.metadata_pulls.get_or_create(&OutcomeLabels { outcome: o.into() });
        }
        for mode in ["sync", "async"] {
            let _ = m.put_duration.get_or_create(&ModeLabels { mode: mode.into() });
        }
        m.register_all();
        m
    }

    fn register_all(&mut self) {
        let r = &mut self.registry;
        r.register(
            "build_info",
            "Always 1; labels carry the hasync version and the node name (node.name)",
            self.build_info.clone(),
        );
        r.register(
            "role",
            "1 for the role the node runs in now (role=\"master\" or \"slave\"), 0 for the other",
            self.role.clone(),
        );
        r.register(
            "epoch",
            "The node's role epoch (the last entry of its epoch history)",
            self.epoch.clone(),
        );
        r.register(
            "fenced",
            "1 while the node refuses puts after an unclean stop as master \
             (node.fence-on-unclean-start) until a ChangeRole confirms it, else 0",
            self.fenced.clone(),
        );
        r.register(
            "replication_mode",
            "1 for the replication mode in force (mode=\"sync\" or \"async\"), 0 for the other",
            self.replication_mode.clone(),
        );
        r.register(
            "replication_sync_ack_replicas",
            "Slave acks a SYNC put waits for (k)",
            self.sync_ack_replicas.clone(),
        );
        r.register(
            "store_min_offset_bytes",
            "First stored commitlog offset, in bytes",
            self.min_offset.clone(),
        );
        r.register(
            "store_max_offset_bytes",
            "End of the valid commitlog data, in bytes (its rate is the write throughput)",
            self.max_offset.clone(),
        );
        r.register(
            "store_flushed_offset_bytes",
            "Commitlog offset below which everything is on disk, in bytes",
            self.flushed_offset.clone(),
        );
        r.register(
            "replication_confirm_offset_bytes",
            "Highest offset k live slaves acknowledged (a master's; never decreases), in bytes",
            self.confirm_offset.clone(),
        );
        r.register(
            "replication_connected_replicas",
            "Slaves connected to this master",
            self.connected_replicas.clone(),
        );
        r.register(
            "replication_in_sync_replicas",
            "Slaves connected and within replication.max-gap-not-in-sync of this master",
            self.in_sync_replicas.clone(),
        );
        r.register(
            "replica_ack_offset_bytes",
            "Highest offset a connected slave acknowledged, per slave connection address",
            self.replica_ack_offset.clone(),
        );
        r.register(
            "replica_lag_bytes",
            "Bytes the master holds that a connected slave has not acknowledged",
            self.replica_lag_bytes.clone(),
        );
        r.register(
            "replica_lag_seconds",
            "Age of the oldest byte a connected slave has not acknowledged (0 when caught up)",
            self.replica_lag_seconds.clone(),
        );
        r.register(
            "replica_in_sync",
            "1 when a connected slave is within replication.max-gap-not-in-sync, else 0",
            self.replica_in_sync.clone(),
        );
        r.register(
            "master_link_up",
            "A slave's HA link to its master: 1 while connected, else 0",
            self.master_link_up.clone(),
        );
        r.register(
            "master_link_lag_bytes",
            "A slave's distance behind its master's max offset as last heard, in bytes",
            self.master_link_lag_bytes.clone(),
        );
        r.register(
            "master_link_last_frame_age_seconds",
            "Seconds since a slave last received a frame from its master (since start if none)",
            self.master_link_last_frame_age_seconds.clone(),
        );
        r.register("puts", "Put requests answered, by RocketMQ put status", self.puts.clone());
        r.register(
            "put_duration_seconds",
            "Time to answer a put, by replication mode (\"sync\" or \"async\")",
            self.put_duration.clone(),
        );
        r.register(
            "ha_sent_bytes",
            "Body bytes sent on the HA data plane (a master's frames to its slaves)",
            self.ha_sent_bytes.clone(),
        );
        r.register(
            "ha_sent_frames",
            "Frames sent on the HA data plane, heartbeats included (a master's)",
            self.ha_sent_frames.clone(),
        );
        r.register(
            "ha_received_bytes",
            "Bytes received on the HA data plane (a master: slave reports; a slave: frame bodies)",
            self.ha_received_bytes.clone(),
        );
        r.register(
            "ha_received_frames",
            "Frames received on the HA data plane (a slave's, from its master)",
            self.ha_received_frames.clone(),
        );
        r.register(
            "ha_connections_opened",
            "Slave connections a master accepted (including ones refused right away)",
            self.ha_connections_opened.clone(),
        );
        r.register(
            "ha_connections_closed",
            "Slave connections a master closed, by reason",
            self.ha_connections_closed.clone(),
        );
        r.register(
            "ha_connections",
            "Slave connections open on a master now",
            self.ha_connections.clone(),
        );
        r.register(
            "slave_reconnects",
            "Connection attempts a slave made to its master after the first",
            self.slave_reconnects.clone(),
        );
        r.register(
            "metadata_pulls",
            "A slave's metadata pulls from its master, by outcome (\"ok\" or \"failed\")",
            self.metadata_pulls.clone(),
        );
        r.register(
            "metadata_lag_seconds",
            "Seconds since a slave's last successful metadata pull (since start if none yet)",
            self.metadata_lag_seconds.clone(),
        );
        r.register(
            "store_flush_duration_seconds",
            "Time one commitlog flush (msync) took",
            self.flush_duration.clone(),
        );
        r.register(
            "store_recovery_duration_seconds",
            "Time opening (and recovering) the commitlog took at start-up",
            self.recovery_duration_seconds.clone(),
        );
        r.register(
            "store_recovery_clean",
            "1 when the last start found a clean stop (no recovery scan), else 0",
            self.recovery_clean.clone(),
        );
        r.register(
            "store_recovery_scanned_bytes",
            "Bytes the start-up recovery scan decoded (0 after a clean stop)",
            self.recovery_scanned_bytes.clone(),
        );
        r.register(
            "data_dir_size_bytes",
            "Disk space used by the files under node.data-dir, in bytes (as du counts it)",
            self.data_dir_bytes.clone(),
        );
        r.register(
            "data_fs_used_ratio",
            "Fraction of the file system holding node.data-dir in use, as df computes it",
            self.disk_used_ratio.clone(),
        );
        r.register(
            "data_fs_max_used_ratio",
            "store.disk-max-used-ratio: above it retention deletes the oldest segments early",
            self.disk_max_used_ratio.clone(),
        );
    }

    /// Records one answered put: its mode (`"sync"` or `"async"`), its RocketMQ status
    /// (`"PUT_OK"`, ...) and how long it took.
    pub fn observe_put(&self, mode: &str, status: &str, latency: Duration) {
        self.puts.get_or_create(&StatusLabels { status: status.to_owned() }).inc();
        self.put_duration
            .get_or_create(&ModeLabels { mode: mode.to_owned() })
            .observe(latency.as_secs_f64());
    }

    /// Records one commitlog flush.
    pub fn observe_flush(&self, latency: Duration) {
        self.flush_duration.observe(latency.as_secs_f64());
    }

    /// Records how long opening (recovering) the commitlog took at start-up.
    pub fn set_recovery_duration(&self, duration: Duration) {
        self.recovery_duration_seconds.set(duration.as_secs_f64());
    }

    /// Copies the node's current state into the snapshot families.
    pub fn refresh(&self, node: &Node) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh_locked(&mut state, node);
    }

    /// The registry as text, without refreshing.
    pub fn encode(&self, format: Format) -> String {
        let _state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.encode_locked(format)
    }

    /// Refreshes from `node`, then encodes: what a scrape answers.
    pub fn render(&self, node: &Node, format: Format) -> String {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh_locked(&mut state, node);
        self.encode_locked(format)
    }

    fn encode_locked(&self, format: Format) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let r = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        // Writing to a String cannot fail; an encoder error would be a bug in a label.
        if let Err(e) = r {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }

    fn refresh_locked(&self, state: &mut RefreshState, node: &Node) {
        let s = node.status();
        let config = node.config();
        let gap = config.replication.max_gap_not_in_sync.0;

        self.build_info.clear();
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                node: s.node_name.clone(),
            })
            .set(1);
        for (role, name) in [(Role::Master, "master"), (Role::Slave, "slave")] {
            self.role
                .get_or_create(&RoleLabels { role: name.into() })
                .set(i64::from(s.role == role));
        }
        self.epoch.set(gauge_u64(s.epoch));
        self.fenced.set(i64::from(s.fenced));
        for (mode, name) in [(ReplicationMode::Sync, "sync"), (ReplicationMode::Async, "async")] {
            self.replication_mode
                .get_or_create(&ModeLabels { mode: name.into() })
                .set(i64::from(s.mode == mode));
        }
        self.sync_ack_replicas.set(gauge_u64(s.sync_ack_replicas as u64));
        self.min_offset.set(gauge_u64(s.min_offset));
        self.max_offset.set(gauge_u64(s.max_offset));
        self.flushed_offset.set(gauge_u64(s.flushed_offset));
        self.confirm_offset.set(gauge_u64(s.confirm_offset));
        self.connected_replicas.set(gauge_u64(s.slaves.len() as u64));
        self.in_sync_replicas.set(gauge_u64(s.in_sync_replicas as u64));

        // Per replica: cleared and re-filled, so a disconnected replica's series disappear.
        self.replica_ack_offset.clear();
        self.replica_lag_bytes.clear();
        self.replica_lag_seconds.clear();
        self.replica_in_sync.clear();
        for r in &s.slaves {
            let l = AddressLabels { address: r.address.to_string() };
            self.replica_ack_offset.get_or_create(&l).set(gauge_u64(r.ack_offset));
            self.replica_lag_bytes.get_or_create(&l).set(gauge_u64(r.lag_bytes));
            self.replica_lag_seconds.get_or_create(&l).set(r.lag_millis as f64 / 1000.0);
            let in_sync = crate::ha::progress::is_in_sync(s.max_offset, r.ack_offset, gap);
            self.replica_in_sync.get_or_create(&l).set(i64::from(in_sync));
        }

        let now_ms = now_millis();
        let since_start = self.created.elapsed().as_secs_f64();
        let age = |unix_ms: i64| {
            if unix_ms <= 0 { since_start } else { (now_ms - unix_ms).max(0) as f64 / 1000.0 }
        };
        self.master_link_up.clear();
        self.master_link_lag_bytes.clear();
        self.master_link_last_frame_age_seconds.clear();
        if let Some(link) = &s.master_link {
            let l = MasterLabels { master: link.address.clone() };
            self.master_link_up.get_or_create(&l).set(i64::from(link.connected));
            if let Some(m) = link.master_max_offset {
                self.master_link_lag_bytes
                    .get_or_create(&l)
                    .set(gauge_u64(m.saturating_sub(s.max_offset)));
            }
            self.master_link_last_frame_age_seconds
                .get_or_create(&l)
                .set(age(link.last_frame_unix_ms));
        }

        let master = node.master();
        self.ha_connections
            .set(master.as_ref().map_or(0, |m| gauge_u64(m.connection_count() as u64)));
        follow(&mut state.master, master.as_ref(), |last, m| {
            let c = m.counters();
            advance(
                &self.ha_connections_opened,
                last,
                "accepted",
                c.accepted.load(Ordering::Relaxed),
            );
            advance(
                &self.ha_sent_frames,
                last,
                "frames_sent",
                c.frames_sent.load(Ordering::Relaxed),
            );
            advance(&self.ha_sent_bytes, last, "bytes_sent", c.bytes_sent.load(Ordering::Relaxed));
            advance(
                &self.ha_received_bytes,
                last,
                "bytes_received",
                c.bytes_received.load(Ordering::Relaxed),
            );
            let closed = c.closed();
            for reason in CLOSE_REASONS {
                let counter = self
                    .ha_connections_closed
                    .get_or_create_owned(&ReasonLabels { reason: reason.as_str().into() });
                let n = closed.get(&reason).copied().unwrap_or(0);
                advance(&counter, last, reason.as_str(), n);
            }
        });
        follow(&mut state.slave, node.slave().as_ref(), |last, slave| {
            let link = slave.status();
            advance(&self.ha_received_bytes, last, "bytes_received", link.bytes_received);
            advance(&self.ha_received_frames, last, "frames_received", link.frames_received);
            advance(&self.slave_reconnects, last, "reconnects", link.reconnects);
        });
        follow(&mut state.puller, node.puller().as_ref(), |last, puller| {
            let p = puller.status();
            for (outcome, n) in [("ok", p.pulls_ok), ("failed", p.pulls_failed)] {
                let counter = self
                    .metadata_pulls
                    .get_or_create_owned(&OutcomeLabels { outcome: outcome.into() });
                advance(&counter, last, outcome, n);
            }
        });
        self.metadata_lag_seconds.clear();
        if let Some(p) = &s.metadata_pull {
            self.metadata_lag_seconds
                .get_or_create(&MasterLabels { master: p.master.clone() })
                .set(age(p.last_success_unix_ms));
        }

        let report = node.store().recovery_report();
        self.recovery_clean.set(i64::from(report.clean));
        self.recovery_scanned_bytes.set(gauge_u64(report.scanned_bytes));

        let dir = &config.node.data_dir;
        self.data_dir_bytes.set(gauge_u64(dir_usage_bytes(dir)));
        match crate::store::retention::disk_used_ratio(dir) {
            Ok(r) => self.disk_used_ratio.set(r),
            Err(e) => {
                tracing::debug!(error = %e, "data dir file system usage unknown");
                self.disk_used_ratio.set(f64::NAN)
            }
        };
        self.disk_max_used_ratio.set(config.store.disk_max_used_ratio);
    }
}

fn gauge_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Bytes allocated on disk by the files under `dir` (as `du` counts them: sparse and
/// preallocated segment files count what they occupy). Unreadable entries count 0.
pub fn dir_usage_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total = total.saturating_add(meta.blocks().saturating_mul(512));
            }
        }
    }
    total
}

/// Serves `GET /metrics` (each scrape refreshes from `node` first) on `listener` until `cancel`
/// fires; anything else is 404. Prometheus text 0.0.4 unless the scraper's `Accept` asks for
/// OpenMetrics.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    node: Arc<Node>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(move |headers: HeaderMap| scrape(Arc::clone(&metrics), Arc::clone(&node), headers)),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found; metrics are at /metrics\n") });
    axum::serve(listener, app).with_graceful_shutdown(cancel.cancelled_owned()).await
}

async fn scrape(metrics: Arc<Metrics>, node: Arc<Node>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::from_accept(accept);
    // The refresh walks the data dir and calls statvfs: off the async workers.
    match tokio::task::spawn_blocking(move || metrics.render(&node, format)).await {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "metrics scrape failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "metrics scrape failed\n").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_grow_by_deltas_and_keep_a_retired_sources_last_increments() {
        let counter = Counter::default();
        let mut slot: Option<Seen<AtomicU64>> = None;
        let count = |last: &mut HashMap<&'static str, u64>, src: &AtomicU64| {
            advance(&counter, last, "x", src.load(Ordering::Relaxed))
        };
        let first = Arc::new(AtomicU64::new(5));
        follow(&mut slot, Some(&first), count);
        first.store(7, Ordering::Relaxed);
        follow(&mut slot, Some(&first), count);
        assert_eq!(counter.get(), 7);
        // The same source going backwards (never expected) adds nothing.
        first.store(6, Ordering::Relaxed);
        follow(&mut slot, Some(&first), count);
        assert_eq!(counter.get(), 7);
        // The source is replaced after growing 6 -> 9: those 3 count, then the new one from 0.
        first.store(9, Ordering::Relaxed);
        let second = Arc::new(AtomicU64::new(3));
        drop(first);
        follow(&mut slot, Some(&second), count);
        assert_eq!(counter.get(), 7 + 3 + 3);
        // The source goes away (a role without it): its last increment still counts.
        second.store(4, Ordering::Relaxed);
        follow(&mut slot, None, count);
        assert_eq!(counter.get(), 14);
        assert!(slot.is_none());
        follow(&mut slot, None, count);
        assert_eq!(counter.get(), 14);
    }

    #[test]
    fn accept_header_picks_the_format() {
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(Format::from_accept(Some("text/plain;version=0.0.4")), Format::Prometheus);
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text;version=1.0.0,*/*;q=0.1")),
            Format::OpenMetrics
        );
    }

    #[test]
    fn put_and_flush_observations_are_encoded() {
        let m = Metrics::new();
        m.observe_put("sync", "PUT_OK", Duration::from_millis(3));
        m.observe_put("sync", "FLUSH_SLAVE_TIMEOUT", Duration::from_secs(5));
        m.observe_flush(Duration::from_micros(700));
        m.set_recovery_duration(Duration::from_millis(1500));
        let text = m.encode(Format::Prometheus);
        for line in [
            "hasync_puts_total{status=\"PUT_OK\"} 1\n",
            "hasync_puts_total{status=\"FLUSH_SLAVE_TIMEOUT\"} 1\n",
            "hasync_puts_total{status=\"SLAVE_NOT_AVAILABLE\"} 0\n",
            "hasync_put_duration_seconds_count{mode=\"sync\"} 2\n",
            "hasync_put_duration_seconds_count{mode=\"async\"} 0\n",
            "hasync_store_flush_duration_seconds_count 1\n",
            "hasync_store_recovery_duration_seconds 1.5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn dir_usage_counts_allocated_bytes() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(dir_usage_bytes(dir.path()), 0);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/f"), vec![1u8; 10_000]).unwrap();
        assert!(dir_usage_bytes(dir.path()) >= 10_000);
        assert_eq!(dir_usage_bytes(&dir.path().join("missing")), 0);
    }
}
