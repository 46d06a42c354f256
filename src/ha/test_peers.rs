//! Support for the data plane's unit tests: a master and a slave over stores in temp dirs,
//! with short timers, on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::AckMode;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::{Master, MasterOptions};
use crate::ha::slave::{Slave, SlaveOptions};
use crate::metrics::HaCounters;
use crate::store::fs::{FileSystem, StdFs};
use crate::store::record::Message;
use crate::store::{CommitLog, StoreOptions};

/// Segment size of data-plane tests.
pub(crate) const SEG: usize = 64 * 1024;

/// Store options with `segment_size` segments, a fast flush and no background retention.
pub(crate) fn store_opts(segment_size: usize) -> StoreOptions {
    StoreOptions {
        segment_size,
        max_message_size: segment_size / 2,
        flush_interval: Duration::from_millis(20),
        retention_check_interval: Duration::from_secs(3600),
        disk_max_used_ratio: 1.0,
        ..StoreOptions::default()
    }
}

/// A store in `dir` on the real file system with `segment_size` segments.
pub(crate) fn store_in(dir: &Path, segment_size: usize) -> Arc<CommitLog> {
    store_on(Arc::new(StdFs), dir, segment_size).expect("open store")
}

/// A store in `dir` on `fs` with `segment_size` segments.
pub(crate) fn store_on(
    fs: Arc<dyn FileSystem>,
    dir: &Path,
    segment_size: usize,
) -> crate::store::Result<Arc<CommitLog>> {
    CommitLog::open(fs, dir, store_opts(segment_size)).map(Arc::new)
}

/// Short timers for tests.
pub(crate) fn master_opts() -> MasterOptions {
    MasterOptions {
        heartbeat_interval: Duration::from_millis(200),
        housekeeping_interval: Duration::from_secs(2),
        ..MasterOptions::default()
    }
}

/// Short timers for tests; `master` is the HA address.
pub(crate) fn slave_opts(master: SocketAddr) -> SlaveOptions {
    SlaveOptions {
        master_ha: master.to_string(),
        read_buffer_size: 4 << 20,
        connect_timeout: Duration::from_secs(2),
        reconnect_backoff: Duration::from_millis(50),
        reconnect_backoff_max: Duration::from_millis(200),
        source_address: None,
        ack_mode: AckMode::Received,
        report_interval: Duration::from_millis(200),
        housekeeping_interval: Duration::from_secs(2),
    }
}

/// A running master.
pub(crate) struct MasterNode {
    pub(crate) store: Arc<CommitLog>,
    pub(crate) master: Arc<Master>,
    pub(crate) addr: SocketAddr,
    /// The replica table and sync waiters of this master.
    pub(crate) waiters: Arc<SyncWaiters>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl MasterNode {
    /// A master over a new store in `dir`.
    pub(crate) async fn start(dir: &Path, o: MasterOptions) -> Self {
        Self::start_with(store_in(dir, SEG), o).await
    }

    /// A master over `store`, listening on an OS-assigned loopback port.
    pub(crate) async fn start_with(store: Arc<CommitLog>, o: MasterOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let waiters = Arc::new(SyncWaiters::new(1));
        let master =
            Master::new(Arc::clone(&store), o, Arc::clone(&waiters), HaCounters::default());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&master).run(Arc::new(listener), cancel.clone()));
        Self { store, master, addr, waiters, cancel, task }
    }
}

impl Drop for MasterNode {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.task.abort();
    }
}

/// A running slave.
pub(crate) struct SlaveNode {
    pub(crate) store: Arc<CommitLog>,
    pub(crate) slave: Arc<Slave>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SlaveNode {
    /// A slave over a new store in `dir`.
    pub(crate) fn start(dir: &Path, o: SlaveOptions) -> Self {
        Self::start_with(store_in(dir, SEG), o)
    }

    /// A slave over `store`.
    pub(crate) fn start_with(store: Arc<CommitLog>, o: SlaveOptions) -> Self {
        let slave = Slave::new(Arc::clone(&store), o, HaCounters::default());
        let cancel = CancellationToken::new();
        let task = Some(tokio::spawn(Arc::clone(&slave).run(cancel.clone())));
        Self { store, slave, cancel, task }
    }

    /// Cancels the slave and waits for its task to end.
    pub(crate) async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for SlaveNode {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Polls `cond` every 10 ms until it holds; panics after `secs` seconds.
pub(crate) async fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let polled = async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(secs), polled).await.is_err() {
        panic!("timed out waiting for: {what}");
    }
}

/// Appends `n` messages on topic `T` with bodies of `body` bytes; the end offset.
pub(crate) fn put(store: &CommitLog, n: usize, body: usize) -> u64 {
    let host: SocketAddr = "127.0.0.1:10911".parse().unwrap();
    let batch: Vec<Message> = (0..n)
        .map(|i| Message {
            topic: "T".to_owned(),
            queue_id: (i % 4) as i32,
            flag: 0,
            body: Bytes::from(vec![i as u8; body]),
            properties: Bytes::new(),
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: host,
            store_timestamp_ms: 2,
            store_host: host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        })
        .collect();
    store.append(&batch).unwrap().end_offset
}

/// Asserts the slave holds exactly the master's bytes over the slave's range.
pub(crate) fn assert_identical(master: &CommitLog, slave: &CommitLog) {
    assert_eq!(slave.max_offset(), master.max_offset(), "max offsets");
    let mut at = slave.min_offset();
    while at < slave.max_offset() {
        let s = slave.read(at, usize::MAX).unwrap().unwrap();
        let m = master.read(at, s.len()).unwrap().unwrap();
        assert_eq!(&s[..m.len()], &m[..], "bytes differ at {at}");
        at += m.len() as u64;
    }
}
