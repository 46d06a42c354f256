//! The failover controller's rules as pure functions: no I/O, nothing async, no clocks (the
//! time and the recent history come in as arguments). The runtime reads the records, calls
//! these, and carries out what they return: a compare-and-swap of the state record, Fence and
//! ChangeRole calls, the steps of a plan. A refusal or a blocked decision changes nothing.
//!
//! - A failover (rule C): [`check_failover`] (may one start?), [`fencing_state`] (the e+1
//!   record the caller CASes), then [`choose`] over the fence replies (the new master, or why
//!   not). [`Decision::to_history`] and [`Blocked::to_history`] write the history record.
//! - Changing V, k or the mode outside a failover (rule B): [`plan_change`] (in [`plan`]).
//! - [`bootstrap_state`] (the first state record, or one rebuilt after an engine restore),
//!   [`next_epoch`], [`switchover_target`].
//!
//! The rule. V is the published voting membership and includes the master; a SYNC put is
//! PUT_OK once k members of V other than the master acked it in the current epoch. Invariant
//! I: every PUT_OK record is held by at least k+1 members of the published V. A failover fences
//! a set F of members of V at e+1 with |F| >= |V| - k: V \ F has at most k members and holds
//! the old master, so at most k-1 members can still ack it (no new PUT_OK), and each PUT_OK
//! record is on one member of F. Epochs make logs agree on their common prefix, so the member
//! of F with the largest (epoch of its last record, end of its last whole record) holds all
//! that F holds: it is promoted; tags only break ties. The property test in `model_tests`
//! checks this against a simulated group, and that a broken rule is caught.
//!
//! ## Why a failover is blocked
//!
//! [`BlockedReason::as_str`] is the `reason` label of `promotion_blocked` and the
//! `blocked_reason` of the history record:
//!
//! | reason | meaning |
//! |---|---|
//! | `paused` | An operator paused the group's automatic failover (`paused` in the state record). |
//! | `state_behind_members` | There is no state record, or a member reports an epoch (or a promised one) above the state's, as after an engine restore from an older backup: rebuild the state from the members first. |
//! | `hold_down` | The group failed over less than the hold-down ago; this stops flapping. |
//! | `rate_limited` | The group reached its limit of automatic failovers per minute. |
//! | `concurrency_limited` | The cluster runs `max-concurrent-failovers` decisions already; this group waits its turn. |
//! | `sync_degraded` | SYNC with k = 0: PUT_OK needed no member's ack, so no member but the master is known to hold every PUT_OK record. Raise k first. |
//! | `async_failover_disabled` | The group is ASYNC and automatic failover of ASYNC groups is off: a promotion could lose acknowledged puts. |
//! | `async_lag_too_large` | ASYNC: the best candidate lags the master's last report by more than max-lag-on-failover (bytes or time), or the master's last offset is unknown. |
//! | `no_voters_reachable` | No member of V other than the master has a member record, or none answered the fence. |
//! | `master_alive` | Pre-vote: a majority of V without the master got a frame from the master recently; the lease expired but the master still serves its slaves. |
//! | `too_few_fenced` | Fewer than \|V\| - k members of V are fenced at the new epoch: the old master might still reach k acks. |
//! | `best_candidate_not_promotable` | Only never-promote members hold the maximum (epoch of last record, end offset) over the fenced set; promoting another would lose records. |
//! | `candidate_below_confirm_offset` | The chosen member ends below the confirm offset the old master published. An alarm: the rule says this cannot happen, so it is a bug or lost data. |

use std::collections::BTreeMap;
use std::fmt;

use crate::coordinator::records::CandidateReport;
use crate::coordinator::records::DecisionKind;
use crate::coordinator::records::GroupState;
use crate::coordinator::records::HistoryRecord;
use crate::coordinator::records::MemberRecord;
use crate::coordinator::records::MemberRole;
use crate::coordinator::records::Mode;
use crate::coordinator::records::Phase;
use crate::coordinator::records::Voter;

mod bootstrap;

