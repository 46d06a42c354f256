//! The controller's side of the Cluster service ([`crate::control::ClusterApi`]): the status,
//! history and pause switches read and written straight from the coordinator's records, and
//! the operator's requests handed to the active controller through `<group>/request` (created
//! only when absent) and answered from `<group>/outcome`. Any node with a coordinator serves
//! it, controller or not: nothing here decides, it only reads, requests and waits (and
//! removes a group without live members: `remove`).
//!
//! A status is read in one transaction (one revision): the groups' records, the controller's
//! campaign key and the cluster's pause key, so it never mixes two moments. Whether a
//! failover is possible is computed from those records by [`blocked_reason`] (pure).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::control::{ClusterApi, ClusterError, ClusterFuture, pb};
use crate::coordinator::keys::Keys;
use crate::coordinator::records::{
    self, DecisionKind, GroupState, HistoryRecord, LeaderRecord, MemberRecord, MemberRole, Mode,
    OperatorRequest, Phase, RequestOutcome,
};
use crate::coordinator::{CmpOp, CmpTarget, Compare, Coordinator, KeyValue, Op, Revision, Txn};

mod change;
mod remove;
pub mod topology;

/// How long a request waits for its outcome when the caller gives no bound.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The longest a request may wait for its outcome.
pub const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(600);
/// How often the outcome key is read while a request waits.
const OUTCOME_POLL: Duration = Duration::from_millis(100);
/// Compare-and-swap attempts of a group's pause switch before giving up (each lost race means
/// the controller changed the state record in between).
const PAUSE_ATTEMPTS: usize = 5;

/// Blocked reasons this view computes (the controller's decision records its own in the
/// state record, which the status passes on).
pub mod reason {
    /// The cluster's or the group's automatic failover is paused.
    pub const PAUSED: &str = "paused";
    /// k = 0: no acks are required, so no member is known to hold every PUT_OK.
    pub const SYNC_DEGRADED: &str = "sync_degraded";
    /// Fewer than |V| - k voters other than the master have a live record: they could not
    /// be fenced.
    pub const TOO_FEW_FENCED: &str = "too_few_fenced";
    /// Every most complete live voter is tagged never-promote.
    pub const BEST_CANDIDATE_NOT_PROMOTABLE: &str = "best_candidate_not_promotable";
    /// The group has members but no state record yet.
    pub const NOT_BOOTSTRAPPED: &str = "not_bootstrapped";
}

/// The Cluster service's view of one cluster's records in the coordinator.
#[derive(Debug, Clone)]
pub struct ClusterView {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
}

/// One group's records as read.
#[derive(Debug, Default)]
struct GroupRecords {
    /// The state record and its mod revision.
    state: Option<(GroupState, Revision)>,
    leader: Option<LeaderRecord>,
    /// By name.
    members: BTreeMap<String, MemberRecord>,
    request: Option<OperatorRequest>,
    /// The history records, by epoch (the topology's recent decisions).
    history: BTreeMap<u64, HistoryRecord>,
}

/// What one status read found.
#[derive(Debug, Default)]
struct Snapshot {
    revision: Revision,
    controller: Option<String>,
    paused: bool,
    groups: BTreeMap<String, GroupRecords>,
}

/// A coordinator failure, for the caller.
fn engine(e: crate::coordinator::Error) -> ClusterError {
    ClusterError::Coordinator(format!("the coordinator failed: {e}"))
}

/// Unix ms now.
fn now_ms() -> i64 {
    crate::ha::status::now_millis()
}

impl ClusterView {
    /// The view of the cluster whose keys are `keys`.
    pub fn new(coord: Arc<dyn Coordinator>, keys: Keys) -> Self {
        Self { coord, keys }
    }

