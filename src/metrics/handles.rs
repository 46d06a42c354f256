//! What the node hands to the metrics: counter handles it increments, and the [`Snapshot`] of
//! values the gauges show at a scrape. Plain types: nothing here reads the node.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{OutcomeLabels, ReasonLabels};
use crate::config::{ReplicationMode, Role};

/// Counter handles of the HA data plane. Every master and slave a node runs gets a clone at
/// construction and increments it as it goes, so the exported totals survive role changes.
/// Cloning shares the counters; a default one is registered nowhere (tests, benches).
#[derive(Debug, Clone, Default)]
pub(crate) struct HaCounters {
    /// Body bytes a master sent.
    pub(crate) sent_bytes: Counter,
    /// Frames a master sent, heartbeats included.
    pub(crate) sent_frames: Counter,
    /// Bytes received: a master's slave reports, a slave's frame bodies.
    pub(crate) received_bytes: Counter,
    /// Frames a slave received.
    pub(crate) received_frames: Counter,
    /// Connections accepted on the HA port (including ones refused right away).
    pub(crate) connections_opened: Counter,
    /// Connection attempts a slave made after the first.
    pub(crate) slave_reconnects: Counter,
    pub(super) connections_closed: Family<ReasonLabels, Counter>,
}

impl HaCounters {
    /// The counter of connections closed on the HA port for `reason` (one of [`super::CLOSE_REASONS`]).
    pub fn closed(&self, reason: &str) -> Counter {
        self.connections_closed.get_or_create_owned(&ReasonLabels { reason: reason.to_owned() })
    }
}

/// Counter handles of the metadata pull loop (a slave's), by outcome.
#[derive(Debug, Clone, Default)]
pub(crate) struct PullCounters {
    pub(super) pulls: Family<OutcomeLabels, Counter>,
}

impl PullCounters {
    /// Counts one pull: `ok` when it completed.
    pub(crate) fn record(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.pulls.get_or_create(&OutcomeLabels { outcome: outcome.into() }).inc();
    }

    /// Pulls counted with this outcome so far.
    pub(crate) fn get(&self, ok: bool) -> u64 {
        let outcome = if ok { "ok" } else { "failed" };
        self.pulls.get_or_create(&OutcomeLabels { outcome: outcome.into() }).get()
    }
}

/// One connected replica, as a master's gauges show it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplicaGauges {
    /// The slave's connection address (the `address` label).
    pub(crate) address: String,
    /// Highest offset it acknowledged.
    pub(crate) ack_offset: u64,
    /// Bytes the master holds that it has not acknowledged.
    pub(crate) lag_bytes: u64,
    /// Age of the oldest byte it has not acknowledged, in milliseconds.
    pub(crate) lag_millis: u64,
    /// Whether it is in sync (as `ha::progress::is_in_sync` decided for the status).
    pub(crate) in_sync: bool,
    /// What it counts as for acks (the `identity` label of `replica_info`).
    pub(crate) identity: String,
    /// The node name it registered (the `node_name` label; empty when unregistered).
    pub(crate) node_name: String,
}

/// A slave's link to its master, as its gauges show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkGauges {
    /// The master's HA address (the `master` label).
    pub(crate) master: String,
    /// Whether a connection is up.
    pub(crate) connected: bool,
    /// The master's max offset as last heard.
    pub(crate) master_max_offset: Option<u64>,
    /// Unix ms of the last frame received (0 before the first).
    pub(crate) last_frame_unix_ms: i64,
}

/// A slave's metadata pull loop, as its gauge shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PullGauges {
    /// The master's gRPC address (the `master` label).
    pub(crate) master: String,
    /// Unix ms of the last successful pull (0 before the first).
    pub(crate) last_success_unix_ms: i64,
}

/// The store and its disk, as the gauges show them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StoreGauges {
    /// Whether the last start found a clean stop.
    pub(crate) recovery_clean: bool,
    /// Bytes the start-up recovery scan decoded.
    pub(crate) recovery_scanned_bytes: u64,
    /// Disk space used under the data dir, in bytes.
    pub(crate) data_dir_bytes: u64,
    /// Fraction of the data dir's file system in use (`None` when unknown).
    pub(crate) data_fs_used_ratio: Option<f64>,
    /// `store.disk-max-used-ratio`.
    pub(crate) data_fs_max_used_ratio: f64,
    /// A write fails now because the disk is full.
    pub(crate) disk_full: bool,
    /// Writes that failed since the start (never decreases).
    pub(crate) disk_write_errors: u64,
    /// The background scrub.
    pub(crate) scrub: super::ScrubGauges,
    /// Bytes of truncated tails kept aside since the data directory exists (never decreases).
    pub(crate) truncated_bytes: u64,
    /// Tail files present now.
    pub(crate) truncated_files: u64,
}

/// Everything the gauges show, as one value the node fills at scrape time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// `node.name` (the `node` label of `build_info`).
    pub(crate) node_name: String,
    /// The role in force.
    pub(crate) role: Role,
    /// The role epoch.
    pub(crate) epoch: u64,
    /// Whether puts are refused until a ChangeRole confirms the role.
    pub(crate) fenced: bool,
    /// The replication mode in force.
    pub(crate) mode: ReplicationMode,
    /// `k`.
    pub(crate) sync_ack_replicas: usize,
    /// First stored offset.
    pub(crate) min_offset: u64,
    /// End of the valid data.
    pub(crate) max_offset: u64,
    /// Everything below is durable.
    pub(crate) flushed_offset: u64,
    /// Highest offset `k` live slaves acked.
    pub(crate) confirm_offset: u64,
    /// Connected slaves in sync.
    pub(crate) in_sync_replicas: usize,
    /// One entry per connected slave (a master's).
    pub(crate) replicas: Vec<ReplicaGauges>,
    /// Slave connections open on a master (replicas and connections before their first report).
    pub(crate) ha_connections: usize,
    /// The link to the master (a slave's).
    pub(crate) master_link: Option<LinkGauges>,
    /// The metadata pull loop (a slave's).
    pub(crate) metadata_pull: Option<PullGauges>,
    /// The store and its disk.
    pub(crate) store: StoreGauges,
}

/// What [`super::serve`] asks for a [`Snapshot`] at every scrape (the node implements it). Called off
/// the async workers: it may walk the data dir.
pub(crate) trait Source: Send + Sync + 'static {
    /// The values of the gauges, as of now.
    fn snapshot(&self) -> Snapshot;
}
