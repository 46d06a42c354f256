//! Conversions between the metadata tables and their protobuf form (`hasync.v1.Metadata`):
//! tables go out in chunks so that large tables never hit gRPC message limits. The protobuf
//! form is the control plane's business, so `metadata` knows nothing of it.

use std::collections::BTreeMap;

use crate::control::pb;
use crate::metadata::{DataVersion, SubscriptionGroupConfig, Table, TableData, TopicConfig};

/// Entries per chunk.
pub(crate) const CHUNK_ENTRIES: usize = 4096;

/// The protobuf table id.
pub(crate) fn table_pb(t: Table) -> pb::MetadataTable {
    match t {
        Table::Topics => pb::MetadataTable::Topics,
        Table::ConsumerOffsets => pb::MetadataTable::ConsumerOffsets,
        Table::DelayOffsets => pb::MetadataTable::DelayOffsets,
        Table::SubscriptionGroups => pb::MetadataTable::SubscriptionGroups,
    }
}

/// The table of a protobuf id.
pub(crate) fn table_of(t: i32) -> Option<Table> {
    match pb::MetadataTable::try_from(t).ok()? {
        pb::MetadataTable::Topics => Some(Table::Topics),
        pb::MetadataTable::ConsumerOffsets => Some(Table::ConsumerOffsets),
        pb::MetadataTable::DelayOffsets => Some(Table::DelayOffsets),
        pb::MetadataTable::SubscriptionGroups => Some(Table::SubscriptionGroups),
        pb::MetadataTable::Unspecified => None,
    }
}

/// DataVersion to protobuf.
pub(crate) fn version_pb(v: DataVersion) -> pb::DataVersion {
    pb::DataVersion {
        state_version: v.state_version,
        timestamp_unix_ms: v.timestamp_unix_ms,
        counter: v.counter,
    }
}

/// DataVersion from protobuf.
pub(crate) fn version_of(v: &pb::DataVersion) -> DataVersion {
    DataVersion {
        state_version: v.state_version,
        timestamp_unix_ms: v.timestamp_unix_ms,
        counter: v.counter,
    }
}

/// Topic config to protobuf.
pub(crate) fn topic_pb(t: &TopicConfig) -> pb::TopicConfig {
    pb::TopicConfig {
        topic_name: t.topic_name.clone(),
        read_queue_nums: t.read_queue_nums,
        write_queue_nums: t.write_queue_nums,
        perm: t.perm,
        topic_filter_type: t.topic_filter_type.clone(),
        topic_sys_flag: t.topic_sys_flag,
        order: t.order,
    }
}

/// Topic config from protobuf (an empty filter type means SINGLE_TAG, as upstream's default).
pub(crate) fn topic_of(t: pb::TopicConfig) -> TopicConfig {
    TopicConfig {
        topic_name: t.topic_name,
        read_queue_nums: t.read_queue_nums,
        write_queue_nums: t.write_queue_nums,
        perm: t.perm,
        topic_filter_type: if t.topic_filter_type.is_empty() {
            "SINGLE_TAG".into()
        } else {
            t.topic_filter_type
        },
        topic_sys_flag: t.topic_sys_flag,
        order: t.order,
    }
}

/// Group config to protobuf.
pub(crate) fn group_pb(g: &SubscriptionGroupConfig) -> pb::SubscriptionGroupConfig {
    pb::SubscriptionGroupConfig {
        group_name: g.group_name.clone(),
        consume_enable: g.consume_enable,
        consume_broadcast_enable: g.consume_broadcast_enable,
        retry_queue_nums: g.retry_queue_nums,
        retry_max_times: g.retry_max_times,
        broker_id: g.broker_id,
        which_broker_when_consume_slowly: g.which_broker_when_consume_slowly,
        notify_consumer_ids_changed_enable: g.notify_consumer_ids_changed_enable,
    }
}

/// Group config from protobuf.
pub(crate) fn group_of(g: pb::SubscriptionGroupConfig) -> SubscriptionGroupConfig {
    SubscriptionGroupConfig {
        group_name: g.group_name,
        consume_enable: g.consume_enable,
        consume_broadcast_enable: g.consume_broadcast_enable,
        retry_queue_nums: g.retry_queue_nums,
        retry_max_times: g.retry_max_times,
        broker_id: g.broker_id,
        which_broker_when_consume_slowly: g.which_broker_when_consume_slowly,
        notify_consumer_ids_changed_enable: g.notify_consumer_ids_changed_enable,
    }
}

