//! Fenced role changes with epochs.
//!
//! - To MASTER (epoch above the last in the history): stop the slave client and the metadata
//!   pull, cut a partial last record, append `(epoch, max offset)` to the history, then accept
//!   puts and metadata writes.
//! - To SLAVE: refuse puts (waiting puts end with SERVICE_NOT_AVAILABLE), close the slave
//!   connections, fetch the new master's epoch history, truncate the local log at the
//!   consistent point (the bytes cut kept aside first in a tail file, [`crate::store::tails`];
//!   a tail that cannot be kept refuses the truncate), adopt the master's history, then follow
//!   it (data plane and metadata pull). A slave re-checks the histories before every
//!   (re)connect of the data plane, and reads the master's last epoch again at the session's
//!   first bytes (a master that opened an epoch in between ends the session before a byte is
//!   applied).
//!
//! A change is all or nothing. [`plan`] makes every check and every refusal (stale epoch, the
//! same epoch with another request, a promotion epoch not above the history, a log that cannot
//! carry it, diverged histories, the new master unreachable, an epoch of 2^53 or more, a master
//! that is this node) from a snapshot, before anything changes: a refused change changes nothing
//! (the write fence is restored, the data plane keeps running). [`execute`] then runs the plan's steps ([`Step`]); a step that fails leaves the
//! node in an explicit failed state: at the new epoch, fenced (no puts, no metadata writes),
//! health NOT_SERVING, no data plane, and `GetStatus.role_change` names the step and the error.
//! The exact repeat of the request resumes it (it is planned again from where the node is, and
//! every step is idempotent); any other change needs a higher epoch, which also ends the
//! failed state.
//!
//! The accepted request is persisted in `<data-dir>/role`, first marked pending (before any
//! other step), then complete (the last file written). It wins over the configuration at the
//! next start; a node that finds it pending (it stopped, or a step failed, mid-change) starts
//! fenced, in the failed state at step "restart", without a data plane, until the exact repeat
//! or a higher epoch. When the pending write itself fails the file still holds the previous
//! request and nothing else was changed on disk: after a restart the node is as before the
//! change.

mod execute;
pub(crate) mod plan;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::task::TaskTracker;

use crate::config::Role;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::{Master, MasterOptions};
use crate::ha::slave::{
    CheckRefusal, Checked, LinkCheck, Slave, SlaveHooks, SlaveOptions, TermProbe,
};
use crate::metadata::pull::Puller;
use crate::node::epoch::EpochHistory;
use crate::node::registration::check_refusal;
use crate::node::remote::MasterEpochs;
use crate::node::role::plan::{Verdict, verdict};
use crate::node::{Error, Node};
use crate::store::fs::FileSystem;
use crate::store::state_file;
use crate::store::{CommitLog, TailCause};

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
    /// Coordinator mode: the token of the controller's decision this change carries out (empty
    /// in static mode; not written when empty, so such requests are stored as before).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decision_token: String,
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
            decision_token: String::new(),
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
            decision_token: String::new(),
        }
    }

    /// The persisted request in `<dir>/role`, read through `fs`, if any. A role file in the
    /// format before the common state-file format (the bare JSON request) is read too.
    #[cfg(test)]
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>, Error> {
        Ok(RoleFile::load(fs, dir)?.map(|f| f.request))
    }

    /// Persists the request in `<dir>/role` atomically through `fs`, in the common state-file
    /// format, as complete.
    fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<(), Error> {
        RoleFile { request: self.clone(), pending: false }.store(fs, dir)
    }
}

/// The role file's contents: the last accepted request, and whether its change is still
/// pending (written before the change's first step, cleared by its last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoleFile {
    /// The request.
    #[serde(flatten)]
    pub(crate) request: RoleRequest,
    /// The change has not completed (absent in files written before issue 14: complete).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) pending: bool,
}

impl RoleFile {
    /// The role file in `<dir>`, if any (a legacy bare-JSON request too).
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>, Error> {
        let legacy =
            |b: &[u8]| serde_json::from_slice(b).map_err(|e| format!("not a role file: {e}"));
        Ok(state_file::load(fs, ROLE_KIND, &dir.join(ROLE_FILE), legacy)?)
    }

    /// Writes it atomically through `fs`.
    pub(crate) fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<(), Error> {
        Ok(state_file::store(fs, ROLE_KIND, &dir.join(ROLE_FILE), self)?)
    }
}

/// Where a role change is (`GetStatus.role_change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleChangeState {
    /// Its steps are running.
    Changing,
    /// A step failed: the node is fenced until the exact repeat or a higher epoch.
    Failed,
}

/// The steps of a role change's execution, in order (a step not in the plan is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The role file, marked pending (first) or complete (last).
    WriteRoleFile,
    /// A demotion fetches the new master's epochs again once the data plane stopped.
    FetchMasterEpochs,
    /// Cutting the log (a divergent tail, or a promoted slave's partial last record).
    Truncate,
    /// Emptying the log (force_resync).
    Wipe,
    /// Making the log's state durable (flush and checkpoint).
    Checkpoint,
    /// The epoch history file.
    WriteEpochFile,
    /// Starting the new role's data plane (a master binds its HA listener).
    StartDataPlane,
    /// The node stopped while the change was pending (found at start).
    Restart,
}

