//! The member agent: what every node runs in coordinator mode.
//!
//! - It claims the node's name in its group by a create-only transaction (the claim holds the
//!   data-dir id; another data dir under the same name is refused at start).
//! - It holds a lease (`coordinator.ttl`), renewed every `coordinator.renew-interval`, and
//!   keeps the member record under it (role, epochs, offsets, the age of the last frame from
//!   the master, the advertised addresses and the tags).
//! - On the master of the state record's epoch: it holds the group's leader key under the same
//!   lease, hands the published voters V to the node (acks count only from them), adds new
//!   members to V (publish first, then count: rule B) and publishes the confirm offset.
//! - It fences a master the state record no longer names, and (ASYNC) a master whose lease may
//!   have expired: a margin before the TTL, measured from when the last acknowledged keep-alive
//!   was sent, on the monotonic clock.
//!
//! After every round it publishes what it saw as a [`GroupView`] (readiness and the pod's role
//! label read it from a watch channel, never from the agent itself).
//!
//! It also implements the node's [`Coordination`] (the linearizable read of the decision a
//! Fence or a ChangeRole is checked against).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{ReplicationMode, Role};
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{
    self, GroupState, LeaderRecord, MemberRecord, MemberRole, Mode, Phase, ReplicaLag, Voter,
};
use crate::coordinator::view::GroupView;
use crate::coordinator::{CmpOp, CmpTarget, Compare, Coordinator, Error, LeaseId, Op, Txn};
use crate::node::Node;
use crate::node::coordination::{BoxFuture, Coordination, Decision, DecisionPhase};

/// What the agent needs besides the engine and the node.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The group.
    pub group: String,
    /// The member's name (`node.name`).
    pub name: String,
    /// Lease TTL.
    pub ttl: Duration,
    /// Renewal period.
    pub renew: Duration,
    /// HA address others reach the node at.
    pub advertise_ha: String,
    /// gRPC address others reach the node at.
    pub advertise_grpc: String,
    /// Tag: never promote.
    pub never_promote: bool,
    /// Tag: tie-break priority.
    pub priority: i32,
    /// `coordinator.min-sync-replicas`: rule B lowers k (and shrinks V) no further.
    pub floor: u32,
    /// `coordinator.allow-degrade`: k may go to 0 (and SYNC to ASYNC); the master degrades
    /// by itself after one TTL with fewer voters in sync than k.
    pub allow_degrade: bool,
    /// `replication.sync-ack-replicas`: the k a degraded group goes back to.
    pub configured_k: u32,
    /// `ha.max-connections`: the most acks this node's master plane can collect.
    pub max_connections: u32,
    /// `replication.slave-timeout`: how long a SYNC put waits for its acks.
    pub slave_timeout: Duration,
}

/// What the agent last saw and did (status, metrics).
#[derive(Debug, Clone, Default)]
pub struct AgentStatus {
    /// The lease held, if any.
    pub lease: Option<LeaseId>,
    /// TTL left at the last acknowledged renewal (see `last_renewal_sent`).
    pub lease_remaining: Option<Duration>,
    /// The last renewal's send time (monotonic).
    pub last_renewal_sent: Option<Instant>,
    /// Whether this node holds the group's leader key.
    pub leader: bool,
    /// The state record last read.
    pub state: Option<GroupState>,
    /// The last failure talking to the engine; empty after a success.
    pub last_error: String,
}

/// `MemberAgent::self_fenced_at` when the master never fenced itself.
const NOT_FENCED: u64 = u64::MAX;

/// The member agent of one node.
#[derive(Debug)]
pub struct MemberAgent {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    opts: AgentOptions,
    node: Arc<Node>,
    status: Mutex<AgentStatus>,
    metrics: crate::metrics::coordinator::CoordinatorMetrics,
    /// The epoch at which this ASYNC master fenced itself for want of a lease (`NOT_FENCED`:
    /// never). At that epoch only a role change (the controller's) opens it again; at a later
    /// epoch the record naming it master does, as for any other fence.
    self_fenced_at: Arc<std::sync::atomic::AtomicU64>,
    /// Where the view of every round is published.
    view: tokio::sync::watch::Sender<GroupView>,
    /// Held by a rule B plan while it runs (`change`): the round then neither sets the
    /// voters nor publishes, so it cannot undo a step half-way.
    rule_lock: tokio::sync::Mutex<()>,
    /// Woken when the round published a larger V: the group's own raise of k may be due.
    rule_due: tokio::sync::Notify,
}