pub use crate::coordinator::refusal::Refusal;
pub use crate::coordinator::rule_b as plan;
pub use crate::coordinator::rule_b::Change;
pub use crate::coordinator::rule_b::Published;
pub use crate::coordinator::rule_b::Step;
pub use crate::coordinator::rule_b::Target;
pub use crate::coordinator::rule_b::effective_k;
pub use crate::coordinator::rule_b::plan_change;
pub use bootstrap::RuleDefaults;
pub use bootstrap::bootstrap_state;
pub use bootstrap::switchover_target;

#[cfg(test)]
mod model;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

/// Why an automatic failover did not happen. The values are fixed: they are Prometheus label
/// values and appear in history records (the table in the module docs explains each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockedReason {
    /// An operator paused the group's automatic failover (`paused` in the state record).
    Paused,
    /// There is no state record, or a member reports an epoch (or a promised one) above the
    /// state's, as after an engine restore from an older backup: rebuild the state from the
    /// members first ([`bootstrap_state`]).
    StateBehindMembers,
    /// The group failed over less than the hold-down ago; this stops flapping.
    HoldDown,
    /// The group reached its limit of automatic failovers per minute.
    RateLimited,
    /// The cluster runs its limit of decisions at once; this group's failover waits its turn.
    ConcurrencyLimited,
    /// SYNC with k = 0: PUT_OK needed no member's ack, so no member but the master is known to
    /// hold every PUT_OK record. Raise k first.
    SyncDegraded,
    /// The group is ASYNC and automatic failover of ASYNC groups is off: a promotion could lose
    /// acknowledged puts.
    AsyncFailoverDisabled,
    /// ASYNC: the best candidate lags the master's last report by more than
    /// max-lag-on-failover (bytes or time), or the master's last offset is unknown.
    AsyncLagTooLarge,
    /// No member of V other than the master has a member record, or none answered the fence.
    NoVotersReachable,
    /// Pre-vote: a majority of V without the master got a frame from the master recently; the
    /// lease expired but the master still serves its slaves.
    MasterAlive,
    /// Fewer than |V| - k members of V are fenced at the new epoch: the old master might still
    /// reach k acks.
    TooFewFenced,
    /// Only never-promote members hold the maximum (epoch of last record, end offset) over the
    /// fenced set; promoting another would lose records.
    BestCandidateNotPromotable,
    /// The chosen member ends below the confirm offset the old master published. An alarm: the
    /// rule says this cannot happen, so it is a bug or lost data.
    CandidateBelowConfirmOffset,
}

impl BlockedReason {
    /// Every reason, in the order of the table.
    pub const ALL: [BlockedReason; 13] = [
        BlockedReason::Paused,
        BlockedReason::StateBehindMembers,
        BlockedReason::HoldDown,
        BlockedReason::RateLimited,
        BlockedReason::ConcurrencyLimited,
        BlockedReason::SyncDegraded,
        BlockedReason::AsyncFailoverDisabled,
        BlockedReason::AsyncLagTooLarge,
        BlockedReason::NoVotersReachable,
        BlockedReason::MasterAlive,
        BlockedReason::TooFewFenced,
        BlockedReason::BestCandidateNotPromotable,
        BlockedReason::CandidateBelowConfirmOffset,
    ];

    /// The snake_case label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockedReason::Paused => "paused",
            BlockedReason::StateBehindMembers => "state_behind_members",
            BlockedReason::HoldDown => "hold_down",
            BlockedReason::RateLimited => "rate_limited",
            BlockedReason::ConcurrencyLimited => "concurrency_limited",
            BlockedReason::SyncDegraded => "sync_degraded",
            BlockedReason::AsyncFailoverDisabled => "async_failover_disabled",
            BlockedReason::AsyncLagTooLarge => "async_lag_too_large",
            BlockedReason::NoVotersReachable => "no_voters_reachable",
            BlockedReason::MasterAlive => "master_alive",
            BlockedReason::TooFewFenced => "too_few_fenced",
            BlockedReason::BestCandidateNotPromotable => "best_candidate_not_promotable",
            BlockedReason::CandidateBelowConfirmOffset => "candidate_below_confirm_offset",
        }
    }

    /// Whether the reason means a broken invariant (page someone), not a wait.
    pub fn is_alarm(self) -> bool {
        self == BlockedReason::CandidateBelowConfirmOffset
    }
}

