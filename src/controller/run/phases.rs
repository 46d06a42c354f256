//! The steps of one group, one per phase of its state record: the bootstrap of a group without
//! one, a stable group's requests, reconciliation and failover check (and the rebuild of a
//! state behind its members), the epoch opened for a decision, fencing and the choice, the
//! promotion, the request's outcome, and a blocked step written into the state.

use crate::control::pb;
use crate::controller::decision::{
    self, Blocked, BlockedReason, DecisionContext, FenceReply, HistoryMeta, Stamp,
};
use crate::controller::slots::Reservation;
use crate::coordinator::records::{
    self, DecisionKind, GroupState, HistoryRecord, MemberRecord, OperatorRequest, Phase,
    RequestOutcome,
};
use crate::coordinator::{Compare, Error, Op, Txn};

use super::{Controller, GroupView, new_token};

fn unix_ms() -> i64 {
    crate::coordinator::unix_ms()
}

impl Controller {
    pub(super) async fn bootstrap(&self, view: &GroupView) -> Result<(), Error> {
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
    pub(super) async fn stable(
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
    pub(super) async fn fencing(
        &self,
        view: &GroupView,
        state: GroupState,
        rev: i64,
    ) -> Result<(), Error> {
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
    pub(super) async fn promoting(
        &self,
        view: &GroupView,
        state: GroupState,
        rev: i64,
    ) -> Result<(), Error> {
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
        self.put_outcome(group, outcome, Some(request_rev)).await
    }

    async fn write_outcome(&self, group: &str, outcome: &RequestOutcome) -> Result<(), Error> {
        self.put_outcome(group, outcome, None).await
    }

    /// Writes a request's outcome under the controller's guard; with `request_rev`, in the same
    /// transaction deletes the request when it is still the one read at that revision.
    async fn put_outcome(
        &self,
        group: &str,
        outcome: &RequestOutcome,
        request_rev: Option<i64>,
    ) -> Result<(), Error> {
        let (mut compares, mut success) = (Vec::new(), Vec::new());
        if let Some(rev) = request_rev {
            let key = self.keys.request(group);
            compares.push(Compare::unchanged_since(&key, rev));
            success.push(Op::Delete { key });
        }
        compares.push(self.guard()?);
        success.push(Op::Put {
            key: self.keys.outcome(group),
            value: records::encode(outcome),
            lease: None,
        });
        let r = self.coord.txn(Txn { compares, success, failure: vec![] }).await?;
        self.settled(r.succeeded, r.revision);
        Ok(())
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
