//! The controller's runtime: the campaign (one active controller per cluster, by a create-only
//! key under its lease), then, every round, each group's records (kept by one prefix watch
//! while active: [`super::groups`]) and its state driven one step on: bootstrap, failover
//! (fence, choose, promote), reconciliation of members that lag the state, and operator
//! requests (switchover, manual failover). The groups' steps of a round run concurrently (at
//! most [`GROUP_STEPS_MAX`] at once), so one group's slow calls to a dead node do not hold
//! another's step back; the limit of concurrent decisions is taken atomically
//! ([`super::slots`]). A round runs every tick, at once when the watch sees a change that
//! calls for it (a member's lease expired), and at a quicker pace while a decision runs, from
//! the round that opens its epoch on.
//!
//! Every change of a state record is a compare-and-swap on the revision it was read at; a
//! step the controller did not finish (killed, deposed) is resumed by whichever controller is
//! active next, from the phase.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::control::client::{ClientOptions, GrpcClient};
use crate::control::pb;
use crate::controller::decision::{
    self, Blocked, BlockedReason, DecisionContext, FailoverPolicy, FenceReply, HistoryMeta,
    RuleDefaults, Stamp,
};
use crate::controller::groups::GroupRecords;
use crate::controller::slots::{DecisionSlots, Reservation};
use crate::coordinator::campaign::Leadership;
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{
    self, DecisionKind, GroupState, HistoryRecord, MemberRecord, OperatorRequest, Phase,
    RequestOutcome,
};
use crate::coordinator::{Compare, Coordinator, Error, KeyValue, LeaseId, Op, Txn};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Its name (in the campaign key, history records and logs).
    pub name: String,
    /// Lease TTL of the campaign key.
    pub ttl: Duration,
    /// How often it renews its lease and looks at every group.
    pub tick: Duration,
    /// How nodes are reached (token, TLS, timeouts); the address is each member's.
    pub client: ClientOptions,
    /// The failover policy (hold-down, rate, ASYNC bounds, pre-vote bound).
    pub policy: FailoverPolicy,
    /// k and the mode of a bootstrapped state when no master reports them.
    pub defaults: RuleDefaults,
    /// The first wait before the groups' watch is read and watched again after a break
    /// (`coordinator.retry`; doubling up to 10 s).
    pub retry: Duration,
}

/// What one group looks like to the controller, read in one prefix read.
#[derive(Debug, Clone, Default)]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// The state record and its mod revision.
    pub state: Option<(GroupState, i64)>,
    /// The leader key's holder, if any.
    pub leader: Option<records::LeaderRecord>,
    /// The member records, by name.
    pub members: BTreeMap<String, MemberRecord>,
    /// The history records, by epoch.
    pub history: BTreeMap<u64, HistoryRecord>,
    /// A pending operator request and its mod revision.
    pub request: Option<(OperatorRequest, i64)>,
    /// The revision of the read.
    pub revision: i64,
}

/// The last thing the controller decided or found blocking, per group (status, metrics).
#[derive(Debug, Clone, Default)]
pub struct ControllerStatus {
    /// Whether this controller is the active one.
    pub active: bool,
    /// Per group: the blocked reason of the last attempt, if blocked.
    pub blocked: BTreeMap<String, BlockedReason>,
    /// Failovers done by this controller (kind, result) counted.
    pub failovers: BTreeMap<(String, String), u64>,
}

/// The controller of one cluster.
#[derive(Debug)]
pub struct Controller {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    opts: ControllerOptions,
    status: Mutex<ControllerStatus>,
    /// The groups' records: one prefix watch while active.
    groups: GroupRecords,
    /// Decisions running now (groups fencing or promoting): counted from the records at the
    /// start of each round, taken as this round opens epochs (the concurrency limit).
    slots: DecisionSlots,
    /// Rounds so far: each round starts its walk over the groups one group further, so that
    /// no group always comes first to a free decision slot.
    rounds: std::sync::atomic::AtomicUsize,
    /// The won campaign while active.
    leadership: Mutex<Option<Leadership>>,
    /// The last member record seen of each group's master (its lease may have expired since).
    last_master: Mutex<BTreeMap<String, MemberRecord>>,
    /// When a switchover's drain started, per group (the write pause is measured from it).
    drain_started: Mutex<BTreeMap<String, tokio::time::Instant>>,
    /// When each group's running decision opened its epoch (the failover duration).
    opened: Mutex<BTreeMap<String, tokio::time::Instant>>,
    metrics: crate::metrics::coordinator::CoordinatorMetrics,
    /// Some group was mid-decision at the last round, or entered one during it.
    busy: std::sync::atomic::AtomicBool,
    /// A step of the running round opened an epoch (the group it read as stable is fencing
    /// now: its next step goes at the busy pace, since the state record's own update wakes
    /// nobody).
    opened_in_round: std::sync::atomic::AtomicBool,
}

/// The controller's pace while a decision runs, and the shortest gap between two rounds.
const BUSY_TICK: Duration = Duration::from_millis(20);
/// The most groups a round drives at once.
pub const GROUP_STEPS_MAX: usize = 16;