impl fmt::Display for BlockedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The failover settings the rules read (the controller's configuration maps onto these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverPolicy {
    /// Pre-vote: a member whose last frame from the master is younger than this says the
    /// master is alive.
    pub prevote_frame_age_ms_max: u64,
    /// The minimum time between two failovers of a group.
    pub hold_down_ms: u64,
    /// At most this many automatic failovers of one group per minute (0: no limit): a group
    /// that keeps failing does not use up the others' failovers.
    pub failovers_per_minute_max: u32,
    /// At most this many decisions running in the cluster at once when an automatic
    /// failover would open another (0: no limit).
    pub concurrent_failovers_max: u32,
    /// Whether an ASYNC group fails over automatically.
    pub async_failover: bool,
    /// ASYNC: max-lag-on-failover in bytes.
    pub async_lag_bytes_max: u64,
    /// ASYNC: max-lag-on-failover in time (the byte lag at the master's write rate).
    pub async_lag_ms_max: u64,
    /// The master's lease TTL (it may write this long after its last report).
    pub lease_ttl_ms: u64,
}

/// What a decision knows besides the records, passed in so that the rules stay pure.
#[derive(Debug, Clone, Copy)]
pub struct DecisionContext<'a> {
    /// Now, unix ms.
    pub now_unix_ms: i64,
    /// When this group last failed over (from its history), unix ms.
    pub group_last_failover_unix_ms: Option<i64>,
    /// When this group's recent automatic failovers happened (from its history), unix ms
    /// (older ones are ignored).
    pub group_failovers_unix_ms: &'a [i64],
    /// Decisions running in the cluster now (groups whose state is fencing or promoting),
    /// this group's excluded.
    pub decisions_running: usize,
    /// The master's recent write rate (ASYNC loss bound and lag in time).
    pub master_write_bytes_per_s: u64,
    /// The last member record the controller saw of the old master (its lease has expired).
    pub master_last_report: Option<&'a MemberRecord>,
}

/// A member's answer to Fence(e+1, token): it promised e+1 and stopped appending and acking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceReply {
    /// `node.name`.
    pub name: String,
    /// Its data-dir id (must be the one V names).
    pub data_dir_id: String,
    /// The epoch it promised (must be the decision's).
    pub promised_epoch: u64,
    /// Its role epoch.
    pub epoch: u64,
    /// Epoch of its last record.
    pub last_record_epoch: u64,
    /// End of its last whole record.
    pub end_offset: u64,
    /// Its never-promote tag.
    pub never_promote: bool,
    /// Its priority tag (higher first, ties only).
    pub priority: i32,
}

impl FenceReply {
    /// The order of completeness: (epoch of the last record, end of the last whole record).
    pub fn key(&self) -> (u64, u64) {
        (self.last_record_epoch, self.end_offset)
    }
}

/// Who writes a record and when.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// The decision token (fresh for each epoch).
    pub token: &'a str,
    /// The controller's name.
    pub controller: &'a str,
    /// Now, unix ms.
    pub now_unix_ms: i64,
}

/// A failover that may not go on, and why; with what it saw, for the history record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// Why.
    pub reason: BlockedReason,
    /// The numbers behind the reason, in words.
    pub detail: String,
    /// Every member of V as the decision saw it (empty before fencing).
    pub candidates: Vec<CandidateReport>,
    /// The rule applied, in words (empty before fencing).
    pub rule: String,
    /// The fenced set and the threshold (empty before fencing).
    pub fencing: String,
}

impl Blocked {
    fn new(reason: BlockedReason, detail: String) -> Self {
        let (candidates, rule, fencing) = (Vec::new(), String::new(), String::new());
        Self { reason, detail, candidates, rule, fencing }
    }

