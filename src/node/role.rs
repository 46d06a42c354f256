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
//! A change refused before it starts (stale epoch, the same epoch with another request, a
//! promotion epoch not above the history, diverged histories, the new master unreachable)
//! changes nothing. A change that fails after it started stopping the data plane (a truncate,
//! an epoch-file or role-file write that fails) is NOT undone today: it returns the error and
//! can leave the node fenced without a data plane; making role changes all or nothing (a pure
//! plan, then its execution, a failure landing in a named state) is issue 14's work. The last
//! accepted request is persisted in `<data-dir>/role` and wins over the configuration at the
//! next start.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::task::TaskTracker;

use crate::config::Role;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::{Master, MasterOptions};
use crate::ha::slave::{BeforeConnect, Slave, SlaveHooks, SlaveOptions};
use crate::metadata::pull::Puller;
use crate::node::epoch::{EpochHistory, consistent_point};
use crate::node::registration::check_refusal;
use crate::node::remote::MasterEpochs;
use crate::node::{Error, Node};
use crate::store::CommitLog;
use crate::store::fs::FileSystem;
use crate::store::state_file;

/// The role file's name inside the data directory.
pub const ROLE_FILE: &str = "role";
/// The state-file kind of the role file.
const ROLE_KIND: &str = "role";

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

    /// The persisted request in `<dir>/role`, read through `fs`, if any. A role file in the
    /// format before the common state-file format (the bare JSON request) is read too.
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>, Error> {
        let legacy =
            |b: &[u8]| serde_json::from_slice(b).map_err(|e| format!("not a role file: {e}"));
        Ok(state_file::load(fs, ROLE_KIND, &dir.join(ROLE_FILE), legacy)?)
    }

    /// Persists the request in `<dir>/role` atomically through `fs`, in the common state-file
    /// format.
    fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<(), Error> {
        Ok(state_file::store(fs, ROLE_KIND, &dir.join(ROLE_FILE), self)?)
    }
}

#[cfg(test)]
mod role_file_tests {
    use super::*;
    use crate::store::fs::{SimFs, StdFs};
    use crate::store::state_file::StateFileError;

    #[test]
    fn a_legacy_role_file_loads_and_the_next_write_is_in_the_common_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ROLE_FILE);
        assert_eq!(RoleRequest::load(&StdFs, dir.path()).unwrap(), None);
        let req = RoleRequest::slave(3, "10.0.0.1:10912", "10.0.0.1:10920");
        std::fs::write(&path, serde_json::to_vec_pretty(&req).unwrap()).unwrap();
        assert_eq!(RoleRequest::load(&StdFs, dir.path()).unwrap(), Some(req.clone()));
        req.store(&StdFs, dir.path()).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(b"hasync-state role v1 "));
        assert_eq!(RoleRequest::load(&StdFs, dir.path()).unwrap(), Some(req));
    }

    #[test]
    fn a_damaged_role_file_is_a_state_file_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ROLE_FILE);
        RoleRequest::master(2).store(&StdFs, dir.path()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap().replace("\"epoch\":2", "\"epoch\":9");
        std::fs::write(&path, text).unwrap();
        let err = RoleRequest::load(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(&err, Error::StateFile(StateFileError::Corrupt { .. })), "{err}");
        assert!(err.to_string().contains("checksum") && err.to_string().contains("role"), "{err}");
    }

    #[test]
    fn a_failed_role_write_is_an_io_error_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let fs = SimFs::new();
        RoleRequest::master(1).store(&fs, dir.path()).unwrap();
        fs.fail_writes(|p| p.ends_with(ROLE_FILE));
        let err = RoleRequest::master(2).store(&fs, dir.path()).unwrap_err();
        assert!(matches!(&err, Error::StateFile(StateFileError::Io { op: "write", .. })), "{err}");
        assert_eq!(RoleRequest::load(&fs, dir.path()).unwrap(), Some(RoleRequest::master(1)));
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

/// Brings the local log in line with the master's history: truncate or wipe as the verdict
/// says, and write the master's history to the epoch file. Returns a note for the status and
/// the history to install (the caller installs it, with the role it goes with).
async fn converge(
    store: &Arc<CommitLog>,
    history: &std::sync::Mutex<EpochHistory>,
    (fs, data_dir): (&dyn FileSystem, &Path),
    master: MasterEpochs,
    force_resync: bool,
) -> Result<(String, EpochHistory), Error> {
    let MasterEpochs { history: master_history, max_offset: master_max } = master;
    let local = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let local_max = store.max_offset();
    let v = verdict(&local, local_max, &master_history, master_max, force_resync)
        .map_err(Error::Diverged)?;
    let s = Arc::clone(store);
    let note = match v {
        Verdict::Keep => format!("epochs agree (master epoch {})", master_history.last().epoch),
        Verdict::Truncate(at) => {
            tokio::task::spawn_blocking(move || s.truncate(at)).await??;
            tracing::warn!(
                from = local_max,
                to = at,
                "divergent tail truncated to follow the master"
            );
            format!("truncated {} bytes the master never had ({local_max} -> {at})", local_max - at)
        }
        Verdict::Wipe => {
            tokio::task::spawn_blocking(move || s.wipe()).await??;
            "force_resync: local log wiped".to_owned()
        }
    };
    master_history.store(fs, data_dir)?;
    Ok((note, master_history))
}

