//! Fenced role changes with epochs.
//!
//! - To MASTER (epoch above the last in the history): stop the slave client and the metadata
//!   pull, cut a partial last record, append `(epoch, max offset)` to the history, then accept
//!   puts and metadata writes.
//! - To SLAVE: refuse puts (waiting puts end with SERVICE_NOT_AVAILABLE), close the slave
//!   connections, fetch the new master's epoch history, truncate the local log at the
//!   consistent point, adopt the master's history, then follow it (data plane and metadata
//!   pull). A slave re-checks the histories before every (re)connect of the data plane.
//!
//! Refused changes change nothing. The last accepted request is persisted in
//! `<data-dir>/role` and wins over the configuration at the next start.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::task::TaskTracker;

use crate::config::Role;
use crate::control::pb;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::{Master, MasterOptions};
use crate::ha::slave::{BeforeConnect, Slave, SlaveOptions};
use crate::metadata::pull::Puller;
use crate::node::epoch::{EpochEntry, EpochHistory, consistent_point};
use crate::node::{Error, Node};
use crate::store::CommitLog;

/// The role file's name inside the data directory.
pub const ROLE_FILE: &str = "role";

/// A ChangeRole request (also what is persisted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRequest {
    /// The role to take.
    pub role: Role,
    /// The epoch of the change.
    pub epoch: u64,
    /// For a slave: the master's HA address.
    #[serde(default)]
    pub master_ha: String,
    /// For a slave: the master's gRPC address (empty: classic mode, no epoch check).
    #[serde(default)]
    pub master_grpc: String,
    /// For a slave: wipe the local log when it cannot converge.
    #[serde(default)]
    pub force_resync: bool,
}

impl RoleRequest {
    /// A promotion to master at `epoch`.
    pub fn master(epoch: u64) -> Self {
        Self {
            role: Role::Master,
            epoch,
            master_ha: String::new(),
            master_grpc: String::new(),
            force_resync: false,
        }
    }

    /// A change to slave of the master at `master_ha` (and `master_grpc`, empty for classic
    /// mode) at `epoch`.
    pub fn slave(epoch: u64, master_ha: impl Into<String>, master_grpc: impl Into<String>) -> Self {
        Self {
            role: Role::Slave,
            epoch,
            master_ha: master_ha.into(),
            master_grpc: master_grpc.into(),
            force_resync: false,
        }
    }

