//! The JSON records hasync keeps in the engine (see [`super::keys`] for where). Field names
//! are snake_case and stable: operators read them with `etcdctl get`. Unknown fields are
//! ignored on read, so a newer writer does not break an older reader.

use serde::{Deserialize, Serialize};

/// SYNC or ASYNC, as the state record publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// PUT_OK after k member acks.
    Sync,
    /// PUT_OK once stored on the master.
    Async,
}

/// Where a group's current decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// A master serves the epoch; no decision is running.
    Stable,
    /// Epoch e+1 is allocated; the controller fences the voters.
    Fencing,
    /// The new master is chosen (`chosen`); the controller sends the role changes.
    Promoting,
}

/// A voting member: its name and the data-dir id it claimed the name with.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Voter {
    /// `node.name`.
    pub name: String,
    /// The member's persisted data-dir id.
    pub data_dir_id: String,
}

/// A group's state record: changed only by compare-and-swap on its revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    /// The current epoch (dense: each decision allocates the next one).
    pub epoch: u64,
    /// The master of the epoch (None while none is, e.g. before the first promotion).
    pub master: Option<String>,
    /// The published voting membership V; includes the master.
    pub voters: Vec<Voter>,
    /// Required acks k: members of V other than the master.
    pub k: u32,
    /// SYNC or ASYNC.
    pub mode: Mode,
    /// Where the decision is.
    pub phase: Phase,
    /// The decision token every Fence and ChangeRole of this epoch carries.
    pub token: String,
    /// While promoting (and after): the member chosen as the epoch's master.
    pub chosen: Option<String>,
    /// The revision of the transaction that allocated `epoch` (its fencing token).
    pub epoch_revision: i64,
    /// The highest confirm offset the master published (a promotion below it would be a bug).
    #[serde(default)]
    pub confirm_offset: u64,
    /// What the last decision was, in words (for status).
    #[serde(default)]
    pub last_decision: String,
    /// The controller that made the last change.
    #[serde(default)]
    pub controller: String,
    /// Unix ms of the last change.
    #[serde(default)]
    pub time_unix_ms: i64,
    /// The group's automatic failover is paused.
    #[serde(default)]
    pub paused: bool,
    /// Why the last failover attempt is blocked (a `controller::decision::BlockedReason`
    /// value); None when nothing is blocked.
    #[serde(default)]
    pub blocked_reason: Option<String>,
    /// What opened the running (or last) decision: failover, switchover, manual failover.
    #[serde(default)]
    pub kind: Option<DecisionKind>,
    /// A switchover's or manual failover's requested member (None: the controller picks).
    #[serde(default)]
    pub target: Option<String>,
    /// The operator request the running decision carries out.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The k the group aims for: set when the record is first built (the master's own
    /// `replication.sync-ack-replicas`, which V may not yet allow) and by an operator's
    /// `cluster change --k`. The master raises the published k towards it, at most |V| - 1,
    /// by rule B's raise order once enough voters are in sync; a degrade to 0 leaves it.
    /// None in records written before it existed: the master's configured k stands in.
    #[serde(default)]
    pub wanted_k: Option<u32>,
}

impl GroupState {
    /// A stable state at `epoch`: `master` (also the chosen one), V, k and the mode; no token,
    /// revision, decision or flag set (fixtures and the model start from it).
    pub fn stable(
        epoch: u64,
        master: Option<&str>,
        voters: Vec<Voter>,
        k: u32,
        mode: Mode,
    ) -> Self {
        Self {
            epoch,
            master: master.map(str::to_owned),
            voters,
            k,
            mode,
            phase: Phase::Stable,
            token: String::new(),
            chosen: master.map(str::to_owned),
            epoch_revision: 0,
            confirm_offset: 0,
            last_decision: String::new(),
            controller: String::new(),
            time_unix_ms: 0,
            paused: false,
            blocked_reason: None,
            kind: None,
            target: None,
            request_id: None,
            wanted_k: None,
        }
    }

    /// The voter named `name`.
    pub fn voter(&self, name: &str) -> Option<&Voter> {
        self.voters.iter().find(|v| v.name == name)
    }

    /// Whether `name` is in V.
    pub fn is_voter(&self, name: &str) -> bool {
        self.voter(name).is_some()
    }
}

/// A node's role as its member record reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberRole {
    /// Takes puts.
    Master,
    /// Follows a master.
    Slave,
}

