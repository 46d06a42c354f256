//! Standard gRPC health (`grpc.health.v1`): service "" is SERVING once the node is up and
//! NOT_SERVING while it shuts down; service `hasync.v1.Replication` is SERVING while the node
//! fulfils its role (see [`Node::fulfils_role`]), so readiness gates can use it; service
//! [`DISK_SERVICE`] is NOT_SERVING while the disk is full (see [`crate::store::disk`]).
//!
//! In coordinator mode replication readiness also follows the coordinator's view
//! ([`CoordinatorReadiness`]: `app` builds it from the member agent's view): SERVING on the
//! master only while the state record names it the master of its epoch and it holds its member
//! lease, on a slave only while it holds its lease and follows the record's master at the
//! record's epoch, on top of the node's own conditions. Static mode is unchanged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::node::Node;

/// What replication readiness asks of coordinator mode, at every evaluation: whether the
/// coordinator's view lets the node be ready now (Err: why not, in words). Defined here, built
/// by `app` from the member agent's view, so that `control` knows nothing of the coordinator.
pub type CoordinatorReadiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The health service name of replication readiness.
pub const REPLICATION_SERVICE: &str = "hasync.v1.Replication";

/// The health service name of the disk's write health: NOT_SERVING while a store write fails
/// because the disk is full. Its own service: neither the overall "" nor replication
/// readiness follows it, so by default it triggers no failover.
pub const DISK_SERVICE: &str = "hasync.v1.Disk";

/// How often the role readiness is re-evaluated.
const EVALUATE_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub(crate) struct Health {
    reporter: HealthReporter,
    stopping: Arc<AtomicBool>,
}

impl Health {
    pub(crate) async fn start(
        node: Arc<Node>,
        reporter: HealthReporter,
        coordinator: Option<CoordinatorReadiness>,
        cancel: CancellationToken,
    ) -> Self {
        let stopping = Arc::new(AtomicBool::new(false));
        reporter.set_service_status("", ServingStatus::Serving).await;
        let (r, s) = (reporter.clone(), Arc::clone(&stopping));
        tokio::spawn(async move {
            let (mut last, mut last_disk) = (None, None);
            loop {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let disk = node.store().disk().status();
                if last_disk != Some(disk.full) {
                    tracing::info!(service = DISK_SERVICE, serving = !disk.full, "health changed");
                    let status =
                        if disk.full { ServingStatus::NotServing } else { ServingStatus::Serving };
                    r.set_service_status(DISK_SERVICE, status).await;
                    last_disk = Some(disk.full);
                }
                let (ok, why) = readiness(&node, coordinator.as_ref());
                if last != Some(ok) {
                    tracing::info!(service = REPLICATION_SERVICE, serving = ok, %why, "health changed");
                    let status =
                        if ok { ServingStatus::Serving } else { ServingStatus::NotServing };
                    r.set_service_status(REPLICATION_SERVICE, status).await;
                    last = Some(ok);
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(EVALUATE_EVERY) => {}
                }
            }
        });
        Self { reporter, stopping }
    }

    pub(crate) async fn set_not_serving(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.reporter.set_service_status("", ServingStatus::NotServing).await;
        self.reporter.set_service_status(REPLICATION_SERVICE, ServingStatus::NotServing).await;
    }
}

/// Replication readiness: the node fulfils its role and, in coordinator mode, the agent's view
/// agrees (the node's reason first when both say no).
fn readiness(node: &Node, coordinator: Option<&CoordinatorReadiness>) -> (bool, String) {
    let (ok, why) = node.fulfils_role();
    let Some(coordinator) = coordinator else { return (ok, why) };
    match coordinator() {
        Ok(()) => (ok, why),
        Err(coordinator) if ok => (false, coordinator),
        Err(coordinator) => (false, format!("{why}; {coordinator}")),
    }
}