    /// Reads every record under `prefix` (the groups, or one group), the controller's key and
    /// the pause key, in one transaction.
    async fn snapshot(&self, prefix: String) -> Result<Snapshot, ClusterError> {
        let txn = Txn {
            compares: vec![],
            success: vec![
                Op::GetPrefix { prefix },
                Op::Get { key: self.keys.controller() },
                Op::Get { key: self.keys.paused() },
            ],
            failure: vec![],
        };
        let resp = self.coord.txn(txn).await.map_err(engine)?;
        let [records, controller, paused] = resp.reads.as_slice() else {
            return Err(ClusterError::Coordinator(format!(
                "the coordinator answered {} reads to a transaction of 3",
                resp.reads.len()
            )));
        };
        let mut snap = Snapshot {
            revision: resp.revision,
            controller: controller
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).trim().to_owned())
                .filter(|c| !c.is_empty()),
            paused: !paused.is_empty(),
            groups: BTreeMap::new(),
        };
        for kv in records {
            self.file(&mut snap.groups, kv)?;
        }
        Ok(snap)
    }

    /// Files one key of a group (history, name claims and the outcome are not status).
    fn file(
        &self,
        groups: &mut BTreeMap<String, GroupRecords>,
        kv: &KeyValue,
    ) -> Result<(), ClusterError> {
        let Some((group, rest)) = self.keys.split_group(&kv.key) else { return Ok(()) };
        let g = groups.entry(group.to_owned()).or_default();
        let decode_err = |e: crate::coordinator::Error| ClusterError::Coordinator(e.to_string());
        match rest {
            "state" => {
                let s = records::decode(&kv.key, &kv.value).map_err(decode_err)?;
                g.state = Some((s, kv.mod_revision));
            }
            "leader" => g.leader = Some(records::decode(&kv.key, &kv.value).map_err(decode_err)?),
            "request" => g.request = Some(records::decode(&kv.key, &kv.value).map_err(decode_err)?),
            _ if rest.starts_with("members/") => {
                let m: MemberRecord = records::decode(&kv.key, &kv.value).map_err(decode_err)?;
                g.members.insert(m.name.clone(), m);
            }
            _ if rest.starts_with("history/") => {
                let h: HistoryRecord = records::decode(&kv.key, &kv.value).map_err(decode_err)?;
                g.history.insert(h.epoch, h);
            }
            _ => {}
        }
        Ok(())
    }

    async fn cluster_status(&self, group: Option<&str>) -> Result<pb::ClusterStatus, ClusterError> {
        let prefix = match group {
            Some(g) => self.keys.group(g),
            None => self.keys.groups(),
        };
        let snap = self.snapshot(prefix).await?;
        if let Some(g) = group
            && !snap.groups.contains_key(g)
        {
            return Err(not_found(g, &self.keys));
        }
        let now = now_ms();
        let groups = snap
            .groups
            .iter()
            .map(|(name, recs)| group_status(name, recs, now, snap.paused, 0))
            .collect();
        Ok(pb::ClusterStatus {
            root: self.keys.root().to_owned(),
            controller: snap.controller.unwrap_or_default(),
            paused: snap.paused,
            groups,
            revision: snap.revision,
            time_unix_ms: now,
        })
    }

    async fn group_history(
        &self,
        group: &str,
        limit: usize,
    ) -> Result<pb::GetHistoryResponse, ClusterError> {
        let txn = Txn {
            compares: vec![],
            success: vec![
                Op::GetPrefix { prefix: self.keys.history(group) },
                Op::GetPrefix { prefix: self.keys.group(group) },
            ],
            failure: vec![],
        };
        // The second read only tells whether the group exists; its keys are not used.
        let resp = self.coord.txn(txn).await.map_err(engine)?;
        let (history, any) = match resp.reads.as_slice() {
            [h, a] => (h, a),
            _ => return Err(ClusterError::Coordinator("a short transaction answer".into())),
        };
        if any.is_empty() {
            return Err(not_found(group, &self.keys));
        }
        let mut entries = Vec::with_capacity(history.len());
        // Keys sort by zero-padded epoch: newest last, so read them backwards.
        for kv in history.iter().rev() {
            if limit > 0 && entries.len() == limit {
                break;
            }
            let h: HistoryRecord = records::decode(&kv.key, &kv.value)
                .map_err(|e| ClusterError::Coordinator(e.to_string()))?;
            entries.push(history_entry(h));
        }
        Ok(pb::GetHistoryResponse { group: group.to_owned(), entries })
    }

    /// Validates an operator request, creates it (only when none is pending) and waits for
    /// its outcome.
    async fn request(&self, ask: Ask) -> Result<pb::OperatorOutcome, ClusterError> {
        let group = ask.group.trim();
        if group.is_empty() {
            return Err(ClusterError::InvalidArgument("group is empty: name the group".into()));
        }
        let state = self.state(group).await?.ok_or_else(|| not_found(group, &self.keys))?.0;
        if let Some(to) = &ask.to {
            check_target(group, &state, to)?;
        }
        let timeout = request_timeout(ask.timeout_ms);
        let request = OperatorRequest {
            id: format!("{:032x}", rand::random::<u128>()),
            kind: ask.kind,
            to: ask.to,
            accept_data_loss: ask.accept_data_loss,
            time_unix_ms: now_ms(),
        };
        let key = self.keys.request(group);
        let txn = Txn::create_only(&key, records::encode(&request), None);
        let resp = self.coord.txn(txn).await.map_err(engine)?;
        if !resp.succeeded {
            return Err(pending(group, &key, resp.reads.first().and_then(|r| r.first())));
        }
        tracing::info!(
            group,
            id = %request.id,
            kind = ?request.kind,
            to = ?request.to,
            "operator request created"
        );
        self.wait_outcome(group, &request.id, timeout).await
    }

    /// The outcome of request `id`, read every poll interval until `timeout`.
    async fn wait_outcome(
        &self,
        group: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<pb::OperatorOutcome, ClusterError> {
        let key = self.keys.outcome(group);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (kv, _) = self.coord.get(&key).await.map_err(engine)?;
            if let Some(kv) = kv {
                let o: RequestOutcome = records::decode(&key, &kv.value)
                    .map_err(|e| ClusterError::Coordinator(e.to_string()))?;
                if o.id == id {
                    return Ok(outcome(group, o));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.timed_out(group, id, timeout).await);
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + OUTCOME_POLL))
                .await;
        }
    }

    /// The answer when no outcome came in time: the request may still be pending, or gone
    /// without an outcome (deleted by hand).
    async fn timed_out(&self, group: &str, id: &str, timeout: Duration) -> ClusterError {
        let key = self.keys.request(group);
        let still = match self.coord.get(&key).await {
            Ok((Some(kv), _)) => {
                records::decode::<OperatorRequest>(&key, &kv.value).is_ok_and(|r| r.id == id)
            }
            _ => true,
        };
        let what = if still {
            format!(
                "it is still pending (key {key}): the controller may act on it later; watch \
                 `hasync cluster status --group {group}`, or delete the key to withdraw it"
            )
        } else {
            format!("it is no longer pending (key {key} was deleted) and left no outcome")
        };
        ClusterError::Timeout(format!(
            "request {id} of group {group}: no outcome within {}s; {what}",
            timeout.as_secs_f64()
        ))
    }

    /// The group's state record and its mod revision.
    async fn state(&self, group: &str) -> Result<Option<(GroupState, Revision)>, ClusterError> {
        let key = self.keys.state(group);
        let (kv, _) = self.coord.get(&key).await.map_err(engine)?;
        let Some(kv) = kv else { return Ok(None) };
        let s = records::decode(&key, &kv.value)
            .map_err(|e| ClusterError::Coordinator(e.to_string()))?;
        Ok(Some((s, kv.mod_revision)))
    }

    /// Sets the cluster's pause key (present: paused).
    async fn set_cluster_paused(&self, paused: bool) -> Result<pb::PauseState, ClusterError> {
        let key = self.keys.paused();
        let txn = if paused {
            let value = serde_json::json!({ "time_unix_ms": now_ms() }).to_string().into_bytes();
            Txn {
                compares: vec![Compare::absent(&key)],
                success: vec![Op::Put { key: key.clone(), value, lease: None }],
                failure: vec![],
            }
        } else {
            Txn {
                compares: vec![Compare {
                    key: key.clone(),
                    op: CmpOp::NotEqual,
                    target: CmpTarget::CreateRevision(0),
                }],
                success: vec![Op::Delete { key: key.clone() }],
                failure: vec![],
            }
        };
        let resp = self.coord.txn(txn).await.map_err(engine)?;
        tracing::info!(paused, changed = resp.succeeded, "cluster pause switch");
        Ok(pb::PauseState { group: String::new(), paused, changed: resp.succeeded })
    }

    /// Sets a group's `paused` flag by compare-and-swap on its state record, retrying a lost
    /// race a bounded number of times. Only that field changes: the record is patched as
    /// JSON, so fields this build does not know survive.
    async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> Result<pb::PauseState, ClusterError> {
        let key = self.keys.state(group);
        for _ in 0..PAUSE_ATTEMPTS {
            let (kv, _) = self.coord.get(&key).await.map_err(engine)?;
            let kv = kv.ok_or_else(|| not_found(group, &self.keys))?;
            let state: GroupState = records::decode(&key, &kv.value)
                .map_err(|e| ClusterError::Coordinator(e.to_string()))?;
            if state.paused == paused {
                return Ok(pb::PauseState { group: group.to_owned(), paused, changed: false });
            }
            let mut value: serde_json::Value = serde_json::from_slice(&kv.value)
                .map_err(|e| ClusterError::Coordinator(format!("{key}: {e}")))?;
            value["paused"] = serde_json::Value::Bool(paused);
            let txn = Txn::swap(&key, kv.mod_revision, value.to_string().into_bytes());
            if self.coord.txn(txn).await.map_err(engine)?.succeeded {
                tracing::info!(group, paused, "group pause switch");
                return Ok(pb::PauseState { group: group.to_owned(), paused, changed: true });
            }
        }
        Err(ClusterError::Conflict(format!(
            "the state record of group {group} changed under each of {PAUSE_ATTEMPTS} attempts \
             (the controller is busy with it); try again"
        )))
    }

    async fn pause_switch(
        &self,
        group: Option<&str>,
        paused: bool,
    ) -> Result<pb::PauseState, ClusterError> {
        match group {
            None => self.set_cluster_paused(paused).await,
            Some(g) => self.set_group_paused(g, paused).await,
        }
    }
}

