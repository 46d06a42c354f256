//! The master's executor of rule-B plans in the model: one step per action, interleaved with
//! everything else; a Publish is a compare-and-swap on the revision the plan was made from.

use std::collections::VecDeque;

use super::super::*;
use super::Applied;
use super::ChangeAct;
use super::Model;
use super::Node;
use super::Variant;

#[derive(Debug, Clone)]
pub(super) struct PlanRun {
    pub(super) master: usize,
    epoch: u64,
    revision: i64,
    steps: VecDeque<Step>,
    target: Option<usize>,
    apply_seq: u64,
}

impl Model {
    pub(super) fn start_change(&mut self, kind: ChangeAct, x: u8) {
        let Some(m) = self.legit_master().filter(|_| self.plan.is_none()) else {
            return;
        };
        let Some(published) = Published::from_state(&self.state) else {
            return;
        };
        let outside: Vec<&Node> =
            self.nodes.iter().filter(|n| !self.state.is_voter(&n.name)).collect();
        let inside: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| self.state.is_voter(&n.name) && n.name != published.master)
            .collect();
        let outside = outside.get(x as usize % outside.len().max(1)).copied();
        let inside = inside.get(x as usize % inside.len().max(1)).copied();
        let wanted = match (kind, outside, inside) {
            (ChangeAct::Add, Some(n), _) => {
                Change::AddVoter(Voter { name: n.name.clone(), data_dir_id: n.dir.clone() })
            }
            (ChangeAct::Remove, _, Some(n)) => Change::RemoveVoter(n.name.clone()),
            (ChangeAct::Add | ChangeAct::Remove, _, _) => return,
            (ChangeAct::RaiseK, _, _) => Change::SetK(published.k + 1),
            (ChangeAct::LowerK, _, _) => Change::SetK(published.k.saturating_sub(1)),
            (ChangeAct::ToAsync, _, _) => Change::SetMode(Mode::Async),
            (ChangeAct::ToSync, _, _) => Change::SetMode(Mode::Sync),
        };
        let Ok(mut steps) = plan_change(&published, wanted, self.floor, self.allow_degrade) else {
            return;
        };
        match (self.variant, kind) {
            (Variant::RaiseKPublishFirst, ChangeAct::RaiseK | ChangeAct::ToSync) => {
                if let Some(at) = steps.iter().position(|s| matches!(s, Step::Publish { .. })) {
                    let publish = steps.remove(at);
                    steps.insert(0, publish);
                }
            }
            (Variant::RemoveSkipWait, ChangeAct::Remove) => {
                steps.retain(|s| matches!(s, Step::Publish { .. } | Step::Apply { .. }));
            }
            _ => {}
        }
        let (epoch, revision) = (self.state.epoch, self.revision);
        let steps = steps.into();
        self.plan = Some(PlanRun { master: m, epoch, revision, steps, target: None, apply_seq: 0 });
    }

    /// The plan's master runs its next step; a Publish that fails its CAS ends the plan.
    pub(super) fn change_step(&mut self) {
        let Some(mut plan) = self.plan.take() else {
            return;
        };
        let m = plan.master;
        if !self.alive(m) {
            self.plan = Some(plan);
            return;
        }
        let master = &self.nodes[m];
        if master.role != MemberRole::Master || master.role_epoch != plan.epoch {
            return;
        }
        let step = plan.steps.front().expect("a plan has steps").clone();
        let done = match step {
            Step::Publish { voters, k, mode } => {
                let st = &self.state;
                let cas = self.revision == plan.revision
                    && st.phase == Phase::Stable
                    && st.epoch == plan.epoch
                    && st.master.as_deref() == Some(master.name.as_str());
                if !cas {
                    return;
                }
                (self.state.voters, self.state.k, self.state.mode) = (voters, k, mode);
                self.revision += 1;
                plan.revision = self.revision;
                true
            }
            Step::Apply { counting, k, mode } => {
                let counting = counting.into_iter().map(|v| v.name).collect();
                let node = &mut self.nodes[m];
                node.applied = Applied { counting, k, mode };
                plan.apply_seq = node.admit_seq;
                self.evaluate(m);
                true
            }
            Step::WaitAdmittedUnderOldRule => {
                master.pending.iter().all(|p| p.seq >= plan.apply_seq)
            }
            Step::WaitWatermark { over, k, at_least } => {
                let inherited = match self.variant {
                    Variant::TargetIgnoresInherited => 0,
                    _ => master.epoch_start,
                };
                let target = *plan.target.get_or_insert(match at_least {
                    Target::ConfirmOffset => master.confirm.max(inherited),
                    Target::MaxOffset => master.log.len(),
                });
                let mut acks: Vec<usize> = over
                    .iter()
                    .filter_map(|v| self.index(&v.name))
                    .map(|i| master.acks.get(&i).copied().unwrap_or(0))
                    .collect();
                acks.sort_unstable_by(|a, b| b.cmp(a));
                k == 0 || acks.get(k as usize - 1).is_some_and(|&a| a >= target)
            }
        };
        if done {
            plan.steps.pop_front();
            plan.target = None;
        }
        if plan.steps.is_empty() {
            self.stats.plans_done += 1;
        } else {
            self.plan = Some(plan);
        }
    }

    pub(super) fn publish_confirm(&mut self) {
        let Some(m) = self.legit_master() else {
            return;
        };
        let confirm = self.nodes[m].confirm as u64;
        if confirm > self.state.confirm_offset {
            self.state.confirm_offset = confirm;
            self.revision += 1;
            if let Some(plan) = self.plan.as_mut().filter(|p| p.master == m) {
                plan.revision = self.revision;
            }
        }
    }
}
