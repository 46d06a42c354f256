//! The second half of a role change: the checks of [`super::plan`], then the plan's steps in
//! order; a failing step lands in the failed state (see the module docs of [`super`]).

use std::net::IpAddr;
use std::time::Duration;

use crate::config::Role;
use crate::node::epoch::EpochHistory;
use crate::node::role::plan::{self, Admission, Plan, Snapshot, Target, Verdict};
use crate::node::role::{RoleChange, RoleChangeState, RoleFile, RoleRequest, Step, tail_cause};
use crate::node::{Error, Node, coordination};
use crate::store::TailCause;

/// A failed step and why.
type StepError = (Step, Error);

impl Node {
    /// Changes the role, fenced by epochs (see the module docs). Returns the role and epoch
    /// now in force. A refused change changes nothing; a change that fails in a step leaves
    /// the node fenced in the failed state and answers [`Error::RoleChangeFailed`].
    pub async fn change_role(&self, req: RoleRequest) -> Result<(Role, u64), Error> {
        let _one_at_a_time = self.role_change.lock().await;
        if !self.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::RoleRefused("the node is shutting down".into()));
        }
        let decision = match &self.coordination {
            Some(c) => {
                let d = coordination::read(c.as_ref()).await?;
                let max = self.config.ha.max_connections as usize;
                coordination::check_change_role(d.as_ref(), &req, &self.config.node.name, max)?;
                d
            }
            None => None,
        };
        self.check_promise(&req)?;
        let resume = match plan::admit(&self.plan_snapshot(), &req)? {
            Admission::Confirm => {
                // Confirms the role in force (a master fenced after an unclean stop).
                self.apply_decision(decision.as_ref());
                self.open_writes(req.role);
                return Ok((req.role, req.epoch));
            }
            Admission::Change { resume } => resume,
        };
        if req.role == Role::Slave {
            plan::check_demote(&req)?;
            plan::check_not_self(&self.own_listeners, &targets(&req).await)?;
        }
        // Puts (and metadata writes) stop before the plan, so the log stops growing while it is
        // compared with the new master's. A running slave plane keeps following its master
        // until the plan is accepted: a refusal must not break its connection.
        let was_fenced = self.fenced();
        if self.state().slave.is_none() {
            self.raise_fence().await;
        }
        match self.plan(req, resume).await {
            Ok(plan) => {
                self.apply_decision(decision.as_ref());
                self.execute(plan).await
            }
            Err(refused) => {
                if !was_fenced {
                    self.open_writes(self.role());
                }
                Err(refused)
            }
        }
    }

    /// The promise's rules (`node::fence`): no change below the promised epoch, and a slave
    /// of a fenced node must be able to check its master's epoch (a gRPC address).
    fn check_promise(&self, req: &RoleRequest) -> Result<(), Error> {
        let promised = self.promised_epoch();
        if req.epoch < promised {
            return Err(Error::RoleRefused(format!(
                "epoch {} is below this node's promised epoch {promised} (a fence at {promised} \
                 made it follow and accept no change below it)",
                req.epoch
            )));
        }
        if promised > 0 && req.role == Role::Slave && req.master_grpc.trim().is_empty() {
            return Err(Error::InvalidArgument {
                field: "master_grpc_address",
                reason: format!(
                    "this node promised epoch {promised} to a fence: it follows only a master \
                     whose epoch it can check, so a slave needs the master's gRPC address"
                ),
            });
        }
        Ok(())
    }

    /// Coordinator mode: takes the decision's voters, `k` (checked by
    /// `coordination::check_change_role`) and SYNC when the group publishes it, for this and
    /// every later master plane: a promoted master never takes a put under a weaker rule than
    /// the group's (an ASYNC-configured node in a SYNC group runs SYNC from its first put).
    fn apply_decision(&self, decision: Option<&coordination::Decision>) {
        let Some(d) = decision else { return };
        self.set_voters(Some(d.voters.clone()));
        let mut st = self.state();
        st.replication.sync_ack_replicas = d.k as usize;
        st.waiters.set_sync_ack_replicas(d.k as usize);
        if d.sync {
            st.replication.mode = crate::config::ReplicationMode::Sync;
        }
    }

    /// The node as the plan sees it.
    fn plan_snapshot(&self) -> Snapshot {
        let st = self.state();
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Snapshot {
            epoch: st.epoch,
            last_request: st.last_request.clone(),
            failed: st.role_change.clone().filter(|c| c.state == RoleChangeState::Failed),
            history,
            max_offset: self.store.max_offset(),
            dispatched: self.store.dispatched_offset(),
            master_plane: st.master.is_some(),
            data_dir_id: self.data_dir_id.clone(),
        }
    }

    /// Plans the change; a demotion asks the new master for its epochs first.
    async fn plan(&self, req: RoleRequest, resume: bool) -> Result<Plan, Error> {
        match req.role {
            Role::Master => plan::promote(&self.plan_snapshot(), req, resume),
            Role::Slave => {
                let (master, id) = if req.master_grpc.is_empty() {
                    (None, None)
                } else {
                    let epochs = self.remote.master.epochs(&req.master_grpc).await?;
                    (Some(epochs), Some(self.remote.master.data_dir_id(&req.master_grpc).await?))
                };
                plan::demote(&self.plan_snapshot(), req, master, id.as_deref())
            }
        }
    }

    /// Raises the write fence and waits until no metadata write is in flight: from here on
    /// nothing is appended and no metadata write starts (both check the fence under their
    /// own lock: the store's writer lock, the metadata gate).
    pub(crate) async fn raise_fence(&self) {
        self.store.set_writes(crate::store::Writes::Fenced);
        drop(self.metadata_gate.write().await);
    }

    /// Runs the plan: the node is at the new epoch from the first step on.
    async fn execute(&self, plan: Plan) -> Result<(Role, u64), Error> {
        self.raise_fence().await;
        let req = plan.req.clone();
        {
            let mut st = self.state();
            st.epoch = req.epoch;
            st.role_change = Some(RoleChange {
                state: RoleChangeState::Changing,
                failed_step: "",
                error: String::new(),
                epoch: req.epoch,
                request: req.clone(),
            });
        }
        tracing::info!(request = ?req, log = ?plan.log, "role change planned; executing");
        match self.run_steps(plan).await {
            Ok(()) => {
                tracing::info!(role = %req.role, epoch = req.epoch, "role change complete");
                Ok((req.role, req.epoch))
            }
            Err((step, e)) => Err(self.fail(req, step, e).await),
        }
    }

    async fn run_steps(&self, plan: Plan) -> Result<(), StepError> {
        let (fs, dir) = (self.fs.as_ref(), self.config.node.data_dir.as_path());
        let pending = RoleFile { request: plan.req.clone(), pending: true };
        pending.store(fs, dir).map_err(|e| (Step::WriteRoleFile, e))?;
        if !plan.keep_plane {
            self.stop_plane().await;
        }
        let (log, history) = self.final_log(&plan).await?;
        let cause = match (&plan.req.role, log, &history) {
            (Role::Slave, Verdict::Truncate(at), Some(master)) => Some(tail_cause(
                "demotion",
                &self.epoch_history(),
                (at, self.store.max_offset()),
                (&plan.req.master_grpc, master),
                (&self.config.node.name, &self.data_dir_id),
            )),
            _ => None,
        };
        self.apply(log, cause).await?;
        let store = std::sync::Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.checkpoint_blocking())
            .await
            .map_err(|e| (Step::Checkpoint, e.into()))?
            .map_err(|e| (Step::Checkpoint, e.into()))?;
        let history = match (plan.open_epoch, history) {
            (Some(epoch), Some(mut h)) => {
                h.append_opened_by(epoch, self.store.max_offset(), &self.config.node.name)
                    .map_err(|e| (Step::WriteEpochFile, e.into()))?;
                Some(h)
            }
            (_, h) => h,
        };
        if let Some(h) = &history {
            h.store(fs, dir).map_err(|e| (Step::WriteEpochFile, e.into()))?;
        }
        plan.req.store(fs, dir).map_err(|e| (Step::WriteRoleFile, e))?;
        self.install(&plan.req, history);
        match plan.req.role {
            Role::Master => {
                if !plan.keep_plane {
                    self.start_master_plane().await.map_err(|e| (Step::StartDataPlane, e))?;
                }
                self.open_writes(Role::Master);
            }
            Role::Slave => {
                self.open_writes(Role::Slave);
                self.start_slave_plane();
            }
        }
        Ok(())
    }

    /// What happens to the log now that the data plane stopped, and the history to write: a
    /// demotion asks its master again (it may have moved on, and a slave's log grew until its
    /// plane stopped) and adopts its history; a promotion cuts a partial last record and
    /// appends its epoch to the history.
    async fn final_log(&self, plan: &Plan) -> Result<(Verdict, Option<EpochHistory>), StepError> {
        let req = &plan.req;
        if req.role == Role::Master {
            let (max, dispatched) = (self.store.max_offset(), self.store.dispatched_offset());
            let log = if max > dispatched { Verdict::Truncate(dispatched) } else { Verdict::Keep };
            return Ok((log, Some(self.epoch_history())));
        }
        if plan.master.is_none() {
            return Ok((Verdict::Keep, None));
        }
        let at = |e: Error| (Step::FetchMasterEpochs, e);
        let m = self.remote.master.epochs(&req.master_grpc).await.map_err(|e| at(e.into()))?;
        let (local, max) = (self.epoch_history(), self.store.max_offset());
        let log = plan::verdict(&local, max, &m.history, m.max_offset, req.force_resync)
            .map_err(|why| at(Error::Diverged(why)))?;
        Ok((log, Some(m.history)))
    }

    /// Truncates or wipes the log (off the async workers). A demotion's truncate (`cause`
    /// given) keeps the tail it cuts aside first ([`crate::store::tails`]); a promotion's cut
    /// of a partial last record (bytes of a record its old master holds whole) does not.
    async fn apply(&self, log: Verdict, cause: Option<TailCause>) -> Result<(), StepError> {
        let store = std::sync::Arc::clone(&self.store);
        let (step, done) = match log {
            // A repeat after a cut whose durable half the disk failed keeps the log as it is
            // now; the checkpoint that follows finishes that cut before any history is stored.
            Verdict::Keep => return Ok(()),
            Verdict::Truncate(at) => {
                let from = store.max_offset();
                tracing::warn!(from, to = at, "role change truncates the log");
                let cut = move || match cause {
                    Some(c) => store.truncate_keeping(at, &c).map(|_| ()),
                    None => store.truncate(at),
                };
                (Step::Truncate, tokio::task::spawn_blocking(cut).await)
            }
            Verdict::Wipe => {
                tracing::warn!("force_resync: role change wipes the log");
                (Step::Wipe, tokio::task::spawn_blocking(move || store.wipe()).await)
            }
        };
        done.map_err(|e| (step, e.into()))?.map_err(|e| (step, e.into()))
    }

    /// Installs the new role: history, role and epoch change in one section under both locks
    /// (state, then history), so a status or an epoch snapshot never sees one without the others.
    fn install(&self, req: &RoleRequest, history: Option<EpochHistory>) {
        let mut st = self.state();
        if let Some(history) = history {
            *self.history.lock().unwrap_or_else(|e| e.into_inner()) = history;
        }
        st.role = req.role;
        st.epoch = req.epoch;
        st.master_ha = req.master_ha.clone();
        st.master_grpc = req.master_grpc.clone();
        st.last_request = Some(req.clone());
        st.role_change = None;
        // A change to the promised epoch or above (`check_promise`) ends the promise's fence.
        debug_assert!(req.epoch >= self.promised_epoch());
        st.promise_fenced = false;
    }

    /// Lands in the failed state: fenced, no data plane, the step and the error in the status.
    async fn fail(&self, req: RoleRequest, step: Step, error: Error) -> Error {
        self.store.set_writes(crate::store::Writes::Fenced);
        self.stop_plane().await;
        tracing::error!(request = ?req, step = step.name(), %error,
            "role change failed; fenced until its exact repeat or a higher epoch");
        self.state().role_change = Some(RoleChange {
            state: RoleChangeState::Failed,
            failed_step: step.name(),
            error: error.to_string(),
            epoch: req.epoch,
            request: req.clone(),
        });
        Error::RoleChangeFailed {
            role: req.role,
            epoch: req.epoch,
            step: step.name(),
            source: Box::new(error),
        }
    }
}

/// How long a demotion's master address may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The addresses a demotion names, resolved, each with whether its IP is this host's. A name
/// that does not resolve now is left out (the slave resolves it again at every connect).
async fn targets(req: &RoleRequest) -> Vec<Target> {
    let mut out = Vec::new();
    let fields = [("master_ha_address", &req.master_ha), ("master_grpc_address", &req.master_grpc)];
    for (field, asked) in fields {
        let host_port = asked.trim().trim_start_matches("http://").trim_start_matches("https://");
        let host_port = host_port.trim_end_matches('/');
        if host_port.is_empty() {
            continue;
        }
        let lookup = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(host_port));
        let resolved = match lookup.await {
            Ok(Ok(addrs)) => addrs.map(|a| (a, is_local(a.ip()))).collect(),
            _ => Vec::new(),
        };
        out.push(Target { field, asked: asked.clone(), resolved });
    }
    out
}

/// Whether `ip` is one of this host's addresses: loopback, unspecified, or one a socket binds.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}