/// What an operator asks, as both request kinds carry it.
struct Ask {
    group: String,
    kind: DecisionKind,
    to: Option<String>,
    accept_data_loss: bool,
    timeout_ms: u32,
}

impl ClusterApi for ClusterView {
    fn status<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::ClusterStatus> {
        Box::pin(self.cluster_status(group))
    }

    fn history<'a>(
        &'a self,
        group: &'a str,
        limit: usize,
    ) -> ClusterFuture<'a, pb::GetHistoryResponse> {
        Box::pin(self.group_history(group, limit))
    }

    fn switchover(&self, r: pb::SwitchoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome> {
        let to = Some(r.to.trim().to_owned()).filter(|t| !t.is_empty());
        let ask = Ask {
            group: r.group,
            kind: DecisionKind::Switchover,
            to,
            accept_data_loss: false,
            timeout_ms: r.timeout_ms,
        };
        Box::pin(self.request(ask))
    }

    fn failover(&self, r: pb::FailoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome> {
        Box::pin(async move {
            if !r.accept_data_loss {
                return Err(ClusterError::InvalidArgument(
                    "a manual failover may lose what only unreachable members hold: it needs \
                     accept_data_loss (--accept-data-loss); for a zero-loss change use a \
                     switchover"
                        .into(),
                ));
            }
            let to = r.to.trim();
            if to.is_empty() {
                return Err(ClusterError::InvalidArgument(
                    "a manual failover needs its target: to (--to NODE)".into(),
                ));
            }
            let ask = Ask {
                group: r.group,
                kind: DecisionKind::ManualFailover,
                to: Some(to.to_owned()),
                accept_data_loss: true,
                timeout_ms: r.timeout_ms,
            };
            self.request(ask).await
        })
    }

    fn pause<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState> {
        Box::pin(self.pause_switch(group, true))
    }

    fn resume<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState> {
        Box::pin(self.pause_switch(group, false))
    }

    fn change_group(&self, r: pb::ChangeGroupRequest) -> ClusterFuture<'_, pb::ChangeGroupOutcome> {
        Box::pin(self.change(r))
    }

    fn watch_topology(
        &self,
        r: pb::WatchTopologyRequest,
    ) -> ClusterFuture<'_, crate::control::cluster::TopologyStream> {
        Box::pin(async move {
            let sample = crate::control::cluster::topology_sample_interval(r.sample_interval_ms)
                .map_err(ClusterError::InvalidArgument)?;
            if r.from_revision < 0 {
                return Err(ClusterError::InvalidArgument(format!(
                    "from_revision {} is negative (0: start with a snapshot)",
                    r.from_revision
                )));
            }
            Ok(topology::start(self, r.from_revision, sample))
        })
    }

    fn remove_group<'a>(&'a self, group: &'a str) -> ClusterFuture<'a, pb::RemoveGroupResponse> {
        Box::pin(self.remove(group))
    }
}

