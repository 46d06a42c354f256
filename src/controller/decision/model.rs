//! A simulated group for the property test in `model_tests`: 3-5 members, each with a log of
//! (epoch, record id) records (record i ends at offset i + 1), a role, a role epoch and a
//! promised epoch; a master that appends and answers PUT_OK by rule A (k acks, counted at the
//! moment, from members of its *applied* V other than itself; k and the mode are the ones the
//! put was admitted under, as `ha::group_transfer` does); slaves that ack only a master they
//! follow at its epoch and not below their promise; the state record with a revision for
//! compare-and-swap; a plan of rule B run step by step by the master, interleaved with
//! everything else; two controllers that read the state at some revision and act on that view
//! later, deciding with [`super::check_failover`] and [`super::choose`]; crashes (nothing
//! received is lost: acks mean "received", no power loss), pauses and partitions.
//!
//! [`Model::step`] runs one action and then checks: invariant I (every PUT_OK record is on at
//! least k+1 members of the published V, at its offset) and, at each promotion, that the new
//! master holds every PUT_OK record and is the only master of its epoch; with the correct rule
//! the confirm-offset alarm must never fire. [`Variant`] breaks the rule on purpose.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use super::*;

mod controllers;
mod plans;

use controllers::Ctrl;
use plans::PlanRun;

/// A record: (epoch, id). Ids are unique, so equal records are the same write.
pub(super) type Rec = (u64, u64);

/// The rule the model runs: the real one, or one deliberately broken (negative controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The rules as `decision` implements them.
    Correct,
    /// A failover fences only |V| - k - 1 members.
    FenceOneShort,
    /// A failover promotes the fenced member with the highest priority, not the maximum.
    PriorityFirst,
    /// Raising k (or ASYNC to SYNC) publishes first.
    RaiseKPublishFirst,
    /// Removing a voter publishes without waiting for the watermark.
    RemoveSkipWait,
    /// The confirm-offset target of a plan's wait ignores the records the master inherited
    /// at its promotion (only the confirm offset it knew).
    TargetIgnoresInherited,
}

/// The group a case starts from.
#[derive(Debug, Clone)]
pub(super) struct Setup {
    /// Members (3-5); member 0 is the master at epoch 1.
    pub members: usize,
    /// V is members 0..voters (2..=members); the others may be added.
    pub voters: usize,
    /// 1..=voters-1.
    pub k: u32,
    /// min-sync-replicas for plans.
    pub floor: u32,
    /// Whether plans may degrade to k = 0 or ASYNC.
    pub allow_degrade: bool,
    /// Per member.
    pub priorities: Vec<i32>,
    /// Per member.
    pub never_promote: Vec<bool>,
}

/// One action. A node number below 128 means the master the state names (for Put, Crash,
/// Pause and Isolate) or the first node down or paused (Restart, Resume), if there is one;
/// any other is taken modulo the number of members.
#[derive(Debug, Clone, Copy)]
pub(super) enum Act {
    /// The node, if a serving master, appends a record and admits the put.
    Put(u8),
    /// The slave receives up to 1 + (b % 3) records from the master it follows, and acks.
    Replicate(u8, u8),
    /// Every slave replicates as in `Replicate`.
    ReplicateAll(u8),
    /// The node reads the state and follows its master (truncating what that master lacks).
    Rejoin(u8),
    /// Every node rejoins as in `Rejoin`.
    RejoinAll,
    /// The master's waiting puts time out (not PUT_OK).
    TimeOut(u8),
    /// The node crashes: its memory (acks, waiters, plan) is lost, its log and promise kept.
    Crash(u8),
    /// The node comes back.
    Restart(u8),
    /// The node stops taking any action.
    Pause(u8),
    /// The node goes on.
    Resume(u8),
    /// The link between two nodes breaks.
    Cut(u8, u8),
    /// The link between two nodes heals.
    Heal(u8, u8),
    /// The node is cut from every node and both controllers.
    Isolate(u8),
    /// Every link heals.
    HealAll,
    /// A controller loses the link to a node.
    CutController(u8, u8),
    /// A controller takes its next step (read, allocate, fence one, choose, promote). With the
    /// second number x: a Fence call times out when x % 8 == 0; a decision of the other
    /// controller still running is taken over (a newer epoch) only when x % 4 == 0.
    Controller(u8, u8),
    /// A controller restarts, dropping its decision in flight.
    ControllerRestart(u8),
    /// The master plans a change of V, k or the mode (rule B).
    Change(ChangeAct, u8),
    /// The master runs the next step of its plan.
    ChangeStep,
    /// The master publishes its confirm offset into the state record.
    PublishConfirm,
}

