//! The slave's metadata pull loop: every `metadata.sync-interval` (first pull at once) it sends
//! the versions it holds to the master's `Metadata.Pull`, adopts each changed table whole with
//! the master's version, and persists only what changed. When the master is unreachable it
//! keeps serving its last good copy and reports the error in its status.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ha::status::now_millis;
use crate::metadata::{DataVersion, MetadataStore, Table, TableData};

/// The tables a master sent because their version differs from the one held, each with the
/// master's version.
pub(crate) type Pulled = Vec<(DataVersion, TableData)>;

/// Where a slave pulls its metadata from (the master's API). `metadata` defines what it
/// needs; the control plane implements it over gRPC.
pub(crate) trait Source: Send + Sync + std::fmt::Debug {
    /// Sends the versions held to the master at `master` and returns every table whose version
    /// differs, whole; a table cut short is an error, never a partial table.
    fn pull<'a>(
        &'a self,
        master: &'a str,
        held: &'a HashMap<Table, DataVersion>,
    ) -> Pin<Box<dyn Future<Output = Result<Pulled, String>> + Send + 'a>>;
}

/// What the pull loop reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullStatus {
    /// The master's gRPC address.
    pub master: String,
    /// Unix ms of the last pull that completed (0 before the first).
    pub last_success_unix_ms: i64,
    /// Unix ms of the last attempt.
    pub last_attempt_unix_ms: i64,
    /// Why the last pull failed, if it did (cleared by a successful one).
    pub last_error: Option<String>,
    /// Pulls that completed.
    pub pulls_ok: u64,
    /// Pulls that failed.
    pub pulls_failed: u64,
    /// Tables adopted (changed) over all pulls.
    pub tables_changed: u64,
}

/// The pull loop of one slave.
#[derive(Debug)]
pub(crate) struct Puller {
    store: Arc<MetadataStore>,
    source: Arc<dyn Source>,
    master: String,
    interval: Duration,
    status: Mutex<PullStatus>,
    counters: crate::metrics::PullCounters,
}

impl Puller {
    /// A pull loop from `source` against the master's gRPC address `master`.
    pub(crate) fn new(
        store: Arc<MetadataStore>,
        source: Arc<dyn Source>,
        master: String,
        interval: Duration,
        counters: crate::metrics::PullCounters,
    ) -> Arc<Self> {
        let status = PullStatus { master: master.clone(), ..Default::default() };
        Arc::new(Self { store, source, master, interval, status: Mutex::new(status), counters })
    }

    fn status_mut(&self) -> MutexGuard<'_, PullStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loop's status.
    pub(crate) fn status(&self) -> PullStatus {
        self.status_mut().clone()
    }

    /// Pulls at once, then every interval, until `cancel` fires.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.pull_once() => r,
            };
            self.record(result);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    fn record(&self, result: Result<usize, String>) {
        self.counters.record(result.is_ok());
        {
            let mut st = self.status_mut();
            st.last_attempt_unix_ms = now_millis();
            match result {
                Ok(changed) => {
                    st.last_success_unix_ms = st.last_attempt_unix_ms;
                    st.last_error = None;
                    st.pulls_ok += 1;
                    st.tables_changed += changed as u64;
                    if changed > 0 {
                        tracing::info!(master = %self.master, changed, "metadata pulled");
                    }
                }
                Err(e) => {
                    if st.last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(master = %self.master, error = %e, "metadata pull failed; serving the last copy");
                    }
                    st.last_error = Some(e);
                    st.pulls_failed += 1;
                }
            }
        }
    }

    /// One pull; returns how many tables changed.
    pub(crate) async fn pull_once(&self) -> Result<usize, String> {
        let held: HashMap<Table, DataVersion> = self.store.versions().into_iter().collect();
        let complete = self.source.pull(&self.master, &held).await?;
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || {
            let mut changed = 0;
            for (version, data) in complete {
                if store.adopt(version, data).map_err(|e| e.to_string())? {
                    changed += 1;
                }
            }
            Ok(changed)
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