fn not_found(group: &str, keys: &Keys) -> ClusterError {
    ClusterError::NotFound(format!(
        "group {group} has no records under {} (not a group of this cluster, or not bootstrapped \
         yet)",
        keys.groups()
    ))
}

/// The refusal of a request while another one is pending, naming it.
fn pending(group: &str, key: &str, kv: Option<&KeyValue>) -> ClusterError {
    let what = match kv.map(|kv| records::decode::<OperatorRequest>(key, &kv.value)) {
        Some(Ok(r)) => format!(
            "request {} ({} to {}, made {}s ago)",
            r.id,
            kind_name(r.kind),
            r.to.as_deref().unwrap_or("the controller's pick"),
            (now_ms() - r.time_unix_ms).max(0) / 1000
        ),
        _ => "a request".to_owned(),
    };
    ClusterError::FailedPrecondition(format!(
        "group {group} has {what} pending (key {key}): wait for its outcome, or delete the key \
         to withdraw it"
    ))
}

/// `to` must be a voter of the group and not its master already.
fn check_target(group: &str, state: &GroupState, to: &str) -> Result<(), ClusterError> {
    if !state.is_voter(to) {
        let voters: Vec<&str> = state.voters.iter().map(|v| v.name.as_str()).collect();
        return Err(ClusterError::InvalidArgument(format!(
            "--to {to} is not a voter of group {group} (voters: {})",
            voters.join(", ")
        )));
    }
    if state.master.as_deref() == Some(to) {
        return Err(ClusterError::InvalidArgument(format!(
            "--to {to} is already the master of group {group} (epoch {})",
            state.epoch
        )));
    }
    Ok(())
}