/// A table as chunks of at most [`CHUNK_ENTRIES`] entries; the last has `last` set (an empty
/// table is one empty last chunk).
pub(crate) fn chunks(version: DataVersion, data: &TableData) -> Vec<pb::MetadataChunk> {
    let head = |table: Table| pb::MetadataChunk {
        table: table_pb(table) as i32,
        version: Some(version_pb(version)),
        ..Default::default()
    };
    let mut out = Vec::new();
    match data {
        TableData::Topics(m) => {
            let all: Vec<_> = m.values().map(topic_pb).collect();
            for c in all.chunks(CHUNK_ENTRIES) {
                out.push(pb::MetadataChunk { topics: c.to_vec(), ..head(Table::Topics) });
            }
        }
        TableData::ConsumerOffsets(m) => {
            let all: Vec<_> = m
                .iter()
                .flat_map(|(k, q)| {
                    let (group, topic) = k.split_once('@').unwrap_or((k.as_str(), ""));
                    q.iter().map(move |(qid, off)| pb::ConsumerOffset {
                        group: group.to_owned(),
                        topic: topic.to_owned(),
                        queue_id: *qid,
                        offset: *off,
                    })
                })
                .collect();
            for c in all.chunks(CHUNK_ENTRIES) {
                out.push(pb::MetadataChunk {
                    consumer_offsets: c.to_vec(),
                    ..head(Table::ConsumerOffsets)
                });
            }
        }
        TableData::DelayOffsets(m) => {
            let all: Vec<_> =
                m.iter().map(|(l, o)| pb::DelayOffset { level: *l, offset: *o }).collect();
            for c in all.chunks(CHUNK_ENTRIES) {
                out.push(pb::MetadataChunk {
                    delay_offsets: c.to_vec(),
                    ..head(Table::DelayOffsets)
                });
            }
        }
        TableData::SubscriptionGroups(m) => {
            let all: Vec<_> = m.values().map(group_pb).collect();
            for c in all.chunks(CHUNK_ENTRIES) {
                out.push(pb::MetadataChunk {
                    subscription_groups: c.to_vec(),
                    ..head(Table::SubscriptionGroups)
                });
            }
        }
    }
    if out.is_empty() {
        out.push(head(data.table()));
    }
    out.last_mut().expect("at least one chunk").last = true;
    out
}

/// Collects a table's chunks back into its data.
#[derive(Debug)]
pub(crate) struct Assembler {
    table: Table,
    data: TableData,
}

impl Assembler {
    /// An empty table being received.
    pub(crate) fn new(table: Table) -> Self {
        let data = match table {
            Table::Topics => TableData::Topics(BTreeMap::new()),
            Table::ConsumerOffsets => TableData::ConsumerOffsets(BTreeMap::new()),
            Table::DelayOffsets => TableData::DelayOffsets(BTreeMap::new()),
            Table::SubscriptionGroups => TableData::SubscriptionGroups(BTreeMap::new()),
        };
        Self { table, data }
    }

    /// Adds a chunk's entries.
    pub(crate) fn add(&mut self, chunk: pb::MetadataChunk) {
        match &mut self.data {
            TableData::Topics(m) => {
                for t in chunk.topics {
                    m.insert(t.topic_name.clone(), topic_of(t));
                }
            }
            TableData::ConsumerOffsets(m) => {
                for o in chunk.consumer_offsets {
                    m.entry(format!("{}@{}", o.group, o.topic))
                        .or_default()
                        .insert(o.queue_id, o.offset);
                }
            }
            TableData::DelayOffsets(m) => {
                for d in chunk.delay_offsets {
                    m.insert(d.level, d.offset);
                }
            }
            TableData::SubscriptionGroups(m) => {
                for g in chunk.subscription_groups {
                    m.insert(g.group_name.clone(), group_of(g));
                }
            }
        }
    }

    /// The table being received.
    pub(crate) fn table(&self) -> Table {
        self.table
    }

    /// The assembled data.
    pub(crate) fn finish(self) -> TableData {
        self.data
    }
}