    /// The history record of a blocked decision at `meta.epoch`.
    pub fn to_history(&self, meta: &HistoryMeta<'_>) -> HistoryRecord {
        let mut record =
            meta.record(None, self.candidates.clone(), self.rule.clone(), self.fencing.clone());
        record.blocked_reason = Some(self.reason.as_str().to_owned());
        record.blocked_detail = self.detail.clone();
        record
    }
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

/// A failover's choice: the member to promote at `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The epoch it opens.
    pub epoch: u64,
    /// The master before.
    pub old_master: Option<String>,
    /// The member to promote.
    pub chosen: String,
    /// Every member of V, chosen or not and why.
    pub candidates: Vec<CandidateReport>,
    /// The rule applied, in words.
    pub rule: String,
    /// The fenced set and the threshold.
    pub fencing: String,
    /// ASYNC: the bound of possible loss in bytes; None in SYNC (zero loss).
    pub loss_bound_bytes: Option<u64>,
}

impl Decision {
    /// The history record of this decision.
    pub fn to_history(&self, meta: &HistoryMeta<'_>) -> HistoryRecord {
        let mut record = meta.record(
            Some(self.chosen.clone()),
            self.candidates.clone(),
            self.rule.clone(),
            self.fencing.clone(),
        );
        record.loss_bound_bytes = self.loss_bound_bytes;
        record
    }
}

/// What a history record needs besides the decision.
#[derive(Debug, Clone, Copy)]
pub struct HistoryMeta<'a> {
    /// The epoch.
    pub epoch: u64,
    /// Its token.
    pub token: &'a str,
    /// What opened it.
    pub kind: DecisionKind,
    /// The master before.
    pub old_master: Option<&'a str>,
    /// The revision of the transaction that allocated the epoch.
    pub revision: i64,
    /// The controller's name.
    pub controller: &'a str,
    /// Unix ms of the decision.
    pub time_unix_ms: i64,
}

impl HistoryMeta<'_> {
    /// The history record of a bootstrap (no candidates, no fencing).
    pub fn record_bootstrap(&self, new_master: Option<String>) -> HistoryRecord {
        self.record(new_master, Vec::new(), String::new(), String::new())
    }

    fn record(
        &self,
        new_master: Option<String>,
        candidates: Vec<CandidateReport>,
        rule: String,
        fencing: String,
    ) -> HistoryRecord {
        HistoryRecord {
            epoch: self.epoch,
            token: self.token.to_owned(),
            kind: self.kind,
            old_master: self.old_master.map(str::to_owned),
            new_master,
            candidates,
            rule,
            fencing,
            blocked_reason: None,
            blocked_detail: String::new(),
            loss_bound_bytes: None,
            revision: self.revision,
            controller: self.controller.to_owned(),
            time_unix_ms: self.time_unix_ms,
        }
    }
}

/// The highest epoch a member reports: its role epoch or the one it promised.
pub fn member_epoch(member: &MemberRecord) -> u64 {
    member.epoch.max(member.promised_epoch)
}

/// The epoch a new decision allocates: above the state's and above every epoch a member
/// reports (promised ones included), so no epoch is ever used twice.
pub fn next_epoch(state: &GroupState, members: &[MemberRecord]) -> u64 {
    let members_max = members.iter().map(member_epoch).max().unwrap_or(0);
    state.epoch.max(members_max) + 1
}

/// The member record of voter `voter` (same name and data-dir id).
fn record_of<'a>(members: &'a [MemberRecord], voter: &Voter) -> Option<&'a MemberRecord> {
    members.iter().find(|m| m.name == voter.name && m.data_dir_id == voter.data_dir_id)
}

fn is_master(state: &GroupState, name: &str) -> bool {
    state.master.as_deref() == Some(name)
}

