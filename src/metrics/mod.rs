//! Prometheus metrics: one [`Metrics`] per node (an explicit prometheus-client `Registry`, no
//! global state but the log writer's counters, so a master and a slave can run in one process), served as text at `/metrics`
//! by [`serve`] on its own small HTTP/1.1 listener (`metrics.listen`). A standalone controller
//! has a small registry of its own, [`ControllerMetrics`], served by [`serve_controller`].
//! A node's listener also serves the cluster console ([`console`]: a read-only page at `/`
//! and its data under `/console/`) from a feed its caller gives.
//!
//! A leaf: it imports nothing of the node, the data plane or the store (only `config`'s enums).
//! Three kinds of values:
//!
//! - Counter handles that the code seeing the event increments directly: [`HaCounters`] (the HA
//!   data plane: a master and a slave get a clone at construction, so the totals survive role
//!   changes) and [`PullCounters`] (the metadata pull loop).
//! - Events recorded through [`Metrics`]: [`Metrics::observe_put`], [`Metrics::observe_flush`],
//!   [`Metrics::set_recovery_duration`].
//! - Gauges copied from a [`Snapshot`] at scrape time by [`Metrics::render`]: a plain value the
//!   node fills (offsets, replicas, lag, the master link, disk usage) and hands over through
//!   [`Source`]. Per-replica and per-link series are cleared and re-filled, so a replica that
//!   disconnected disappears.
//!
//! Every name has the `hasync_` prefix and its unit in base units (`_bytes`, `_seconds`,
//! `_ratio`); counters are registered without `_total`, which the encoder appends.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

pub mod console;
pub(crate) mod coordinator;
pub mod feed;
mod handles;
pub(crate) mod listener;
mod ops;
mod scrub;
mod standalone;

pub(crate) use handles::HaCounters;
pub(crate) use handles::{
    LinkGauges, PullCounters, PullGauges, ReplicaGauges, Snapshot, Source, StoreGauges,
};
pub(crate) use ops::{GrpcConnMetrics, log_counters};
pub(crate) use scrub::ScrubGauges;
pub(crate) use standalone::ControllerMetrics;

/// Content type of the Prometheus text format 0.0.4 (the default answer).
pub const PROMETHEUS_TEXT: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// Content type of the OpenMetrics text format (answered when the scraper asks for it).
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every reason the master closes a slave connection (the `reason` label values, pre-created at
/// 0). `ha::status::CloseReason::as_str` gives exactly these; a test there pins it.
pub(crate) const CLOSE_REASONS: [&str; 11] = [
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
];

/// The put statuses pre-created at 0, so rates and ratios exist before the first failure.
pub(crate) const PUT_STATUSES: [&str; 6] = [
    "PUT_OK",
    "FLUSH_DISK_TIMEOUT",
    "FLUSH_SLAVE_TIMEOUT",
    "SLAVE_NOT_AVAILABLE",
    "SERVICE_NOT_AVAILABLE",
    "MESSAGE_ILLEGAL",
];

/// The text formats [`Metrics::encode`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Prometheus text 0.0.4 ([`PROMETHEUS_TEXT`]).
    Prometheus,
    /// OpenMetrics 1.0 text ([`OPENMETRICS_TEXT`]), ending in `# EOF`.
    OpenMetrics,
}

impl Format {
    /// The format a scraper asks for in its `Accept` header: OpenMetrics when it names it,
    /// else the Prometheus text format.
    pub(crate) fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// The `Content-Type` of the format.
    pub(crate) fn content_type(self) -> &'static str {
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
struct ReplicaInfoLabels {
    address: String,
    identity: String,
    node_name: String,
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

fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The metrics of one node.
pub(crate) struct Metrics {
    registry: Registry,
    /// Serialises refresh + encode, so two scrapes never see a half-filled family.
    scrape: Mutex<()>,
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
    replica_info: Family<ReplicaInfoLabels, Gauge>,

    master_link_up: Family<MasterLabels, Gauge>,
    master_link_lag_bytes: Family<MasterLabels, Gauge>,
    master_link_last_frame_age_seconds: Family<MasterLabels, FloatGauge>,

    puts: Family<StatusLabels, Counter>,
    put_duration: Family<ModeLabels, Histogram, fn() -> Histogram>,

    ha: HaCounters,
    ha_connections: Gauge,

    pulls: PullCounters,
    metadata_lag_seconds: Family<MasterLabels, FloatGauge>,

    flush_duration: Histogram,
    recovery_duration_seconds: FloatGauge,
    recovery_clean: Gauge,
    recovery_scanned_bytes: Gauge,

