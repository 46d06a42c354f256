//! Conversions between protobuf messages and node/store types.

use std::net::SocketAddr;

use bytes::Bytes;

use crate::config::{ReplicationMode, Role};
use crate::control::pb;
use crate::ha::status::now_millis;
use crate::node::{NodeStatus, PutStatus};
use crate::store::record::{self, Message, RecordView};

pub(crate) fn role(r: Role) -> pb::Role {
    match r {
        Role::Master => pb::Role::Master,
        Role::Slave => pb::Role::Slave,
    }
}

pub(crate) fn mode(m: ReplicationMode) -> pb::ReplicationMode {
    match m {
        ReplicationMode::Sync => pb::ReplicationMode::Sync,
        ReplicationMode::Async => pb::ReplicationMode::Async,
    }
}

/// An epoch history entry on the wire.
pub(crate) fn epoch_entry(e: &crate::node::epoch::EpochEntry) -> pb::EpochEntry {
    pb::EpochEntry {
        epoch: e.epoch,
        start_offset: i64_of(e.start_offset),
        master_name: e.master_name.clone(),
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn status(s: &NodeStatus) -> pb::ReplicationStatus {
    pb::ReplicationStatus {
        node_name: s.node_name.clone(),
        role: role(s.role) as i32,
        epoch: s.epoch,
        mode: mode(s.mode) as i32,
        sync_ack_replicas: s.sync_ack_replicas as u32,
        min_offset: i64_of(s.min_offset),
        max_offset: i64_of(s.max_offset),
        flushed_offset: i64_of(s.flushed_offset),
        confirm_offset: i64_of(s.confirm_offset),
        in_sync_replicas: s.in_sync_replicas as u32,
        slaves: s
            .slaves
            .iter()
            .map(|r| pb::SlaveStatus {
                replica_id: r.id,
                address: r.address.to_string(),
                ack_offset: i64_of(r.ack_offset),
                lag_bytes: i64_of(r.lag_bytes),
                lag_millis: i64_of(r.lag_millis),
                in_sync: r.in_sync,
                last_ack_unix_ms: r.last_ack_unix_ms,
                bytes_per_sec: r.bytes_per_sec,
                connected_since_unix_ms: r.connected_since_unix_ms,
                first_offset: i64_of(r.first_offset),
                identity: r.identity.clone(),
                node_name: r.node_name.clone(),
                voter: r.voter,
            })
            .collect(),
        master_link: s.master_link.as_ref().map(|l| pb::MasterLink {
            address: l.address.clone(),
            connected: l.connected,
            last_frame_unix_ms: l.last_frame_unix_ms,
            master_max_offset: l.master_max_offset.map(i64_of),
            reconnects: l.reconnects,
            last_error: l.last_error.clone().unwrap_or_default(),
            bytes_received: i64_of(l.bytes_received),
            epoch_check: l.epoch_check.clone(),
            registration: l.registration.clone(),
            damaged_record: l.damaged_record.as_ref().map(|d| d.to_string()).unwrap_or_default(),
        }),
        time_unix_ms: now_millis(),
        metadata_sync: Some(metadata_sync(s)),
        epoch_history_length: s.epoch_history_length as u32,
        fenced: s.fenced,
        readable_offset: i64_of(s.readable_offset),
        data_dir_id: s.data_dir_id.clone(),
        role_change: s.role_change.as_ref().map(role_change),
        disk: Some(pb::DiskStatus {
            full: s.disk.full,
            since_unix_ms: s.disk.since_unix_ms,
            last_error: s.disk.last_error.clone(),
            failed_writes: s.disk.failed_writes,
            failing: s.disk.failing.clone(),
        }),
        scrub: Some(scrub(&s.scrub)),
        promised_epoch: s.promised_epoch,
        voters: s.voters.clone(),
        voters_set: s.voters_set,
        truncated_bytes: s.truncated_bytes,
        truncated_files: s.truncated_files,
    }
}

/// The scrub's status on the wire.
fn scrub(s: &crate::store::ScrubStatus) -> pb::ScrubStatus {
    pb::ScrubStatus {
        rate_bytes_per_sec: s.rate_bytes_per_sec,
        passes: s.passes,
        segments_checked: s.segments_checked,
        bytes_checked: s.bytes_checked,
        records_checked: s.records_checked,
        position: i64_of(s.position),
        last_pass_unix_ms: s.last_pass_unix_ms,
        damaged_segments: s.damaged_segments,
        damage: s
            .damage
            .iter()
            .map(|d| pb::ScrubDamage {
                file: d.file.display().to_string(),
                offset: i64_of(d.offset),
                reason: d.reason.clone(),
            })
            .collect(),
    }
}

fn role_change(c: &crate::node::role::RoleChange) -> pb::RoleChange {
    use crate::node::role::RoleChangeState as S;
    let r = &c.request;
    pb::RoleChange {
        state: match c.state {
            S::Changing => pb::RoleChangeState::Changing,
            S::Failed => pb::RoleChangeState::Failed,
        } as i32,
        failed_step: c.failed_step.to_owned(),
        error: c.error.clone(),
        epoch: c.epoch,
        request: Some(pb::ChangeRoleRequest {
            role: role(r.role) as i32,
            epoch: r.epoch,
            master_ha_address: r.master_ha.clone(),
            master_grpc_address: r.master_grpc.clone(),
            force_resync: r.force_resync,
            decision_token: r.decision_token.clone(),
        }),
    }
}

fn metadata_sync(s: &NodeStatus) -> pb::MetadataSync {
    use crate::control::metadata_wire as wire;
    let p = s.metadata_pull.clone().unwrap_or_default();
    pb::MetadataSync {
        versions: s
            .metadata_versions
            .iter()
            .map(|(t, v)| pb::TableVersion {
                table: wire::table_pb(*t) as i32,
                version: Some(wire::version_pb(*v)),
            })
            .collect(),
        master: p.master,
        last_success_unix_ms: p.last_success_unix_ms,
        last_attempt_unix_ms: p.last_attempt_unix_ms,
        last_error: p.last_error.unwrap_or_default(),
        pulls_ok: p.pulls_ok,
        pulls_failed: p.pulls_failed,
    }
}

pub(crate) fn put_status(s: PutStatus) -> pb::PutStatus {
    match s {
        PutStatus::PutOk => pb::PutStatus::PutOk,
        PutStatus::FlushDiskTimeout => pb::PutStatus::FlushDiskTimeout,
        PutStatus::FlushSlaveTimeout => pb::PutStatus::FlushSlaveTimeout,
        PutStatus::SlaveNotAvailable => pb::PutStatus::SlaveNotAvailable,
        PutStatus::ServiceNotAvailable | PutStatus::MessageIllegal => {
            pb::PutStatus::ServiceNotAvailable
        }
    }
}

/// A protobuf message as the store takes it; the error names the message and what is wrong.
pub(crate) fn message(
    index: usize,
    m: pb::Message,
    born_host: SocketAddr,
    store_host: SocketAddr,
    max_body: usize,
) -> Result<Message, tonic::Status> {
    let bad = |what: String| tonic::Status::invalid_argument(format!("message {index}: {what}"));
    if m.topic.is_empty() {
        return Err(bad("empty topic".into()));
    }
    if m.queue_id < 0 {
        return Err(bad(format!("queue_id {} is negative", m.queue_id)));
    }
    if m.body.len() > max_body {
        return Err(bad(format!(
            "body of {} bytes exceeds store.max-message-size ({max_body} bytes)",
            m.body.len()
        )));
    }
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(m.properties.len() + 2);
    if !m.keys.is_empty() {
        pairs.push(("KEYS", m.keys.as_str()));
    }
    if !m.tags.is_empty() {
        pairs.push(("TAGS", m.tags.as_str()));
    }
    let mut user: Vec<_> = m.properties.iter().collect();
    user.sort();
    for (k, v) in user {
        if k == "KEYS" || k == "TAGS" {
            return Err(bad(format!("property {k} is set by the `keys`/`tags` fields")));
        }
        pairs.push((k.as_str(), v.as_str()));
    }
    let properties = record::encode_properties(&pairs).map_err(|e| bad(e.to_string()))?;
    let msg = Message {
        topic: m.topic,
        queue_id: m.queue_id,
        flag: m.flag,
        body: m.body,
        properties,
        sys_flag: 0,
        born_timestamp_ms: now_millis(),
        born_host,
        store_timestamp_ms: 0,
        store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    record::encoded_len(&msg).map_err(|e| bad(e.to_string()))?;
    Ok(msg)
}

pub(crate) fn stored(view: &RecordView<'_>, offset: u64) -> pb::StoredMessage {
    let text =
        |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    let properties =
        record::parse_properties(view.properties).unwrap_or_default().into_iter().collect();
    pb::StoredMessage {
        physical_offset: i64_of(offset),
        size: view.total_size,
        topic: String::from_utf8_lossy(view.topic).into_owned(),
        queue_id: view.queue_id,
        queue_offset: view.queue_offset,
        flag: view.flag,
        body: Bytes::copy_from_slice(view.body),
        tags: text(view.tags()),
        keys: text(view.keys()),
        properties,
        born_timestamp_unix_ms: view.born_timestamp_ms,
        store_timestamp_unix_ms: view.store_timestamp_ms,
        born_host: view.born_host.to_string(),
        store_host: view.store_host.to_string(),
        sys_flag: view.sys_flag,
        reconsume_times: view.reconsume_times,
    }
}