/// May a failover of this group start? After the master's lease expired, in this order:
/// paused, no state or a state behind the members, hold-down, rate limit, a degraded SYNC or
/// an ASYNC group, no voter with a record, then the pre-vote. `members` are the live member
/// records. Only availability rests on this check; safety rests on [`choose`].
pub fn check_failover(
    state: Option<&GroupState>,
    members: &[MemberRecord],
    policy: &FailoverPolicy,
    ctx: &DecisionContext<'_>,
) -> Result<(), Blocked> {
    let Some(state) = state else {
        let detail = "no state record: bootstrap it from the members".to_owned();
        return Err(Blocked::new(BlockedReason::StateBehindMembers, detail));
    };
    if state.paused {
        return Err(Blocked::new(BlockedReason::Paused, "automatic failover is paused".into()));
    }
    if let Some(m) = members.iter().find(|m| member_epoch(m) > state.epoch) {
        let detail = format!(
            "{} reports epoch {} above the state's {} (an engine restore?): rebuild the state",
            m.name,
            member_epoch(m),
            state.epoch
        );
        return Err(Blocked::new(BlockedReason::StateBehindMembers, detail));
    }
    check_pace(policy, ctx)?;
    check_mode(state, policy)?;
    prevote(state, members, policy, ctx)
}

fn check_pace(policy: &FailoverPolicy, ctx: &DecisionContext<'_>) -> Result<(), Blocked> {
    let now = ctx.now_unix_ms;
    if let Some(last) = ctx.group_last_failover_unix_ms {
        let ago_ms = now.saturating_sub(last);
        if ago_ms < i64::try_from(policy.hold_down_ms).unwrap_or(i64::MAX) {
            let detail =
                format!("last failover {ago_ms} ms ago, hold-down {} ms", policy.hold_down_ms);
            return Err(Blocked::new(BlockedReason::HoldDown, detail));
        }
    }
    let max = policy.failovers_per_minute_max;
    if max > 0 {
        let recent = ctx
            .group_failovers_unix_ms
            .iter()
            .filter(|&&t| t <= now && now.saturating_sub(t) < 60_000)
            .count();
        if recent >= max as usize {
            let detail =
                format!("{recent} failovers of this group in the last minute, limit {max}");
            return Err(Blocked::new(BlockedReason::RateLimited, detail));
        }
    }
    let most = policy.concurrent_failovers_max;
    if most > 0 && ctx.decisions_running >= most as usize {
        let detail = format!(
            "{} decisions of other groups are running, limit {most}: this group's turn comes \
             when one ends",
            ctx.decisions_running
        );
        return Err(Blocked::new(BlockedReason::ConcurrencyLimited, detail));
    }
    Ok(())
}

fn check_mode(state: &GroupState, policy: &FailoverPolicy) -> Result<(), Blocked> {
    match state.mode {
        Mode::Sync if state.k == 0 => {
            let detail = "SYNC with k = 0: no member is known to hold every PUT_OK record; \
                          raise k first"
                .to_owned();
            Err(Blocked::new(BlockedReason::SyncDegraded, detail))
        }
        Mode::Async if !policy.async_failover => {
            let detail = "ASYNC group and automatic ASYNC failover is disabled".to_owned();
            Err(Blocked::new(BlockedReason::AsyncFailoverDisabled, detail))
        }
        Mode::Sync | Mode::Async => Ok(()),
    }
}