/// A member's record, refreshed every few seconds under the member's own lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// `node.name`.
    pub name: String,
    /// The data-dir id the name is claimed with.
    pub data_dir_id: String,
    /// The node's role.
    pub role: MemberRole,
    /// The node's role epoch.
    pub epoch: u64,
    /// The highest epoch the node promised (Fence); 0 when never fenced.
    #[serde(default)]
    pub promised_epoch: u64,
    /// Epoch of the node's last record.
    pub last_record_epoch: u64,
    /// End of the node's last whole record (its max offset).
    pub max_offset: u64,
    /// The node's confirm offset.
    #[serde(default)]
    pub confirm_offset: u64,
    /// Whether the node refuses puts now (fenced).
    #[serde(default)]
    pub fenced: bool,
    /// A slave's master link: age in ms of the last frame (data or heartbeat) it got from its
    /// master when the record was written; None when it got none (or is master).
    #[serde(default)]
    pub master_frame_age_ms: Option<u64>,
    /// A slave's master (its HA address).
    #[serde(default)]
    pub following: String,
    /// A master's SYNC/ASYNC and k in force.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// A master's k in force.
    #[serde(default)]
    pub k: u32,
    /// The HA address others reach the node at (`node.advertise-ha`).
    pub advertise_ha: String,
    /// The gRPC address others reach the node at (`node.advertise-grpc`).
    pub advertise_grpc: String,
    /// Never promote this member (tags).
    #[serde(default)]
    pub never_promote: bool,
    /// Breaks ties among equally complete candidates: higher first.
    #[serde(default)]
    pub priority: i32,
    /// Bytes truncated from this node's log and kept aside (divergent tails), total.
    #[serde(default)]
    pub truncated_bytes: u64,
    /// Where a read stops by default (the node's readable offset); 0 from an older build.
    #[serde(default)]
    pub readable_offset: u64,
    /// A master's view of its slaves (by node name): in sync, lag in bytes and time. Empty
    /// for a slave.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaLag>,
    /// Unix ms when the record was written.
    pub time_unix_ms: i64,
}

/// One slave as its master sees it (in the master's member record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLag {
    /// The slave's node name (empty: a slave that did not register a name).
    pub name: String,
    /// Its acks are within the SYNC bound.
    pub in_sync: bool,
    /// Bytes its ack trails the master's max offset.
    pub lag_bytes: u64,
    /// How long its ack trails the master's newest record, in ms.
    pub lag_ms: u64,
}

/// Who holds the leader key (the master of an epoch, under its lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The master's name.
    pub name: String,
    /// Its epoch.
    pub epoch: u64,
}

/// One candidate of a decision as the decision saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateReport {
    /// The member.
    pub name: String,
    /// Whether it was fenced at the decision's epoch.
    pub fenced: bool,
    /// Its role epoch when fenced.
    pub epoch: u64,
    /// Epoch of its last record.
    pub last_record_epoch: u64,
    /// End of its last whole record.
    pub end_offset: u64,
    /// Whether it was chosen.
    pub chosen: bool,
    /// Why it was or was not chosen.
    pub why: String,
}

/// What opened an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// The first state record, built from the members.
    Bootstrap,
    /// The master's lease expired.
    Failover,
    /// An operator's zero-loss switchover.
    Switchover,
    /// An operator's `failover --accept-data-loss`.
    ManualFailover,
}

/// The history record of one epoch: the decision that opened it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The epoch.
    pub epoch: u64,
    /// Its decision token.
    pub token: String,
    /// What kind of decision.
    pub kind: DecisionKind,
    /// The master before.
    pub old_master: Option<String>,
    /// The master chosen (None while blocked).
    pub new_master: Option<String>,
    /// Every member of V as the decision saw it.
    pub candidates: Vec<CandidateReport>,
    /// The rule applied, in words.
    pub rule: String,
    /// The fenced set and whether it reached |V| - k.
    pub fencing: String,
    /// A blocked decision's reason (a snake_case value of `controller::BlockedReason`).
    #[serde(default)]
    pub blocked_reason: Option<String>,
    /// A blocked decision's numbers behind the reason, in words (e.g. "1 of 3 voters fenced,
    /// need 2").
    #[serde(default)]
    pub blocked_detail: String,
    /// The bound of possible loss in bytes (ASYNC or a manual override); None: zero loss.
    #[serde(default)]
    pub loss_bound_bytes: Option<u64>,
    /// The revision of the transaction that allocated the epoch.
    pub revision: i64,
    /// The controller that decided.
    pub controller: String,
    /// Unix ms of the decision.
    pub time_unix_ms: i64,
}

