//! One snapshot of everything the control plane reports about a node, and its conversion to
//! the metrics' gauges.

use std::path::Path;

use crate::config::{ReplicationMode, Role};
use crate::ha::status::{MasterLinkStatus, ReplicaStatus};
use crate::node::Node;

/// The node's status (GetStatus, `hasync status`, metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStatus {
    /// Node name.
    pub node_name: String,
    /// This data directory's random id (what a slave registers with its master).
    pub data_dir_id: String,
    /// Current role.
    pub role: Role,
    /// Current epoch.
    pub epoch: u64,
    /// Entries in the epoch history.
    pub epoch_history_length: usize,
    /// Puts refused until a ChangeRole confirms the role.
    pub fenced: bool,
    /// The epoch promised to a fence (0: none); fenced while it is above the role's epoch.
    pub promised_epoch: u64,
    /// The names of the voters whose acks count (`Node::set_voters`); empty when every
    /// replica counts (`voters_set` tells an empty set from none).
    pub voters: Vec<String>,
    /// Whether a voter set is in force (coordinator mode; possibly empty: then no ack counts).
    pub voters_set: bool,
    /// Replication mode (meaningful on a master).
    pub mode: ReplicationMode,
    /// `k`.
    pub sync_ack_replicas: usize,
    /// First stored offset.
    pub min_offset: u64,
    /// End of the valid data.
    pub max_offset: u64,
    /// Everything below is durable.
    pub flushed_offset: u64,
    /// Highest offset `k` live slaves acked; never decreases.
    pub confirm_offset: u64,
    /// Where Read stops by default (see `node::readable`).
    pub readable_offset: u64,
    /// SYNC puts waiting for slave acks (a master's).
    pub pending_sync_puts: usize,
    /// Slaves connected and within the in-sync gap.
    pub in_sync_replicas: usize,
    /// One entry per replica (a master's).
    pub slaves: Vec<ReplicaStatus>,
    /// The link to the master (a slave's).
    pub master_link: Option<MasterLinkStatus>,
    /// The metadata versions held.
    pub metadata_versions: [(crate::metadata::Table, crate::metadata::DataVersion); 4],
    /// The metadata pull loop (a slave's).
    pub metadata_pull: Option<crate::metadata::pull::PullStatus>,
    /// A role change running or failed (None once the last one completed).
    pub role_change: Option<crate::node::role::RoleChange>,
    /// Which kinds of write fail now, and whether the disk is full.
    pub disk: crate::store::disk::DiskStatus,
    /// The background scrub of sealed segments: progress and damage found.
    pub scrub: crate::store::ScrubStatus,
    /// Bytes of truncated tails kept aside under `<data-dir>/truncated/` since the data
    /// directory exists (tail files retention removed since included).
    pub truncated_bytes: u64,
    /// Tail files present under `<data-dir>/truncated/` now.
    pub truncated_files: u64,
}

/// The node's epochs as one snapshot (GetEpochHistory, a slave's epoch check of this node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EpochSnapshot {
    /// The role.
    pub(crate) role: Role,
    /// The epoch in force.
    pub(crate) epoch: u64,
    /// The epoch history.
    pub(crate) history: crate::node::epoch::EpochHistory,
    /// The max offset.
    pub(crate) max_offset: u64,
}

