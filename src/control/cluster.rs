//! `hasync.v1.Cluster`: the operator interface of automatic failover. This module defines what
//! it needs ([`ClusterApi`], implemented by the controller over the coordinator's records, the
//! way `node::remote` is defined by its consumer) and serves it; it holds no state and knows
//! no coordinator. A node without a coordinator has no implementation and answers every call
//! FAILED_PRECONDITION ([`NO_COORDINATOR`]).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::control::pb;
use crate::node::Node;

mod local;

/// The answer of every call on a node without a coordinator.
pub const NO_COORDINATOR: &str =
    "this node runs without a coordinator ([coordinator] endpoints is empty)";

/// Why a [`ClusterApi`] call did not do what was asked; each kind has its gRPC code (mapped in
/// `control::error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The request is wrong (an unknown target, a missing flag). INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// The group has no records. NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// Not in this state (another request pending). FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A compare-and-swap lost its race too often; try again. ABORTED.
    #[error("{0}")]
    Conflict(String),
    /// No outcome in time; the request stays pending. DEADLINE_EXCEEDED.
    #[error("{0}")]
    Timeout(String),
    /// The coordinator failed or holds what hasync did not write there. INTERNAL (never
    /// UNAVAILABLE: the node answered, its coordinator did not).
    #[error("{0}")]
    Coordinator(String),
}

/// A topology stream's sample interval when the request gives none.
pub const TOPOLOGY_SAMPLE_DEFAULT: Duration = Duration::from_millis(2000);
/// The shortest sample interval a request may ask for.
pub const TOPOLOGY_SAMPLE_MIN: Duration = Duration::from_millis(200);
/// The longest sample interval a request may ask for.
pub const TOPOLOGY_SAMPLE_MAX: Duration = Duration::from_millis(60_000);

/// The sample interval of a `WatchTopology` request: 0 is the default; outside the bounds is
/// an error that names them.
pub fn topology_sample_interval(ms: u32) -> Result<Duration, String> {
    if ms == 0 {
        return Ok(TOPOLOGY_SAMPLE_DEFAULT);
    }
    let d = Duration::from_millis(u64::from(ms));
    if d < TOPOLOGY_SAMPLE_MIN || d > TOPOLOGY_SAMPLE_MAX {
        return Err(format!(
            "sample_interval_ms {ms} is outside {}..={} (0: {})",
            TOPOLOGY_SAMPLE_MIN.as_millis(),
            TOPOLOGY_SAMPLE_MAX.as_millis(),
            TOPOLOGY_SAMPLE_DEFAULT.as_millis()
        ));
    }
    Ok(d)
}

/// The topology stream of a node without a coordinator: its own group (see `local`).
pub fn local_topology(
    node: Arc<Node>,
    request: pb::WatchTopologyRequest,
) -> Result<TopologyStream, Status> {
    local::start(node, request)
}

/// The updates of one `WatchTopology` stream (it ends when the receiver is dropped).
pub type TopologyStream = tokio::sync::mpsc::Receiver<pb::TopologyUpdate>;

/// The future a [`ClusterApi`] call returns.
pub type ClusterFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ClusterError>> + Send + 'a>>;

/// What the Cluster service needs: the cluster's records, read and requested through the
/// coordinator (the controller implements it).
pub trait ClusterApi: Send + Sync + Debug {
    /// Every group's status, or `group`'s only (None: all).
    fn status<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::ClusterStatus>;
    /// `group`'s history records, newest first, at most `limit` (0: all).
    fn history<'a>(
        &'a self,
        group: &'a str,
        limit: usize,
    ) -> ClusterFuture<'a, pb::GetHistoryResponse>;
    /// Requests a switchover and waits for its outcome.
    fn switchover(&self, request: pb::SwitchoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome>;
    /// Requests a manual failover and waits for its outcome.
    fn failover(&self, request: pb::FailoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome>;
    /// Pauses the cluster's (None) or `group`'s automatic failover.
    fn pause<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState>;
    /// Resumes the cluster's (None) or `group`'s automatic failover.
    fn resume<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState>;
    /// Requests a change of V, k or the mode from the group's master and waits for its
    /// outcome.
    fn change_group(
        &self,
        request: pb::ChangeGroupRequest,
    ) -> ClusterFuture<'_, pb::ChangeGroupOutcome>;
    /// The cluster's topology: a snapshot (or the changes after `from_revision`), then its
    /// changes, samples of its members, and the coordinator's loss and return.
    fn watch_topology(
        &self,
        request: pb::WatchTopologyRequest,
    ) -> ClusterFuture<'_, TopologyStream>;
    /// Deletes every record of `group`, refused while it has a live member or a leader key.
    fn remove_group<'a>(&'a self, group: &'a str) -> ClusterFuture<'a, pb::RemoveGroupResponse>;
}

/// The tonic service, delegating to the controller's [`ClusterApi`] when the node has one.
#[derive(Debug, Clone)]
pub(crate) struct ClusterService {
    api: Option<Arc<dyn ClusterApi>>,
    /// The node serving (None in tests of the service alone): its own group is the topology
    /// without a coordinator.
    node: Option<Arc<Node>>,
    /// Cancelled when the server stops: open topology streams end.
    stop: tokio_util::sync::CancellationToken,
    /// Topology streams open now, at most [`MAX_TOPOLOGY_STREAMS`] (each is a watch on the
    /// coordinator).
    streams: Arc<tokio::sync::Semaphore>,
}

/// The most `WatchTopology` streams one node serves at once: each holds one etcd watcher
/// that carries every change of the cluster, so they are bounded like connections.
pub const MAX_TOPOLOGY_STREAMS: usize = 64;

impl ClusterService {
    pub(crate) fn new(
        api: Option<Arc<dyn ClusterApi>>,
        node: Option<Arc<Node>>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        Self {
            api,
            node,
            stop,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_TOPOLOGY_STREAMS)),
        }
    }

    fn api(&self) -> Result<&dyn ClusterApi, Status> {
        self.api.as_deref().ok_or_else(|| Status::failed_precondition(NO_COORDINATOR))
    }
}