impl Step {
    /// The step's name in the status and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Step::WriteRoleFile => "write role file",
            Step::FetchMasterEpochs => "fetch master epochs",
            Step::Truncate => "truncate",
            Step::Wipe => "wipe",
            Step::Checkpoint => "checkpoint",
            Step::WriteEpochFile => "write epoch file",
            Step::StartDataPlane => "start data plane",
            Step::Restart => "restart",
        }
    }
}

/// A role change running or failed (absent when the last change completed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleChange {
    /// Running or failed.
    pub state: RoleChangeState,
    /// The step that failed (empty while running).
    pub failed_step: &'static str,
    /// The failure (empty while running).
    pub error: String,
    /// The change's epoch (the node's epoch from the change's first step on).
    pub epoch: u64,
    /// The request; its exact repeat resumes a failed change.
    pub request: RoleRequest,
}

/// Refuses a master whose last epoch is below this node's promise (`promised`, 0: none): a
/// fenced node follows and acks no master of an older term. It may pass (the master may be
/// promoted at the promise soon): retried with the short backoff.
fn check_promise(master_epoch: u64, promised: u64) -> Result<(), CheckRefusal> {
    if master_epoch < promised {
        return Err(CheckRefusal {
            reason: format!(
                "the master's last epoch {master_epoch} is below this node's promised epoch \
                 {promised}: it follows no master below its promise"
            ),
            operator_must_fix: false,
        });
    }
    Ok(())
}

/// Who this node is, for the tail files it keeps: its name and its data directory's id.
pub(crate) type Identity<'a> = (&'a str, &'a str);

/// What the tail file of a cut of `[at, max)` says: `reason`, the epochs of the cut records in
/// this node's history `local`, and the master (`master_grpc`, its history's last entry) whose
/// history made the cut necessary.
pub(crate) fn tail_cause(
    reason: &str,
    local: &EpochHistory,
    (at, max): (u64, u64),
    (master_grpc, master_history): (&str, &EpochHistory),
    (node_name, data_dir_id): Identity<'_>,
) -> TailCause {
    let entries = local.entries();
    let epochs = entries
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            let next = entries.get(i + 1).map_or(u64::MAX, |n| n.start_offset);
            e.start_offset < max && next > at
        })
        .map(|(_, e)| e.epoch)
        .collect();
    let last = master_history.last();
    TailCause {
        reason: reason.to_owned(),
        epochs,
        master: master_grpc.to_owned(),
        master_epoch: last.epoch,
        master_name: last.master_name,
        node_name: node_name.to_owned(),
        data_dir_id: data_dir_id.to_owned(),
    }
}

