//! The console's producer: while someone looks at the console (`metrics::feed`), it follows
//! the topology stream this node serves (`WatchTopology`: the cluster's groups through the
//! coordinator, or the node's own group without one) and publishes the view as the console's
//! JSON document, one per update. When nobody looks it closes the stream (and its watch).
//!
//! The document: `node`, `cluster`, `coordinated`, `connected` and `coordinator_error` (this
//! node lost its coordinator: the view may be stale), `revision`, `time_unix_ms`,
//! `controller`, `paused`, and `groups` as `hasync cluster status --json` writes them
//! (`control::json`) with their recent decisions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::control::cluster::{ClusterApi, TopologyStream};
use crate::control::{json, pb};
use crate::metrics::feed::Feed;
use crate::node::Node;

/// How often the producer checks whether anyone still looks.
const CHECK: Duration = Duration::from_secs(2);
/// The wait before the stream is opened again after it failed.
const RETRY: Duration = Duration::from_secs(1);
/// The sample interval of the console's stream.
const SAMPLE: Duration = Duration::from_millis(1000);

/// The view the document renders: merged from the stream's updates.
#[derive(Debug, Default)]
struct View {
    groups: BTreeMap<String, pb::GroupStatus>,
    revision: i64,
    connected: bool,
    error: String,
    controller: String,
    paused: bool,
}

impl View {
    fn apply(&mut self, u: pb::TopologyUpdate) {
        if u.kind() == pb::TopologyUpdateKind::Snapshot {
            self.groups.clear();
        }
        for g in u.groups {
            self.groups.insert(g.group.clone(), g);
        }
        for g in &u.removed_groups {
            self.groups.remove(g);
        }
        self.revision = u.revision;
        self.connected = u.coordinator_connected;
        self.error = u.coordinator_error;
        self.controller = u.controller;
        self.paused = u.paused;
    }
}

/// What the producer follows.
#[derive(Debug, Clone)]
pub(super) struct Source {
    /// The cluster through the coordinator; None: the node's own group.
    pub(super) cluster: Option<Arc<dyn ClusterApi>>,
    pub(super) node: Arc<Node>,
}

impl Source {
    async fn open(&self) -> Result<TopologyStream, String> {
        let req = pb::WatchTopologyRequest {
            from_revision: 0,
            sample_interval_ms: SAMPLE.as_millis() as u32,
        };
        match &self.cluster {
            Some(api) => api.watch_topology(req).await.map_err(|e| e.to_string()),
            None => crate::control::cluster::local_topology(Arc::clone(&self.node), req)
                .map_err(|e| e.message().to_owned()),
        }
    }

    fn document(&self, view: &View) -> String {
        let c = self.node.config();
        json!({
            "node": c.node.name,
            "cluster": c.coordinator.cluster,
            "coordinated": self.cluster.is_some(),
            "connected": view.connected,
            "coordinator_error": Some(view.error.as_str()).filter(|e| !e.is_empty()),
            "revision": view.revision,
            "time_unix_ms": crate::ha::status::now_millis(),
            "controller": Some(view.controller.as_str()).filter(|c| !c.is_empty()),
            "paused": view.paused,
            "groups": view.groups.values().map(json::group).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

/// The document before the producer has a view.
pub(super) fn initial(node: &Node, coordinated: bool) -> String {
    let c = node.config();
    json!({
        "node": c.node.name,
        "cluster": c.coordinator.cluster,
        "coordinated": coordinated,
        "connected": false,
        "coordinator_error": "the console's view is not loaded yet",
        "revision": 0,
        "time_unix_ms": crate::ha::status::now_millis(),
        "controller": null,
        "paused": false,
        "groups": [],
    })
    .to_string()
}

/// Runs the producer until `cancel`.
pub(super) async fn run(source: Source, feed: Feed, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = feed.until_wanted() => {}
        }
        let mut stream = match source.open().await {
            Ok(s) => s,
            Err(e) => {
                let view = View { error: e, ..View::default() };
                feed.publish(source.document(&view));
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
                continue;
            }
        };
        let mut view = View::default();
        let mut check = tokio::time::interval(CHECK);
        check.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                u = stream.recv() => match u {
                    Some(u) => {
                        view.apply(u);
                        feed.publish(source.document(&view));
                    }
                    None => break,
                },
                _ = check.tick() => {
                    if !feed.wanted() {
                        break;
                    }
                }
            }
        }
        // Nobody looks (or the stream ended): the watch goes with the stream.
        drop(stream);
        feed.idle();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}
