//! The node: opens the store, starts the data plane for its role, owns the shutdown token and
//! the task set. The control plane (gRPC) calls into it; it knows nothing of gRPC.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Role};
use crate::ha::master::{Master, MasterOptions};
use crate::ha::slave::{Slave, SlaveOptions};
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
    /// A blocking store task panicked.
    #[error("store task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    config: Config,
    store: Arc<CommitLog>,
    master: Option<Arc<Master>>,
    slave: Option<Arc<Slave>>,
    ha_addr: Option<SocketAddr>,
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
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (mut master, mut slave, mut ha_addr) = (None, None, None);
        match config.node.role {
            Role::Master => {
                let addr = config.ha.listen;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Bind { what: "ha.listen", addr, source })?;
                ha_addr = listener.local_addr().ok();
                let m =
                    Master::new(Arc::clone(&store), MasterOptions::from_config(&config.ha), None);
                tasks.spawn(Arc::clone(&m).run(listener, cancel.child_token()));
                tracing::info!(ha_listen = ?ha_addr, "master data plane listening");
                master = Some(m);
            }
            Role::Slave => {
                let s = Slave::new(Arc::clone(&store), SlaveOptions::from_config(&config));
                tasks.spawn(Arc::clone(&s).run(cancel.child_token()));
                tracing::info!(master_ha = %config.slave.master_ha, "slave data plane started");
                slave = Some(s);
            }
        }
        Ok(Self { config, store, master, slave, ha_addr, cancel, tasks })
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

    /// Stops the data plane, then closes the store cleanly (final flush, checkpoint, abort
    /// marker removed).
    pub async fn shutdown(self) -> Result<(), Error> {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let store = self.store;
        drop((self.master, self.slave));
        match Arc::try_unwrap(store) {
            Ok(store) => tokio::task::spawn_blocking(move || store.close()).await??,
            Err(store) => {
                // Someone still holds the store: flush and checkpoint; the marker stays.
                tracing::warn!("store still in use at shutdown; flushing without a clean close");
                tokio::task::spawn_blocking(move || store.checkpoint_blocking()).await??;
            }
        }
        Ok(())
    }
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
