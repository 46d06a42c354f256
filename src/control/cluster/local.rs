//! `WatchTopology` on a node without a coordinator: its own group, as the node sees it.
//!
//! - The group is named `coordinator.group` (the node's name when that is empty); it has this
//!   node and, on a master, the slaves connected to it (by the name they registered with,
//!   their address otherwise). A slave does not know its master's name: the group's master is
//!   absent then, and the member it follows is shown by address (`following`).
//! - A snapshot first, then every sample interval: a CHANGE when the role, the epoch, the
//!   fence, the mode or k changed, a SAMPLE when only offsets or slaves moved. Revisions are
//!   0 (there is no coordinator; a resume always starts with a snapshot, flagged `resync`
//!   when the client asked for a revision).

use std::sync::Arc;

use tonic::Status;

use crate::config::{ReplicationMode, Role};
use crate::control::pb;
use crate::node::{Node, NodeStatus};

/// Updates buffered for a slow client.
const BUFFER: usize = 8;

/// Starts the stream's task; INVALID_ARGUMENT for a bad sample interval.
pub(super) fn start(
    node: Arc<Node>,
    req: pb::WatchTopologyRequest,
) -> Result<tokio::sync::mpsc::Receiver<pb::TopologyUpdate>, Status> {
    let every = super::topology_sample_interval(req.sample_interval_ms)
        .map_err(Status::invalid_argument)?;
    if req.from_revision < 0 {
        return Err(Status::invalid_argument(format!(
            "from_revision {} is negative (0: start with a snapshot)",
            req.from_revision
        )));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(BUFFER);
    let resync = (req.from_revision != 0).then(|| {
        format!(
            "this node runs without a coordinator: there are no revisions to resume from \
             (from_revision {}); a fresh snapshot",
            req.from_revision
        )
    });
    tokio::spawn(async move {
        let group = {
            let c = node.config();
            if c.coordinator.group.is_empty() {
                c.node.name.clone()
            } else {
                c.coordinator.group.clone()
            }
        };
        let mut last = group_of(&group, &node.status());
        let mut first = update(pb::TopologyUpdateKind::Snapshot, vec![last.clone()]);
        first.resync = resync.is_some();
        first.resync_reason = resync.unwrap_or_default();
        if tx.send(first).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tick.tick() => {}
            }
            let now = group_of(&group, &node.status());
            let kind = if shape(&now) != shape(&last) {
                pb::TopologyUpdateKind::Change
            } else if now != last {
                pb::TopologyUpdateKind::Sample
            } else {
                continue;
            };
            last = now.clone();
            if tx.send(update(kind, vec![now])).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

fn update(kind: pb::TopologyUpdateKind, groups: Vec<pb::GroupStatus>) -> pb::TopologyUpdate {
    pb::TopologyUpdate {
        kind: kind as i32,
        groups,
        coordinator_connected: true,
        time_unix_ms: crate::ha::status::now_millis(),
        ..Default::default()
    }
}

/// What a CHANGE is about: who is master, at which epoch, under which rule; each member's
/// role and fence.
#[derive(PartialEq)]
struct Shape {
    master: Option<String>,
    epoch: u64,
    mode: i32,
    k: u32,
    members: Vec<(String, i32, bool)>,
}

fn shape(g: &pb::GroupStatus) -> Shape {
    Shape {
        master: g.master.clone(),
        epoch: g.epoch,
        mode: g.mode,
        k: g.k,
        members: g.members.iter().map(|m| (m.name.clone(), m.role, m.fenced)).collect(),
    }
}

fn group_of(group: &str, s: &NodeStatus) -> pb::GroupStatus {
    let master = s.role == Role::Master;
    let mode = match s.mode {
        ReplicationMode::Sync => pb::ReplicationMode::Sync,
        ReplicationMode::Async => pb::ReplicationMode::Async,
    };
    let me = pb::ClusterMember {
        name: s.node_name.clone(),
        live: true,
        voter: true,
        role: if master { pb::Role::Master } else { pb::Role::Slave } as i32,
        epoch: s.epoch,
        max_offset: s.max_offset as i64,
        lag_bytes: master.then_some(0),
        promised_epoch: s.promised_epoch,
        fenced: s.fenced,
        confirm_offset: s.confirm_offset as i64,
        readable_end: s.readable_offset as i64,
        following: s.master_link.as_ref().map(|l| l.address.clone()).unwrap_or_default(),
        data_dir_id: s.data_dir_id.clone(),
        ..Default::default()
    };
    let mut members = vec![me];
    if master {
        members.extend(s.slaves.iter().map(|r| pb::ClusterMember {
            name: if r.node_name.is_empty() { r.address.to_string() } else { r.node_name.clone() },
            live: true,
            voter: r.voter,
            role: pb::Role::Slave as i32,
            max_offset: r.ack_offset as i64,
            lag_bytes: Some(r.lag_bytes as i64),
            in_sync: Some(r.in_sync),
            lag_ms: Some(r.lag_millis),
            ..Default::default()
        }));
    }
    pb::GroupStatus {
        group: group.to_owned(),
        bootstrapped: true,
        epoch: s.epoch,
        master: master.then(|| s.node_name.clone()),
        phase: pb::GroupPhase::Stable as i32,
        voters: if s.voters_set { s.voters.clone() } else { Vec::new() },
        k: s.sync_ack_replicas as u32,
        mode: mode as i32,
        members,
        confirm_offset: s.confirm_offset as i64,
        blocked_reason: Some("no_coordinator".into()),
        last_decision: "static roles: no coordinator, no automatic failover".into(),
        ..Default::default()
    }
}