    data_dir_bytes: Gauge,
    disk_used_ratio: FloatGauge,
    disk_max_used_ratio: FloatGauge,
    disk_full: Gauge,
    disk_write_errors: Counter,
    truncated_bytes: Counter,
    truncated_files: Gauge,

    scrub: scrub::ScrubMetrics,

    grpc: GrpcConnMetrics,

    coordinator: coordinator::CoordinatorMetrics,
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
    /// snapshot values at 0 until the first [`render`](Metrics::render).
    pub(crate) fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("hasync"),
            scrape: Mutex::default(),
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
            replica_info: Family::default(),
            master_link_up: Family::default(),
            master_link_lag_bytes: Family::default(),
            master_link_last_frame_age_seconds: Family::default(),
            puts: Family::default(),
            put_duration: Family::new_with_constructor(put_histogram as fn() -> Histogram),
            ha: HaCounters::default(),
            ha_connections: Gauge::default(),
            pulls: PullCounters::default(),
            metadata_lag_seconds: Family::default(),
            flush_duration: flush_histogram(),
            recovery_duration_seconds: FloatGauge::default(),
            recovery_clean: Gauge::default(),
            recovery_scanned_bytes: Gauge::default(),
            data_dir_bytes: Gauge::default(),
            disk_used_ratio: FloatGauge::default(),
            disk_max_used_ratio: FloatGauge::default(),
            disk_full: Gauge::default(),
            disk_write_errors: Counter::default(),
            truncated_bytes: Counter::default(),
            truncated_files: Gauge::default(),
            scrub: scrub::ScrubMetrics::default(),
            grpc: GrpcConnMetrics::default(),
            coordinator: coordinator::CoordinatorMetrics::default(),
        };
        for s in PUT_STATUSES {
            let _ = m.puts.get_or_create(&StatusLabels { status: s.into() });
        }
        for r in CLOSE_REASONS {
            let _ = m.ha.closed(r);
        }
        for ok in [true, false] {
            let _ = m.pulls.get(ok);
        }
        for mode in ["sync", "async"] {
            let _ = m.put_duration.get_or_create(&ModeLabels { mode: mode.into() });
        }
        m.register_all();
        m
    }

    fn register_all(&mut self) {
        self.register_node();
        self.register_links();
        self.register_traffic();
        self.register_store();
        self.scrub.register(&mut self.registry);
        self.coordinator.register(&mut self.registry);
        ops::register(&mut self.registry, &self.grpc);
    }

    /// The node, its role and replication settings, its offsets.
    fn register_node(&mut self) {
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
    }

    /// Per-replica (a master's) and per-link (a slave's) gauges.
    fn register_links(&mut self) {
        let r = &mut self.registry;
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
            "replica_info",
            "Always 1, per slave connection address: what the replica counts as for acks \
             (identity, ha.replica-identity) and the node name it registered",
            self.replica_info.clone(),
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
    }

    /// Puts, the HA data plane and the metadata pull.
    fn register_traffic(&mut self) {
        let r = &mut self.registry;
        r.register("puts", "Put requests answered, by RocketMQ put status", self.puts.clone());
        r.register(
            "put_duration_seconds",
            "Time to answer a put, by replication mode (\"sync\" or \"async\")",
            self.put_duration.clone(),
        );
        r.register(
            "ha_sent_bytes",
            "Body bytes sent on the HA data plane (a master's frames to its slaves)",
            self.ha.sent_bytes.clone(),
        );
        r.register(
            "ha_sent_frames",
            "Frames sent on the HA data plane, heartbeats included (a master's)",
            self.ha.sent_frames.clone(),
        );
        r.register(
            "ha_received_bytes",
            "Bytes received on the HA data plane (a master: slave reports; a slave: frame bodies)",
            self.ha.received_bytes.clone(),
        );
        r.register(
            "ha_received_frames",
            "Frames received on the HA data plane (a slave's, from its master)",
            self.ha.received_frames.clone(),
        );
        r.register(
            "ha_connections_opened",
            "Connections accepted on the HA port (including ones refused right away, and those a node that is not the master closes at once)",
            self.ha.connections_opened.clone(),
        );
        r.register(
            "ha_connections_closed",
            "Connections closed on the HA port, by reason (not_master: by a node that is not the master)",
            self.ha.connections_closed.clone(),
        );
        r.register(
            "ha_connections",
            "Slave connections open on a master now",
            self.ha_connections.clone(),
        );
        r.register(
            "slave_reconnects",
            "Connection attempts a slave made to its master after the first",
            self.ha.slave_reconnects.clone(),
        );
        r.register(
            "metadata_pulls",
            "A slave's metadata pulls from its master, by outcome (\"ok\" or \"failed\")",
            self.pulls.pulls.clone(),
        );
        r.register(
            "metadata_lag_seconds",
            "Seconds since a slave's last successful metadata pull (since start if none yet)",
            self.metadata_lag_seconds.clone(),
        );
    }

