//! The slave's metadata pull loop: every `metadata.sync-interval` (first pull at once) it sends
//! the versions it holds to the master's `Metadata.Pull`, adopts each changed table whole with
//! the master's version, and persists only what changed. When the master is unreachable it
//! keeps serving its last good copy and reports the error in its status.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::control::pb;
use crate::ha::status::now_millis;
use crate::metadata::wire::{self, Assembler};
use crate::metadata::{DataVersion, MetadataStore, Table};

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
pub struct Puller {
    store: Arc<MetadataStore>,
    master: String,
    interval: Duration,
    token: String,
    status: Mutex<PullStatus>,
    counters: crate::metrics::PullCounters,
}

impl Puller {
    /// A pull loop against the master's gRPC address (`host:port`); `token` is sent as a
    /// bearer token when not empty; every pull is counted in `counters`.
    pub fn new(
        store: Arc<MetadataStore>,
        master: String,
        interval: Duration,
        token: String,
        counters: crate::metrics::PullCounters,
    ) -> Arc<Self> {
        let status = PullStatus { master: master.clone(), ..Default::default() };
        Arc::new(Self { store, master, interval, token, status: Mutex::new(status), counters })
    }

    fn status_mut(&self) -> MutexGuard<'_, PullStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loop's status.
    pub fn status(&self) -> PullStatus {
        self.status_mut().clone()
    }

    /// Pulls at once, then every interval, until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
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
    pub async fn pull_once(&self) -> Result<usize, String> {
        let url = if self.master.contains("://") {
            self.master.clone()
        } else {
            format!("http://{}", self.master)
        };
        let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
            .map_err(|e| format!("bad slave.master-grpc {:?}: {e}", self.master))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60));
        let channel = endpoint.connect().await.map_err(|e| format!("cannot reach {url}: {e}"))?;
        let mut client =
            pb::metadata_client::MetadataClient::new(channel).max_decoding_message_size(64 << 20);
        let held: HashMap<Table, DataVersion> = self.store.versions().into_iter().collect();
        let v = |t| Some(wire::version_pb(held[&t]));
        let mut req = tonic::Request::new(pb::PullRequest {
            topics: v(Table::Topics),
            consumer_offsets: v(Table::ConsumerOffsets),
            delay_offsets: v(Table::DelayOffsets),
            subscription_groups: v(Table::SubscriptionGroups),
        });
        if !self.token.is_empty() {
            let value =
                format!("Bearer {}", self.token).parse().map_err(|_| "bad token".to_owned())?;
            req.metadata_mut().insert("authorization", value);
        }
        let mut stream = client
            .pull(req)
            .await
            .map_err(|s| format!("Pull refused by {url}: {:?}: {}", s.code(), s.message()))?
            .into_inner();
        let mut receiving: Option<Assembler> = None;
        let mut complete = Vec::new();
        while let Some(chunk) =
            stream.message().await.map_err(|s| format!("Pull stream broke: {}", s.message()))?
        {
            let table = wire::table_of(chunk.table).ok_or("chunk for an unknown table")?;
            if chunk.unchanged {
                continue;
            }
            let version = chunk.version.as_ref().map(wire::version_of).unwrap_or_default();
            let last = chunk.last;
            let asm = receiving.get_or_insert_with(|| Assembler::new(table));
            if asm.table() != table {
                return Err("chunks of two tables interleaved".into());
            }
            asm.add(chunk);
            if last {
                complete.push((version, receiving.take().expect("receiving").finish()));
            }
        }
        if receiving.is_some() {
            return Err("the stream ended inside a table; nothing of it adopted".into());
        }
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
