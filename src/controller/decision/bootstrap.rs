//! Building a state record from the members (the first one, or after an engine restore) and
//! choosing a switchover's target: the rules that start from member records, not from a
//! fenced set.

use std::collections::BTreeMap;

use crate::coordinator::records::GroupState;
use crate::coordinator::records::MemberRecord;
use crate::coordinator::records::MemberRole;
use crate::coordinator::records::Mode;
use crate::coordinator::records::Phase;
use crate::coordinator::records::Voter;

use super::BlockedReason;
use super::Refusal;
use super::Stamp;
use super::member_epoch;
use super::record_of;

/// k and the mode a state record starts with when no master reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleDefaults {
    /// Required acks.
    pub k: u32,
    /// SYNC or ASYNC.
    pub mode: Mode,
}

/// The first state record, built from the members (or rebuilt after an engine restore, with
/// the restored record as `previous`): the epoch is the members' maximum (promised epochs
/// included); the master is the one member reporting role master at that epoch (None when
/// none or several do: a failover decides); V is the members, plus the voters of `previous`
/// (a superset of V keeps invariant I); k and the mode come from the master's report (on a
/// rebuild: `previous`'s mode and the lower k of the two), else `previous`, else `defaults`,
/// with k at most |V| - 1. Err: no members.
pub fn bootstrap_state(
    members: &[MemberRecord],
    previous: Option<&GroupState>,
    defaults: RuleDefaults,
    stamp: Stamp<'_>,
) -> Result<GroupState, BlockedReason> {
    let epoch = members.iter().map(member_epoch).max().ok_or(BlockedReason::NoVotersReachable)?;
    let epoch = epoch.max(previous.map_or(0, |p| p.epoch));
    let masters: Vec<&MemberRecord> =
        members.iter().filter(|m| m.role == MemberRole::Master && m.epoch == epoch).collect();
    let master = match masters.as_slice() {
        [one] => Some(*one),
        _ => None,
    };
    let mut voters: BTreeMap<&str, Voter> = BTreeMap::new();
    for v in previous.map_or(&[][..], |p| &p.voters[..]) {
        voters.insert(&v.name, v.clone());
    }
    for m in members {
        let voter = Voter { name: m.name.clone(), data_dir_id: m.data_dir_id.clone() };
        voters.insert(&m.name, voter);
    }
    let voters: Vec<Voter> = voters.into_values().collect();
    let (k, mode) = match (master.and_then(|m| m.mode.map(|mode| (m.k, mode))), previous) {
        // A rebuild: the group's mode, and the lower of the k published and the one the
        // master runs. What a master runs may be more than the acks behind every PUT_OK (a
        // raise that did not publish yet, a strict group's aim), or less in name only (a
        // degraded master runs ASYNC): claiming more than was published would let a failover
        // fence too few.
        (Some((k, mode)), Some(p)) => {
            let running = if mode == Mode::Async { 0 } else { k };
            (running.min(p.k), p.mode)
        }
        (Some(reported), None) => reported,
        (None, Some(p)) => (p.k, p.mode),
        (None, None) => (defaults.k, defaults.mode),
    };
    // The k the group aims for survives a rebuild; V may not allow it yet (the master raises
    // the published k towards it as members join, by rule B).
    let wanted_k = previous.and_then(|p| p.wanted_k).unwrap_or(k);
    let k = k.min(u32::try_from(voters.len() - 1).unwrap_or(u32::MAX));
    let confirm_offset = members
        .iter()
        .map(|m| m.confirm_offset)
        .chain(previous.map(|p| p.confirm_offset))
        .max()
        .unwrap_or(0);
    let last_decision = match master {
        Some(m) => format!("bootstrap: epoch {epoch} from the members; master {}", m.name),
        None => format!("bootstrap: epoch {epoch} from the members; no single master: failover"),
    };
    Ok(GroupState {
        epoch,
        master: master.map(|m| m.name.clone()),
        voters,
        k,
        mode,
        phase: Phase::Stable,
        token: stamp.token.to_owned(),
        chosen: master.map(|m| m.name.clone()),
        epoch_revision: 0,
        confirm_offset,
        last_decision,
        controller: stamp.controller.to_owned(),
        time_unix_ms: stamp.now_unix_ms,
        paused: previous.is_some_and(|p| p.paused),
        blocked_reason: None,
        kind: None,
        target: None,
        request_id: None,
        wanted_k: Some(wanted_k),
    })
}

/// The target of a zero-loss switchover: the named voter if it may take over, else the most
/// caught-up promotable voter other than the master (by (epoch of last record, max offset),
/// then priority, then name). The switchover itself drains the master until the target acked
/// its max offset, then fences and promotes.
pub fn switchover_target<'a>(
    state: &GroupState,
    members: &'a [MemberRecord],
    to: Option<&str>,
) -> Result<&'a MemberRecord, Refusal> {
    let Some(master) = state.master.as_deref() else {
        return Err(Refusal::NoMaster);
    };
    if state.phase != Phase::Stable {
        return Err(Refusal::DecisionRunning { phase: state.phase });
    }
    if let Some(name) = to {
        let voter = state.voter(name).ok_or_else(|| Refusal::NotAVoter { name: name.into() })?;
        if name == master {
            return Err(Refusal::IsMaster { name: name.into() });
        }
        let record =
            record_of(members, voter).ok_or_else(|| Refusal::NotReachable { name: name.into() })?;
        if record.never_promote {
            return Err(Refusal::NeverPromote { name: name.into() });
        }
        return Ok(record);
    }
    state
        .voters
        .iter()
        .filter(|v| v.name != master)
        .filter_map(|v| record_of(members, v))
        .filter(|m| !m.never_promote)
        .min_by_key(|m| {
            let key = std::cmp::Reverse((m.last_record_epoch, m.max_offset, m.priority));
            (key, &m.name)
        })
        .ok_or(Refusal::NoPromotableVoter)
}