fn unix_ms() -> i64 {
    crate::coordinator::unix_ms()
}

impl Controller {
    /// A controller over `coord` for the cluster of `keys`.
    pub fn new(coord: Arc<dyn Coordinator>, keys: Keys, opts: ControllerOptions) -> Self {
        Self::with_metrics(
            coord,
            keys,
            opts,
            crate::metrics::coordinator::CoordinatorMetrics::default(),
        )
    }

    /// A controller whose metrics a node's `/metrics` serves.
    pub(crate) fn with_metrics(
        coord: Arc<dyn Coordinator>,
        keys: Keys,
        opts: ControllerOptions,
        metrics: crate::metrics::coordinator::CoordinatorMetrics,
    ) -> Self {
        let reasons: Vec<&str> = BlockedReason::ALL.iter().map(|r| r.as_str()).collect();
        metrics.declare(&["failover", "switchover", "manual_failover"], &reasons);
        Self {
            opened: Mutex::new(BTreeMap::new()),
            busy: std::sync::atomic::AtomicBool::new(false),
            opened_in_round: std::sync::atomic::AtomicBool::new(false),
            metrics,
            groups: GroupRecords::new(Arc::clone(&coord), keys.clone(), opts.retry),
            coord,
            keys,
            opts,
            status: Mutex::new(ControllerStatus::default()),
            slots: DecisionSlots::default(),
            rounds: std::sync::atomic::AtomicUsize::new(0),
            leadership: Mutex::new(None),
            last_master: Mutex::new(BTreeMap::new()),
            drain_started: Mutex::new(BTreeMap::new()),
        }
    }