/// The kind of a rule-B change; the number of [`Act::Change`] picks the member added (among
/// those outside V) or removed (among V without the master).
#[derive(Debug, Clone, Copy)]
pub(super) enum ChangeAct {
    Add,
    Remove,
    RaiseK,
    LowerK,
    ToAsync,
    ToSync,
}

/// What the checker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Violation {
    /// A PUT_OK record on fewer than k+1 members of the published V.
    InvariantI { record: Rec, offset: usize, holders: usize, needed: usize },
    /// A promoted master lacks a PUT_OK record.
    PromotedWithoutPutOk { node: String, epoch: u64, record: Rec },
    /// Two masters in one epoch.
    TwoMastersInEpoch { epoch: u64 },
    /// The correct rule hit the confirm-offset alarm.
    Alarm(String),
}

/// What a case did, to show the test is not vacuous.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stats {
    /// PUT_OK answers.
    pub put_oks: usize,
    /// Successful ChangeRole calls to master.
    pub promotions: usize,
    /// Plans of rule B run to their end.
    pub plans_done: usize,
    /// Epochs allocated by a controller.
    pub allocations: usize,
    /// Blocked decisions, by [`BlockedReason::ALL`] index.
    pub blocked: [usize; BlockedReason::ALL.len()],
}

impl Stats {
    /// The sum of two.
    pub(super) fn add(self, other: Stats) -> Stats {
        let mut blocked = self.blocked;
        for (sum, b) in blocked.iter_mut().zip(other.blocked) {
            *sum += b;
        }
        Stats {
            put_oks: self.put_oks + other.put_oks,
            promotions: self.promotions + other.promotions,
            plans_done: self.plans_done + other.plans_done,
            allocations: self.allocations + other.allocations,
            blocked,
        }
    }

    /// How often `reason` blocked a decision.
    pub(super) fn blocked_by(&self, reason: BlockedReason) -> usize {
        BlockedReason::ALL.iter().position(|&r| r == reason).map_or(0, |at| self.blocked[at])
    }

    fn count_blocked(&mut self, reason: BlockedReason) {
        if let Some(at) = BlockedReason::ALL.iter().position(|&r| r == reason) {
            self.blocked[at] += 1;
        }
    }
}

#[derive(Debug, Clone)]
struct Applied {
    counting: BTreeSet<String>,
    k: u32,
    mode: Mode,
}

impl Applied {
    fn published(state: &GroupState, me: &str) -> Self {
        let counting = state.voters.iter().map(|v| v.name.clone()).filter(|n| n != me).collect();
        Self { counting, k: state.k, mode: state.mode }
    }
}

#[derive(Debug, Clone)]
struct Pending {
    offset: usize,
    rec: Rec,
    k: u32,
    seq: u64,
}

#[derive(Debug, Clone)]
struct Node {
    name: String,
    dir: String,
    priority: i32,
    never_promote: bool,
    up: bool,
    paused: bool,
    log: Vec<Rec>,
    role: MemberRole,
    role_epoch: u64,
    promised: u64,
    promised_token: String,
    following: Option<usize>,
    // A master's memory (lost in a crash).
    acks: BTreeMap<usize, usize>,
    pending: Vec<Pending>,
    applied: Applied,
    confirm: usize,
    /// The end of the log when the node's epoch as master began.
    epoch_start: usize,
    admit_seq: u64,
}

