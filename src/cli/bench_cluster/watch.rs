//! The two clocks of a failover in `hasync bench cluster`: an independent watch of the groups'
//! records in etcd (when a master's leader key went, when the epoch opened, when the new
//! master was stable, as etcd has them), and one `WatchTopology` stream on a node (when the
//! node told its client). Both stamp what they see with this process's monotonic clock.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use prost::Message as _;

use crate::control::pb;
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{self, GroupState, Phase};
use crate::coordinator::{Coordinator, Revision, WatchEvent};

/// How long a topology stream's first update (the snapshot) may take.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(20);

/// A change of a group's records, as the bench's own watch saw it.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) at: Instant,
    pub(super) group: String,
    /// The state record written; None: the leader key was deleted (the master's lease went).
    pub(super) state: Option<GroupState>,
}

/// When one failover's steps reached etcd.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Steps {
    /// The old master's leader key deleted (its lease expired).
    pub(super) leader_gone: Option<Instant>,
    /// The first state record of a later epoch (the controller opened it: phase fencing).
    pub(super) opened: Option<Instant>,
    /// The first state record of a later epoch in phase promoting (enough voters fenced,
    /// the new master chosen).
    pub(super) promoting: Option<Instant>,
    /// The first stable state record of a later epoch with another master.
    pub(super) stable: Option<Instant>,
}

/// The bench's independent watch of `<root>groups/`.
pub(super) struct Observer {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Watches every group's records from `from` on.
    pub(super) async fn start(
        engine: Arc<dyn Coordinator>,
        keys: &Keys,
        from: Revision,
    ) -> anyhow::Result<Self> {
        let mut stream = engine.watch(&keys.groups(), from).await.context("watching the groups")?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = Arc::clone(&seen);
        let keys = keys.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(batch)) = stream.recv().await {
                let at = Instant::now();
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                for ev in batch.events {
                    let (key, state) = match &ev {
                        WatchEvent::Put(kv) => {
                            (kv.key.as_str(), records::decode::<GroupState>(&kv.key, &kv.value))
                        }
                        WatchEvent::Delete { key, .. } => {
                            if let Some((group, "leader")) = keys.split_group(key) {
                                log.push(Seen { at, group: group.to_owned(), state: None });
                            }
                            continue;
                        }
                    };
                    if let (Some((group, "state")), Ok(s)) = (keys.split_group(key), state) {
                        log.push(Seen { at, group: group.to_owned(), state: Some(s) });
                    }
                }
            }
        });
        Ok(Self { seen, task })
    }

    /// When the failover of `group` away from `old` (master of epoch `epoch`) reached etcd,
    /// counting only what was seen at or after `since`.
    pub(super) fn steps(&self, group: &str, old: &str, epoch: u64, since: Instant) -> Steps {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut steps = Steps::default();
        for s in seen.iter().filter(|s| s.group == group && s.at >= since) {
            match &s.state {
                None => {
                    steps.leader_gone.get_or_insert(s.at);
                }
                Some(st) if st.epoch > epoch => {
                    steps.opened.get_or_insert(s.at);
                    if st.phase == Phase::Promoting {
                        steps.promoting.get_or_insert(s.at);
                    }
                    if st.phase == Phase::Stable && st.master.as_deref().is_some_and(|m| m != old) {
                        steps.stable.get_or_insert(s.at);
                    }
                }
                Some(_) => {}
            }
        }
        steps
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a topology stream brought so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Received {
    /// Updates of every kind, and their encoded size.
    pub(super) updates: u64,
    pub(super) bytes: u64,
    /// Per CHANGE, per group in it: when it came, the group, its master, stable or not, epoch.
    pub(super) changes: Vec<(Instant, String, Option<String>, bool, u64)>,
}

/// One `WatchTopology` stream, read by a task of its own.
pub(super) struct Topology {
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
    /// The encoded size of the snapshot the stream began with.
    pub(super) snapshot_bytes: usize,
}

impl Topology {
    /// Opens the stream on the node at `grpc` and waits for its snapshot.
    pub(super) async fn open(grpc: SocketAddr) -> anyhow::Result<Self> {
        let url = format!("http://{grpc}");
        let mut client = pb::cluster_client::ClusterClient::connect(url.clone())
            .await
            .with_context(|| format!("connecting to {url}"))?
            .max_decoding_message_size(crate::control::client::RESPONSE_MAX);
        let req = pb::WatchTopologyRequest { from_revision: 0, sample_interval_ms: 0 };
        let mut stream = client.watch_topology(req).await.context("WatchTopology")?.into_inner();
        let first = tokio::time::timeout(SNAPSHOT_WAIT, stream.message())
            .await
            .with_context(|| format!("no topology snapshot within {SNAPSHOT_WAIT:?}"))?
            .context("the topology stream")?
            .context("the topology stream ended before its snapshot")?;
        anyhow::ensure!(
            first.kind() == pb::TopologyUpdateKind::Snapshot,
            "the topology stream began with {:?}, not a snapshot",
            first.kind()
        );
        let snapshot_bytes = first.encoded_len();
        let received = Arc::new(Mutex::new(Received::default()));
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            while let Ok(Some(u)) = stream.message().await {
                let at = Instant::now();
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.updates += 1;
                log.bytes += u.encoded_len() as u64;
                if u.kind() != pb::TopologyUpdateKind::Change {
                    continue;
                }
                for g in &u.groups {
                    let stable = g.phase() == pb::GroupPhase::Stable;
                    log.changes.push((at, g.group.clone(), g.master.clone(), stable, g.epoch));
                }
            }
        });
        Ok(Self { received, task, snapshot_bytes })
    }

    /// What the stream brought so far.
    pub(super) fn received(&self) -> Received {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// When a CHANGE first named a stable master of `group` other than `old` at an epoch
    /// above `epoch`.
    pub(super) fn promoted(&self, group: &str, old: &str, epoch: u64) -> Option<Instant> {
        let r = self.received.lock().unwrap_or_else(|e| e.into_inner());
        r.changes
            .iter()
            .find(|(_, g, master, stable, e)| {
                g == group && *stable && *e > epoch && master.as_deref().is_some_and(|m| m != old)
            })
            .map(|c| c.0)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.task.abort();
    }
}