/// The pre-vote: a majority of V without the master that heard from the master within the
/// bound (its reported frame age plus the record's age) blocks the failover.
fn prevote(
    state: &GroupState,
    members: &[MemberRecord],
    policy: &FailoverPolicy,
    ctx: &DecisionContext<'_>,
) -> Result<(), Blocked> {
    let others: Vec<&Voter> = state.voters.iter().filter(|v| !is_master(state, &v.name)).collect();
    let reporting: Vec<&MemberRecord> =
        others.iter().filter_map(|v| record_of(members, v)).collect();
    if reporting.is_empty() {
        let detail =
            format!("none of the {} voters besides the master has a member record", others.len());
        return Err(Blocked::new(BlockedReason::NoVotersReachable, detail));
    }
    let Some(master) = state.master.as_deref() else {
        return Ok(());
    };
    let bound_ms = policy.prevote_frame_age_ms_max;
    let fresh = |r: &&MemberRecord| {
        let record_age_ms = u64::try_from(ctx.now_unix_ms.saturating_sub(r.time_unix_ms));
        r.role == MemberRole::Slave
            && r.master_frame_age_ms
                .is_some_and(|a| a.saturating_add(record_age_ms.unwrap_or(0)) < bound_ms)
    };
    let alive = reporting.iter().copied().filter(fresh).count();
    if alive * 2 > others.len() {
        let detail = format!(
            "{alive} of the {} voters besides {master} got a frame from it within {bound_ms} ms",
            others.len()
        );
        return Err(Blocked::new(BlockedReason::MasterAlive, detail));
    }
    Ok(())
}

/// The state record a failover CASes first: epoch [`next_epoch`] with a fresh token, phase
/// Fencing, V, k and the mode carried over. The caller records the revision its CAS returns
/// (`epoch_revision`) in its next write.
pub fn fencing_state(state: &GroupState, members: &[MemberRecord], stamp: Stamp<'_>) -> GroupState {
    let epoch = next_epoch(state, members);
    let old = state.master.as_deref().unwrap_or("none");
    GroupState {
        epoch,
        phase: Phase::Fencing,
        token: stamp.token.to_owned(),
        chosen: None,
        epoch_revision: 0,
        last_decision: format!("failover from {old}: fencing at epoch {epoch}"),
        controller: stamp.controller.to_owned(),
        time_unix_ms: stamp.now_unix_ms,
        ..state.clone()
    }
}

/// How many members of V must be fenced: |V| - k in SYNC; in ASYNC |V| - max(k, 1) (fencing
/// cannot stop an ASYNC master's PUT_OK; it keeps at most one voter unfenced).
pub fn fenced_needed(state: &GroupState) -> usize {
    let k = match state.mode {
        Mode::Sync => state.k,
        Mode::Async => state.k.max(1),
    };
    state.voters.len().saturating_sub(k as usize)
}

fn fmt_key(key: (u64, u64)) -> String {
    format!("({}, {})", key.0, key.1)
}

/// The replies that count: one per member of V, with V's data-dir id, promised at the epoch.
fn fenced_set<'a>(
    state: &GroupState,
    replies: &'a [FenceReply],
) -> BTreeMap<&'a str, &'a FenceReply> {
    let mut fenced = BTreeMap::new();
    for r in replies {
        let in_v = state.voter(&r.name).is_some_and(|v| v.data_dir_id == r.data_dir_id);
        if in_v && r.promised_epoch == state.epoch {
            fenced.entry(r.name.as_str()).or_insert(r);
        }
    }
    fenced
}

/// A report for every member of V: the fenced ones with their offsets, the others with why
/// their reply (if any) did not count.
fn initial_reports(
    state: &GroupState,
    replies: &[FenceReply],
    fenced: &BTreeMap<&str, &FenceReply>,
) -> Vec<CandidateReport> {
    let report = |v: &Voter| match fenced.get(v.name.as_str()) {
        Some(r) => CandidateReport {
            name: v.name.clone(),
            fenced: true,
            epoch: r.epoch,
            last_record_epoch: r.last_record_epoch,
            end_offset: r.end_offset,
            chosen: false,
            why: String::new(),
        },
        None => {
            let why = match replies.iter().find(|r| r.name == v.name) {
                Some(r) if r.data_dir_id != v.data_dir_id => format!(
                    "not fenced: answered from data dir {}, V has {}",
                    r.data_dir_id, v.data_dir_id
                ),
                Some(r) => {
                    format!("not fenced: promised epoch {}, not {}", r.promised_epoch, state.epoch)
                }
                None => "not fenced".to_owned(),
            };
            CandidateReport {
                name: v.name.clone(),
                fenced: false,
                epoch: 0,
                last_record_epoch: 0,
                end_offset: 0,
                chosen: false,
                why,
            }
        }
    };
    state.voters.iter().map(report).collect()
}

