//! The two controllers of the model: each reads the state and the member records at some
//! revision and acts on that view later, step by step, through the real rules
//! ([`check_failover`], [`fencing_state`], [`choose`]), with a compare-and-swap on the revision
//! it read; the nodes check every Fence and ChangeRole against their own read of the state.

use super::super::*;
use super::Applied;
use super::Model;
use super::Variant;
use super::Violation;

#[derive(Debug, Clone)]
pub(super) enum Ctrl {
    Idle,
    Read { revision: i64, state: GroupState, members: Vec<MemberRecord> },
    Fencing { revision: i64, state: GroupState, next: usize, replies: Vec<FenceReply> },
    Promoting { revision: i64, state: GroupState, chosen: String },
}

/// The failover settings of the model: no pacing (failovers as often as the pre-vote lets
/// them), no ASYNC failover (it may lose PUT_OK records by design). A record says "hears the
/// master" as of the controller's read, which may be many steps (100 ms each) old.
const POLICY: FailoverPolicy = FailoverPolicy {
    prevote_frame_age_ms_max: 60_000,
    hold_down_ms: 0,
    failovers_per_minute_max: 0,
    concurrent_failovers_max: 0,
    async_failover: false,
    async_lag_bytes_max: 0,
    async_lag_ms_max: 0,
    lease_ttl_ms: 1_000,
};

impl Model {
    fn member_records(&self) -> Vec<MemberRecord> {
        (0..self.nodes.len()).filter(|&i| self.alive(i)).map(|i| self.member_record(i)).collect()
    }

    fn member_record(&self, i: usize) -> MemberRecord {
        let n = &self.nodes[i];
        let hears = n.following.is_some_and(|m| {
            self.state.master.as_deref() == Some(self.nodes[m].name.as_str())
                && self.serving_master(m)
                && self.linked(i, m)
                && !n.fenced()
        });
        let master = n.role == MemberRole::Master;
        MemberRecord {
            name: n.name.clone(),
            data_dir_id: n.dir.clone(),
            role: n.role,
            epoch: n.role_epoch,
            promised_epoch: n.promised,
            last_record_epoch: n.log.last().map_or(0, |r| r.0),
            max_offset: n.log.len() as u64,
            confirm_offset: n.confirm as u64,
            fenced: n.fenced(),
            master_frame_age_ms: (hears && !master).then_some(0),
            following: String::new(),
            mode: master.then_some(n.applied.mode),
            k: n.applied.k,
            advertise_ha: String::new(),
            advertise_grpc: String::new(),
            never_promote: n.never_promote,
            priority: n.priority,
            truncated_bytes: 0,
            readable_offset: 0,
            replicas: Vec::new(),
            time_unix_ms: self.now_unix_ms,
        }
    }