impl Node {
    /// Role, epoch, epoch history and max offset read under the role-state lock (the history's
    /// lock nested inside, in the node's lock order), so they never straddle a role change
    /// (which changes them under the same locks).
    pub(crate) fn epoch_snapshot(&self) -> EpochSnapshot {
        let st = self.state();
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner()).clone();
        EpochSnapshot {
            role: st.role,
            epoch: st.epoch,
            history,
            max_offset: self.store.max_offset(),
        }
    }

    /// A snapshot of the node's status: the role-dependent part is read under the role-state
    /// lock (the epoch history's lock nested inside, in the node's lock order), so it never
    /// straddles a role change.
    pub fn status(&self) -> NodeStatus {
        self.status_with_connections().0
    }

    /// The status and the master's open HA connections, from the same data plane.
    fn status_with_connections(&self) -> (NodeStatus, usize) {
        let (role, epoch, r, master, slave, puller, waiters, history_len, role_change, voters) = {
            let st = self.state();
            let history_len =
                self.history.lock().unwrap_or_else(|e| e.into_inner()).entries().len();
            (
                st.role,
                st.epoch,
                st.replication,
                st.master.clone(),
                st.slave.clone(),
                st.puller.clone(),
                std::sync::Arc::clone(&st.waiters),
                history_len,
                st.role_change.clone(),
                st.voters.clone(),
            )
        };
        let fenced = self.fenced();
        let tails = self.store.tail_status();
        let max = self.store.max_offset();
        let connections = master.as_ref().map_or(0, |m| m.connection_count());
        let slaves = master.map(|m| m.replicas()).unwrap_or_default();
        let status = NodeStatus {
            node_name: self.config.node.name.clone(),
            data_dir_id: self.data_dir_id.clone(),
            role,
            epoch,
            epoch_history_length: history_len,
            fenced,
            promised_epoch: self.promised_epoch(),
            voters_set: voters.is_some(),
            voters: voters.unwrap_or_default().into_iter().map(|(name, _)| name).collect(),
            mode: r.mode,
            sync_ack_replicas: r.sync_ack_replicas,
            min_offset: self.store.min_offset(),
            max_offset: max,
            flushed_offset: self.store.flushed_offset(),
            // The master term's table; a slave has none of its own (its readable end uses the
            // confirm offset it learned, kept by the store).
            confirm_offset: if role == Role::Master { waiters.confirm_offset() } else { 0 },
            readable_offset: super::readable::readable_end(
                self.readable_mode(role, r.mode),
                &self.store,
            ),
            pending_sync_puts: waiters.pending_count(),
            in_sync_replicas: slaves.iter().filter(|r| r.in_sync && r.voter).count(),
            slaves,
            master_link: slave.map(|s| s.status()),
            metadata_versions: self.metadata.versions(),
            metadata_pull: puller.map(|p| p.status()),
            role_change,
            disk: self.store.disk().status(),
            scrub: self.store.scrub_status(),
            truncated_bytes: tails.bytes_total,
            truncated_files: tails.files,
        };
        (status, connections)
    }
}

impl Node {
    /// Whether the node fulfils its role, and why not: a master that can answer SYNC puts
    /// with PUT_OK (enough in-sync slaves) or runs ASYNC; a slave connected to its master and
    /// within the in-sync gap of it.
    pub(crate) fn fulfils_role(&self) -> (bool, String) {
        if !self.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            return (false, "shutting down".into());
        }
        let s = self.status();
        let gap = self.config.replication.max_gap_not_in_sync.0;
        if let Some(c) = &s.role_change {
            return (
                false,
                match c.state {
                    crate::node::role::RoleChangeState::Changing => "changing role".into(),
                    crate::node::role::RoleChangeState::Failed => {
                        format!("role change failed at step \"{}\": {}", c.failed_step, c.error)
                    }
                },
            );
        }
        if s.fenced && s.promised_epoch > s.epoch {
            return (
                false,
                format!(
                    "fenced: promised epoch {} to a fence, until a ChangeRole at it or above",
                    s.promised_epoch
                ),
            );
        }
        if s.fenced {
            return (false, "fenced until a ChangeRole confirms the role".into());
        }
        match (s.role, &s.master_link) {
            (Role::Master, _) if s.mode == ReplicationMode::Async => (true, "master, ASYNC".into()),
            (Role::Master, _) if s.in_sync_replicas >= s.sync_ack_replicas => {
                (true, format!("master, SYNC, {} in-sync slave(s)", s.in_sync_replicas))
            }
            (Role::Master, _) => (
                false,
                format!(
                    "master in SYNC mode with {} in-sync slave(s), needs {}",
                    s.in_sync_replicas, s.sync_ack_replicas
                ),
            ),
            (Role::Slave, Some(link)) if !link.connected => {
                (false, "slave not connected to its master".into())
            }
            (Role::Slave, Some(link)) => match link.master_max_offset {
                Some(m) if crate::ha::progress::is_in_sync(m, s.max_offset, gap) => {
                    (true, "slave in sync".into())
                }
                Some(m) => {
                    (false, format!("slave is {} bytes behind its master", m - s.max_offset))
                }
                None => (false, "slave has not heard from its master yet".into()),
            },
            (Role::Slave, None) => (false, "slave without a master link".into()),
        }
    }
}