    /// The store and its disk.
    fn register_store(&mut self) {
        let r = &mut self.registry;
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
        r.register(
            "disk_full",
            "1 while a write of the store fails because the disk (or quota) is full, else 0",
            self.disk_full.clone(),
        );
        r.register(
            "disk_write_errors",
            "Writes of the store (appends, segment preparation, flush and checkpoint, consumer \
             offsets) that failed, full disk or not",
            self.disk_write_errors.clone(),
        );
        r.register(
            "truncated_bytes",
            "Bytes a truncate removed from the commitlog and kept aside in tail files under \
             node.data-dir/truncated/ (a demoted master's divergent tail, a slave's cut at its \
             epoch check), since the data directory exists",
            self.truncated_bytes.clone(),
        );
        r.register(
            "truncated_files",
            "Tail files under node.data-dir/truncated/ now (store.truncated-retention and \
             store.truncated-max-bytes remove old ones)",
            self.truncated_files.clone(),
        );
    }

    /// Records one answered put: its mode (`"sync"` or `"async"`), its RocketMQ status
    /// (`"PUT_OK"`, ...) and how long it took.
    pub(crate) fn observe_put(&self, mode: &str, status: &str, latency: Duration) {
        self.puts.get_or_create(&StatusLabels { status: status.to_owned() }).inc();
        self.put_duration
            .get_or_create(&ModeLabels { mode: mode.to_owned() })
            .observe(latency.as_secs_f64());
    }

    /// Records one commitlog flush.
    pub(crate) fn observe_flush(&self, latency: Duration) {
        self.flush_duration.observe(latency.as_secs_f64());
    }

    /// Records how long opening (recovering) the commitlog took at start-up.
    pub(crate) fn set_recovery_duration(&self, duration: Duration) {
        self.recovery_duration_seconds.set(duration.as_secs_f64());
    }

    /// The HA data-plane counter handles (for a master or slave this node runs).
    /// Coordinator mode's handles (the member agent's and the controller's).
    pub(crate) fn coordinator(&self) -> coordinator::CoordinatorMetrics {
        self.coordinator.clone()
    }

    pub(crate) fn ha_counters(&self) -> HaCounters {
        self.ha.clone()
    }

    /// The gRPC port's connection counters (for the control plane's listener).
    pub(crate) fn grpc_connections(&self) -> GrpcConnMetrics {
        self.grpc.clone()
    }

    /// The metadata pull counter handles (for a slave's pull loop).
    pub(crate) fn pull_counters(&self) -> PullCounters {
        self.pulls.clone()
    }