/// The bound of a request's wait: 0 is the default, and no more than the maximum.
fn request_timeout(ms: u32) -> Duration {
    if ms == 0 {
        REQUEST_TIMEOUT_DEFAULT
    } else {
        Duration::from_millis(u64::from(ms)).min(REQUEST_TIMEOUT_MAX)
    }
}

/// Why the controller could not fail `state`'s group over now, if its master were gone; None
/// when it could. `live` are the members with a live record. In order: paused (the cluster or
/// the group), k = 0, fewer than |V| - k voters other than the master live (they could not be
/// fenced), every most complete of them (last record epoch, then max offset) never-promote,
/// then whatever the state record itself says is blocked.
pub fn blocked_reason<'a>(
    state: &GroupState,
    live: impl IntoIterator<Item = &'a MemberRecord>,
    cluster_paused: bool,
) -> Option<String> {
    if cluster_paused || state.paused {
        return Some(reason::PAUSED.into());
    }
    if state.k == 0 {
        return Some(reason::SYNC_DEGRADED.into());
    }
    let master = state.master.as_deref();
    // A live record counts as a voter only with the data-dir id the voter claimed.
    let candidates: Vec<&MemberRecord> = live
        .into_iter()
        .filter(|m| Some(m.name.as_str()) != master)
        .filter(|m| state.voter(&m.name).is_some_and(|v| v.data_dir_id == m.data_dir_id))
        .collect();
    let needed = state.voters.len().saturating_sub(state.k as usize).max(1);
    if candidates.len() < needed {
        return Some(reason::TOO_FEW_FENCED.into());
    }
    let best = candidates.iter().map(|m| (m.last_record_epoch, m.max_offset)).max();
    let promotable = candidates
        .iter()
        .filter(|m| Some((m.last_record_epoch, m.max_offset)) == best)
        .any(|m| !m.never_promote);
    if !promotable {
        return Some(reason::BEST_CANDIDATE_NOT_PROMOTABLE.into());
    }
    state.blocked_reason.clone()
}

