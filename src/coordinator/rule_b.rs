//! Rule B: changing V, k or the mode outside a failover, as a plan of steps whose order keeps
//! invariant I (every PUT_OK record is on at least k+1 members of the published V) at every
//! point between two steps, whether the plan finishes, stops half-way, or a failover takes
//! over (the failover uses what is published, and the master applies a rule at least as
//! strict as the published one):
//!
//! | change | steps |
//! |---|---|
//! | add x | publish V + x, then count x |
//! | remove x | stop counting x, wait for the puts admitted before, wait until the k-watermark over V \ {x} reaches the confirm offset (at least the epoch's start offset, see [`Target`]), then publish V \ {x} |
//! | lower k, SYNC to ASYNC | publish, then apply |
//! | raise k, ASYNC to SYNC | apply, wait for the puts admitted under the old rule, wait until the new watermark reaches the confirm offset (as for remove; the max offset when the old rule needed no ack), then publish |
//!
//! The executor (the master) runs the steps in order; each Publish is a compare-and-swap on
//! the revision the plan was made from (or that its previous Publish returned), so a plan
//! made from a state that changed since, a failover's included, stops at that step.

use crate::coordinator::records::GroupState;
use crate::coordinator::records::Mode;
use crate::coordinator::records::Voter;

use super::refusal::Refusal;

/// What the state record publishes about a group with a master: V, k and the mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The master (a member of `voters`).
    pub master: String,
    /// V, the master included.
    pub voters: Vec<Voter>,
    /// Required acks from members of V other than the master (in SYNC).
    pub k: u32,
    /// SYNC or ASYNC.
    pub mode: Mode,
}

impl Published {
    /// What `state` publishes; None when it names no master or its master is not in V.
    pub fn from_state(state: &GroupState) -> Option<Self> {
        let master = state.master.clone()?;
        state.is_voter(&master).then(|| Self {
            master,
            voters: state.voters.clone(),
            k: state.k,
            mode: state.mode,
        })
    }

    /// The acks a PUT_OK needs: k in SYNC, none in ASYNC.
    pub fn effective_k(&self) -> u32 {
        effective_k(self.k, self.mode)
    }

    /// The members whose acks count: V without the master.
    pub fn counting(&self) -> Vec<Voter> {
        self.voters.iter().filter(|v| v.name != self.master).cloned().collect()
    }

    /// Members of V other than the master.
    pub fn others(&self) -> u32 {
        u32::try_from(self.voters.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }
}

/// The acks a PUT_OK needs under (k, mode): k in SYNC, none in ASYNC.
pub fn effective_k(k: u32, mode: Mode) -> u32 {
    match mode {
        Mode::Sync => k,
        Mode::Async => 0,
    }
}

/// A change an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Add a member to V.
    AddVoter(Voter),
    /// Remove the member of V with this name (not the master).
    RemoveVoter(String),
    /// Set k.
    SetK(u32),
    /// Set SYNC or ASYNC (k kept).
    SetMode(Mode),
}

/// The offset a watermark wait must reach, read by the executor when the wait begins (after
/// the steps before it are done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The master's confirm offset, and at least the end of its log when its epoch began (the
    /// start offset of its epoch in its history): a promoted master cannot tell which of the
    /// records it inherited were PUT_OK, so it counts them all. Only for these waits; reads
    /// stay capped at the confirm offset itself. (Without the epoch start, removing a voter
    /// or raising k right after a failover publishes at once; the property test found this.)
    ConfirmOffset,
    /// The master's max offset (when the old rule answered PUT_OK without acks).
    MaxOffset,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// CAS the state record to V = `voters`, `k`, `mode`.
    Publish {
        /// V after the step.
        voters: Vec<Voter>,
        /// k after the step.
        k: u32,
        /// The mode after the step.
        mode: Mode,
    },
    /// The master counts acks of `counting` (members of V other than itself) and needs `k` of
    /// them in `mode` for puts admitted from now on.
    Apply {
        /// The members whose acks count.
        counting: Vec<Voter>,
        /// Required acks.
        k: u32,
        /// SYNC or ASYNC.
        mode: Mode,
    },
    /// Wait until the `k`-th highest ack offset among `over` reaches `at_least`.
    WaitWatermark {
        /// The members whose acks count (the master not among them).
        over: Vec<Voter>,
        /// Which ack: the k-th highest.
        k: u32,
        /// The offset to reach.
        at_least: Target,
    },
    /// Wait until every put admitted before the last Apply has completed (PUT_OK, timed out
    /// or failed).
    WaitAdmittedUnderOldRule,
}

