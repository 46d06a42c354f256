//! Rule B on the master: the executor of [`rule_b::plan_change`]'s steps.
//!
//! Outside a failover only the master changes V, k or the mode. It does so for
//! - an operator's [`ChangeRequest`] (`<group>/change`: remove a member, set k, set the mode),
//!   answered in `<group>/change-outcome`;
//! - the group's own degrade (`coordinator.allow-degrade`): SYNC with fewer voters in sync
//!   than k for one TTL lowers k to 0 (no PUT_OK then waits for a member, and no automatic
//!   failover is possible: `sync_degraded`); once enough voters are in sync again, k goes
//!   back to `replication.sync-ack-replicas` (at most |V| - 1).
//!
//! Each Publish is a compare-and-swap on the revision of the state record the plan was made
//! from (or of the previous Publish): a state that changed meanwhile, a failover's included,
//! stops the plan at that step. A stopped plan re-applies the rule last published, which is
//! what every step before left in force or stricter, so invariant I holds whatever happens.
//! While a plan runs, the agent's round neither sets the voters nor publishes (see
//! [`MemberAgent::rule_lock`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{MemberAgent, voter_pairs};
use crate::config::{ReplicationMode, Role};
use crate::coordinator::records::{self, ChangeOutcome, ChangeRequest, GroupState, Mode, Voter};
use crate::coordinator::refusal::Refusal;
use crate::coordinator::rule_b::{self, Change, Published, Step, Target};
use crate::coordinator::{Compare, Error, Op, Txn};

/// How long a watermark wait of a plan may take before the plan stops.
const WATERMARK_WAIT: Duration = Duration::from_secs(15);
/// How often a raise of k that waits for its voters to hold the log looks again.
const RAISE_POLL: Duration = Duration::from_millis(50);
/// How many such looks come at that pace in a row (about 2 s).
const RAISE_FAST_POLLS: u32 = 40;
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(5);

/// The node's mode for the published one.
fn node_mode(mode: Mode) -> ReplicationMode {
    match mode {
        Mode::Sync => ReplicationMode::Sync,
        Mode::Async => ReplicationMode::Async,
    }
}

/// The change loop's memory between its looks.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Since when fewer voters than k are in sync (the degrade waits one TTL of it).
    short_since: Option<Instant>,
    /// A raise is due but its voters do not hold the log yet.
    raise_pending: bool,
    /// Looks in a row at the raise's fast pace.
    fast_polls: u32,
    /// The master's max offset at the last look.
    last_max: u64,
}

/// Who asked for a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// An operator's request (`cluster change`): a k it sets becomes the group's `wanted_k`.
    Operator,
    /// The group's own raise or degrade.
    Group,
}

/// The change a request asks for, or why it is not one (one change per request).
pub fn change_of(req: &ChangeRequest) -> Result<Change, String> {
    match (&req.remove_member, req.k, req.mode) {
        (Some(name), None, None) => Ok(Change::RemoveVoter(name.clone())),
        (None, Some(k), None) => Ok(Change::SetK(k)),
        (None, None, Some(mode)) => Ok(Change::SetMode(mode)),
        (None, None, None) => Err("the request changes nothing".into()),
        _ => Err("one change per request: remove a member, or set k, or set the mode".into()),
    }
}

impl MemberAgent {
    /// Runs rule B's changes until `cancel`: every renewal period it looks for an operator's
    /// request and for the group's own degrade or restore, when this node is the master of the
    /// state record.
    pub(super) async fn change_loop(self: Arc<Self>, cancel: CancellationToken) {
        let mut pacing = Pacing::default();
        loop {
            // A raise waiting for its voters to hold the log looks again soon (a slave that
            // just joined V acks what it was sent within milliseconds), for a few seconds at
            // most (each look reads the engine twice): then at the renewal pace.
            pacing.fast_polls = if pacing.raise_pending { pacing.fast_polls + 1 } else { 0 };
            let pause = if pacing.raise_pending && pacing.fast_polls <= RAISE_FAST_POLLS {
                self.opts.renew.min(RAISE_POLL)
            } else {
                self.opts.renew
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
                _ = self.rule_due.notified() => {}
            }
            pacing.raise_pending = false;
            if let Err(e) = self.change_round(&mut pacing).await {
                tracing::warn!(error = %e, group = %self.opts.group, "rule B change");
            }
        }
    }

