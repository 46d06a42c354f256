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

use crate::control::client::ClientOptions;
use crate::controller::decision::{BlockedReason, FailoverPolicy, RuleDefaults};
use crate::controller::groups::GroupRecords;
use crate::controller::slots::DecisionSlots;
use crate::coordinator::campaign::Leadership;
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{
    self, GroupState, HistoryRecord, MemberRecord, OperatorRequest, Phase,
};
use crate::coordinator::{Coordinator, Error, KeyValue, LeaseId, Txn};

mod phases;
mod rpc;

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

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