/// The steps that change `current` as `wanted` asks, in the order that keeps invariant I; or
/// why not. `floor` is `min-sync-replicas`: no lowering of k below it and no removal that
/// leaves fewer members besides the master; k = 0 in SYNC and SYNC to ASYNC (a degrade) only
/// with `allow_degrade` (and a degraded group cannot fail over automatically until k is
/// raised).
pub fn plan_change(
    current: &Published,
    wanted: Change,
    floor: u32,
    allow_degrade: bool,
) -> Result<Vec<Step>, Refusal> {
    debug_assert!(current.voters.iter().any(|v| v.name == current.master), "master in V");
    let next = next_published(current, &wanted)?;
    check_rule(current, &next, floor, allow_degrade)?;
    let steps = match wanted {
        Change::AddVoter(_) => vec![publish(&next), apply(&next)],
        Change::RemoveVoter(_) => remove_steps(&next),
        Change::SetK(_) | Change::SetMode(_) => rule_steps(current, &next),
    };
    let publishes = steps.iter().filter(|s| matches!(s, Step::Publish { .. })).count();
    debug_assert_eq!(publishes, 1, "a plan publishes once");
    Ok(steps)
}

fn next_published(current: &Published, wanted: &Change) -> Result<Published, Refusal> {
    let mut next = current.clone();
    match wanted {
        Change::AddVoter(x) => {
            if current.voters.iter().any(|v| v.name == x.name) {
                return Err(Refusal::AlreadyAVoter { name: x.name.clone() });
            }
            next.voters.push(x.clone());
        }
        Change::RemoveVoter(name) => {
            if *name == current.master {
                return Err(Refusal::RemovesMaster { name: name.clone() });
            }
            if !current.voters.iter().any(|v| v.name == *name) {
                return Err(Refusal::NotAVoter { name: name.clone() });
            }
            next.voters.retain(|v| v.name != *name);
        }
        Change::SetK(k) if *k == current.k => return Err(Refusal::NoChange),
        Change::SetK(k) => next.k = *k,
        Change::SetMode(mode) if *mode == current.mode => return Err(Refusal::NoChange),
        Change::SetMode(mode) => next.mode = *mode,
    }
    Ok(next)
}

/// Refuses a result that no put could meet, that goes below the floor, or that degrades
/// where the group does not allow it.
fn check_rule(
    current: &Published,
    next: &Published,
    floor: u32,
    allow_degrade: bool,
) -> Result<(), Refusal> {
    let others = next.others();
    if next.k > others {
        return Err(Refusal::KAboveOthers { k: next.k, others });
    }
    if next.voters.len() < current.voters.len() && others < floor {
        return Err(Refusal::VotersBelowFloor { others, floor });
    }
    if next.k < current.k && next.k > 0 && next.k < floor {
        return Err(Refusal::BelowFloor { k: next.k, floor });
    }
    let degraded = |p: &Published| p.mode == Mode::Sync && p.k == 0;
    let to_async = current.mode == Mode::Sync && next.mode == Mode::Async;
    let degrades = to_async || (degraded(next) && !degraded(current));
    if degrades && !allow_degrade {
        return Err(Refusal::DegradeNotAllowed);
    }
    Ok(())
}

fn publish(next: &Published) -> Step {
    Step::Publish { voters: next.voters.clone(), k: next.k, mode: next.mode }
}

fn apply(next: &Published) -> Step {
    Step::Apply { counting: next.counting(), k: next.k, mode: next.mode }
}

/// Remove x: stop counting it first; publish only once the members left hold, k of them,
/// everything confirmed while x still counted.
fn remove_steps(next: &Published) -> Vec<Step> {
    let mut steps = vec![apply(next), Step::WaitAdmittedUnderOldRule];
    let k = next.effective_k();
    if k > 0 {
        let over = next.counting();
        steps.push(Step::WaitWatermark { over, k, at_least: Target::ConfirmOffset });
    }
    steps.push(publish(next));
    steps
}

/// k or the mode: a stricter rule is applied, caught up and then published; a weaker one is
/// published and then applied.
fn rule_steps(current: &Published, next: &Published) -> Vec<Step> {
    let (old_k, new_k) = (current.effective_k(), next.effective_k());
    if new_k <= old_k {
        return vec![publish(next), apply(next)];
    }
    let at_least = if old_k == 0 { Target::MaxOffset } else { Target::ConfirmOffset };
    vec![
        apply(next),
        Step::WaitAdmittedUnderOldRule,
        Step::WaitWatermark { over: next.counting(), k: new_k, at_least },
        publish(next),
    ]
}

#[cfg(test)]
mod tests;