/// An empty group name is "none given".
fn group(name: &str) -> Option<&str> {
    Some(name.trim()).filter(|g| !g.is_empty())
}

/// A `WatchTopology` stream as tonic sends it.
type UpdateStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::TopologyUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    type WatchTopologyStream = UpdateStream;

    async fn watch_topology(
        &self,
        request: Request<pb::WatchTopologyRequest>,
    ) -> Result<Response<UpdateStream>, Status> {
        let req = request.into_inner();
        let permit = Arc::clone(&self.streams).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this node serves {MAX_TOPOLOGY_STREAMS} WatchTopology streams already; close \
                 one or watch through another node"
            ))
        })?;
        let rx = match (&self.api, &self.node) {
            (Some(api), _) => api.watch_topology(req).await?,
            (None, Some(node)) => local::start(Arc::clone(node), req)?,
            (None, None) => return Err(Status::failed_precondition(NO_COORDINATOR)),
        };
        let name = self.node.as_ref().map(|n| n.config().node.name.clone()).unwrap_or_default();
        // Forwarded until the server stops (it would wait for open streams otherwise) or the
        // client goes away; either drop ends the watcher's task.
        let (tx, out) = tokio::sync::mpsc::channel(1);
        let stop = self.stop.clone();
        let mut rx = rx;
        tokio::spawn(async move {
            let _permit = permit;
            loop {
                let mut u = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    u = rx.recv() => match u {
                        Some(u) => u,
                        None => return,
                    },
                };
                u.node = name.clone();
                // A client that stops reading must not hold the server's stop.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    sent = tx.send(Ok(u)) => if sent.is_err() { return },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))))
    }

    async fn get_cluster_status(
        &self,
        request: Request<pb::GetClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.api()?.status(group(&req.group)).await?))
    }

    async fn get_history(
        &self,
        request: Request<pb::GetHistoryRequest>,
    ) -> Result<Response<pb::GetHistoryResponse>, Status> {
        let api = self.api()?;
        let req = request.into_inner();
        let Some(g) = group(&req.group) else {
            return Err(Status::invalid_argument("group is empty: name the group"));
        };
        Ok(Response::new(api.history(g, req.limit as usize).await?))
    }

    async fn switchover(
        &self,
        request: Request<pb::SwitchoverRequest>,
    ) -> Result<Response<pb::OperatorOutcome>, Status> {
        let api = self.api()?;
        Ok(Response::new(api.switchover(request.into_inner()).await?))
    }

    async fn failover(
        &self,
        request: Request<pb::FailoverRequest>,
    ) -> Result<Response<pb::OperatorOutcome>, Status> {
        let api = self.api()?;
        Ok(Response::new(api.failover(request.into_inner()).await?))
    }

    async fn pause(
        &self,
        request: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseState>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.api()?.pause(group(&req.group)).await?))
    }

    async fn change_group(
        &self,
        request: Request<pb::ChangeGroupRequest>,
    ) -> Result<Response<pb::ChangeGroupOutcome>, Status> {
        let api = self.api()?;
        Ok(Response::new(api.change_group(request.into_inner()).await?))
    }

    async fn resume(
        &self,
        request: Request<pb::ResumeRequest>,
    ) -> Result<Response<pb::PauseState>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.api()?.resume(group(&req.group)).await?))
    }

    async fn remove_group(
        &self,
        request: Request<pb::RemoveGroupRequest>,
    ) -> Result<Response<pb::RemoveGroupResponse>, Status> {
        let api = self.api()?;
        let req = request.into_inner();
        let Some(g) = group(&req.group) else {
            return Err(Status::invalid_argument("group is empty: name the group"));
        };
        Ok(Response::new(api.remove_group(g).await?))
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