    /// The state record, its revision, when this node is its master now.
    async fn mastered_state(&self) -> Result<Option<(GroupState, i64)>, Error> {
        let (kv, _) = self.coord.get(&self.keys.state(&self.opts.group)).await?;
        let Some(kv) = kv else { return Ok(None) };
        let state: GroupState = records::decode(&kv.key, &kv.value)?;
        let s = self.node.status();
        let mine = state.phase == records::Phase::Stable
            && state.master.as_deref() == Some(self.opts.name.as_str())
            && s.role == Role::Master
            && s.epoch == state.epoch
            && !s.fenced;
        Ok(mine.then_some((state, kv.mod_revision)))
    }

    async fn change_round(&self, pacing: &mut Pacing) -> Result<(), Error> {
        // The last round's state first (no read of the engine on the other members).
        let named = self.status().state.is_some_and(|s| {
            s.master.as_deref() == Some(self.opts.name.as_str()) && self.node.role() == Role::Master
        });
        if !named {
            pacing.short_since = None;
            return Ok(());
        }
        let Some((state, _)) = self.mastered_state().await? else {
            pacing.short_since = None;
            return Ok(());
        };
        let key = self.keys.change(&self.opts.group);
        let (request, _) = self.coord.get(&key).await?;
        if let Some(kv) = request {
            let (id, result) = match records::decode::<ChangeRequest>(&kv.key, &kv.value) {
                Ok(req)
                    if req.expires_unix_ms.is_some_and(|t| t < crate::coordinator::unix_ms()) =>
                {
                    let why = format!(
                        "expired: its requester stopped waiting at unix ms {} before this master \
                         took it; nothing changed (ask again)",
                        req.expires_unix_ms.unwrap_or_default()
                    );
                    (req.id, Err(why))
                }
                Ok(req) => {
                    let result = match change_of(&req) {
                        Ok(Change::RemoveVoter(name))
                            if name != self.opts.name && self.is_live(&name).await? =>
                        {
                            Err(format!(
                                "{name} has a live member record (it runs): a running member joins V \
                             again; stop it first, then remove it"
                            ))
                        }
                        Ok(Change::RemoveVoter(name))
                            if state.is_voter(&name)
                                && self.strict_floor(&state)
                                    >= state.voters.len().saturating_sub(1) =>
                        {
                            let left = state.voters.len().saturating_sub(2);
                            Err(format!(
                                "refused: the group aims for k = {}, and without {name} V has {left} \
                                 member(s) besides the master: no put could be answered; lower k \
                                 first (hasync cluster change --k {left})",
                                self.aimed_k(&state)
                            ))
                        }
                        Ok(change) => {
                            self.execute(change, "operator request", Origin::Operator).await
                        }
                        Err(why) => Err(why),
                    };
                    (req.id, result)
                }
                // Answered under its id where one can be read, so that its requester hears.
                Err(e) => (id_of(&kv.value), Err(format!("not a change request: {e}"))),
            };
            self.answer(&id, kv.mod_revision, result).await?;
            return Ok(());
        }
        if let Some(change) = self.own_change(&state, pacing) {
            let why = match change {
                Change::SetK(0) => "degrade: fewer voters in sync than k for one TTL",
                _ => "raise: enough voters in sync for the group's k",
            };
            match self.execute(change, why, Origin::Group).await {
                Ok(s) => tracing::warn!(group = %self.opts.group, k = s.k, "{why}: k is {}", s.k),
                Err(e) => tracing::warn!(group = %self.opts.group, "{why}: not done: {e}"),
            }
            pacing.short_since = None;
        }
        Ok(())
    }