/// One group's status from its records at `now_unix_ms`.
/// A group's status from its records, with its `recent` newest decisions.
fn group_status(
    name: &str,
    recs: &GroupRecords,
    now_unix_ms: i64,
    cluster_paused: bool,
    recent: usize,
) -> pb::GroupStatus {
    let state = recs.state.as_ref().map(|(s, _)| s);
    let master = state.and_then(|s| s.master.clone());
    let master_record = master.as_ref().and_then(|m| recs.members.get(m));
    let master_offset = master_record.map(|r| r.max_offset as i64);
    let replicas = master_record.map(|r| r.replicas.as_slice());
    let mut names: Vec<&str> = recs.members.keys().map(String::as_str).collect();
    if let Some(s) = state {
        names.extend(s.voters.iter().map(|v| v.name.as_str()));
    }
    names.sort_unstable();
    names.dedup();
    let members = names
        .into_iter()
        .map(|n| {
            let voter = state.is_some_and(|s| s.is_voter(n));
            match recs.members.get(n) {
                Some(r) => member(r, voter, master_offset, replicas, now_unix_ms),
                None => pb::ClusterMember { name: n.to_owned(), voter, ..Default::default() },
            }
        })
        .collect();
    let blocked = match state {
        Some(s) => blocked_reason(s, recs.members.values(), cluster_paused),
        None => Some(reason::NOT_BOOTSTRAPPED.into()),
    };
    let mut g = pb::GroupStatus {
        group: name.to_owned(),
        bootstrapped: state.is_some(),
        master,
        members,
        leader: recs.leader.as_ref().map(|l| l.name.clone()),
        leader_epoch: recs.leader.as_ref().map_or(0, |l| l.epoch),
        failover_possible: blocked.is_none(),
        blocked_reason: blocked,
        pending_request: recs.request.as_ref().map(|r| pb::PendingRequest {
            id: r.id.clone(),
            kind: decision_kind(r.kind) as i32,
            to: r.to.clone().unwrap_or_default(),
            time_unix_ms: r.time_unix_ms,
        }),
        recent_decisions: recs
            .history
            .values()
            .rev()
            .take(recent)
            .map(|h| history_entry(h.clone()))
            .collect(),
        ..Default::default()
    };
    if let Some(s) = state {
        g.epoch = s.epoch;
        g.phase = phase(s.phase) as i32;
        g.voters = s.voters.iter().map(|v| v.name.clone()).collect();
        g.k = s.k;
        g.mode = mode(s.mode) as i32;
        g.paused = s.paused;
        g.last_decision = s.last_decision.clone();
        g.last_controller = s.controller.clone();
        g.confirm_offset = s.confirm_offset as i64;
        g.chosen = s.chosen.clone();
    }
    g
}

