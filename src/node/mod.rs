//! The node: opens the store, starts the data plane for its role, owns the shutdown token and
//! the task set. The control plane (gRPC) calls into it; it knows nothing of gRPC.

mod put;
mod status;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use put::{PutOutcome, PutStatus};
pub use status::NodeStatus;

use crate::config::{Config, ReplicationMode, Role};
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::{Master, MasterOptions, ReplicaEvents};
use crate::ha::slave::{Slave, SlaveOptions};
use crate::metadata::MetadataStore;
use crate::metadata::pull::Puller;
use crate::store::fs::StdFs;
use crate::store::{CommitLog, StoreOptions};

/// Why a node could not start or stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store refused to open or close.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The metadata refused to load or a write failed.
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
    /// A blocking store task panicked.
    #[error("store task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The request needs the master role.
    #[error("this node is a slave (its master is {master}); {what} needs the master")]
    NotMaster {
        /// What was asked.
        what: &'static str,
        /// The master's HA address as configured.
        master: String,
    },
    /// A request argument is out of range.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

/// The replication mode in force and the number of slave acks a sync put waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// SYNC or ASYNC.
    pub mode: ReplicationMode,
    /// `k`: slave acks a SYNC put waits for (slaves only, never the master).
    pub sync_ack_replicas: usize,
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    config: Config,
    store: Arc<CommitLog>,
    master: Option<Arc<Master>>,
    slave: Option<Arc<Slave>>,
    ha_addr: Option<SocketAddr>,
    metadata: Arc<MetadataStore>,
    puller: Option<Arc<Puller>>,
    waiters: Arc<SyncWaiters>,
    replication: Mutex<ReplicationSettings>,
    accepting: AtomicBool,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl Node {
    /// Opens the store (recovering it) and starts the data plane of the configured role.
    pub async fn start(config: Config, repair: bool) -> Result<Self, Error> {
        let mut opts = StoreOptions::from_config(&config.store);
        opts.repair = repair;
        let dir = config.node.data_dir.clone();
        let store =
            tokio::task::spawn_blocking(move || CommitLog::open(Arc::new(StdFs), &dir, opts))
                .await??;
        let store = Arc::new(store);
        log_recovery(&config, &store);
        let dir = config.node.data_dir.clone();
        let metadata = Arc::new(
            tokio::task::spawn_blocking(move || MetadataStore::open(Arc::new(StdFs), &dir))
                .await??,
        );
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let replication = ReplicationSettings {
            mode: config.replication.mode,
            sync_ack_replicas: config.replication.sync_ack_replicas as usize,
        };
        let waiters = Arc::new(SyncWaiters::new(replication.sync_ack_replicas));
        tasks.spawn(Arc::clone(&waiters).run_expiry(cancel.child_token()));
        let (mut master, mut slave, mut ha_addr, mut puller) = (None, None, None, None);
        tasks.spawn(persist_offsets(
            Arc::clone(&metadata),
            config.metadata.consumer_offset_persist_interval,
            cancel.child_token(),
        ));
        match config.node.role {
            Role::Master => {
                let addr = config.ha.listen;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Bind { what: "ha.listen", addr, source })?;
                ha_addr = listener.local_addr().ok();
                let events: Arc<dyn ReplicaEvents> = Arc::clone(&waiters) as Arc<dyn ReplicaEvents>;
                let opts = MasterOptions::from_config(&config.ha);
                let m = Master::new(Arc::clone(&store), opts, Some(events));
                tasks.spawn(Arc::clone(&m).run(listener, cancel.child_token()));
                tracing::info!(ha_listen = %listener_addr(ha_addr), "master data plane listening");
                master = Some(m);
            }
            Role::Slave => {
                let s = Slave::new(Arc::clone(&store), SlaveOptions::from_config(&config));
                tasks.spawn(Arc::clone(&s).run(cancel.child_token()));
                tracing::info!(master_ha = %config.slave.master_ha, "slave data plane started");
                slave = Some(s);
                if config.slave.master_grpc.is_empty() {
                    tracing::warn!("slave.master-grpc is not set: no metadata pull");
                } else {
                    let p = Puller::new(
                        Arc::clone(&metadata),
                        config.slave.master_grpc.clone(),
                        config.metadata.sync_interval,
                        config.grpc.token.clone(),
                    );
                    tasks.spawn(Arc::clone(&p).run(cancel.child_token()));
                    puller = Some(p);
                }
            }
        }
        Ok(Self {
            config,
            store,
            master,
            slave,
            ha_addr,
            metadata,
            puller,
            waiters,
            replication: Mutex::new(replication),
            accepting: AtomicBool::new(true),
            cancel,
            tasks,
        })
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// The commitlog.
    pub fn store(&self) -> &Arc<CommitLog> {
        &self.store
    }
    /// The master's data plane, when the node is a master.
    pub fn master(&self) -> Option<&Arc<Master>> {
        self.master.as_ref()
    }
    /// The slave's data plane, when the node is a slave.
    pub fn slave(&self) -> Option<&Arc<Slave>> {
        self.slave.as_ref()
    }
    /// The bound HA address (a master's), with the OS-assigned port resolved.
    pub fn ha_addr(&self) -> Option<SocketAddr> {
        self.ha_addr
    }

    /// The replication mode and `k` in force.
    pub fn replication(&self) -> ReplicationSettings {
        *self.replication.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switches SYNC/ASYNC (and optionally `k`) for the next put; waiters already waiting run to
    /// their own outcome. Only a master has a replication mode.
    pub fn set_replication_mode(
        &self,
        mode: ReplicationMode,
        sync_ack_replicas: Option<usize>,
    ) -> Result<ReplicationSettings, Error> {
        if self.master.is_none() {
            return Err(self.not_master("changing the replication mode"));
        }
        if sync_ack_replicas == Some(0) {
            return Err(Error::InvalidArgument {
                field: "sync_ack_replicas",
                reason: "must be at least 1 (it counts slaves, never the master)".into(),
            });
        }
        let mut r = self.replication.lock().unwrap_or_else(|e| e.into_inner());
        let before = *r;
        r.mode = mode;
        if let Some(k) = sync_ack_replicas {
            r.sync_ack_replicas = k;
            self.waiters.set_sync_ack_replicas(k);
        }
        tracing::info!(?before, after = ?*r, "replication mode changed");
        Ok(*r)
    }

    fn not_master(&self, what: &'static str) -> Error {
        Error::NotMaster { what, master: self.config.slave.master_ha.clone() }
    }

    /// The broker metadata.
    pub fn metadata(&self) -> &Arc<MetadataStore> {
        &self.metadata
    }

    /// The metadata pull loop (a slave's with slave.master-grpc set).
    pub fn puller(&self) -> Option<&Arc<Puller>> {
        self.puller.as_ref()
    }

    /// Refuses metadata writes on a slave, naming its master.
    pub fn check_metadata_write(&self) -> Result<(), Error> {
        if self.master.is_none() {
            return Err(self.not_master("a metadata write"));
        }
        Ok(())
    }

    /// The sync waiters and ack table.
    pub fn waiters(&self) -> &Arc<SyncWaiters> {
        &self.waiters
    }

    /// Stops the data plane, then closes the store cleanly (final flush, checkpoint, abort
    /// marker removed). New puts are refused first, and every waiting put completes with
    /// SERVICE_NOT_AVAILABLE (outcome unknown).
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.accepting.store(false, std::sync::atomic::Ordering::SeqCst);
        self.waiters.shutdown();
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.close()).await??;
        let metadata = Arc::clone(&self.metadata);
        tokio::task::spawn_blocking(move || metadata.persist_offsets_if_dirty()).await??;
        Ok(())
    }
}

/// Writes the consumer offsets at most every `every` while they change.
async fn persist_offsets(
    metadata: Arc<MetadataStore>,
    every: std::time::Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let m = Arc::clone(&metadata);
        match tokio::task::spawn_blocking(move || m.persist_offsets_if_dirty()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "persisting consumer offsets failed; will retry")
            }
            Err(e) => tracing::error!(error = %e, "consumer-offset persist task failed"),
        }
    }
}

fn listener_addr(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "?".into(), |a| a.to_string())
}

fn log_recovery(config: &Config, log: &CommitLog) {
    let r = log.recovery_report();
    tracing::info!(
        data_dir = %config.node.data_dir.display(),
        clean = r.clean,
        scan_from = r.scan_from,
        scanned_bytes = r.scanned_bytes,
        scanned_records = r.scanned_records,
        min_offset = log.min_offset(),
        max_offset = log.max_offset(),
        "store opened"
    );
    if let Some(from) = r.truncated_from {
        tracing::warn!(
            truncated_from = from,
            removed_files = ?r.removed_files,
            reason = r.stopped_because.as_deref().unwrap_or(""),
            repaired = r.repaired,
            "recovery truncated the commitlog"
        );
    }
}