    /// Whether member `name` has a record (its lease lives).
    async fn is_live(&self, name: &str) -> Result<bool, Error> {
        let (kv, _) = self.coord.get(&self.keys.member(&self.opts.group, name)).await?;
        Ok(kv.is_some())
    }

    /// The group's own change, if one is due: the raise of k towards the k it aims for
    /// (`wanted_k`, else `replication.sync-ack-replicas`; at most |V| - 1) once that many
    /// voters are in sync (a group bootstrapped before its slaves joined, or restored after a
    /// degrade); or, where `coordinator.allow-degrade` is set, the degrade to k = 0 after one
    /// TTL with fewer voters in sync than k.
    fn own_change(&self, state: &GroupState, pacing: &mut Pacing) -> Option<Change> {
        if state.mode != Mode::Sync {
            pacing.short_since = None;
            return None;
        }
        let in_sync = self.voters_in_sync(state);
        let others = u32::try_from(state.voters.len().saturating_sub(1)).unwrap_or(u32::MAX);
        let goal = self.aimed_k(state).min(others);
        // Only once `goal` voters hold the whole log up to where it ended at the last look
        // (under load the newest bytes are always in flight; the plan's own wait then ends
        // soon): on an idle group after a master restart that is after the next put.
        let max = self.node.status().max_offset;
        let last = std::mem::replace(&mut pacing.last_max, max);
        let seen = if last == 0 { max } else { last.min(max) };
        if state.k < goal && in_sync >= goal {
            if self.node.voters_hold(usize::try_from(goal).unwrap_or(usize::MAX), 0..seen) {
                pacing.short_since = None;
                return Some(Change::SetK(goal));
            }
            pacing.raise_pending = true;
        }
        if !self.opts.allow_degrade || state.k == 0 || in_sync >= state.k {
            pacing.short_since = None;
            return None;
        }
        let since = *pacing.short_since.get_or_insert_with(Instant::now);
        (since.elapsed() >= self.opts.ttl).then_some(Change::SetK(0))
    }