/// A member's status; `replicas` is the master's view of its slaves (None: no live master
/// record).
fn member(
    r: &MemberRecord,
    voter: bool,
    master_offset: Option<i64>,
    replicas: Option<&[crate::coordinator::records::ReplicaLag]>,
    now_unix_ms: i64,
) -> pb::ClusterMember {
    let seen = replicas
        .filter(|_| r.role == MemberRole::Slave)
        .and_then(|rs| rs.iter().find(|x| !x.name.is_empty() && x.name == r.name));
    pb::ClusterMember {
        readable_end: r.readable_offset as i64,
        in_sync: seen.map(|x| x.in_sync),
        lag_ms: seen.map(|x| x.lag_ms),
        name: r.name.clone(),
        live: true,
        voter,
        role: match r.role {
            MemberRole::Master => pb::Role::Master,
            MemberRole::Slave => pb::Role::Slave,
        } as i32,
        epoch: r.epoch,
        max_offset: r.max_offset as i64,
        lag_bytes: master_offset.map(|m| m - r.max_offset as i64),
        promised_epoch: r.promised_epoch,
        fenced: r.fenced,
        lease_age_ms: (now_unix_ms - r.time_unix_ms).max(0),
        last_record_epoch: r.last_record_epoch,
        confirm_offset: r.confirm_offset as i64,
        never_promote: r.never_promote,
        priority: r.priority,
        advertise_grpc: r.advertise_grpc.clone(),
        advertise_ha: r.advertise_ha.clone(),
        following: r.following.clone(),
        master_frame_age_ms: r.master_frame_age_ms,
        data_dir_id: r.data_dir_id.clone(),
    }
}

fn history_entry(h: HistoryRecord) -> pb::HistoryEntry {
    pb::HistoryEntry {
        epoch: h.epoch,
        token: h.token,
        kind: decision_kind(h.kind) as i32,
        old_master: h.old_master,
        new_master: h.new_master,
        candidates: h
            .candidates
            .into_iter()
            .map(|c| pb::HistoryCandidate {
                name: c.name,
                fenced: c.fenced,
                epoch: c.epoch,
                last_record_epoch: c.last_record_epoch,
                end_offset: c.end_offset as i64,
                chosen: c.chosen,
                why: c.why,
            })
            .collect(),
        rule: h.rule,
        fencing: h.fencing,
        blocked_reason: h.blocked_reason,
        loss_bound_bytes: h.loss_bound_bytes.map(|b| b as i64),
        revision: h.revision,
        controller: h.controller,
        time_unix_ms: h.time_unix_ms,
    }
}

fn outcome(group: &str, o: RequestOutcome) -> pb::OperatorOutcome {
    pb::OperatorOutcome {
        id: o.id,
        group: group.to_owned(),
        done: o.done,
        master: o.master,
        epoch: o.epoch,
        refusal: o.refusal,
        write_pause_ms: o.write_pause_ms,
        loss_bound_bytes: o.loss_bound_bytes.map(|b| b as i64),
        time_unix_ms: o.time_unix_ms,
    }
}

fn phase(p: Phase) -> pb::GroupPhase {
    match p {
        Phase::Stable => pb::GroupPhase::Stable,
        Phase::Fencing => pb::GroupPhase::Fencing,
        Phase::Promoting => pb::GroupPhase::Promoting,
    }
}

fn mode(m: Mode) -> pb::ReplicationMode {
    match m {
        Mode::Sync => pb::ReplicationMode::Sync,
        Mode::Async => pb::ReplicationMode::Async,
    }
}

fn decision_kind(k: DecisionKind) -> pb::DecisionKind {
    match k {
        DecisionKind::Bootstrap => pb::DecisionKind::Bootstrap,
        DecisionKind::Failover => pb::DecisionKind::Failover,
        DecisionKind::Switchover => pb::DecisionKind::Switchover,
        DecisionKind::ManualFailover => pb::DecisionKind::ManualFailover,
    }
}

/// The record's spelling of a decision kind (as `etcdctl get` shows it).
fn kind_name(k: DecisionKind) -> &'static str {
    match k {
        DecisionKind::Bootstrap => "bootstrap",
        DecisionKind::Failover => "failover",
        DecisionKind::Switchover => "switchover",
        DecisionKind::ManualFailover => "manual_failover",
    }
}

#[cfg(test)]
#[path = "cluster_api_tests.rs"]
mod tests;