/// What an operator asks the controller to do with a group (`<group>/request`, created only
/// when absent; the controller deletes it when done and records the outcome in `outcome`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRequest {
    /// A random id, echoed in the outcome.
    pub id: String,
    /// Switchover (zero loss) or a manual failover (`--accept-data-loss`).
    pub kind: DecisionKind,
    /// The member to promote; None: the controller picks the most caught-up voter.
    pub to: Option<String>,
    /// A manual failover accepts losing what only unreachable members hold.
    #[serde(default)]
    pub accept_data_loss: bool,
    /// Unix ms of the request.
    pub time_unix_ms: i64,
}

/// What became of an operator request (`<group>/outcome`, overwritten by the next one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutcome {
    /// The request's id.
    pub id: String,
    /// Whether it was done.
    pub done: bool,
    /// The new master and epoch when done.
    pub master: Option<String>,
    /// The epoch opened.
    pub epoch: u64,
    /// Why not, when refused (a blocked reason or a sentence).
    pub refusal: Option<String>,
    /// The write pause of a switchover, in ms (from fencing the old master to the new master
    /// taking puts).
    pub write_pause_ms: Option<u64>,
    /// The bound of possible loss of a manual failover, in bytes.
    pub loss_bound_bytes: Option<u64>,
    /// Unix ms of the outcome.
    pub time_unix_ms: i64,
}

/// A change of V, k or the mode an operator asks the group's master to make (rule B,
/// `<group>/change`, created only when absent; the master deletes it when done and records
/// the outcome in `change-outcome`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRequest {
    /// A random id, echoed in the outcome.
    pub id: String,
    /// Remove this member from V (not the master).
    #[serde(default)]
    pub remove_member: Option<String>,
    /// Set k.
    #[serde(default)]
    pub k: Option<u32>,
    /// Set SYNC or ASYNC.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Unix ms of the request.
    pub time_unix_ms: i64,
    /// Unix ms after which the master refuses it as expired (the requester stopped waiting
    /// then): a request left behind while no master ran does not change the group hours
    /// later. None: no expiry.
    #[serde(default)]
    pub expires_unix_ms: Option<i64>,
}

/// What became of a [`ChangeRequest`] (`<group>/change-outcome`, overwritten by the next).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeOutcome {
    /// The request's id.
    pub id: String,
    /// Whether it was done.
    pub done: bool,
    /// Why not, when refused or stopped (nothing more published then).
    pub refusal: Option<String>,
    /// V's names after it.
    pub voters: Vec<String>,
    /// k after it.
    pub k: u32,
    /// The mode after it.
    pub mode: Mode,
    /// Who made it: the master's name.
    pub master: String,
    /// Unix ms of the outcome.
    pub time_unix_ms: i64,
}

/// Encodes a record as the engine stores it.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("records serialize")
}

/// Decodes a record read from `key`, naming the key when it is not one.
pub fn decode<T: for<'de> Deserialize<'de>>(key: &str, value: &[u8]) -> Result<T, super::Error> {
    serde_json::from_slice(value)
        .map_err(|e| super::Error::InvalidValue { key: key.to_owned(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_record_round_trips_and_an_invalid_one_names_its_key() {
        let s = GroupState {
            epoch: 3,
            master: Some("n1".into()),
            voters: vec![Voter { name: "n1".into(), data_dir_id: "a".into() }],
            k: 1,
            mode: Mode::Sync,
            phase: Phase::Stable,
            token: "t".into(),
            chosen: Some("n1".into()),
            epoch_revision: 42,
            confirm_offset: 7,
            last_decision: String::new(),
            controller: "c".into(),
            time_unix_ms: 1,
            paused: false,
            blocked_reason: None,
            kind: None,
            target: None,
            request_id: None,
            wanted_k: Some(2),
        };
        let back: GroupState = decode("k", &encode(&s)).unwrap();
        assert_eq!(back, s);
        let e = decode::<GroupState>("/x/state", b"{").unwrap_err().to_string();
        assert!(e.contains("/x/state"), "{e}");
    }
}
