//! The Cluster service's answers as JSON, for scripts (`hasync cluster status --json`,
//! `hasync cluster watch --json`) and for the console (`/console/topology.json`). The names
//! are a public interface (docs/operations.md lists them): `groups`, and per group `group`,
//! `epoch`, `master` (a name or null), `members` (`name`, `role`, `epoch`, `max_offset`, ...),
//! `failover_possible` and `blocked_reason` (a string or null). Enum values are written as the
//! coordinator's records spell them (`stable`, `sync`, `master`, `manual_failover`), so they
//! match what `etcdctl get` shows.

use serde_json::{Value, json};

use crate::control::pb;

/// A group phase as the state record spells it.
pub fn phase(p: pb::GroupPhase) -> Option<&'static str> {
    match p {
        pb::GroupPhase::Stable => Some("stable"),
        pb::GroupPhase::Fencing => Some("fencing"),
        pb::GroupPhase::Promoting => Some("promoting"),
        pb::GroupPhase::Unspecified => None,
    }
}

/// A replication mode as the state record spells it.
pub fn mode(m: pb::ReplicationMode) -> Option<&'static str> {
    match m {
        pb::ReplicationMode::Sync => Some("sync"),
        pb::ReplicationMode::Async => Some("async"),
        pb::ReplicationMode::Unspecified => None,
    }
}

/// A role as the member record spells it.
pub fn role(r: pb::Role) -> Option<&'static str> {
    match r {
        pb::Role::Master => Some("master"),
        pb::Role::Slave => Some("slave"),
        pb::Role::Unspecified => None,
    }
}

/// A decision kind as the history record spells it.
pub fn kind(k: pb::DecisionKind) -> &'static str {
    match k {
        pb::DecisionKind::Bootstrap => "bootstrap",
        pb::DecisionKind::Failover => "failover",
        pb::DecisionKind::Switchover => "switchover",
        pb::DecisionKind::ManualFailover => "manual_failover",
        pb::DecisionKind::Unspecified => "unspecified",
    }
}

/// A topology update's kind.
pub fn update_kind(k: pb::TopologyUpdateKind) -> &'static str {
    match k {
        pb::TopologyUpdateKind::Snapshot => "snapshot",
        pb::TopologyUpdateKind::Change => "change",
        pb::TopologyUpdateKind::Sample => "sample",
        pb::TopologyUpdateKind::CoordinatorLost => "coordinator_lost",
        pb::TopologyUpdateKind::CoordinatorRestored => "coordinator_restored",
        pb::TopologyUpdateKind::Unspecified => "unspecified",
    }
}

/// One member.
pub fn member(m: &pb::ClusterMember) -> Value {
    // A voter without a live record has no numbers: null, never a made-up 0.
    let live = |v: Value| if m.live { v } else { Value::Null };
    json!({
        "name": m.name,
        "live": m.live,
        "voter": m.voter,
        "role": role(m.role()),
        "epoch": live(json!(m.epoch)),
        "max_offset": live(json!(m.max_offset)),
        "readable_end": live(json!(m.readable_end)),
        "lag_bytes": m.lag_bytes,
        "lag_ms": m.lag_ms,
        "in_sync": m.in_sync,
        "promised_epoch": live(json!(m.promised_epoch)),
        "fenced": live(json!(m.fenced)),
        "lease_age_ms": live(json!(m.lease_age_ms)),
        "last_record_epoch": live(json!(m.last_record_epoch)),
        "confirm_offset": live(json!(m.confirm_offset)),
        "never_promote": m.never_promote,
        "priority": m.priority,
        "advertise_grpc": m.advertise_grpc,
        "advertise_ha": m.advertise_ha,
        "following": m.following,
        "master_frame_age_ms": m.master_frame_age_ms,
    })
}

/// One history entry (a decision); `full` adds the candidates, the token and the revision.
pub fn history_entry(e: &pb::HistoryEntry, full: bool) -> Value {
    let mut v = json!({
        "epoch": e.epoch,
        "kind": kind(e.kind()),
        "old_master": e.old_master,
        "new_master": e.new_master,
        "rule": e.rule,
        "fencing": e.fencing,
        "blocked_reason": e.blocked_reason,
        "loss_bound_bytes": e.loss_bound_bytes,
        "controller": e.controller,
        "time_unix_ms": e.time_unix_ms,
    });
    if full {
        v["token"] = json!(e.token);
        v["revision"] = json!(e.revision);
        v["candidates"] = e
            .candidates
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "fenced": c.fenced,
                    "epoch": c.epoch,
                    "last_record_epoch": c.last_record_epoch,
                    "end_offset": c.end_offset,
                    "chosen": c.chosen,
                    "why": c.why,
                })
            })
            .collect();
    }
    v
}

/// One group.
pub fn group(g: &pb::GroupStatus) -> Value {
    json!({
        "group": g.group,
        "bootstrapped": g.bootstrapped,
        "epoch": g.epoch,
        "master": g.master,
        "phase": phase(g.phase()),
        "voters": g.voters,
        "k": g.k,
        "mode": mode(g.mode()),
        "members": g.members.iter().map(member).collect::<Vec<_>>(),
        "leader": g.leader,
        "leader_epoch": g.leader_epoch,
        "failover_possible": g.failover_possible,
        "blocked_reason": g.blocked_reason,
        "paused": g.paused,
        "last_decision": g.last_decision,
        "last_controller": g.last_controller,
        "confirm_offset": g.confirm_offset,
        "chosen": g.chosen,
        "pending_request": g.pending_request.as_ref().map(|r| json!({
            "id": r.id,
            "kind": kind(r.kind()),
            "to": Some(r.to.as_str()).filter(|t| !t.is_empty()),
            "time_unix_ms": r.time_unix_ms,
        })),
        "recent_decisions": g
            .recent_decisions
            .iter()
            .map(|e| history_entry(e, false))
            .collect::<Vec<_>>(),
    })
}

/// `hasync cluster status --json`.
pub fn status(st: &pb::ClusterStatus) -> Value {
    json!({
        "root": st.root,
        "controller": Some(st.controller.as_str()).filter(|c| !c.is_empty()),
        "paused": st.paused,
        "revision": st.revision,
        "time_unix_ms": st.time_unix_ms,
        "groups": st.groups.iter().map(group).collect::<Vec<_>>(),
    })
}

/// `hasync cluster history --json`.
pub fn history(h: &pb::GetHistoryResponse) -> Value {
    let entries: Vec<Value> = h.entries.iter().map(|e| history_entry(e, true)).collect();
    json!({ "group": h.group, "entries": entries })
}

/// One topology update, as `hasync cluster watch --json` prints it (one line each).
pub fn topology_update(u: &pb::TopologyUpdate) -> Value {
    json!({
        "kind": update_kind(u.kind()),
        "revision": u.revision,
        "resync": u.resync,
        "resync_reason": Some(u.resync_reason.as_str()).filter(|r| !r.is_empty()),
        "groups": u.groups.iter().map(group).collect::<Vec<_>>(),
        "removed_groups": u.removed_groups,
        "coordinator_connected": u.coordinator_connected,
        "coordinator_error": Some(u.coordinator_error.as_str()).filter(|e| !e.is_empty()),
        "controller": Some(u.controller.as_str()).filter(|c| !c.is_empty()),
        "paused": u.paused,
        "root": u.root,
        "node": u.node,
        "time_unix_ms": u.time_unix_ms,
    })
}
