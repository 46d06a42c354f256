//! Shared helpers for the integration tests: messages, temp stores, nodes, a fault proxy.

pub mod browser;
pub mod etcd;
pub mod group;
pub mod grpc;
pub mod ha;
pub mod kube;
pub mod node;
pub mod process;
pub mod tmpfs;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hasync::store::fs::{FileSystem, SimFs, StdFs};
use hasync::store::record::Message;
use hasync::store::{CommitLog, StoreOptions};

/// A message with fixed hosts and timestamps.
pub fn msg(topic: &str, queue_id: i32, body: &[u8]) -> Message {
    Message {
        topic: topic.to_owned(),
        queue_id,
        flag: 0,
        body: Bytes::copy_from_slice(body),
        properties: Bytes::from_static(b"KEYS\x01k\x02TAGS\x01t\x02"),
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: "192.168.1.10:54321".parse::<SocketAddr>().unwrap(),
        store_timestamp_ms: 1_700_000_000_123,
        store_host: "10.0.0.1:10911".parse::<SocketAddr>().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// The encoded size of [`msg`] with a body of `body_len` bytes on topic `topic`.
pub fn msg_size(topic: &str, body_len: usize) -> usize {
    hasync::store::record::encoded_len(&msg(topic, 0, &vec![0; body_len])).unwrap()
}

/// Store options for tests: small segments, fast flush, long retention.
pub fn opts(segment_size: usize) -> StoreOptions {
    StoreOptions {
        segment_size,
        max_message_size: segment_size / 2,
        flush_interval: Duration::from_millis(20),
        sync_flush_timeout: Duration::from_secs(5),
        retention_check_interval: Duration::from_secs(3600),
        disk_max_used_ratio: 1.0,
        ..StoreOptions::default()
    }
}

/// Opens a store on the real file system.
pub fn open(dir: &Path, opts: StoreOptions) -> CommitLog {
    CommitLog::open(Arc::new(StdFs), dir, opts).expect("open store")
}

/// Opens a store on a simulated file system (for power-loss tests).
pub fn open_sim(
    fs: &Arc<SimFs>,
    dir: &Path,
    opts: StoreOptions,
) -> hasync::store::Result<CommitLog> {
    CommitLog::open(Arc::clone(fs) as Arc<dyn FileSystem>, dir, opts)
}

/// All bytes of the store from its min to its max offset.
pub fn all_bytes(log: &CommitLog) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = log.min_offset();
    while let Some(b) = log.read(at, usize::MAX).unwrap() {
        at += b.len() as u64;
        out.extend_from_slice(&b);
    }
    out
}

/// A topic with `queues` read and write queues, read-write, single-tag filter.
pub fn topic_config(name: &str, queues: u32) -> hasync::metadata::TopicConfig {
    hasync::metadata::TopicConfig {
        topic_name: name.to_owned(),
        read_queue_nums: queues,
        write_queue_nums: queues,
        perm: 6,
        topic_filter_type: "SINGLE_TAG".into(),
        topic_sys_flag: 0,
        order: false,
    }
}