mod change;
pub use change::change_of;

/// Claims `name` in `group` for `data_dir_id`: created when free, accepted when it already
/// holds this data-dir id, refused (naming both) when another data dir claimed it.
pub async fn claim_name(
    coord: &dyn Coordinator,
    keys: &Keys,
    group: &str,
    name: &str,
    data_dir_id: &str,
) -> Result<(), Error> {
    let key = keys.name_claim(group, name);
    let txn = Txn::create_only(&key, data_dir_id.as_bytes().to_vec(), None);
    let r = coord.txn(txn).await?;
    if r.succeeded {
        return Ok(());
    }
    let held = r.reads.first().and_then(|kvs| kvs.first()).map(|kv| kv.value.clone());
    match held {
        Some(v) if v == data_dir_id.as_bytes() => Ok(()),
        Some(v) => Err(Error::Refused {
            call: "name claim",
            reason: format!(
                "member name {name:?} in group {group:?} is claimed by data dir {} (this node's \
                 data dir is {data_dir_id}); give this node another node.name, or delete {key} \
                 if that data dir is gone for good",
                String::from_utf8_lossy(&v)
            ),
        }),
        None => Err(Error::Refused {
            call: "name claim",
            reason: format!("{key} changed while it was claimed; retry"),
        }),
    }
}

impl MemberAgent {
    /// An agent for `node`.
    pub fn new(
        coord: Arc<dyn Coordinator>,
        keys: Keys,
        opts: AgentOptions,
        node: Arc<Node>,
    ) -> Self {
        Self {
            coord,
            keys,
            opts,
            metrics: node.metrics().coordinator(),
            node,
            status: Mutex::new(AgentStatus::default()),
            self_fenced_at: Arc::new(std::sync::atomic::AtomicU64::new(NOT_FENCED)),
            view: tokio::sync::watch::Sender::new(GroupView::default()),
            rule_lock: tokio::sync::Mutex::new(()),
            rule_due: tokio::sync::Notify::new(),
        }
    }

    /// Publishes the view of every round on `view` (readiness and the role label read it)
    /// instead of a channel of its own.
    pub fn with_view(mut self, view: tokio::sync::watch::Sender<GroupView>) -> Self {
        self.view = view;
        self
    }

    /// A receiver of the view the agent publishes after every round.
    pub fn view(&self) -> tokio::sync::watch::Receiver<GroupView> {
        self.view.subscribe()
    }

    /// Publishes what the last round saw: the state record, the node's role and epoch now,
    /// and until when the lease holds (the last acknowledged renewal's send time plus the TTL
    /// it reported left).
    fn publish_view(&self) {
        let s = self.status();
        let node = self.node.status();
        let lease_until = match (s.lease, s.last_renewal_sent, s.lease_remaining) {
            (Some(_), Some(sent), Some(left)) => Some(sent + left),
            _ => None,
        };
        let view =
            GroupView::of(&self.opts.name, s.state.as_ref(), node.role, node.epoch, lease_until);
        self.view.send_if_modified(|v| {
            let changed = *v != view;
            if changed {
                *v = view;
            }
            changed
        });
    }