    /// What it last did.
    pub fn status(&self) -> ControllerStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn with_status(&self, f: impl FnOnce(&mut ControllerStatus)) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        self.metrics.set_controller_active(s.active);
        // One series per reason: 1 while some group is blocked by it.
        let all: Vec<&str> = BlockedReason::ALL.iter().map(|r| r.as_str()).collect();
        let on: Vec<&str> = s.blocked.values().map(|r| r.as_str()).collect();
        self.metrics.set_blocked(&all, &on);
    }

    /// Campaigns, then drives the groups while active, until `cancel` (then it resigns).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut lease: Option<LeaseId> = None;
        loop {
            match self.round(&mut lease).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %e, controller = %self.opts.name, "controller round");
                }
            }
            // A decision in progress (or an operator's request) goes on at once: its steps are
            // CASes on the state it just read, not waits.
            let wait = if self.busy.load(std::sync::atomic::Ordering::Relaxed) {
                BUSY_TICK
            } else {
                self.opts.tick
            };
            let ended = tokio::time::Instant::now();
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                // A change the watch saw (a lease expired): a round now, but never two rounds
                // closer than the busy pace (changes that come meanwhile wait for it).
                _ = self.groups.wake().notified() => tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep_until(ended + BUSY_TICK) => {}
                },
            }
        }
        if let Some(l) = lease {
            let _ = tokio::time::timeout(Duration::from_secs(2), self.coord.revoke(l)).await;
        }
        self.deactivate();
    }

    /// One round: lease, campaign, and (when active) every group one step.
    pub async fn round(&self, lease: &mut Option<LeaseId>) -> Result<(), Error> {
        let id = match *lease {
            Some(id) => match self.coord.keep_alive(id).await {
                Ok(_) => id,
                Err(Error::LeaseNotFound(_)) => {
                    *lease = None;
                    self.deactivate();
                    return Ok(());
                }
                Err(e) => {
                    self.deactivate();
                    return Err(e);
                }
            },
            None => {
                let l = self.coord.grant(self.opts.ttl).await?;
                *lease = Some(l.id);
                l.id
            }
        };
        let leadership = self.campaign(id).await?;
        self.with_status(|s| s.active = leadership.is_some());
        let Some(leadership) = leadership else {
            self.deactivate();
            return Ok(());
        };
        *self.leadership.lock().unwrap_or_else(|e| e.into_inner()) = Some(leadership);
        self.groups.start();
        let (paused, _) = self.coord.get(&self.keys.paused()).await?;
        let mut views = self.read_groups().await?;
        self.forget_removed(&views);
        let running = views
            .iter()
            .filter(|v| v.state.as_ref().is_some_and(|(s, _)| s.phase != Phase::Stable))
            .count();
        self.slots.set(running);
        if !views.is_empty() {
            let turn = self.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let by = turn % views.len();
            views.rotate_left(by);
        }
        // Not a blocked one: it retries at the normal pace.
        let busy = views.iter().any(|view| {
            view.request.is_some()
                || view
                    .state
                    .as_ref()
                    .is_some_and(|(s, _)| s.phase != Phase::Stable && s.blocked_reason.is_none())
        });
        let paused = paused.is_some();
        // The rotated order is the order the steps start in (the free decision slots go to
        // the first ones that take them).
        futures_util::stream::iter(views)
            .for_each_concurrent(GROUP_STEPS_MAX, |view| async move {
                let group = view.group.clone();
                if let Err(e) = self.drive(view, paused).await {
                    tracing::warn!(group = %group, error = %e, "controller step");
                }
            })
            .await;
        let opened = self.opened_in_round.swap(false, std::sync::atomic::Ordering::Relaxed);
        self.busy.store(busy || opened, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Whether the groups' watch is live now (tests, status).
    pub fn watching(&self) -> bool {
        self.groups.watching()
    }

    /// Forgets what it kept of groups that have no records any more (removed by
    /// `hasync cluster remove-group`).
    fn forget_removed(&self, views: &[GroupView]) {
        let present = |g: &String| views.iter().any(|v| v.group == *g);
        let mut gone: Vec<String> = {
            let last = self.last_master.lock().unwrap_or_else(|e| e.into_inner());
            last.keys().filter(|g| !present(g)).cloned().collect()
        };
        self.with_status(|s| {
            gone.extend(s.blocked.keys().filter(|g| !present(g)).cloned());
            s.blocked.retain(|g, _| present(g));
        });
        self.last_master.lock().unwrap_or_else(|e| e.into_inner()).retain(|g, _| present(g));
        self.drain_started.lock().unwrap_or_else(|e| e.into_inner()).retain(|g, _| present(g));
        self.opened.lock().unwrap_or_else(|e| e.into_inner()).retain(|g, _| present(g));
        gone.sort();
        gone.dedup();
        for g in gone {
            tracing::info!(group = %g, "the group has no records any more: forgotten");
        }
    }

    /// Holds the campaign key (create-only under the lease); this controller's leadership
    /// when it is the active one.
    async fn campaign(&self, lease: LeaseId) -> Result<Option<Leadership>, Error> {
        let key = self.keys.controller();
        let value = self.opts.name.as_bytes().to_vec();
        let r = self.coord.txn(Txn::create_only(&key, value, Some(lease))).await?;
        let value = self.opts.name.as_bytes().to_vec();
        if r.succeeded {
            tracing::info!(controller = %self.opts.name, "this controller is active");
            return Ok(Some(Leadership {
                key: self.keys.controller(),
                value,
                lease,
                revision: r.revision,
            }));
        }
        Ok(r.reads.first().and_then(|kvs| kvs.first()).filter(|kv| kv.lease == lease).map(|kv| {
            Leadership { key: kv.key.clone(), value, lease, revision: kv.create_revision }
        }))
    }

    /// Every group's records: the watch's snapshot, or one prefix read while the watch is
    /// not live or behind this controller's own writes ([`super::groups`]).
    pub async fn read_groups(&self) -> Result<Vec<GroupView>, Error> {
        let (kvs, revision, _) = self.groups.read().await?;
        Ok(views(&self.keys, &kvs, revision))
    }

    /// One step of one group.
    async fn drive(&self, view: GroupView, cluster_paused: bool) -> Result<(), Error> {
        let Some((state, rev)) = view.state.clone() else {
            return self.bootstrap(&view).await;
        };
        match state.phase {
            Phase::Stable => self.stable(&view, state, rev, cluster_paused).await,
            Phase::Fencing => self.fencing(&view, state, rev).await,
            Phase::Promoting => self.promoting(&view, state, rev).await,
        }
    }

    async fn bootstrap(&self, view: &GroupView) -> Result<(), Error> {
        let members: Vec<MemberRecord> = view.members.values().cloned().collect();
        if members.is_empty() {
            return Ok(());
        }
        let token = new_token();
        let stamp = Stamp { token: &token, controller: &self.opts.name, now_unix_ms: unix_ms() };
        let state = match decision::bootstrap_state(&members, None, self.opts.defaults, stamp) {
            Ok(s) => s,
            Err(reason) => {
                self.blocked(&view.group, reason);
                return Ok(());
            }
        };
        let meta = HistoryMeta {
            epoch: state.epoch,
            token: &token,
            kind: DecisionKind::Bootstrap,
            old_master: None,
            revision: view.revision,
            controller: &self.opts.name,
            time_unix_ms: unix_ms(),
        };
        let mut history = meta.record_bootstrap(state.master.clone());
        history.rule = "first state record: the members' maximum epoch; the master is the one \
                        member reporting master at it"
            .into();
        let key = self.keys.state(&view.group);
        let r = self
            .coord
            .txn(Txn {
                compares: vec![Compare::absent(&key), self.guard()?],
                success: vec![
                    Op::Put { key, value: records::encode(&state), lease: None },
                    Op::Put {
                        key: self.keys.history_of(&view.group, state.epoch),
                        value: records::encode(&history),
                        lease: None,
                    },
                ],
                failure: vec![],
            })
            .await?;
        if r.succeeded {
            self.groups.wrote(r.revision);
            tracing::info!(group = %view.group, epoch = state.epoch, master = ?state.master,
                voters = state.voters.len(), "group state bootstrapped from its members");
        } else {
            self.groups.lost_race();
        }
        Ok(())
    }

    /// A member reports an epoch above the state's (an etcd restore from an old backup, or a
    /// promotion outside the controller): nothing is promoted until the state is rebuilt from
    /// the members (V the union of the old voters and the members).
    async fn rebuild(&self, view: &GroupView, state: &GroupState, rev: i64) -> Result<(), Error> {
        let members: Vec<MemberRecord> = view.members.values().cloned().collect();
        let token = new_token();
        let stamp = Stamp { token: &token, controller: &self.opts.name, now_unix_ms: unix_ms() };
        let Ok(mut next) =
            decision::bootstrap_state(&members, Some(state), self.opts.defaults, stamp)
        else {
            return Ok(());
        };
        next.last_decision = format!(
            "rebuilt from the members: a member reported an epoch above the state's {}",
            state.epoch
        );
        let meta = HistoryMeta {
            epoch: next.epoch,
            token: &token,
            kind: DecisionKind::Bootstrap,
            old_master: state.master.as_deref(),
            revision: view.revision,
            controller: &self.opts.name,
            time_unix_ms: unix_ms(),
        };
        let mut history = meta.record_bootstrap(next.master.clone());
        history.rule = "state rebuilt from the members: their maximum epoch, the member \
                        reporting master at it, V the old voters and the members"
            .into();
        if self.cas(&view.group, rev, &next, Some(&history)).await?.is_some() {
            tracing::warn!(group = %view.group, old_epoch = state.epoch, epoch = next.epoch,
                master = ?next.master, "state behind its members: rebuilt from them");
        }
        Ok(())
    }

    fn context<'a>(
        &self,
        view: &GroupView,
        failovers: &'a [i64],
        master: Option<&'a MemberRecord>,
        decisions_running: usize,
    ) -> DecisionContext<'a> {
        let last = view
            .history
            .values()
            .filter(|h| matches!(h.kind, DecisionKind::Failover))
            .map(|h| h.time_unix_ms)
            .max();
        DecisionContext {
            now_unix_ms: unix_ms(),
            group_last_failover_unix_ms: last,
            group_failovers_unix_ms: failovers,
            decisions_running,
            master_write_bytes_per_s: 0,
            master_last_report: master,
        }
    }

    /// A master serves: requests, reconciliation of members that lag; a failover when its
    /// lease expired.
    async fn stable(
        &self,
        view: &GroupView,
        state: GroupState,
        rev: i64,
        cluster_paused: bool,
    ) -> Result<(), Error> {
        if let Some(m) = state.master.as_ref().and_then(|m| view.members.get(m.as_str())) {
            self.last_master
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(view.group.clone(), m.clone());
        }
        if view.members.values().any(|m| decision::member_epoch(m) > state.epoch) {
            return self.rebuild(view, &state, rev).await;
        }
        if let Some((request, request_rev)) = view.request.clone() {
            return self.start_request(view, state, rev, request, request_rev).await;
        }
        let master_alive =
            state.master.as_ref().is_some_and(|m| view.members.contains_key(m.as_str()));
        if master_alive {
            self.clear_blocked(&view.group);
            if state.blocked_reason.is_some() {
                let mut next = state.clone();
                next.blocked_reason = None;
                let _ = self.cas(&view.group, rev, &next, None).await?;
            }
            self.reconcile(view, &state).await;
            return Ok(());
        }
        let members: Vec<MemberRecord> = view.members.values().cloned().collect();
        let failovers = group_failovers(view);
        let last_master =
            self.last_master.lock().unwrap_or_else(|e| e.into_inner()).get(&view.group).cloned();
        let ctx = self.context(view, &failovers, last_master.as_ref(), self.slots.running());
        let mut gated = state.clone();
        gated.paused = state.paused || cluster_paused;
        if let Err(blocked) =
            decision::check_failover(Some(&gated), &members, &self.opts.policy, &ctx)
        {
            return self.block(view, &state, rev, &blocked).await;
        }
        // The rules passed on the count read above; the slot is taken in one atomic step
        // (another group's step may have taken the last one since), and given back unless
        // the epoch is allocated.
        let most = self.opts.policy.concurrent_failovers_max;
        let slot = match self.slots.reserve(most) {
            Ok(slot) => slot,
            Err(running) => {
                let blocked = Blocked {
                    reason: BlockedReason::ConcurrencyLimited,
                    detail: format!(
                        "{running} decisions of other groups are running, limit {most}: this \
                         group's turn comes when one ends"
                    ),
                    candidates: Vec::new(),
                    rule: String::new(),
                    fencing: String::new(),
                };
                return self.block(view, &state, rev, &blocked).await;
            }
        };
        self.open_epoch(view, state, rev, DecisionKind::Failover, None, None, Some(slot)).await
    }

    /// An operator's switchover or manual failover: checked, then an epoch opened for it; a
    /// refusal is the request's outcome.
    async fn start_request(
        &self,
        view: &GroupView,
        state: GroupState,
        rev: i64,
        request: OperatorRequest,
        request_rev: i64,
    ) -> Result<(), Error> {
        let members: Vec<MemberRecord> = view.members.values().cloned().collect();
        let target = match request.kind {
            DecisionKind::Switchover => {
                decision::switchover_target(&state, &members, request.to.as_deref())
                    .map(|m| m.name.clone())
            }
            _ => match request.to.as_deref() {
                Some(to) if state.is_voter(to) && view.members.contains_key(to) => {
                    Ok(to.to_owned())
                }
                Some(to) => Err(decision::Refusal::NotAVoter { name: to.to_owned() }),
                None => Err(decision::Refusal::NoMaster),
            },
        };
        let target = match target {
            Ok(t) => t,
            Err(refusal) => {
                let outcome = RequestOutcome {
                    id: request.id.clone(),
                    done: false,
                    master: state.master.clone(),
                    epoch: state.epoch,
                    refusal: Some(refusal.to_string()),
                    write_pause_ms: None,
                    loss_bound_bytes: None,
                    time_unix_ms: unix_ms(),
                };
                tracing::warn!(group = %view.group, id = %request.id, refusal = %refusal, "operator request refused");
                return self.finish_request(&view.group, request_rev, &outcome).await;
            }
        };
        self.open_epoch(view, state, rev, request.kind, Some(target), Some(request.id), None).await
    }

    /// CAS the state to epoch e+1, phase fencing, with a fresh token. An automatic failover
    /// holds its decision slot (`slot`), kept once the epoch is allocated; an operator's
    /// decision (`None`) is counted then, whatever the limit.
    #[allow(clippy::too_many_arguments)]
    async fn open_epoch(
        &self,
        view: &GroupView,
        state: GroupState,
        rev: i64,
        kind: DecisionKind,
        target: Option<String>,
        request_id: Option<String>,
        slot: Option<Reservation<'_>>,
    ) -> Result<(), Error> {
        let members: Vec<MemberRecord> = view.members.values().cloned().collect();
        let token = new_token();
        let stamp = Stamp { token: &token, controller: &self.opts.name, now_unix_ms: unix_ms() };
        let mut next = decision::fencing_state(&state, &members, stamp);
        next.kind = Some(kind);
        next.target = target.clone();
        next.request_id = request_id;
        next.blocked_reason = None;
        if kind != DecisionKind::Failover {
            next.last_decision = format!("{kind:?} to {target:?}: fencing at epoch {}", next.epoch);
        }
        if let Some(revision) = self.cas(&view.group, rev, &next, None).await? {
            match slot {
                Some(slot) => slot.keep(),
                None => self.slots.add(),
            }
            self.opened
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(view.group.clone(), tokio::time::Instant::now());
            self.opened_in_round.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(group = %view.group, epoch = next.epoch, kind = ?kind, old_master = ?state.master,
                target = ?target, revision, "epoch allocated, fencing the voters");
            // The allocating revision is the epoch's fencing token: recorded with it.
            let mut with_rev = next.clone();
            with_rev.epoch_revision = revision;
            let _ = self.cas(&view.group, revision, &with_rev, None).await?;
        }
        Ok(())
    }

    /// Fence every reachable voter at the decision's epoch; choose when enough are fenced.
    async fn fencing(&self, view: &GroupView, state: GroupState, rev: i64) -> Result<(), Error> {
        let kind = state.kind.unwrap_or(DecisionKind::Failover);
        let drain_for = if kind == DecisionKind::Switchover { state.target.clone() } else { None };
        if drain_for.is_some() {
            self.drain_started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(view.group.clone())
                .or_insert_with(tokio::time::Instant::now);
        }
        let replies = self.fence_all(view, &state, drain_for.as_deref()).await;
        let failovers = group_failovers(view);
        let last_master =
            self.last_master.lock().unwrap_or_else(|e| e.into_inner()).get(&view.group).cloned();
        let ctx = self.context(view, &failovers, last_master.as_ref(), self.slots.running());
        let chosen = if kind == DecisionKind::ManualFailover {
            manual_choice(&state, &replies)
        } else {
            decision::choose(&state, &replies, &self.opts.policy, &ctx)
        };
        let mut choice = match chosen {
            Ok(c) => c,
            Err(blocked) => return self.block(view, &state, rev, &blocked).await,
        };
        // A switchover's target, when it is as complete as the choice, is the one promoted.
        if let (DecisionKind::Switchover, Some(t)) = (kind, state.target.as_deref()) {
            let best = replies.iter().find(|r| r.name == choice.chosen).map(FenceReply::key);
            let target = replies.iter().find(|r| r.name == t).map(FenceReply::key);
            if best.is_some() && best == target && t != choice.chosen {
                choice.chosen = t.to_owned();
                for c in &mut choice.candidates {
                    c.chosen = c.name == t;
                    if c.chosen {
                        c.why = "switchover target, as complete as the maximum".into();
                    }
                }
            }
        }
        let mut next = state.clone();
        next.phase = Phase::Promoting;
        next.blocked_reason = None;
        next.chosen = Some(choice.chosen.clone());
        next.time_unix_ms = unix_ms();
        next.last_decision = format!("promoting {} at epoch {}", choice.chosen, state.epoch);
        let meta = HistoryMeta {
            epoch: state.epoch,
            token: &state.token,
            kind,
            old_master: state.master.as_deref(),
            revision: state.epoch_revision,
            controller: &self.opts.name,
            time_unix_ms: unix_ms(),
        };
        let history = choice.to_history(&meta);
        if self.cas(&view.group, rev, &next, Some(&history)).await?.is_some() {
            log_decision(&history);
        }
        Ok(())
    }

    /// Promote the chosen member, point the others at it, then mark the state stable.
    async fn promoting(&self, view: &GroupView, state: GroupState, rev: i64) -> Result<(), Error> {
        let Some(chosen) = state.chosen.clone() else {
            return Ok(());
        };
        let Some(x) = view.members.get(&chosen) else {
            tracing::warn!(group = %view.group, chosen = %chosen, "the chosen member has no record (down?); waiting");
            return Ok(());
        };
        let req = pb::ChangeRoleRequest {
            role: pb::Role::Master as i32,
            epoch: state.epoch,
            decision_token: state.token.clone(),
            ..Default::default()
        };
        if !(x.role == records::MemberRole::Master && x.epoch == state.epoch)
            && let Err(e) = self.change_role(&x.advertise_grpc, req).await
        {
            tracing::warn!(group = %view.group, chosen = %chosen, error = %e, "promotion refused or failed; retrying");
            return Ok(());
        }
        let pause = self
            .drain_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&view.group)
            .map(|t| t.elapsed().as_millis() as u64);
        for m in view.members.values().filter(|m| m.name != chosen && state.is_voter(&m.name)) {
            if m.epoch >= state.epoch {
                continue;
            }
            if let Err(e) = self.change_role(&m.advertise_grpc, slave_request(&state, x)).await {
                tracing::info!(group = %view.group, member = %m.name, error = %e, "repoint failed; the reconciliation retries");
            }
        }
        let mut next = state.clone();
        next.phase = Phase::Stable;
        next.master = Some(chosen.clone());
        next.time_unix_ms = unix_ms();
        next.last_decision = format!("{chosen} is master of epoch {}", state.epoch);
        if self.cas(&view.group, rev, &next, None).await?.is_some() {
            let kind = state.kind.unwrap_or(DecisionKind::Failover);
            self.with_status(|s| {
                *s.failovers.entry((kind_label(kind).into(), "promoted".into())).or_default() += 1;
            });
            let took = self
                .opened
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&view.group)
                .map(|t| t.elapsed().as_secs_f64());
            self.metrics.failover(kind_label(kind), "promoted", took);
            tracing::warn!(group = %view.group, epoch = state.epoch, master = %chosen, kind = ?kind,
                write_pause_ms = ?pause, "promotion done");
            if let Some(id) = &state.request_id {
                let loss = view.history.get(&state.epoch).and_then(|h| h.loss_bound_bytes);
                let outcome = RequestOutcome {
                    id: id.clone(),
                    done: true,
                    master: Some(chosen.clone()),
                    epoch: state.epoch,
                    refusal: None,
                    write_pause_ms: pause,
                    loss_bound_bytes: loss,
                    time_unix_ms: unix_ms(),
                };
                let request_rev = view.request.as_ref().map(|(_, r)| *r);
                match request_rev {
                    Some(r) => self.finish_request(&view.group, r, &outcome).await?,
                    None => self.write_outcome(&view.group, &outcome).await?,
                }
            }
        }
        Ok(())
    }

    /// Deletes the request (when it is still the one read) and writes its outcome.
    async fn finish_request(
        &self,
        group: &str,
        request_rev: i64,
        outcome: &RequestOutcome,
    ) -> Result<(), Error> {
        let key = self.keys.request(group);
        let r = self
            .coord
            .txn(Txn {
                compares: vec![Compare::unchanged_since(&key, request_rev), self.guard()?],
                success: vec![
                    Op::Delete { key },
                    Op::Put {
                        key: self.keys.outcome(group),
                        value: records::encode(outcome),
                        lease: None,
                    },
                ],
                failure: vec![],
            })
            .await?;
        self.settled(r.succeeded, r.revision);
        Ok(())
    }

    async fn write_outcome(&self, group: &str, outcome: &RequestOutcome) -> Result<(), Error> {
        let r = self
            .coord
            .txn(Txn {
                compares: vec![self.guard()?],
                success: vec![Op::Put {
                    key: self.keys.outcome(group),
                    value: records::encode(outcome),
                    lease: None,
                }],
                failure: vec![],
            })
            .await?;
        self.settled(r.succeeded, r.revision);
        Ok(())
    }

    /// Tells the groups' records what became of this controller's transaction under the
    /// prefix: written at `revision` (the next round's view must show it), or lost (its view
    /// missed a change).
    fn settled(&self, succeeded: bool, revision: i64) {
        if succeeded {
            self.groups.wrote(revision);
        } else {
            self.groups.lost_race();
        }
    }

    /// A blocked step: counted, logged, and written into the state when the reason changed.
    async fn block(
        &self,
        view: &GroupView,
        state: &GroupState,
        rev: i64,
        blocked: &Blocked,
    ) -> Result<(), Error> {
        let reason = blocked.reason;
        self.blocked(&view.group, reason);
        if state.blocked_reason.as_deref() == Some(reason.as_str()) {
            return Ok(());
        }
        tracing::warn!(group = %view.group, epoch = state.epoch, reason = reason.as_str(),
            detail = %blocked.detail, alarm = reason.is_alarm(), "failover blocked");
        let mut next = state.clone();
        next.blocked_reason = Some(reason.as_str().to_owned());
        next.time_unix_ms = unix_ms();
        let _ = self.cas(&view.group, rev, &next, None).await?;
        Ok(())
    }

    /// Members of the group behind the state's epoch (a returning old master, a slave that
    /// missed the repoint) are pointed at the master with the epoch's token.
    async fn reconcile(&self, view: &GroupView, state: &GroupState) {
        let Some(master) = state.master.as_ref().and_then(|m| view.members.get(m)) else {
            return;
        };
        for m in view.members.values() {
            if m.name == master.name || m.epoch >= state.epoch {
                continue;
            }
            let req = slave_request(state, master);
            match self.change_role(&m.advertise_grpc, req).await {
                Ok(()) => {
                    tracing::info!(group = %view.group, member = %m.name, epoch = state.epoch,
                    master = %master.name, "member pointed at the group's master")
                }
                Err(e) => {
                    tracing::info!(group = %view.group, member = %m.name, error = %e, "repoint failed")
                }
            }
        }
    }

    async fn fence_all(
        &self,
        view: &GroupView,
        state: &GroupState,
        drain_for: Option<&str>,
    ) -> Vec<FenceReply> {
        // A switchover's drain runs on the master while the target still follows it: the
        // master is fenced (and drained) first, the others only after it answered. Fenced at
        // once, the target would close its HA link before its last ack reached the drain, the
        // drain would time out and the old master, holding the most, be promoted again.
        let mut master_first = None;
        let mut pending = Vec::new();
        for v in &state.voters {
            let Some(m) = view.members.get(&v.name) else { continue };
            let opts = self.client_to(&m.advertise_grpc);
            let is_master = state.master.as_deref() == Some(v.name.as_str());
            let req = pb::FenceRequest {
                epoch: state.epoch,
                token: state.token.clone(),
                drain_for: if is_master {
                    drain_for.unwrap_or_default().to_owned()
                } else {
                    String::new()
                },
            };
            let name = v.name.clone();
            let (never_promote, priority) = (m.never_promote, m.priority);
            let call = async move {
                let r = async {
                    let c = GrpcClient::connect(&opts).await.map_err(|e| e.to_string())?;
                    c.replication()
                        .fence(req)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|s| s.message().to_owned())
                }
                .await;
                (name, never_promote, priority, r)
            };
            if is_master && drain_for.is_some() {
                master_first = Some(call);
            } else {
                pending.push(call);
            }
        }
        let mut answers = Vec::new();
        if let Some(call) = master_first {
            answers.push(call.await);
        }
        let mut calls = tokio::task::JoinSet::new();
        for call in pending {
            calls.spawn(call);
        }
        while let Some(joined) = calls.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        let mut reports = Vec::new();
        for (name, never_promote, priority, r) in answers {
            match r {
                Ok(f) => reports.push(FenceReply {
                    name: name.clone(),
                    data_dir_id: f.data_dir_id,
                    epoch: f.epoch,
                    promised_epoch: f.promised_epoch,
                    last_record_epoch: f.last_record_epoch,
                    end_offset: f.end_offset.max(0) as u64,
                    never_promote,
                    priority,
                }),
                Err(e) => {
                    tracing::info!(group = %view.group, member = %name, error = %e, "fence failed")
                }
            }
        }
        reports
    }

    fn client_to(&self, address: &str) -> ClientOptions {
        let mut o = self.opts.client.clone();
        o.address = address.to_owned();
        o
    }

    async fn change_role(&self, address: &str, req: pb::ChangeRoleRequest) -> Result<(), String> {
        let c = GrpcClient::connect(&self.client_to(address)).await.map_err(|e| e.to_string())?;
        c.replication().change_role(req).await.map(|_| ()).map_err(|s| s.message().to_owned())
    }

    /// CAS the group's state from `rev` to `next` (with a history record); the revision of
    /// the transaction when it won.
    async fn cas(
        &self,
        group: &str,
        rev: i64,
        next: &GroupState,
        history: Option<&HistoryRecord>,
    ) -> Result<Option<i64>, Error> {
        let key = self.keys.state(group);
        let mut success =
            vec![Op::Put { key: key.clone(), value: records::encode(next), lease: None }];
        if let Some(h) = history {
            success.push(Op::Put {
                key: self.keys.history_of(group, h.epoch),
                value: records::encode(h),
                lease: None,
            });
        }
        let r = self
            .coord
            .txn(Txn {
                compares: vec![Compare::unchanged_since(&key, rev), self.guard()?],
                success,
                failure: vec![],
            })
            .await?;
        self.settled(r.succeeded, r.revision);
        Ok(r.succeeded.then_some(r.revision))
    }

    /// The compare that holds only while this controller's leadership does: every change it
    /// makes carries it, so a deposed (paused, cut-off) controller changes nothing.
    fn guard(&self) -> Result<Compare, Error> {
        self.leadership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Leadership::guard)
            .ok_or_else(|| Error::Refused {
                call: "state change",
                reason: "this controller is not active".into(),
            })
    }

    fn deactivate(&self) {
        self.with_status(|s| s.active = false);
        *self.leadership.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.groups.stop();
    }

    fn blocked(&self, group: &str, reason: BlockedReason) {
        self.with_status(|s| {
            s.blocked.insert(group.to_owned(), reason);
        });
    }

    fn clear_blocked(&self, group: &str) {
        self.with_status(|s| {
            s.blocked.remove(group);
        });
    }
}

