//! `hasync status --json`: the ReplicationStatus message as JSON under its proto field names,
//! built by hand (the generated types have no serde), with a test that keeps it complete.

use serde_json::{Value, json};

use crate::control::pb;

fn role_name(v: i32) -> &'static str {
    pb::Role::try_from(v).map_or("ROLE_UNKNOWN", |r| r.as_str_name())
}

fn mode_name(v: i32) -> &'static str {
    pb::ReplicationMode::try_from(v).map_or("REPLICATION_MODE_UNKNOWN", |m| m.as_str_name())
}

/// The status as JSON: every ReplicationStatus field under its proto name, enums by their
/// proto names, int64 as JSON numbers, an absent `master_link` (or `master_max_offset`) as
/// null.
pub(crate) fn to_json(s: &pb::ReplicationStatus) -> Value {
    let slaves: Vec<Value> = s
        .slaves
        .iter()
        .map(|r| {
            json!({
                "replica_id": r.replica_id,
                "address": r.address,
                "ack_offset": r.ack_offset,
                "lag_bytes": r.lag_bytes,
                "lag_millis": r.lag_millis,
                "in_sync": r.in_sync,
                "last_ack_unix_ms": r.last_ack_unix_ms,
                "bytes_per_sec": r.bytes_per_sec,
                "connected_since_unix_ms": r.connected_since_unix_ms,
                "first_offset": r.first_offset,
                "identity": r.identity,
                "node_name": r.node_name,
                "voter": r.voter,
            })
        })
        .collect();
    let link = s.master_link.as_ref().map_or(Value::Null, |l| {
        json!({
            "address": l.address,
            "connected": l.connected,
            "last_frame_unix_ms": l.last_frame_unix_ms,
            "master_max_offset": l.master_max_offset,
            "reconnects": l.reconnects,
            "last_error": l.last_error,
            "bytes_received": l.bytes_received,
            "epoch_check": l.epoch_check,
            "registration": l.registration,
            "damaged_record": l.damaged_record,
        })
    });
    json!({
        "node_name": s.node_name,
        "role": role_name(s.role),
        "epoch": s.epoch,
        "mode": mode_name(s.mode),
        "sync_ack_replicas": s.sync_ack_replicas,
        "min_offset": s.min_offset,
        "max_offset": s.max_offset,
        "flushed_offset": s.flushed_offset,
        "confirm_offset": s.confirm_offset,
        "readable_offset": s.readable_offset,
        "in_sync_replicas": s.in_sync_replicas,
        "slaves": slaves,
        "master_link": link,
        "time_unix_ms": s.time_unix_ms,
        "metadata_sync": s.metadata_sync.as_ref().map_or(Value::Null, metadata_json),
        "epoch_history_length": s.epoch_history_length,
        "fenced": s.fenced,
        "promised_epoch": s.promised_epoch,
        "voters": s.voters,
        "voters_set": s.voters_set,
        "data_dir_id": s.data_dir_id,
        "role_change": s.role_change.as_ref().map_or(Value::Null, role_change_json),
        "disk": s.disk.as_ref().map_or(Value::Null, |d| json!({
            "full": d.full,
            "since_unix_ms": d.since_unix_ms,
            "last_error": d.last_error,
            "failed_writes": d.failed_writes,
            "failing": d.failing,
        })),
        "scrub": s.scrub.as_ref().map_or(Value::Null, scrub_json),
        "truncated_bytes": s.truncated_bytes,
        "truncated_files": s.truncated_files,
    })
}

fn scrub_json(c: &pb::ScrubStatus) -> Value {
    let damage: Vec<Value> = c
        .damage
        .iter()
        .map(|d| json!({ "file": d.file, "offset": d.offset, "reason": d.reason }))
        .collect();
    json!({
        "rate_bytes_per_sec": c.rate_bytes_per_sec,
        "passes": c.passes,
        "segments_checked": c.segments_checked,
        "bytes_checked": c.bytes_checked,
        "records_checked": c.records_checked,
        "position": c.position,
        "last_pass_unix_ms": c.last_pass_unix_ms,
        "damaged_segments": c.damaged_segments,
        "damage": damage,
    })
}

fn role_change_json(c: &pb::RoleChange) -> Value {
    let state = match pb::RoleChangeState::try_from(c.state) {
        Ok(pb::RoleChangeState::Changing) => "ROLE_CHANGE_STATE_CHANGING",
        Ok(pb::RoleChangeState::Failed) => "ROLE_CHANGE_STATE_FAILED",
        _ => "ROLE_CHANGE_STATE_UNSPECIFIED",
    };
    let request = c.request.as_ref().map_or(Value::Null, |r| {
        json!({
            "role": role_name(r.role),
            "epoch": r.epoch,
            "master_ha_address": r.master_ha_address,
            "master_grpc_address": r.master_grpc_address,
            "force_resync": r.force_resync,
            "decision_token": r.decision_token,
        })
    });
    json!({
        "state": state,
        "failed_step": c.failed_step,
        "error": c.error,
        "epoch": c.epoch,
        "request": request,
    })
}

fn version_json(v: Option<&pb::DataVersion>) -> Value {
    v.map_or(Value::Null, |v| {
        json!({
            "state_version": v.state_version,
            "timestamp_unix_ms": v.timestamp_unix_ms,
            "counter": v.counter,
        })
    })
}

pub(super) fn table_name(v: i32) -> &'static str {
    pb::MetadataTable::try_from(v).map_or("METADATA_TABLE_UNKNOWN", |t| t.as_str_name())
}

fn metadata_json(m: &pb::MetadataSync) -> Value {
    let versions: Vec<Value> = m
        .versions
        .iter()
        .map(|t| json!({"table": table_name(t.table), "version": version_json(t.version.as_ref())}))
        .collect();
    json!({
        "versions": versions,
        "master": m.master,
        "last_success_unix_ms": m.last_success_unix_ms,
        "last_attempt_unix_ms": m.last_attempt_unix_ms,
        "last_error": m.last_error,
        "pulls_ok": m.pulls_ok,
        "pulls_failed": m.pulls_failed,
    })
}