    /// The registry as text, without refreshing.
    #[cfg(test)]
    pub(crate) fn encode(&self, format: Format) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.encode_locked(format)
    }

    /// Refreshes from `snapshot`, then encodes: what a scrape answers.
    pub(crate) fn render(&self, snapshot: &Snapshot, format: Format) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh_locked(snapshot);
        self.encode_locked(format)
    }

    fn encode_locked(&self, format: Format) -> String {
        encode_registry(&self.registry, format)
    }

    fn refresh_locked(&self, s: &Snapshot) {
        self.refresh_node(s);
        self.refresh_replicas(s);
        self.refresh_link(s);
        self.refresh_store(s);
    }

    fn refresh_node(&self, s: &Snapshot) {
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
        self.connected_replicas.set(gauge_u64(s.replicas.len() as u64));
        self.in_sync_replicas.set(gauge_u64(s.in_sync_replicas as u64));
        self.ha_connections.set(gauge_u64(s.ha_connections as u64));
    }

    /// Per replica: cleared and re-filled, so a disconnected replica's series disappear.
    fn refresh_replicas(&self, s: &Snapshot) {
        self.replica_ack_offset.clear();
        self.replica_lag_bytes.clear();
        self.replica_lag_seconds.clear();
        self.replica_in_sync.clear();
        self.replica_info.clear();
        for r in &s.replicas {
            let l = AddressLabels { address: r.address.clone() };
            self.replica_ack_offset.get_or_create(&l).set(gauge_u64(r.ack_offset));
            self.replica_lag_bytes.get_or_create(&l).set(gauge_u64(r.lag_bytes));
            self.replica_lag_seconds.get_or_create(&l).set(r.lag_millis as f64 / 1000.0);
            self.replica_in_sync.get_or_create(&l).set(i64::from(r.in_sync));
            let info = ReplicaInfoLabels {
                address: r.address.clone(),
                identity: r.identity.clone(),
                node_name: r.node_name.clone(),
            };
            self.replica_info.get_or_create(&info).set(1);
        }
    }

    /// Seconds since `unix_ms`, or since these metrics were created when it is 0 (never).
    fn age_seconds(&self, unix_ms: i64) -> f64 {
        if unix_ms <= 0 {
            self.created.elapsed().as_secs_f64()
        } else {
            (now_millis() - unix_ms).max(0) as f64 / 1000.0
        }
    }

    /// The master link and the metadata pull (a slave's), cleared and re-filled.
    fn refresh_link(&self, s: &Snapshot) {
        self.master_link_up.clear();
        self.master_link_lag_bytes.clear();
        self.master_link_last_frame_age_seconds.clear();
        if let Some(link) = &s.master_link {
            let l = MasterLabels { master: link.master.clone() };
            self.master_link_up.get_or_create(&l).set(i64::from(link.connected));
            if let Some(m) = link.master_max_offset {
                self.master_link_lag_bytes
                    .get_or_create(&l)
                    .set(gauge_u64(m.saturating_sub(s.max_offset)));
            }
            self.master_link_last_frame_age_seconds
                .get_or_create(&l)
                .set(self.age_seconds(link.last_frame_unix_ms));
        }
        self.metadata_lag_seconds.clear();
        if let Some(p) = &s.metadata_pull {
            self.metadata_lag_seconds
                .get_or_create(&MasterLabels { master: p.master.clone() })
                .set(self.age_seconds(p.last_success_unix_ms));
        }
    }

    fn refresh_store(&self, s: &Snapshot) {
        let s = &s.store;
        self.recovery_clean.set(i64::from(s.recovery_clean));
        self.recovery_scanned_bytes.set(gauge_u64(s.recovery_scanned_bytes));
        self.data_dir_bytes.set(gauge_u64(s.data_dir_bytes));
        self.disk_used_ratio.set(s.data_fs_used_ratio.unwrap_or(f64::NAN));
        self.disk_max_used_ratio.set(s.data_fs_max_used_ratio);
        self.disk_full.set(i64::from(s.disk_full));
        // A counter follows the store's own count (which never decreases).
        let seen = self.disk_write_errors.get();
        self.disk_write_errors.inc_by(s.disk_write_errors.saturating_sub(seen));
        let kept = self.truncated_bytes.get();
        self.truncated_bytes.inc_by(s.truncated_bytes.saturating_sub(kept));
        self.truncated_files.set(gauge_u64(s.truncated_files));
        self.scrub.refresh(&s.scrub);
    }
}

fn gauge_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Serves `GET /metrics` (each scrape refreshes from `source` first) on `listener` (bounded:
/// [`listener::Limited`]) until `cancel` fires, and the cluster console from `console` (None:
/// `/` and `/console/...` answer 404, [`console::OFF`]); anything else is 404. Prometheus
/// text 0.0.4 unless the scraper's `Accept` asks for OpenMetrics.
pub(crate) async fn serve<S: Source>(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    source: Arc<S>,
    console: Option<feed::Feed>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let render: Render = Arc::new(move |format| metrics.render(&source.snapshot(), format));
    serve_render(listener, render, console, cancel).await
}

/// Serves a standalone controller's registry at `/metrics` until `cancel` (the same server as
/// a node's).
pub(crate) async fn serve_controller(
    listener: tokio::net::TcpListener,
    metrics: Arc<ControllerMetrics>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let render: Render = Arc::new(move |format| metrics.encode(format));
    serve_render(listener, render, None, cancel).await
}

/// What a scrape answers, in a format.
type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

/// The metrics listener's routes: `/metrics` and the console's (see [`serve`]).
fn router(render: Render, console: Option<feed::Feed>, cancel: CancellationToken) -> Router {
    Router::new()
        .route("/metrics", get(move |headers: HeaderMap| scrape(Arc::clone(&render), headers)))
        .merge(console::routes(console, cancel))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found; metrics are at /metrics\n") })
}

async fn serve_render(
    listener: tokio::net::TcpListener,
    render: Render,
    console: Option<feed::Feed>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = router(render, console, cancel.clone());
    axum::serve(listener::Limited::new(listener), app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

/// A registry as text in `format`.
fn encode_registry(registry: &Registry, format: Format) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let r = match format {
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry),
    };
    // Writing to a String cannot fail; an encoder error would be a bug in a label.
    if let Err(e) = r {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    out
}

async fn scrape(render: Render, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::from_accept(accept);
    // A node's snapshot walks the data dir and calls statvfs: off the async workers.
    let render = move || render(format);
    match tokio::task::spawn_blocking(render).await {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "metrics scrape failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "metrics scrape failed\n").into_response()
        }
    }
}

#[cfg(test)]
mod tests;