fn slave_request(state: &GroupState, master: &MemberRecord) -> pb::ChangeRoleRequest {
    pb::ChangeRoleRequest {
        role: pb::Role::Slave as i32,
        epoch: state.epoch,
        master_ha_address: master.advertise_ha.clone(),
        master_grpc_address: master.advertise_grpc.clone(),
        force_resync: false,
        decision_token: state.token.clone(),
    }
}

/// When the group's automatic failovers happened, from its history records (they outlive a
/// controller's restart), unix ms.
fn group_failovers(view: &GroupView) -> Vec<i64> {
    let failover = |h: &&HistoryRecord| matches!(h.kind, DecisionKind::Failover);
    view.history.values().filter(failover).map(|h| h.time_unix_ms).collect()
}

/// A fresh decision token: 128 random bits in hex.
pub fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Splits a prefix read of `groups/` into one view per group.
pub fn views(keys: &Keys, kvs: &[KeyValue], revision: i64) -> Vec<GroupView> {
    let mut by: BTreeMap<String, GroupView> = BTreeMap::new();
    for kv in kvs {
        let Some((group, rest)) = keys.split_group(&kv.key) else { continue };
        let v = by.entry(group.to_owned()).or_insert_with(|| GroupView {
            group: group.to_owned(),
            revision,
            ..Default::default()
        });
        if rest == "state" {
            match records::decode::<GroupState>(&kv.key, &kv.value) {
                Ok(s) => v.state = Some((s, kv.mod_revision)),
                Err(e) => tracing::error!(error = %e, "unreadable state record"),
            }
        } else if rest == "leader" {
            v.leader = records::decode(&kv.key, &kv.value).ok();
        } else if let Some(name) = rest.strip_prefix("members/") {
            if let Ok(m) = records::decode::<MemberRecord>(&kv.key, &kv.value) {
                v.members.insert(name.to_owned(), m);
            }
        } else if rest == "request" {
            if let Ok(r) = records::decode::<OperatorRequest>(&kv.key, &kv.value) {
                v.request = Some((r, kv.mod_revision));
            }
        } else if rest.starts_with("history/")
            && let Ok(h) = records::decode::<HistoryRecord>(&kv.key, &kv.value)
        {
            v.history.insert(h.epoch, h);
        }
    }
    by.into_values().collect()
}

