//! `hasync.v1.Replication`: status, status stream, replication mode, role (later).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::config::{ReplicationMode, Role};
use crate::control::{convert, pb};
use crate::node::Node;
use crate::node::role::RoleRequest;

/// Default and smallest WatchStatus intervals.
const WATCH_DEFAULT: Duration = Duration::from_millis(1000);
const WATCH_MIN: Duration = Duration::from_millis(100);

pub(crate) struct ReplicationService {
    node: Arc<Node>,
    cancel: CancellationToken,
}

impl ReplicationService {
    pub(crate) fn new(node: Arc<Node>, cancel: CancellationToken) -> Self {
        Self { node, cancel }
    }

    fn snapshot(node: &Node) -> pb::ReplicationStatus {
        convert::status(&node.status())
    }
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<pb::ReplicationStatus, Status>> + Send>>;

#[tonic::async_trait]
impl pb::replication_server::Replication for ReplicationService {
    async fn get_status(
        &self,
        _: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::ReplicationStatus>, Status> {
        Ok(Response::new(Self::snapshot(&self.node)))
    }

    type WatchStatusStream = StatusStream;

    async fn watch_status(
        &self,
        request: Request<pb::WatchStatusRequest>,
    ) -> Result<Response<StatusStream>, Status> {
        let ms = request.into_inner().interval_ms;
        let every = if ms == 0 {
            WATCH_DEFAULT
        } else {
            Duration::from_millis(u64::from(ms)).max(WATCH_MIN)
        };
        let node = Arc::clone(&self.node);
        let cancel = self.cancel.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tx.closed() => return, // the client went away
                    _ = tick.tick() => {}
                }
                if tx.send(Ok(Self::snapshot(&node))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn set_replication_mode(
        &self,
        request: Request<pb::SetReplicationModeRequest>,
    ) -> Result<Response<pb::SetReplicationModeResponse>, Status> {
        let req = request.into_inner();
        let mode = match pb::ReplicationMode::try_from(req.mode) {
            Ok(pb::ReplicationMode::Sync) => ReplicationMode::Sync,
            Ok(pb::ReplicationMode::Async) => ReplicationMode::Async,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "mode must be REPLICATION_MODE_SYNC or REPLICATION_MODE_ASYNC, got {}",
                    req.mode
                )));
            }
        };
        let k = req.sync_ack_replicas.map(|k| k as usize);
        let now = self.node.set_replication_mode(mode, k)?;
        Ok(Response::new(pb::SetReplicationModeResponse {
            mode: convert::mode(now.mode) as i32,
            sync_ack_replicas: now.sync_ack_replicas as u32,
        }))
    }

    async fn change_role(
        &self,
        request: Request<pb::ChangeRoleRequest>,
    ) -> Result<Response<pb::ChangeRoleResponse>, Status> {
        let req = request.into_inner();
        let role = match pb::Role::try_from(req.role) {
            Ok(pb::Role::Master) => Role::Master,
            Ok(pb::Role::Slave) => Role::Slave,
            _ => return Err(Status::invalid_argument("role must be ROLE_MASTER or ROLE_SLAVE")),
        };
        if role == Role::Master && (!req.master_ha_address.is_empty() || req.force_resync) {
            return Err(Status::invalid_argument(
                "master_ha_address and force_resync are for ROLE_SLAVE only",
            ));
        }
        let request = RoleRequest {
            role,
            epoch: req.epoch,
            master_ha: req.master_ha_address,
            master_grpc: req.master_grpc_address,
            force_resync: req.force_resync,
            decision_token: req.decision_token,
        };
        // In its own task, as puts are: a client that goes away (or whose deadline passes) must
        // not drop the change between its steps (a demotion that fenced puts and is waiting for
        // the new master's history would stay fenced).
        let node = Arc::clone(&self.node);
        let (role, epoch) =
            tokio::spawn(async move { node.change_role(request).await })
                .await
                .map_err(|e| Status::internal(format!("role change task failed: {e}")))??;
        Ok(Response::new(pb::ChangeRoleResponse { role: convert::role(role) as i32, epoch }))
    }

    async fn fence(
        &self,
        request: Request<pb::FenceRequest>,
    ) -> Result<Response<pb::FenceResponse>, Status> {
        let req = request.into_inner();
        // In its own task, as a role change: a client that goes away must not drop the fence
        // between the promise written and the HA link closed.
        let node = Arc::clone(&self.node);
        let f = tokio::spawn(async move {
            node.fence_draining(req.epoch, &req.token, &req.drain_for).await
        })
        .await
        .map_err(|e| Status::internal(format!("fence task failed: {e}")))??;
        Ok(Response::new(pb::FenceResponse {
            promised_epoch: f.promised_epoch,
            node_name: f.node_name,
            data_dir_id: f.data_dir_id,
            role: convert::role(f.role) as i32,
            epoch: f.epoch,
            history: f.history.iter().map(convert::epoch_entry).collect(),
            last_record_epoch: f.last_record_epoch,
            end_offset: f.end_offset as i64,
            drained: f.drained,
        }))
    }

    async fn register_replica(
        &self,
        request: Request<pb::RegisterReplicaRequest>,
    ) -> Result<Response<pb::RegisterReplicaResponse>, Status> {
        let req = request.into_inner();
        let address = req.ha_local_address.parse().map_err(|e| {
            Status::invalid_argument(format!(
                "ha_local_address {:?} is not ip:port: {e}",
                req.ha_local_address
            ))
        })?;
        let r = self.node.register_replica(req.data_dir_id, req.node_name, address)?;
        Ok(Response::new(pb::RegisterReplicaResponse {
            identity: r.identity,
            replica_id: r.replica_id.unwrap_or(0),
            matched: r.matched,
        }))
    }

    async fn get_epoch_history(
        &self,
        _: Request<pb::GetEpochHistoryRequest>,
    ) -> Result<Response<pb::GetEpochHistoryResponse>, Status> {
        // One snapshot: a slave's epoch check must not see a history and a role from two
        // sides of a role change.
        let s = self.node.epoch_snapshot();
        Ok(Response::new(pb::GetEpochHistoryResponse {
            entries: s.history.entries().iter().map(convert::epoch_entry).collect(),
            max_offset: s.max_offset as i64,
            role: convert::role(s.role) as i32,
            epoch: s.epoch,
        }))
    }
}