impl Node {
    fn fenced(&self) -> bool {
        self.promised > self.role_epoch
    }
}

/// The simulated group.
pub(super) struct Model {
    variant: Variant,
    floor: u32,
    allow_degrade: bool,
    nodes: Vec<Node>,
    links: Vec<Vec<bool>>,
    controller_links: [Vec<bool>; 2],
    state: GroupState,
    revision: i64,
    controllers: [Ctrl; 2],
    plan: Option<PlanRun>,
    put_ok: Vec<(usize, Rec)>,
    next_id: u64,
    now_unix_ms: i64,
    tokens: u64,
    pub(super) stats: Stats,
}

impl Model {
    /// Member 0 masters epoch 1; every member follows it.
    pub(super) fn new(setup: &Setup, variant: Variant) -> Self {
        let n = setup.members;
        let voters: Vec<Voter> = (0..setup.voters)
            .map(|i| Voter { name: format!("n{i}"), data_dir_id: format!("d{i}") })
            .collect();
        let state = GroupState {
            token: "boot".into(),
            epoch_revision: 1,
            ..GroupState::stable(1, Some("n0"), voters, setup.k, Mode::Sync)
        };
        let nodes = (0..n)
            .map(|i| Node {
                name: format!("n{i}"),
                dir: format!("d{i}"),
                priority: setup.priorities[i],
                never_promote: setup.never_promote[i],
                up: true,
                paused: false,
                log: Vec::new(),
                role: if i == 0 { MemberRole::Master } else { MemberRole::Slave },
                role_epoch: 1,
                promised: 0,
                promised_token: String::new(),
                following: (i != 0).then_some(0),
                acks: BTreeMap::new(),
                pending: Vec::new(),
                applied: Applied::published(&state, &format!("n{i}")),
                confirm: 0,
                epoch_start: 0,
                admit_seq: 0,
            })
            .collect();
        Self {
            variant,
            floor: setup.floor,
            allow_degrade: setup.allow_degrade,
            nodes,
            links: vec![vec![true; n]; n],
            controller_links: [vec![true; n], vec![true; n]],
            state,
            revision: 1,
            controllers: [Ctrl::Idle, Ctrl::Idle],
            plan: None,
            put_ok: Vec::new(),
            next_id: 1,
            now_unix_ms: 1_000_000,
            tokens: 0,
            stats: Stats::default(),
        }
    }