fn rule_text(state: &GroupState, policy: &FailoverPolicy) -> String {
    let need = fenced_needed(state);
    let choice = "promote the member of F with the maximum (epoch of last record, end of last \
                  whole record); priority (higher first), never-promote, the old master last \
                  and then the name only break ties";
    match state.mode {
        Mode::Sync => format!(
            "SYNC, k = {}: fence |F| >= |V| - k = {need} of V at epoch {}; {choice}; the chosen \
             must hold the confirm offset {}",
            state.k, state.epoch, state.confirm_offset
        ),
        Mode::Async => format!(
            "ASYNC, automatic failover on: fence |F| >= |V| - max(k, 1) = {need} of V at epoch \
             {}; {choice}; its lag must be within {} bytes and {} ms; possible loss = lag + one \
             TTL ({} ms) of the master's writes",
            state.epoch, policy.async_lag_bytes_max, policy.async_lag_ms_max, policy.lease_ttl_ms
        ),
    }
}

fn fencing_text(state: &GroupState, fenced: &BTreeMap<&str, &FenceReply>) -> String {
    let names: Vec<&str> = fenced.keys().copied().collect();
    let need = fenced_needed(state);
    let verdict = if fenced.len() >= need { "enough" } else { "too few" };
    format!(
        "fenced {} of {} voters at epoch {} (need {need}, {verdict}): [{}]",
        fenced.len(),
        state.voters.len(),
        state.epoch,
        names.join(", ")
    )
}

/// Chooses the new master from the fence replies at `state.epoch` (the e+1 record the caller
/// CASed, phase Fencing): only a member of the fenced set F, |F| >= [`fenced_needed`], with the
/// maximum (epoch of its last record, end of its last whole record) over F; tags only break
/// ties. SYNC: it must hold the published confirm offset. ASYNC: its lag must be within
/// max-lag-on-failover, and the decision records the loss bound.
pub fn choose(
    state: &GroupState,
    replies: &[FenceReply],
    policy: &FailoverPolicy,
    ctx: &DecisionContext<'_>,
) -> Result<Decision, Blocked> {
    let fenced = fenced_set(state, replies);
    let mut reports = initial_reports(state, replies, &fenced);
    let fencing = fencing_text(state, &fenced);
    let rule = rule_text(state, policy);
    let blocked = |reason, detail, reports: &[CandidateReport]| Blocked {
        reason,
        detail,
        candidates: reports.to_vec(),
        rule: rule.clone(),
        fencing: fencing.clone(),
    };
    if let Err(b) = check_mode(state, policy) {
        return Err(blocked(b.reason, b.detail, &reports));
    }
    if fenced.is_empty() {
        let detail = format!("no member of V answered Fence at epoch {}", state.epoch);
        return Err(blocked(BlockedReason::NoVotersReachable, detail, &reports));
    }
    let need = fenced_needed(state);
    if fenced.len() < need {
        let detail = format!(
            "{} of {} voters fenced, need {need} (|V| - k, k = {})",
            fenced.len(),
            state.voters.len(),
            state.k
        );
        return Err(blocked(BlockedReason::TooFewFenced, detail, &reports));
    }
    let chosen = match pick(state, &fenced, &mut reports) {
        Ok(chosen) => chosen,
        Err(detail) => {
            return Err(blocked(BlockedReason::BestCandidateNotPromotable, detail, &reports));
        }
    };
    debug_assert!(fenced.contains_key(chosen.name.as_str()), "the chosen is in F");
    debug_assert!(fenced.values().all(|r| r.key() <= chosen.key()), "the chosen holds the max");
    let loss_bound_bytes = match state.mode {
        Mode::Sync if chosen.end_offset < state.confirm_offset => {
            let detail = format!(
                "{} ends at {}, below the published confirm offset {}: a bug or lost data",
                chosen.name, chosen.end_offset, state.confirm_offset
            );
            return Err(blocked(BlockedReason::CandidateBelowConfirmOffset, detail, &reports));
        }
        Mode::Sync => None,
        Mode::Async => match async_loss_bound(state, chosen, policy, ctx) {
            Ok(bound) => Some(bound),
            Err(detail) => return Err(blocked(BlockedReason::AsyncLagTooLarge, detail, &reports)),
        },
    };
    for r in reports.iter_mut().filter(|r| r.name == chosen.name) {
        r.chosen = true;
    }
    Ok(Decision {
        epoch: state.epoch,
        old_master: state.master.clone(),
        chosen: chosen.name.clone(),
        candidates: reports,
        rule,
        fencing,
        loss_bound_bytes,
    })
}