    /// Members of V other than this node connected as voters and in sync.
    fn voters_in_sync(&self, state: &GroupState) -> u32 {
        let slaves = self.node.status().slaves;
        let n = state
            .voters
            .iter()
            .filter(|v| v.name != self.opts.name)
            .filter(|v| slaves.iter().any(|r| counts_as(r, v) && r.in_sync))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The offset a watermark wait must reach, read when the wait begins (after the puts
    /// admitted under the old rule completed). The executor always takes the max offset then,
    /// stricter than the planner's `Target::ConfirmOffset`: a put admitted under the old rule
    /// that answered PUT_OK after the Apply does not move the confirm offset (it is observed
    /// with the new rule), so only the max offset certainly covers it. The epoch's start is
    /// below it.
    fn target(&self, _at_least: Target) -> u64 {
        self.node.status().max_offset
    }

    /// Applies a published rule (V, k, mode) to the node.
    fn apply(
        &self,
        voters: &[Voter],
        k: u32,
        mode: Mode,
    ) -> Result<crate::node::AdmittedUnderOldRule, String> {
        let k = usize::try_from(k).unwrap_or(usize::MAX);
        self.node.apply_rule(voter_pairs(voters), k, node_mode(mode)).map_err(|e| e.to_string())
    }

    /// Whether this node still runs as the master of `state`'s epoch, unfenced (no read of
    /// the engine: the plan's Publish compares the revision anyway).
    fn still_master_of(&self, state: &GroupState) -> bool {
        self.node.role() == Role::Master && self.node.epoch() == state.epoch && !self.node.fenced()
    }

    /// Runs the plan of `wanted` against the state record now; the state published at the end.
    pub(super) async fn execute(
        &self,
        wanted: Change,
        why: &str,
        origin: Origin,
    ) -> Result<GroupState, String> {
        let _quiet = self.rule_lock.lock().await;
        let (mut state, mut revision) = self
            .mastered_state()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("this node is not the group's master (or is fenced) now")?;
        let current = Published::from_state(&state).ok_or("the state names no master in V")?;
        if let (Origin::Operator, Change::SetK(k)) = (origin, &wanted)
            && *k == state.k
            && state.wanted_k != Some(*k)
        {
            // The published k already; only the k the group aims for changes (a strict
            // group runs at least that one, see `running_rule`): lowering it only weakens
            // what runs down to what is published, raising it only strengthens it.
            let others = current.others();
            let refusal = if *k > others {
                Some(Refusal::KAboveOthers { k: *k, others })
            } else if *k == 0 && !self.opts.allow_degrade {
                Some(Refusal::DegradeNotAllowed)
            } else if *k > 0 && *k < self.opts.floor {
                Some(Refusal::BelowFloor { k: *k, floor: self.opts.floor })
            } else {
                None
            };
            if let Some(r) = refusal {
                return Err(format!("refused: {r}"));
            }
            let mut next = state.clone();
            next.wanted_k = Some(*k);
            next.last_decision =
                format!("{why}: the group aims for k = {k}, by {}", self.opts.name);
            next.time_unix_ms = crate::coordinator::unix_ms();
            return match self.cas_state(&next, revision).await {
                Ok(Some(_)) => {
                    // A failure is logged there; the next round tries again.
                    self.run_published_rule(&next);
                    Ok(next)
                }
                Ok(None) => Err("the state record changed meanwhile: nothing published".into()),
                Err(e) => Err(format!("publishing failed: {e}")),
            };
        }
        let steps =
            rule_b::plan_change(&current, wanted.clone(), self.opts.floor, self.opts.allow_degrade)
                .map_err(|r| format!("refused: {r}"))?;
        let published = state.clone();
        let mut old_rule = None;
        for step in steps {
            let done = match step {
                Step::Publish { voters, k, mode } => {
                    let mut next = state.clone();
                    next.voters = voters;
                    next.k = k;
                    next.mode = mode;
                    if let (Origin::Operator, Change::SetK(k)) = (origin, &wanted) {
                        // The operator's k is the group's from now on: kept across restarts
                        // and failovers, and what a degraded group is restored to.
                        next.wanted_k = Some(*k);
                    }
                    next.last_decision = format!("{why}: {wanted:?} by {}", self.opts.name);
                    next.time_unix_ms = crate::coordinator::unix_ms();
                    match self.cas_state(&next, revision).await {
                        Ok(Some(r)) => {
                            revision = r;
                            state = next;
                            Ok(())
                        }
                        Ok(None) => {
                            Err("the state record changed meanwhile: nothing published".into())
                        }
                        Err(e) => Err(format!("publishing failed: {e}")),
                    }
                }
                Step::Apply { counting, k, mode } => {
                    let me = state.voter(&self.opts.name).cloned();
                    let voters: Vec<Voter> = counting.into_iter().chain(me).collect();
                    // Never below what a strict group runs for the rule published now.
                    let k = match mode {
                        Mode::Sync => {
                            k.max(u32::try_from(self.strict_floor(&state)).unwrap_or(u32::MAX))
                        }
                        Mode::Async => k,
                    };
                    self.apply(&voters, k, mode).map(|old| old_rule = Some(old))
                }
                Step::WaitAdmittedUnderOldRule => {
                    let timeout = self.opts.slave_timeout + Duration::from_secs(5);
                    match &old_rule {
                        Some(old) if !old.completed(timeout).await => Err(format!(
                            "puts admitted under the old rule still running after {timeout:?}"
                        )),
                        _ => Ok(()),
                    }
                }
                Step::WaitWatermark { over, k, at_least } => {
                    // The node counts exactly `over` now (the plan's Apply came before), and
                    // its ack table knows where each one's run starts: k of them must each
                    // hold the whole log up to the target, not merely have acked past it.
                    let target = self.target(at_least);
                    let deadline = Instant::now() + WATERMARK_WAIT;
                    let needed = usize::try_from(k).unwrap_or(usize::MAX);
                    loop {
                        if self.node.voters_hold(needed, 0..target) {
                            break Ok(());
                        }
                        if !self.still_master_of(&state) {
                            break Err("this node stopped being the group's master".into());
                        }
                        if Instant::now() >= deadline {
                            break Err(format!(
                                "fewer than {k} of {:?} hold the log up to {target} after \
                                 {WATERMARK_WAIT:?} (a voter counts once it acked a byte this \
                                 master sent it: on an idle group, put something)",
                                over.iter().map(|v| v.name.as_str()).collect::<Vec<_>>()
                            ));
                        }
                        tokio::time::sleep(POLL).await;
                    }
                }
            };
            if let Err(e) = done {
                // The rule last published is in force again: every step so far left it or a
                // stricter one. Not after a role change meanwhile: the next round applies
                // what the state publishes then.
                let same_term =
                    self.node.role() == Role::Master && self.node.epoch() == state.epoch;
                if same_term {
                    self.run_published_rule(&state);
                }
                tracing::warn!(group = %self.opts.group, change = ?wanted, "{why}: stopped: {e}");
                return Err(e);
            }
        }
        tracing::info!(
            group = %self.opts.group,
            change = ?wanted,
            before = ?(published.voters.len(), published.k, published.mode),
            after = ?(state.voters.len(), state.k, state.mode),
            "{why}: published"
        );
        Ok(state)
    }

    /// CAS of the state record on `revision`: the new revision, or None when it changed.
    async fn cas_state(&self, next: &GroupState, revision: i64) -> Result<Option<i64>, Error> {
        let key = self.keys.state(&self.opts.group);
        let r = self.coord.txn(Txn::swap(&key, revision, records::encode(next))).await?;
        Ok(r.succeeded.then_some(r.revision))
    }

    /// Records the outcome of request `id` and deletes the request (if unchanged).
    async fn answer(
        &self,
        id: &str,
        request_revision: i64,
        result: Result<GroupState, String>,
    ) -> Result<(), Error> {
        let (state, refusal) = match result {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(e)),
        };
        let shown = match &state {
            Some(s) => Some(s.clone()),
            None => self.mastered_state().await.ok().flatten().map(|(s, _)| s),
        };
        let outcome = ChangeOutcome {
            id: id.to_owned(),
            done: refusal.is_none(),
            refusal,
            voters: shown.iter().flat_map(|s| s.voters.iter().map(|v| v.name.clone())).collect(),
            k: shown.as_ref().map_or(0, |s| s.k),
            mode: shown.as_ref().map_or(Mode::Sync, |s| s.mode),
            master: self.opts.name.clone(),
            time_unix_ms: crate::coordinator::unix_ms(),
        };
        let request = self.keys.change(&self.opts.group);
        self.coord
            .txn(Txn {
                compares: vec![Compare::unchanged_since(&request, request_revision)],
                success: vec![
                    Op::Put {
                        key: self.keys.change_outcome(&self.opts.group),
                        value: records::encode(&outcome),
                        lease: None,
                    },
                    Op::Delete { key: request },
                ],
                failure: vec![],
            })
            .await?;
        Ok(())
    }
}

/// The `id` of an undecodable request, when its JSON has one (else empty).
fn id_of(value: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(value)
        .ok()
        .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// Whether replica `r` is voter `v` (registered with its data-dir id, counted as a voter).
fn counts_as(r: &crate::ha::status::ReplicaStatus, v: &Voter) -> bool {
    let id = r.identity.strip_prefix("data-dir ").and_then(|rest| rest.split_whitespace().next());
    r.voter && !v.data_dir_id.is_empty() && id == Some(v.data_dir_id.as_str())
}