    /// Runs one action, then checks the invariants.
    pub(super) fn step(&mut self, act: Act) -> Result<(), Violation> {
        self.now_unix_ms += 100;
        let n = self.nodes.len();
        let node = |x: u8| x as usize % n;
        let master = self.state.master.as_deref().and_then(|name| self.index(name));
        let master_or = |x: u8| master.filter(|_| x < 128).unwrap_or(x as usize % n);
        let stopped = (0..n).find(|&i| !self.alive(i));
        let stopped_or = |x: u8| stopped.filter(|_| x < 128).unwrap_or(x as usize % n);
        match act {
            Act::Put(i) => self.put(master_or(i)),
            Act::Replicate(s, batch) => self.replicate(node(s), 1 + batch as usize % 3),
            Act::ReplicateAll(batch) => {
                (0..n).for_each(|s| self.replicate(s, 1 + batch as usize % 3))
            }
            Act::Rejoin(i) => self.rejoin(node(i)),
            Act::RejoinAll => (0..n).for_each(|s| self.rejoin(s)),
            Act::TimeOut(i) => self.nodes[master_or(i)].pending.clear(),
            Act::Crash(i) => self.crash(master_or(i)),
            Act::Restart(i) => self.restart(stopped_or(i)),
            Act::Pause(i) => self.nodes[master_or(i)].paused = true,
            Act::Resume(i) => self.nodes[stopped_or(i)].paused = false,
            Act::Cut(a, b) => self.set_link(node(a), node(b), false),
            Act::Heal(a, b) => self.set_link(node(a), node(b), true),
            Act::Isolate(a) => self.isolate(master_or(a)),
            Act::HealAll => self.heal_all(),
            Act::CutController(c, i) => self.controller_links[c as usize % 2][node(i)] = false,
            Act::Controller(c, x) => self.controller_step(c as usize % 2, x)?,
            Act::ControllerRestart(c) => self.controllers[c as usize % 2] = Ctrl::Idle,
            Act::Change(kind, x) => self.start_change(kind, x),
            Act::ChangeStep => self.change_step(),
            Act::PublishConfirm => self.publish_confirm(),
        }
        self.check()
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    fn alive(&self, i: usize) -> bool {
        self.nodes[i].up && !self.nodes[i].paused
    }

    fn linked(&self, a: usize, b: usize) -> bool {
        a == b || self.links[a][b]
    }

    fn serving_master(&self, i: usize) -> bool {
        let n = &self.nodes[i];
        self.alive(i) && n.role == MemberRole::Master && !n.fenced()
    }

    /// The master the state names, if it serves its epoch and no decision runs.
    fn legit_master(&self) -> Option<usize> {
        if self.state.phase != Phase::Stable {
            return None;
        }
        let m = self.index(self.state.master.as_deref()?)?;
        let serves = self.serving_master(m) && self.nodes[m].role_epoch == self.state.epoch;
        serves.then_some(m)
    }

    fn set_link(&mut self, a: usize, b: usize, up: bool) {
        if a != b {
            self.links[a][b] = up;
            self.links[b][a] = up;
        }
    }

    fn isolate(&mut self, a: usize) {
        for b in 0..self.nodes.len() {
            self.set_link(a, b, false);
        }
        for links in &mut self.controller_links {
            links[a] = false;
        }
    }

    fn heal_all(&mut self) {
        let n = self.nodes.len();
        self.links = vec![vec![true; n]; n];
        self.controller_links = [vec![true; n], vec![true; n]];
    }

    fn answer_put_ok(&mut self, m: usize, offset: usize, rec: Rec) {
        self.put_ok.push((offset, rec));
        self.stats.put_oks += 1;
        let node = &mut self.nodes[m];
        node.confirm = node.confirm.max(offset + 1);
    }

    fn put(&mut self, m: usize) {
        if !self.serving_master(m) {
            return;
        }
        let rec = (self.nodes[m].role_epoch, self.next_id);
        self.next_id += 1;
        let node = &mut self.nodes[m];
        node.log.push(rec);
        let offset = node.log.len() - 1;
        let seq = node.admit_seq;
        node.admit_seq += 1;
        let k = effective_k(node.applied.k, node.applied.mode);
        if k == 0 {
            self.answer_put_ok(m, offset, rec);
        } else {
            node.pending.push(Pending { offset, rec, k, seq });
        }
    }

    fn replicate(&mut self, s: usize, batch: usize) {
        let Some(m) = self.nodes[s].following else {
            return;
        };
        let (slave, master) = (&self.nodes[s], &self.nodes[m]);
        let ok = self.alive(s)
            && self.alive(m)
            && self.linked(s, m)
            && slave.role == MemberRole::Slave
            && self.serving_master(m)
            && master.role_epoch == slave.role_epoch
            && master.role_epoch >= slave.promised;
        if !ok {
            return;
        }
        let have = slave.log.len();
        assert!(master.log.len() >= have && master.log[..have] == slave.log[..], "model: prefix");
        let end = master.log.len().min(have + batch);
        let more: Vec<Rec> = master.log[have..end].to_vec();
        self.nodes[s].log.extend(more);
        self.nodes[m].acks.insert(s, end);
        self.evaluate(m);
    }

    /// Rule A: a waiting put is PUT_OK once `k` members of the applied V acked its end.
    fn evaluate(&mut self, m: usize) {
        if !self.serving_master(m) {
            return;
        }
        let node = &self.nodes[m];
        let counting: Vec<usize> =
            node.applied.counting.iter().filter_map(|name| self.index(name)).collect();
        let acked = |p: &Pending| {
            counting.iter().filter(|i| node.acks.get(i).is_some_and(|&a| a > p.offset)).count()
        };
        let (done, waiting): (Vec<Pending>, Vec<Pending>) =
            node.pending.iter().cloned().partition(|p| acked(p) >= p.k as usize);
        self.nodes[m].pending = waiting;
        for p in done {
            self.answer_put_ok(m, p.offset, p.rec);
        }
    }

    /// The node follows the state's master: it truncates what that master lacks.
    fn rejoin(&mut self, s: usize) {
        let st = &self.state;
        let Some(x) = st.master.as_deref().and_then(|name| self.index(name)) else {
            return;
        };
        let (node, master) = (&self.nodes[s], &self.nodes[x]);
        let ok = st.phase == Phase::Stable
            && x != s
            && self.alive(s)
            && self.alive(x)
            && self.linked(s, x)
            && master.role == MemberRole::Master
            && master.role_epoch == st.epoch
            && st.epoch >= node.promised
            && st.epoch >= node.role_epoch
            && !(node.following == Some(x) && node.role_epoch == st.epoch);
        if !ok {
            return;
        }
        let common = node.log.iter().zip(&master.log).take_while(|(a, b)| a == b).count();
        let epoch = st.epoch;
        let node = &mut self.nodes[s];
        node.log.truncate(common);
        node.role = MemberRole::Slave;
        node.role_epoch = epoch;
        node.following = Some(x);
        node.acks.clear();
        node.pending.clear();
        self.nodes[x].acks.remove(&s);
        if self.plan.as_ref().is_some_and(|p| p.master == s) {
            self.plan = None;
        }
    }

    fn crash(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.up = false;
        node.acks.clear();
        node.pending.clear();
        if self.plan.as_ref().is_some_and(|p| p.master == i) {
            self.plan = None;
        }
    }

    /// A master that the state names at its epoch applies what is published again (its
    /// applied rule was memory); a deposed one keeps what it had.
    fn restart(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if node.up {
            return;
        }
        node.up = true;
        let named = self.state.master.as_deref() == Some(node.name.as_str());
        if node.role == MemberRole::Master && named && node.role_epoch == self.state.epoch {
            node.applied = Applied::published(&self.state, &node.name);
        }
    }

    /// The state record and every node, one line (for failure messages).
    pub(super) fn describe(&self) -> String {
        let st = &self.state;
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let down = if n.up { "" } else { " down" };
                let paused = if n.paused { " paused" } else { "" };
                format!(
                    "{}: {:?} e{} promised {} following {:?} log {:?}{down}{paused}",
                    n.name, n.role, n.role_epoch, n.promised, n.following, n.log
                )
            })
            .collect();
        format!(
            "state e{} {:?} master {:?} V {:?} k {} {:?} rev {}; PUT_OK {:?}; {}",
            st.epoch,
            st.phase,
            st.master,
            st.voters.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            st.k,
            st.mode,
            self.revision,
            self.put_ok,
            nodes.join("; ")
        )
    }

    /// Invariant I over the published V and k.
    fn check(&self) -> Result<(), Violation> {
        let needed = effective_k(self.state.k, self.state.mode) as usize + 1;
        let voters: Vec<&Node> = self
            .state
            .voters
            .iter()
            .filter_map(|v| self.index(&v.name))
            .map(|i| &self.nodes[i])
            .collect();
        for &(offset, record) in &self.put_ok {
            let holders = voters.iter().filter(|n| n.log.get(offset) == Some(&record)).count();
            if holders < needed {
                return Err(Violation::InvariantI { record, offset, holders, needed });
            }
        }
        Ok(())
    }
}