impl crate::metrics::Source for Node {
    fn snapshot(&self) -> crate::metrics::Snapshot {
        let (status, ha_connections) = self.status_with_connections();
        let report = self.store.recovery_report();
        let dir = &self.config.node.data_dir;
        let used_ratio = crate::store::retention::disk_used_ratio(dir)
            .inspect_err(|e| tracing::debug!(error = %e, "data dir file system usage unknown"))
            .ok();
        let store = crate::metrics::StoreGauges {
            recovery_clean: report.clean,
            recovery_scanned_bytes: report.scanned_bytes,
            data_dir_bytes: dir_usage_bytes(dir),
            data_fs_used_ratio: used_ratio,
            data_fs_max_used_ratio: self.config.store.disk_max_used_ratio,
            disk_full: status.disk.full,
            disk_write_errors: status.disk.failed_writes,
            scrub: scrub_gauges(&status.scrub),
            truncated_bytes: status.truncated_bytes,
            truncated_files: status.truncated_files,
        };
        metrics_snapshot(status, ha_connections, store)
    }
}

/// The scrub's gauges from its status.
fn scrub_gauges(s: &crate::store::ScrubStatus) -> crate::metrics::ScrubGauges {
    crate::metrics::ScrubGauges {
        rate_bytes_per_sec: s.rate_bytes_per_sec,
        passes: s.passes,
        segments_checked: s.segments_checked,
        bytes_checked: s.bytes_checked,
        damaged_segments: s.damaged_segments,
        last_pass_unix_ms: s.last_pass_unix_ms,
    }
}

/// The gauges' values: the status, plus what the status does not carry.
fn metrics_snapshot(
    s: NodeStatus,
    ha_connections: usize,
    store: crate::metrics::StoreGauges,
) -> crate::metrics::Snapshot {
    use crate::metrics::{LinkGauges, PullGauges, ReplicaGauges};
    crate::metrics::Snapshot {
        replicas: s
            .slaves
            .iter()
            .map(|r| ReplicaGauges {
                address: r.address.to_string(),
                ack_offset: r.ack_offset,
                lag_bytes: r.lag_bytes,
                lag_millis: r.lag_millis,
                in_sync: r.in_sync,
                identity: r.identity.clone(),
                node_name: r.node_name.clone(),
            })
            .collect(),
        master_link: s.master_link.map(|l| LinkGauges {
            master: l.address,
            connected: l.connected,
            master_max_offset: l.master_max_offset,
            last_frame_unix_ms: l.last_frame_unix_ms,
        }),
        metadata_pull: s
            .metadata_pull
            .map(|p| PullGauges { master: p.master, last_success_unix_ms: p.last_success_unix_ms }),
        node_name: s.node_name,
        role: s.role,
        epoch: s.epoch,
        fenced: s.fenced,
        mode: s.mode,
        sync_ack_replicas: s.sync_ack_replicas,
        min_offset: s.min_offset,
        max_offset: s.max_offset,
        flushed_offset: s.flushed_offset,
        confirm_offset: s.confirm_offset,
        in_sync_replicas: s.in_sync_replicas,
        ha_connections,
        store,
    }
}

/// Bytes allocated on disk by the files under `dir` (as `du` counts them: sparse and
/// preallocated segment files count what they occupy). Unreadable entries count 0.
pub(crate) fn dir_usage_bytes(dir: &Path) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