    /// The persisted request, if any.
    pub fn load(dir: &Path) -> Result<Option<Self>, Error> {
        let path = dir.join(ROLE_FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                Error::RoleRefused(format!("role file {} is unreadable: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::RoleRefused(format!("cannot read {}: {e}", path.display()))),
        }
    }

    fn store(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(ROLE_FILE);
        let bytes = serde_json::to_vec_pretty(self).expect("role request serializes");
        crate::store::fs::FileSystem::write_atomic(&crate::store::fs::StdFs, &path, &bytes)
            .map_err(|e| Error::RoleRefused(format!("cannot write {}: {e}", path.display())))
    }
}

/// What a slave does with its log against a master's history.
#[derive(Debug)]
enum Verdict {
    /// Nothing to cut.
    Keep,
    /// Cut at this offset.
    Truncate(u64),
    /// Empty the log (force_resync).
    Wipe,
}

/// Decides how a slave's log (history `local`, max `local_max`) converges with its master's.
fn verdict(
    local: &EpochHistory,
    local_max: u64,
    master: &EpochHistory,
    master_max: u64,
    force_resync: bool,
) -> Result<Verdict, String> {
    let (l, m) = (local.last(), master.last());
    let refuse = |why: String| if force_resync { Ok(Verdict::Wipe) } else { Err(why) };
    if m.epoch < l.epoch {
        return refuse(format!(
            "the master's last epoch {} is lower than this node's {}: it is stale",
            m.epoch, l.epoch
        ));
    }
    let Some(point) = consistent_point(local, local_max, master, master_max) else {
        return refuse("no epoch shared with the master: the logs cannot converge".into());
    };
    if point >= local_max {
        return Ok(Verdict::Keep);
    }
    if m.epoch == l.epoch {
        return refuse(format!(
            "the master is behind this node in the same epoch {}: its log ends at {master_max}, \
             this node's at {local_max}; refusing to truncate (promote this node instead, or \
             force_resync)",
            m.epoch
        ));
    }
    Ok(Verdict::Truncate(point))
}

/// Fetches a master's epoch history and max offset over gRPC.
async fn fetch_history(master_grpc: &str, token: &str) -> Result<(EpochHistory, u64), String> {
    let url = if master_grpc.contains("://") {
        master_grpc.to_owned()
    } else {
        format!("http://{master_grpc}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("bad master gRPC address {master_grpc:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    let channel =
        endpoint.connect().await.map_err(|e| format!("cannot reach the master at {url}: {e}"))?;
    let mut req = tonic::Request::new(pb::GetEpochHistoryRequest {});
    if !token.is_empty()
        && let Ok(v) = format!("Bearer {token}").parse()
    {
        req.metadata_mut().insert("authorization", v);
    }
    let resp = pb::replication_client::ReplicationClient::new(channel)
        .get_epoch_history(req)
        .await
        .map_err(|s| format!("GetEpochHistory on {url}: {:?}: {}", s.code(), s.message()))?
        .into_inner();
    let history = EpochHistory::from_entries(
        resp.entries
            .iter()
            .map(|e| EpochEntry { epoch: e.epoch, start_offset: e.start_offset.max(0) as u64 }),
    )
    .map_err(|e| format!("the master's epoch history is invalid: {e}"))?;
    Ok((history, resp.max_offset.max(0) as u64))
}

/// Brings the local log in line with the master's history: truncate or wipe as the verdict
/// says, adopt the master's history. Returns a note for the status.
async fn converge(
    store: &Arc<CommitLog>,
    history: &std::sync::Mutex<EpochHistory>,
    data_dir: &Path,
    master: (EpochHistory, u64),
    force_resync: bool,
) -> Result<String, String> {
    let (master_history, master_max) = master;
    let local = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let local_max = store.max_offset();
    let v = verdict(&local, local_max, &master_history, master_max, force_resync)?;
    let s = Arc::clone(store);
    let note = match v {
        Verdict::Keep => format!("epochs agree (master epoch {})", master_history.last().epoch),
        Verdict::Truncate(at) => {
            tokio::task::spawn_blocking(move || s.truncate(at))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot truncate to {at}: {e}"))?;
            tracing::warn!(
                from = local_max,
                to = at,
                "divergent tail truncated to follow the master"
            );
            format!("truncated {} bytes the master never had ({local_max} -> {at})", local_max - at)
        }
        Verdict::Wipe => {
            tokio::task::spawn_blocking(move || s.wipe())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot wipe the log: {e}"))?;
            "force_resync: local log wiped".to_owned()
        }
    };
    master_history.store(&crate::store::fs::StdFs, data_dir).map_err(|e| e.to_string())?;
    *history.lock().unwrap_or_else(|e| e.into_inner()) = master_history;
    Ok(note)
}

impl Node {
    /// Binds the HA listener and starts the master data plane with fresh sync waiters.
    pub(crate) async fn start_master_plane(&self) -> Result<(), Error> {
        let addr = self.config.ha.listen;
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind {
            what: "ha.listen",
            addr,
            source,
        })?;
        let ha_addr = listener.local_addr().ok();
        let waiters = Arc::new(SyncWaiters::new(self.replication().sync_ack_replicas));
        let m = Master::new(
            Arc::clone(&self.store),
            MasterOptions::from_config(&self.config),
            Arc::clone(&waiters),
            self.metrics.ha_counters(),
        );
        let mut st = self.state();
        st.plane = self.cancel.child_token();
        st.plane_tasks = TaskTracker::new();
        st.plane_tasks.spawn(Arc::clone(&waiters).run_expiry(st.plane.child_token()));
        st.plane_tasks.spawn(Arc::clone(&m).run(listener, st.plane.child_token()));
        st.waiters = waiters;
        st.master = Some(m);
        st.ha_addr = ha_addr;
        tracing::info!(ha_listen = %ha_addr.map_or_else(|| "?".into(), |a| a.to_string()), epoch = st.epoch, "master data plane listening");
        Ok(())
    }

    /// Starts the slave client (with the epoch check before every connect) and the metadata
    /// pull against the master in the role state.
    pub(crate) fn start_slave_plane(&self) {
        let mut st = self.state();
        let mut opts = SlaveOptions::from_config(&self.config);
        opts.master_ha = st.master_ha.clone();
        let check = self.epoch_check(st.master_grpc.clone());
        let slave =
            Slave::with_check(Arc::clone(&self.store), opts, check, self.metrics.ha_counters());
        st.plane = self.cancel.child_token();
        st.plane_tasks = TaskTracker::new();
        st.plane_tasks.spawn(Arc::clone(&slave).run(st.plane.child_token()));
        st.slave = Some(slave);
        st.puller = None;
        if st.master_grpc.is_empty() {
            tracing::warn!(
                "no master gRPC address: classic mode (no epoch check, no metadata pull)"
            );
        } else {
            let p = Puller::new(
                Arc::clone(&self.metadata),
                st.master_grpc.clone(),
                self.config.metadata.sync_interval,
                self.config.grpc.token.clone(),
                self.metrics.pull_counters(),
            );
            st.plane_tasks.spawn(Arc::clone(&p).run(st.plane.child_token()));
            st.puller = Some(p);
        }
        tracing::info!(master_ha = %st.master_ha, master_grpc = %st.master_grpc, epoch = st.epoch, "slave data plane started");
    }

    /// The check a slave runs before every (re)connect: compare histories with the master,
    /// converge or refuse. `None` (classic mode) without a master gRPC address.
    fn epoch_check(&self, master_grpc: String) -> Option<BeforeConnect> {
        if master_grpc.is_empty() {
            return None;
        }
        let store = Arc::clone(&self.store);
        let token = self.config.grpc.token.clone();
        let dir = self.config.node.data_dir.clone();
        let history = Arc::clone(&self.history);
        Some(Arc::new(move || {
            let (store, token, dir, history, grpc) = (
                Arc::clone(&store),
                token.clone(),
                dir.clone(),
                Arc::clone(&history),
                master_grpc.clone(),
            );
            Box::pin(async move {
                let master = fetch_history(&grpc, &token).await?;
                converge(&store, &history, &dir, master, false).await
            })
        }))
    }

    /// Stops the current role's data plane and waits for its tasks.
    pub(crate) async fn stop_plane(&self) {
        let (plane, tasks, waiters) = {
            let st = self.state();
            (st.plane.clone(), st.plane_tasks.clone(), Arc::clone(&st.waiters))
        };
        waiters.shutdown();
        plane.cancel();
        tasks.close();
        tasks.wait().await;
        let mut st = self.state();
        st.master = None;
        st.slave = None;
        st.puller = None;
        st.ha_addr = None;
    }
}

impl Node {
    /// Changes the role, fenced by epochs (see the module docs). Returns the role and epoch
    /// now in force. A refused change changes nothing.
    pub async fn change_role(&self, req: RoleRequest) -> Result<(Role, u64), Error> {
        let _one_at_a_time = self.role_change.lock().await;
        if !self.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::RoleRefused("the node is shutting down".into()));
        }
        let (role, epoch, last) = {
            let st = self.state();
            (st.role, st.epoch, st.last_request.clone())
        };
        if req.epoch < epoch {
            return Err(Error::RoleRefused(format!(
                "stale epoch {}: this node is at epoch {epoch}",
                req.epoch
            )));
        }
        if req.epoch == epoch {
            if last.as_ref() == Some(&req) {
                self.state().fenced = false;
                return Ok((role, epoch));
            }
            return Err(Error::RoleRefused(format!(
                "epoch {epoch} is already in force ({role}); only an exact repeat of the request \
                 that set it is accepted; use a higher epoch for a change"
            )));
        }
        match req.role {
            Role::Master => self.promote(req).await,
            Role::Slave => self.demote(req).await,
        }
    }

    async fn promote(&self, req: RoleRequest) -> Result<(Role, u64), Error> {
        let last = self.epoch_history().last();
        if req.epoch <= last.epoch {
            return Err(Error::RoleRefused(format!(
                "promotion needs an epoch above the history's last ({}), got {}",
                last.epoch, req.epoch
            )));
        }
        let was_master = self.role() == Role::Master;
        if !was_master {
            self.stop_plane().await;
        }
        // A slave's log may end mid-record: cut the partial record first.
        let store = Arc::clone(&self.store);
        let boundary = store.dispatched_offset();
        if store.max_offset() > boundary {
            tokio::task::spawn_blocking(move || store.truncate(boundary)).await??;
        }
        let max = self.store.max_offset();
        {
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            let mut next = h.clone();
            next.append(req.epoch, max)?;
            next.store(&crate::store::fs::StdFs, &self.config.node.data_dir)?;
            *h = next;
        }
        req.store(&self.config.node.data_dir)?;
        {
            let mut st = self.state();
            st.role = Role::Master;
            st.epoch = req.epoch;
            st.fenced = false;
            st.master_ha.clear();
            st.master_grpc.clear();
            st.last_request = Some(req.clone());
        }
        if !was_master {
            self.start_master_plane().await?;
        }
        tracing::info!(epoch = req.epoch, start_offset = max, "promoted to master");
        Ok((Role::Master, req.epoch))
    }

    async fn demote(&self, req: RoleRequest) -> Result<(Role, u64), Error> {
        if req.master_ha.trim().is_empty() {
            return Err(Error::InvalidArgument {
                field: "master_ha_address",
                reason: "a slave needs its master's HA address".into(),
            });
        }
        // Puts stop first, so the log no longer grows while the histories are compared.
        let was_fenced = std::mem::replace(&mut self.state().fenced, true);
        let master = if req.master_grpc.is_empty() {
            None
        } else {
            match fetch_history(&req.master_grpc, &self.config.grpc.token).await {
                Ok(m) => Some(m),
                Err(e) => {
                    self.state().fenced = was_fenced;
                    return Err(Error::RoleRefused(e));
                }
            }
        };
        if let Some((h, max)) = &master {
            let local = self.epoch_history();
            if let Err(why) = verdict(&local, self.store.max_offset(), h, *max, req.force_resync) {
                self.state().fenced = was_fenced;
                return Err(Error::RoleRefused(why));
            }
        }
        self.stop_plane().await;
        if let Some(m) = master {
            let note = converge(
                &self.store,
                &self.history,
                &self.config.node.data_dir,
                m,
                req.force_resync,
            )
            .await
            .map_err(Error::RoleRefused)?;
            tracing::info!(%note, "converged with the new master");
        }
        req.store(&self.config.node.data_dir)?;
        {
            let mut st = self.state();
            st.role = Role::Slave;
            st.epoch = req.epoch;
            st.fenced = false;
            st.master_ha = req.master_ha.clone();
            st.master_grpc = req.master_grpc.clone();
            st.last_request = Some(req.clone());
        }
        self.start_slave_plane();
        tracing::info!(epoch = req.epoch, master_ha = %req.master_ha, "now a slave");
        Ok((Role::Slave, req.epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::epoch::history_of as h;

    #[test]
    fn a_master_behind_in_the_same_epoch_is_refused_a_newer_epoch_truncates() {
        let same = h(&[(1, 0)]);
        assert!(verdict(&same, 900, &same, 600, false).unwrap_err().contains("behind this node"));
        assert!(matches!(verdict(&same, 900, &same, 600, true), Ok(Verdict::Wipe)));
        let newer = h(&[(1, 0), (2, 500)]);
        assert!(matches!(verdict(&same, 900, &newer, 1000, false), Ok(Verdict::Truncate(500))));
        assert!(matches!(verdict(&same, 400, &newer, 1000, false), Ok(Verdict::Keep)));
        assert!(verdict(&newer, 900, &same, 900, false).unwrap_err().contains("stale"));
    }
}