/// Brings the local log in line with the master's history (at `master_grpc`): truncate, its
/// tail kept aside ([`crate::store::tails`]), or wipe as the verdict says, and write the
/// master's history to the epoch file. Returns a note for the status and the history to
/// install (the caller installs it, with the role it goes with).
async fn converge(
    store: &Arc<CommitLog>,
    history: &std::sync::Mutex<EpochHistory>,
    (fs, data_dir): (&dyn FileSystem, &Path),
    (master_grpc, master): (&str, MasterEpochs),
    identity: Identity<'_>,
) -> Result<(String, EpochHistory), Error> {
    let MasterEpochs { history: master_history, max_offset: master_max } = master;
    let local = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let local_max = store.max_offset();
    let v =
        verdict(&local, local_max, &master_history, master_max, false).map_err(Error::Diverged)?;
    let s = Arc::clone(store);
    let note = match v {
        Verdict::Keep => {
            // The history adopted below builds on the log as it is, including a cut whose
            // durable half the disk failed before: that is finished first.
            tokio::task::spawn_blocking(move || s.settle_cuts()).await??;
            format!("epochs agree (master epoch {})", master_history.last().epoch)
        }
        Verdict::Truncate(at) => {
            let master = (master_grpc, &master_history);
            let cause = tail_cause("epoch check", &local, (at, local_max), master, identity);
            let kept =
                tokio::task::spawn_blocking(move || s.truncate_keeping(at, &cause)).await??;
            let kept = kept.map_or_else(String::new, |k| format!(", kept in {}", k.path.display()));
            tracing::warn!(
                from = local_max,
                to = at,
                "divergent tail truncated to follow the master"
            );
            format!(
                "truncated {} bytes the master never had ({local_max} -> {at}){kept}",
                local_max - at
            )
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
    /// Serves on the HA listener the node holds, or binds one (kept from then on: see
    /// [`crate::ha::held_port`]), and starts the master data plane with fresh sync waiters.
    pub(crate) async fn start_master_plane(&self) -> Result<(), Error> {
        self.stop_refusing().await;
        let listener = match self.held_ha_listener() {
            Some(l) => l,
            None => {
                let addr = *self.ha_bind.lock().unwrap_or_else(|e| e.into_inner());
                let bound = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Bind { what: "ha.listen", addr, source })?;
                let bound = Arc::new(bound);
                *self.ha_listener.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Arc::clone(&bound));
                bound
            }
        };
        let ha_addr = listener.local_addr().ok();
        if let Some(bound) = ha_addr {
            *self.ha_bind.lock().unwrap_or_else(|e| e.into_inner()) = bound;
        }
        let k = self.replication().sync_ack_replicas;
        let waiters = Arc::new(SyncWaiters::for_store(Arc::clone(&self.store), k));
        let m = Master::new(
            Arc::clone(&self.store),
            MasterOptions::from_config(&self.config),
            Arc::clone(&waiters),
            self.metrics.ha_counters(),
        );
        let mut st = self.state();
        // Before the plane accepts a connection: no ack counts under the wrong rule.
        m.set_voters(self.voter_data_dirs(&st.voters));
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
            check: self.epoch_check(st.master_grpc.clone()),
            probe: self.term_probe(st.master_grpc.clone()),
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
    /// converge or refuse; a master whose last epoch is below this node's promise is refused.
    /// `None` (classic mode) without a master gRPC address, unless the node promised an epoch:
    /// then it refuses every connect (it cannot check its master's epoch).
    fn epoch_check(&self, master_grpc: String) -> Option<LinkCheck> {
        let promised = Arc::clone(&self.promised);
        if master_grpc.is_empty() {
            if promised.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return None;
            }
            return Some(Arc::new(move || {
                let p = promised.load(std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move {
                    Err(CheckRefusal {
                        reason: format!(
                            "this node promised epoch {p}: it follows no master whose epoch it \
                             cannot check (no master gRPC address)"
                        ),
                        operator_must_fix: true,
                    })
                })
            }));
        }
        let store = Arc::clone(&self.store);
        let api = Arc::clone(&self.remote.master);
        let fs = Arc::clone(&self.fs);
        let dir = self.config.node.data_dir.clone();
        let history = Arc::clone(&self.history);
        let (name, id) = (self.config.node.name.clone(), self.data_dir_id.clone());
        Some(Arc::new(move || {
            let (store, api, fs, dir, history, grpc) = (
                Arc::clone(&store),
                Arc::clone(&api),
                Arc::clone(&fs),
                dir.clone(),
                Arc::clone(&history),
                master_grpc.clone(),
            );
            let (name, id) = (name.clone(), id.clone());
            let promised = promised.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let master = api.epochs(&grpc).await.map_err(check_refusal)?;
                check_promise(master.history.last().epoch, promised)?;
                let (note, adopted) =
                    converge(&store, &history, (fs.as_ref(), &dir), (&grpc, master), (&name, &id))
                        .await
                        .map_err(check_refusal)?;
                let master_epoch = adopted.last().epoch;
                // Role and epoch do not change here: the history alone is installed.
                *history.lock().unwrap_or_else(|e| e.into_inner()) = adopted;
                Ok(Checked { note, master_epoch })
            })
        }))
    }

    /// The master's last epoch, read again at a session's first bytes (see [`TermProbe`]).
    /// `None` (classic mode) without a master gRPC address.
    fn term_probe(&self, master_grpc: String) -> Option<TermProbe> {
        if master_grpc.is_empty() {
            return None;
        }
        let api = Arc::clone(&self.remote.master);
        let promised = Arc::clone(&self.promised);
        Some(Arc::new(move || {
            let (api, grpc) = (Arc::clone(&api), master_grpc.clone());
            let promised = promised.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let master = api.epochs(&grpc).await.map_err(|e| e.to_string())?;
                let epoch = master.history.last().epoch;
                check_promise(epoch, promised).map_err(|r| r.reason)?;
                Ok(epoch)
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
        {
            let mut st = self.state();
            st.master = None;
            st.slave = None;
            st.puller = None;
            st.ha_addr = None;
        }
        // Whatever comes next (a slave plane, a fence, a failed change), the held port is not
        // left to a backlog nobody accepts from; a master plane stops this first.
        self.refuse_on_ha_port();
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

    #[test]
    fn a_pending_role_file_says_so_and_a_complete_one_reads_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let req = RoleRequest::slave(4, "m:1", "m:2");
        RoleFile { request: req.clone(), pending: true }.store(&StdFs, dir.path()).unwrap();
        let f = RoleFile::load(&StdFs, dir.path()).unwrap().unwrap();
        assert_eq!((f.request, f.pending), (req.clone(), true));
        req.store(&StdFs, dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(ROLE_FILE)).unwrap();
        assert!(!text.contains("pending"), "a complete file is the request alone: {text}");
        assert!(!RoleFile::load(&StdFs, dir.path()).unwrap().unwrap().pending);
    }
}