impl Node {
    /// Takes the HA listener the node was given, or binds one, and starts the master data plane
    /// with fresh sync waiters.
    pub(crate) async fn start_master_plane(&self) -> Result<(), Error> {
        let given = self.ha_listener.lock().unwrap_or_else(|e| e.into_inner()).take();
        let listener = match given {
            Some(l) => l,
            None => {
                let addr = self.ha_bind;
                tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind {
                    what: "ha.listen",
                    addr,
                    source,
                })?
            }
        };
        let ha_addr = listener.local_addr().ok();
        let k = self.replication().sync_ack_replicas;
        let waiters = Arc::new(SyncWaiters::for_store(Arc::clone(&self.store), k));
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
        let hooks = SlaveHooks {
            before_connect: self.epoch_check(st.master_grpc.clone()),
            after_connect: self.registration_hook(&st.master_grpc),
        };
        let slave =
            Slave::with_hooks(Arc::clone(&self.store), opts, hooks, self.metrics.ha_counters());
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
                Arc::clone(&self.remote.metadata),
                st.master_grpc.clone(),
                self.config.metadata.sync_interval,
                self.metrics.pull_counters(),
            );
            st.plane_tasks.spawn(Arc::clone(&p).run(st.plane.child_token()));
            st.puller = Some(p);
        }
        self.learn_confirm_offset(&st);
        tracing::info!(master_ha = %st.master_ha, master_grpc = %st.master_grpc, epoch = st.epoch, "slave data plane started");
    }

    /// The check a slave runs before every (re)connect: compare histories with the master,
    /// converge or refuse. `None` (classic mode) without a master gRPC address.
    fn epoch_check(&self, master_grpc: String) -> Option<BeforeConnect> {
        if master_grpc.is_empty() {
            return None;
        }
        let store = Arc::clone(&self.store);
        let api = Arc::clone(&self.remote.master);
        let fs = Arc::clone(&self.fs);
        let dir = self.config.node.data_dir.clone();
        let history = Arc::clone(&self.history);
        Some(Arc::new(move || {
            let (store, api, fs, dir, history, grpc) = (
                Arc::clone(&store),
                Arc::clone(&api),
                Arc::clone(&fs),
                dir.clone(),
                Arc::clone(&history),
                master_grpc.clone(),
            );
            Box::pin(async move {
                let master = api.epochs(&grpc).await.map_err(check_refusal)?;
                let (note, adopted) =
                    converge(&store, &history, (fs.as_ref(), &dir), master, false)
                        .await
                        .map_err(check_refusal)?;
                // Role and epoch do not change here: the history alone is installed.
                *history.lock().unwrap_or_else(|e| e.into_inner()) = adopted;
                Ok(note)
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
    /// now in force. A change refused before it starts changes nothing (see the module docs
    /// for what a failure half-way leaves).
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
            return Err(Error::StaleEpoch { asked: req.epoch, current: epoch });
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
        // Refused here, before anything stops: a log that ends below the start of the history's
        // last epoch (a slave that adopted a history it has not caught up with) cannot start
        // a new epoch. The log only grows until the plane stops, so this cannot pass now and
        // fail below.
        self.epoch_history().append(req.epoch, self.store.dispatched_offset())?;
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
        // The files are written without a lock held (status readers take them); `role_change`
        // keeps other writers out, and the slave plane that also writes the history is stopped.
        let mut next = self.epoch_history();
        next.append_opened_by(req.epoch, max, &self.config.node.name)?;
        next.store(self.fs.as_ref(), &self.config.node.data_dir)?;
        req.store(self.fs.as_ref(), &self.config.node.data_dir)?;
        {
            // History, role and epoch change in one section under both locks (state, then
            // history), so a status or an epoch snapshot never sees one without the others.
            let mut st = self.state();
            *self.history.lock().unwrap_or_else(|e| e.into_inner()) = next;
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
        // Puts are refused from here on, so the log stops growing while the histories are
        // compared; a put that passed its check just before may still append (the fence is not
        // yet checked under the store's writer lock: issue 14).
        let was_fenced = std::mem::replace(&mut self.state().fenced, true);
        let master = if req.master_grpc.is_empty() {
            None
        } else {
            match self.remote.master.epochs(&req.master_grpc).await {
                Ok(m) => Some(m),
                Err(e) => {
                    self.state().fenced = was_fenced;
                    return Err(Error::MasterUnreachable(e));
                }
            }
        };
        if let Some(m) = &master {
            let local = self.epoch_history();
            let max = self.store.max_offset();
            if let Err(why) = verdict(&local, max, &m.history, m.max_offset, req.force_resync) {
                self.state().fenced = was_fenced;
                return Err(Error::Diverged(why));
            }
        }
        let mut adopted = None;
        self.stop_plane().await;
        if let Some(m) = master {
            let at = (self.fs.as_ref(), self.config.node.data_dir.as_path());
            let (note, history) =
                converge(&self.store, &self.history, at, m, req.force_resync).await?;
            adopted = Some(history);
            tracing::info!(%note, "converged with the new master");
        }
        req.store(self.fs.as_ref(), &self.config.node.data_dir)?;
        {
            // As in a promotion: history, role and epoch change in one section.
            let mut st = self.state();
            if let Some(history) = adopted {
                *self.history.lock().unwrap_or_else(|e| e.into_inner()) = history;
            }
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