    /// What the agent last saw.
    pub fn status(&self) -> AgentStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_status(&self, f: impl FnOnce(&mut AgentStatus)) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        let left_now = match (s.lease, s.last_renewal_sent, s.lease_remaining) {
            (Some(_), Some(sent), Some(left)) => {
                (sent + left).saturating_duration_since(Instant::now()).as_secs_f64()
            }
            _ => 0.0,
        };
        self.metrics.set_lease_remaining(left_now);
        self.metrics.set_leader(s.leader);
        self.metrics.set_voters(s.state.as_ref().map_or(0, |st| st.voters.len()));
        if let Some(st) = &s.state {
            let k = crate::coordinator::rule_b::effective_k(st.k, st.mode);
            self.metrics.set_rule(k, st.mode == Mode::Sync && st.k == 0);
        }
    }

    /// Runs until `cancel`: then it revokes the lease (the member record and a held leader key
    /// go at once, so a failover of a stopped master does not wait for the TTL).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let state_key = self.keys.state(&self.opts.group);
        let mut changes = tokio::spawn(Arc::clone(&self).change_loop(cancel.clone()));
        let mut watch = None;
        loop {
            if watch.is_none() {
                watch = self.coord.watch(&state_key, 0).await.ok();
            }
            if let Err(e) = self.tick().await {
                tracing::warn!(error = %e, group = %self.opts.group, "coordinator agent");
                self.set_status(|s| s.last_error = e.to_string());
            }
            let wait = tokio::time::sleep(self.opts.renew);
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = wait => {}
                ev = async {
                    match watch.as_mut() {
                        Some(w) => w.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if !matches!(ev, Some(Ok(_))) {
                        watch = None;
                    }
                }
            }
        }
        if tokio::time::timeout(Duration::from_secs(2), &mut changes).await.is_err() {
            // A plan in a wait: stopped here, before the lease goes (it publishes nothing more).
            changes.abort();
            tracing::warn!("the rule B change loop did not stop within 2 s: aborted");
        }
        if let Some(lease) = self.status().lease {
            let revoke = self.coord.revoke(lease);
            if tokio::time::timeout(Duration::from_secs(2), revoke).await.is_err() {
                tracing::warn!("revoking the member lease timed out; it expires by its TTL");
            }
        }
    }

    /// One round: lease, member record, state, leader key, voters, fences; then the view is
    /// published (also after a failed round: the lease may run out meanwhile).
    pub async fn tick(&self) -> Result<(), Error> {
        let result = self.round().await;
        self.publish_view();
        result
    }

    async fn round(&self) -> Result<(), Error> {
        // The fence is checked whether the renewal succeeded or not: a master cut off from
        // the engine fails every renewal, and it is the one that must fence itself.
        let renewed = self.renew_lease().await;
        self.check_async_fence();
        let lease = renewed?;
        // None while a rule B plan runs: it sets the voters and publishes itself. Taken before
        // the node's status and the state are read, so that a plan cannot apply or publish
        // between these reads and what the round does with them.
        let quiet = self.rule_lock.try_lock().ok();
        let status = self.node.status();
        let member = self.member_record(&status);
        let key = self.keys.member(&self.opts.group, &self.opts.name);
        self.coord
            .txn(Txn {
                compares: vec![],
                success: vec![Op::Put { key, value: records::encode(&member), lease: Some(lease) }],
                failure: vec![],
            })
            .await?;
        let (kv, _) = self.coord.get(&self.keys.state(&self.opts.group)).await?;
        let Some(kv) = kv else {
            self.set_status(|s| {
                s.state = None;
                s.last_error.clear();
            });
            return Ok(());
        };
        let state: GroupState = records::decode(&kv.key, &kv.value)?;
        let is_master_of_state = state.phase == Phase::Stable
            && state.master.as_deref() == Some(self.opts.name.as_str())
            && status.role == Role::Master
            && status.epoch == state.epoch;
        if is_master_of_state {
            // Not while a plan runs: between its Apply and its Publish the node runs the
            // plan's rule on purpose.
            if quiet.is_some() {
                let running = self.run_published_rule(&state);
                if running
                    && status.fenced
                    && self.self_fenced_at.load(std::sync::atomic::Ordering::SeqCst) != state.epoch
                {
                    self.node.confirm_coordinated_master(state.epoch);
                }
            }
            self.hold_leader_key(lease, state.epoch).await?;
            if quiet.is_some() {
                self.publish(&state, kv.mod_revision, &status).await?;
            }
        } else {
            if status.role == Role::Master && !status.fenced {
                // Another master, or another epoch, is the group's now: stop taking puts.
                tracing::warn!(
                    group = %self.opts.group,
                    state_epoch = state.epoch,
                    state_master = ?state.master,
                    epoch = status.epoch,
                    "this master is not the group's master in the coordinator: fencing its writes"
                );
                self.node.fence_master_writes(None).await;
            }
            self.set_status(|s| s.leader = false);
        }
        self.set_status(|s| {
            s.state = Some(state);
            s.last_error.clear();
        });
        Ok(())
    }

    /// The rule this master runs for `state`: V, the mode, and k as it acts (SYNC with k = 0
    /// runs ASYNC). It is the published k, never lower, whatever the node's own settings,
    /// what it ran before a restart or what a failover's ChangeRole gave it (lower would break
    /// invariant I). Higher only in a strict SYNC group (no `allow-degrade`): there it is at
    /// least the k the group aims for (`wanted_k`), so that no put answers PUT_OK with fewer
    /// acks than the operator asked for while the published k is still lower (a group
    /// bootstrapped before its slaves joined V: it answers SLAVE_NOT_AVAILABLE until they
    /// did). Publishing a higher k is not the round's business: only a rule B raise does it,
    /// after its watermark wait ([`MemberAgent::change_loop`]).
    pub(super) fn running_rule(&self, state: &GroupState) -> (usize, ReplicationMode) {
        let published = usize::try_from(state.k).unwrap_or(usize::MAX);
        match state.mode {
            Mode::Async => (published, ReplicationMode::Async),
            Mode::Sync => (published.max(self.strict_floor(state)), ReplicationMode::Sync),
        }
    }

    /// The k a strict SYNC group (no `allow-degrade`) runs at least: the k it aims for, at
    /// most `ha.max-connections` (a `wanted_k` from another node's settings may be more than
    /// this node can collect; the published k is never capped). 0 where degrading is allowed.
    pub(super) fn strict_floor(&self, state: &GroupState) -> usize {
        if self.opts.allow_degrade {
            return 0;
        }
        let aimed = self.aimed_k(state).min(self.opts.max_connections);
        usize::try_from(aimed).unwrap_or(usize::MAX)
    }

    /// The k the group aims for: `wanted_k`; in a record written before it existed, the
    /// published k (an operator's lower k among them), or this node's own
    /// `replication.sync-ack-replicas` while the published k is 0.
    pub(super) fn aimed_k(&self, state: &GroupState) -> u32 {
        state.wanted_k.unwrap_or(if state.k == 0 { self.opts.configured_k } else { state.k })
    }

    /// Applies [`Self::running_rule`] when the node runs another one (and sets V otherwise).
    /// Runs before a fenced new master is opened, and after a stopped rule B plan.
    pub(super) fn run_published_rule(&self, state: &GroupState) -> bool {
        let status = self.node.status();
        let acting = match status.mode {
            ReplicationMode::Sync => status.sync_ack_replicas,
            ReplicationMode::Async => 0,
        };
        let (k, mode) = self.running_rule(state);
        let wanted = if mode == ReplicationMode::Async { 0 } else { k };
        let voters = voter_pairs(&state.voters);
        if acting == wanted {
            self.node.set_voters(Some(voters));
            return true;
        }
        tracing::info!(group = %self.opts.group, acting, k, ?mode, "running the group's rule");
        match self.node.apply_rule(voters, k, mode) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(error = %e, "applying the group's rule (a fenced master stays fenced)");
                false
            }
        }
    }

    async fn renew_lease(&self) -> Result<LeaseId, Error> {
        if let Some(lease) = self.status().lease {
            let sent = Instant::now();
            match self.coord.keep_alive(lease).await {
                Ok(left) => {
                    self.set_status(|s| {
                        s.lease_remaining = Some(left);
                        s.last_renewal_sent = Some(sent);
                    });
                    return Ok(lease);
                }
                Err(Error::LeaseNotFound(_)) => {
                    tracing::warn!(
                        lease = format!("{lease:x}"),
                        "the member lease expired; granting a new one"
                    );
                    self.set_status(|s| {
                        s.lease = None;
                        s.leader = false;
                    });
                }
                Err(e) => return Err(e),
            }
        }
        let sent = Instant::now();
        let lease = self.coord.grant(self.opts.ttl).await?;
        self.set_status(|s| {
            s.lease = Some(lease.id);
            s.lease_remaining = Some(lease.ttl);
            s.last_renewal_sent = Some(sent);
        });
        Ok(lease.id)
    }

    /// ASYNC: a master whose lease may have expired (no acknowledged renewal sent within
    /// TTL less a margin) fences its writes and closes its HA connections, so that the pre-vote
    /// does not see it alive and no PUT_OK is answered past its lease.
    fn check_async_fence(&self) {
        // The epoch and the role in one read: while a role change runs, it decides.
        let Some(epoch) = self.node.settled_master_epoch() else { return };
        if self.node.replication().mode != ReplicationMode::Async || self.node.fenced() {
            return;
        }
        let Some(sent) = self.status().last_renewal_sent else { return };
        if sent.elapsed() + self.async_margin() >= self.opts.ttl {
            tracing::error!(
                group = %self.opts.group,
                "ASYNC master without an acknowledged lease renewal for {:?}: self-fencing",
                sent.elapsed()
            );
            use std::sync::atomic::Ordering::SeqCst;
            self.self_fenced_at.store(epoch, SeqCst);
            let (node, fenced_at) = (Arc::clone(&self.node), Arc::clone(&self.self_fenced_at));
            tokio::spawn(async move {
                let raised = node.fence_master_writes(Some(epoch)).await;
                if !raised && node.settled_master_epoch() != Some(epoch) {
                    // A role change came first: the master this decision saw is gone, and
                    // its epoch is no longer the self-fence's.
                    let _ = fenced_at.compare_exchange(epoch, NOT_FENCED, SeqCst, SeqCst);
                }
            });
        }
    }

    /// The margin before the TTL at which an ASYNC master fences itself: two renewals.
    pub fn async_margin(&self) -> Duration {
        self.opts.renew * 2
    }

    fn member_record(&self, s: &crate::node::NodeStatus) -> MemberRecord {
        let history = self.node.epoch_history();
        let last_record_epoch =
            if s.max_offset == 0 { 0 } else { history.epoch_at(s.max_offset - 1) };
        let now = crate::coordinator::unix_ms();
        let link = s.master_link.as_ref();
        MemberRecord {
            name: self.opts.name.clone(),
            data_dir_id: s.data_dir_id.clone(),
            role: match s.role {
                Role::Master => MemberRole::Master,
                Role::Slave => MemberRole::Slave,
            },
            epoch: s.epoch,
            promised_epoch: s.promised_epoch,
            last_record_epoch,
            max_offset: s.max_offset,
            confirm_offset: s.confirm_offset,
            fenced: s.fenced,
            master_frame_age_ms: link
                .filter(|l| l.last_frame_unix_ms > 0)
                .map(|l| (now - l.last_frame_unix_ms).max(0) as u64),
            following: link.map(|l| l.address.clone()).unwrap_or_default(),
            mode: (s.role == Role::Master).then_some(match s.mode {
                ReplicationMode::Sync => Mode::Sync,
                ReplicationMode::Async => Mode::Async,
            }),
            k: s.sync_ack_replicas as u32,
            advertise_ha: self.opts.advertise_ha.clone(),
            advertise_grpc: self.opts.advertise_grpc.clone(),
            never_promote: self.opts.never_promote,
            priority: self.opts.priority,
            truncated_bytes: s.truncated_bytes,
            readable_offset: s.readable_offset,
            replicas: if s.role == Role::Master {
                s.slaves
                    .iter()
                    .map(|r| ReplicaLag {
                        name: r.node_name.clone(),
                        in_sync: r.in_sync,
                        lag_bytes: r.lag_bytes,
                        lag_ms: r.lag_millis,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            time_unix_ms: now,
        }
    }

    /// The master holds the leader key under its lease (created when absent; taken over when
    /// a former lease of this node holds it, or a master of an older epoch does: after a
    /// switchover the old master lives on, as a slave, and keeps its lease).
    async fn hold_leader_key(&self, lease: LeaseId, epoch: u64) -> Result<(), Error> {
        let key = self.keys.leader(&self.opts.group);
        let value = records::encode(&LeaderRecord { name: self.opts.name.clone(), epoch });
        let (held, _) = self.coord.get(&key).await?;
        let compare = match &held {
            None => CmpTarget::CreateRevision(0),
            Some(kv) => {
                let holder = records::decode::<LeaderRecord>(&kv.key, &kv.value).ok();
                let mine = holder.as_ref().is_some_and(|l| l.name == self.opts.name);
                let stale = holder.as_ref().is_none_or(|l| l.epoch < epoch);
                if kv.lease == lease && kv.value == value {
                    self.set_status(|s| s.leader = true);
                    return Ok(());
                }
                if !mine && !stale {
                    self.set_status(|s| s.leader = false);
                    return Ok(());
                }
                CmpTarget::ModRevision(kv.mod_revision)
            }
        };
        let r = self
            .coord
            .txn(Txn {
                compares: vec![Compare { key: key.clone(), op: CmpOp::Equal, target: compare }],
                success: vec![Op::Put { key, value, lease: Some(lease) }],
                failure: vec![],
            })
            .await?;
        self.set_status(|s| s.leader = r.succeeded);
        Ok(())
    }

    /// The master's share of rule B: members that joined are added to V (published, then
    /// counted), and the confirm offset is published.
    async fn publish(
        &self,
        state: &GroupState,
        revision: i64,
        s: &crate::node::NodeStatus,
    ) -> Result<(), Error> {
        let (members, _) = self.coord.get_prefix(&self.keys.members(&self.opts.group)).await?;
        let mut next = state.clone();
        for kv in &members {
            let Ok(m) = records::decode::<MemberRecord>(&kv.key, &kv.value) else { continue };
            if !next.is_voter(&m.name) {
                tracing::info!(group = %self.opts.group, member = %m.name, "adding a member to the voters");
                next.voters
                    .push(Voter { name: m.name.clone(), data_dir_id: m.data_dir_id.clone() });
            }
        }
        next.voters.sort();
        if s.confirm_offset > next.confirm_offset {
            next.confirm_offset = s.confirm_offset;
        }
        if next == *state {
            return Ok(());
        }
        next.time_unix_ms = crate::coordinator::unix_ms();
        let key = self.keys.state(&self.opts.group);
        let r = self.coord.txn(Txn::swap(&key, revision, records::encode(&next))).await?;
        if r.succeeded {
            // Published: now count the new members.
            self.node.set_voters(Some(voter_pairs(&next.voters)));
            if next.voters.len() > state.voters.len() {
                self.rule_due.notify_one();
            }
        }
        Ok(())
    }
}

fn voter_pairs(voters: &[Voter]) -> Vec<(String, String)> {
    voters.iter().map(|v| (v.name.clone(), v.data_dir_id.clone())).collect()
}

/// The node's read of its group's decision, over the engine.
#[derive(Debug, Clone)]
pub struct StateReader {
    /// The engine.
    pub coord: Arc<dyn Coordinator>,
    /// The cluster's keys.
    pub keys: Keys,
    /// The group.
    pub group: String,
}

impl StateReader {
    /// The group's state record, if any (a linearizable read).
    pub async fn read(&self) -> Result<Option<GroupState>, Error> {
        let (kv, _) = self.coord.get(&self.keys.state(&self.group)).await?;
        kv.map(|kv| records::decode(&kv.key, &kv.value)).transpose()
    }
}

/// The node's view of a state record.
pub fn decision_of(s: &GroupState) -> Decision {
    Decision {
        epoch: s.epoch,
        token: s.token.clone(),
        phase: match s.phase {
            Phase::Stable => DecisionPhase::Stable,
            Phase::Fencing => DecisionPhase::Fencing,
            Phase::Promoting => DecisionPhase::Promoting,
        },
        chosen: s.chosen.clone(),
        master: s.master.clone(),
        voters: voter_pairs(&s.voters),
        k: s.k,
        sync: s.mode == Mode::Sync,
    }
}

impl Coordination for StateReader {
    fn decision(&self) -> BoxFuture<'_, Result<Option<Decision>, String>> {
        Box::pin(async move {
            self.read().await.map(|s| s.as_ref().map(decision_of)).map_err(|e| e.to_string())
        })
    }
}