    fn context(&self) -> DecisionContext<'static> {
        DecisionContext {
            now_unix_ms: self.now_unix_ms,
            group_last_failover_unix_ms: None,
            group_failovers_unix_ms: &[],
            decisions_running: 0,
            master_write_bytes_per_s: 0,
            master_last_report: None,
        }
    }

    pub(super) fn controller_step(&mut self, c: usize, x: u8) -> Result<(), Violation> {
        let (fence_lost, fence_all, take_over) =
            (x.is_multiple_of(8), x.is_multiple_of(2), x.is_multiple_of(3));
        let ctrl = std::mem::replace(&mut self.controllers[c], Ctrl::Idle);
        self.controllers[c] = match ctrl {
            Ctrl::Idle => Ctrl::Read {
                revision: self.revision,
                state: self.state.clone(),
                members: self.member_records(),
            },
            Ctrl::Read { state, .. }
                if state.phase != Phase::Stable
                    && !state.token.starts_with(&format!("c{c}-"))
                    && !take_over =>
            {
                Ctrl::Idle
            }
            Ctrl::Read { revision, state, members } => self.allocate(c, revision, state, members),
            Ctrl::Fencing { revision, state, next, mut replies } if next < state.voters.len() => {
                let last = if fence_all { state.voters.len() } else { next + 1 };
                for (at, voter) in state.voters.iter().enumerate().take(last).skip(next) {
                    let lost = fence_lost && at == next;
                    let reachable =
                        self.index(&voter.name).filter(|&i| self.controller_links[c][i]);
                    if let Some(reply) =
                        reachable.filter(|_| !lost).and_then(|i| self.fence(i, &state))
                    {
                        replies.push(reply);
                    }
                }
                Ctrl::Fencing { revision, state, next: last, replies }
            }
            Ctrl::Fencing { revision, state, replies, .. } => {
                self.decide(revision, state, &replies)?
            }
            Ctrl::Promoting { revision, state, chosen } => {
                self.promote(c, revision, &state, &chosen)?;
                Ctrl::Idle
            }
        };
        Ok(())
    }

    /// Pre-checks on the controller's (maybe stale) view, then CAS epoch e+1 against the
    /// revision it read.
    fn allocate(
        &mut self,
        c: usize,
        revision: i64,
        state: GroupState,
        members: Vec<MemberRecord>,
    ) -> Ctrl {
        if let Err(b) = check_failover(Some(&state), &members, &POLICY, &self.context()) {
            self.stats.count_blocked(b.reason);
            return Ctrl::Idle;
        }
        self.stats.allocations += 1;
        self.tokens += 1;
        let token = format!("c{c}-{}", self.tokens);
        let stamp = Stamp { token: &token, controller: "c", now_unix_ms: self.now_unix_ms };
        let next = fencing_state(&state, &members, stamp);
        if self.revision != revision {
            return Ctrl::Idle;
        }
        assert!(next.epoch > self.state.epoch, "epochs increase");
        self.state = next.clone();
        self.revision += 1;
        Ctrl::Fencing { revision: self.revision, state: next, next: 0, replies: Vec::new() }
    }

    /// The node checks Fence(e, token) against its read of the state, then promises e.
    fn fence(&mut self, i: usize, st: &GroupState) -> Option<FenceReply> {
        let matches = self.state.epoch == st.epoch && self.state.token == st.token;
        let node = &mut self.nodes[i];
        let fresh = node.promised < st.epoch
            || (node.promised == st.epoch && node.promised_token == st.token);
        if !(matches && fresh && node.up && !node.paused) {
            return None;
        }
        node.promised = st.epoch;
        node.promised_token = st.token.clone();
        node.pending.clear();
        Some(FenceReply {
            name: node.name.clone(),
            data_dir_id: node.dir.clone(),
            promised_epoch: st.epoch,
            epoch: node.role_epoch,
            last_record_epoch: node.log.last().map_or(0, |r| r.0),
            end_offset: node.log.len() as u64,
            never_promote: node.never_promote,
            priority: node.priority,
        })
    }

    /// `choose` (or a broken variant of it), then CAS the choice.
    fn decide(
        &mut self,
        revision: i64,
        state: GroupState,
        replies: &[FenceReply],
    ) -> Result<Ctrl, Violation> {
        let ctx = self.context();
        let outcome = match self.variant {
            Variant::FenceOneShort => {
                let looser = GroupState { k: state.k + 1, ..state.clone() };
                choose(&looser, replies, &POLICY, &ctx)
            }
            _ => choose(&state, replies, &POLICY, &ctx),
        };
        let chosen = match outcome {
            Ok(d) if self.variant == Variant::PriorityFirst => replies
                .iter()
                .filter(|r| r.promised_epoch == state.epoch && !r.never_promote)
                .max_by_key(|r| (r.priority, std::cmp::Reverse(r.name.clone())))
                .map_or(d.chosen, |r| r.name.clone()),
            Ok(d) => d.chosen,
            Err(b) if b.reason.is_alarm() && self.variant == Variant::Correct => {
                return Err(Violation::Alarm(b.to_string()));
            }
            Err(b) => {
                self.stats.count_blocked(b.reason);
                return Ok(Ctrl::Idle);
            }
        };
        if self.revision != revision {
            return Ok(Ctrl::Idle);
        }
        self.state.phase = Phase::Promoting;
        self.state.chosen = Some(chosen.clone());
        self.revision += 1;
        Ok(Ctrl::Promoting { revision: self.revision, state: self.state.clone(), chosen })
    }

    /// ChangeRole(e, token) to the chosen: it checks the state, becomes master, and the
    /// controller CASes the state to Stable.
    fn promote(
        &mut self,
        c: usize,
        revision: i64,
        st: &GroupState,
        chosen: &str,
    ) -> Result<(), Violation> {
        let Some(i) = self.index(chosen).filter(|&i| self.controller_links[c][i] && self.alive(i))
        else {
            return Ok(());
        };
        let cur = &self.state;
        let state_ok = cur.epoch == st.epoch
            && cur.token == st.token
            && cur.phase == Phase::Promoting
            && cur.chosen.as_deref() == Some(chosen);
        let node = &self.nodes[i];
        if !(state_ok && node.promised == st.epoch && node.promised_token == st.token) {
            return Ok(());
        }
        let twice =
            self.nodes.iter().any(|n| n.role == MemberRole::Master && n.role_epoch == st.epoch);
        if twice {
            return Err(Violation::TwoMastersInEpoch { epoch: st.epoch });
        }
        if let Some(&(_, record)) =
            self.put_ok.iter().find(|(off, rec)| node.log.get(*off) != Some(rec))
        {
            let node = chosen.to_owned();
            return Err(Violation::PromotedWithoutPutOk { node, epoch: st.epoch, record });
        }
        let applied = Applied::published(cur, chosen);
        let confirm = cur.confirm_offset as usize;
        let node = &mut self.nodes[i];
        node.role = MemberRole::Master;
        node.role_epoch = st.epoch;
        node.following = None;
        node.acks.clear();
        node.pending.clear();
        node.applied = applied;
        node.confirm = node.confirm.max(confirm);
        node.epoch_start = node.log.len();
        self.stats.promotions += 1;
        if self.revision == revision {
            self.state.phase = Phase::Stable;
            self.state.master = Some(chosen.to_owned());
            self.revision += 1;
        }
        Ok(())
    }
}