/// A manual failover (`--accept-data-loss`): the requested member, fenced, whatever the
/// threshold; the loss bound is what the most complete fenced member holds beyond it.
fn manual_choice(
    state: &GroupState,
    replies: &[FenceReply],
) -> Result<decision::Decision, Blocked> {
    let target = state.target.clone().unwrap_or_default();
    let Some(t) = replies.iter().find(|r| r.name == target && r.promised_epoch == state.epoch)
    else {
        return Err(Blocked {
            reason: BlockedReason::NoVotersReachable,
            detail: format!(
                "the requested member {target} did not answer Fence at epoch {}",
                state.epoch
            ),
            candidates: Vec::new(),
            rule: "manual failover".into(),
            fencing: String::new(),
        });
    };
    let best = replies.iter().map(|r| r.end_offset).max().unwrap_or(0);
    let candidates = replies
        .iter()
        .map(|r| records::CandidateReport {
            name: r.name.clone(),
            fenced: r.promised_epoch == state.epoch,
            epoch: r.epoch,
            last_record_epoch: r.last_record_epoch,
            end_offset: r.end_offset,
            chosen: r.name == target,
            why: if r.name == target {
                "requested by the operator".into()
            } else {
                "not requested".into()
            },
        })
        .collect();
    Ok(decision::Decision {
        epoch: state.epoch,
        old_master: state.master.clone(),
        chosen: target,
        candidates,
        rule: "manual failover with --accept-data-loss: the requested member, whatever the \
               fencing threshold and the maximum"
            .into(),
        fencing: format!("{} of {} voters answered", replies.len(), state.voters.len()),
        loss_bound_bytes: Some(best.saturating_sub(t.end_offset)),
    })
}

fn kind_label(kind: DecisionKind) -> &'static str {
    match kind {
        DecisionKind::Bootstrap => "bootstrap",
        DecisionKind::Failover => "failover",
        DecisionKind::Switchover => "switchover",
        DecisionKind::ManualFailover => "manual_failover",
    }
}

/// One structured log line per decision, with the history record's fields.
fn log_decision(h: &HistoryRecord) {
    tracing::warn!(
        epoch = h.epoch,
        token = %h.token,
        kind = kind_label(h.kind),
        old_master = ?h.old_master,
        new_master = ?h.new_master,
        rule = %h.rule,
        fencing = %h.fencing,
        loss_bound_bytes = ?h.loss_bound_bytes,
        revision = h.revision,
        controller = %h.controller,
        time_unix_ms = h.time_unix_ms,
        candidates = %serde_json::to_string(&h.candidates).unwrap_or_default(),
        "failover decision"
    );
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