/// The maximum over F and, among its holders, the promotable one the tags put first. Fills in
/// every fenced member's `why`. Err: only never-promote members hold the maximum.
fn pick<'a>(
    state: &GroupState,
    fenced: &BTreeMap<&str, &'a FenceReply>,
    reports: &mut [CandidateReport],
) -> Result<&'a FenceReply, String> {
    let max = fenced.values().map(|r| r.key()).max().expect("F is not empty");
    let mut holders: Vec<&FenceReply> =
        fenced.values().copied().filter(|r| r.key() == max && !r.never_promote).collect();
    // Ties only: priority (higher first), the old master last (its lease just expired), name.
    holders.sort_by_key(|r| (std::cmp::Reverse(r.priority), is_master(state, &r.name), &r.name));
    let chosen = holders.first().copied();
    for report in reports.iter_mut().filter(|r| r.fenced) {
        let r = fenced[report.name.as_str()];
        report.why = match chosen {
            _ if r.key() < max => format!("behind: {} < max {}", fmt_key(r.key()), fmt_key(max)),
            _ if r.never_promote => format!("never-promote (holds the max {})", fmt_key(max)),
            Some(c) if c.name == r.name => format!("chosen: holds the max {} over F", fmt_key(max)),
            Some(c) if r.priority < c.priority => {
                format!("lower priority ({} < {}) at the max", r.priority, c.priority)
            }
            Some(_) if is_master(state, &r.name) => {
                "old master: last among equal candidates".to_owned()
            }
            Some(c) => format!("tie at the max and priority: {} comes first by name", c.name),
            None => unreachable!("a promotable holder of the max has a chosen one"),
        };
    }
    chosen.ok_or_else(|| format!("only never-promote members hold the max {}", fmt_key(max)))
}

/// ASYNC: the chosen member's lag behind the old master's last report, checked against
/// max-lag-on-failover; Ok: the loss bound (that lag plus one TTL of the master's writes).
fn async_loss_bound(
    state: &GroupState,
    chosen: &FenceReply,
    policy: &FailoverPolicy,
    ctx: &DecisionContext<'_>,
) -> Result<u64, String> {
    let master_report =
        ctx.master_last_report.filter(|m| state.master.as_deref() == Some(m.name.as_str()));
    let Some(master) = master_report else {
        return Err("the old master's last offset is unknown: its lag cannot be bounded".into());
    };
    let rate = ctx.master_write_bytes_per_s;
    let lag_bytes = master.max_offset.saturating_sub(chosen.end_offset);
    let lag_ms = match (lag_bytes, rate) {
        (0, _) => 0,
        (_, 0) => u64::MAX,
        (bytes, rate) => bytes.saturating_mul(1000) / rate,
    };
    if lag_bytes > policy.async_lag_bytes_max || lag_ms > policy.async_lag_ms_max {
        return Err(format!(
            "{} lags {lag_bytes} bytes (~{lag_ms} ms at {rate} bytes/s) behind {}'s last report; \
             max-lag-on-failover is {} bytes / {} ms",
            chosen.name, master.name, policy.async_lag_bytes_max, policy.async_lag_ms_max
        ));
    }
    let ttl_bytes = rate.saturating_mul(policy.lease_ttl_ms) / 1000;
    Ok(lag_bytes.saturating_add(ttl_bytes))
}
