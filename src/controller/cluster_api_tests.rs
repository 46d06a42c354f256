//! The Cluster service's view against a coordinator: status computed from the records (blocked
//! reasons, failover possible, lag and lease ages), history newest first, requests created
//! only when none is pending and answered from the outcome, timeouts, and the pause switches.
//! Each test takes its coordinator from [`coordinator`] as `Arc<dyn Coordinator>`, so any
//! backend runs them (a small in-test fake for now).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::coordinator::records::{CandidateReport, Voter};
use crate::coordinator::{Lease, LeaseId, TxnResponse, WatchStream};

/// An in-memory engine with etcd's revision rules for what these tests use (no leases, no
/// watches). `races` makes the next compare-and-swaps on a mod revision lose: the key is
/// rewritten just before each.
#[derive(Debug, Default)]
struct Fake {
    kvs: Mutex<(Revision, BTreeMap<String, KeyValue>)>,
    races: AtomicUsize,
}

impl Fake {
    fn put(&self, key: &str, value: Vec<u8>) {
        let mut g = self.kvs.lock().unwrap();
        let rev = g.0 + 1;
        g.0 = rev;
        write(&mut g.1, key, value, rev);
    }

    fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.kvs.lock().unwrap().1.get(key).map(|kv| kv.value.clone())
    }
}

fn write(kvs: &mut BTreeMap<String, KeyValue>, key: &str, value: Vec<u8>, rev: Revision) {
    let kv = kvs.entry(key.to_owned()).or_insert_with(|| KeyValue {
        key: key.to_owned(),
        value: vec![],
        create_revision: rev,
        mod_revision: rev,
        version: 0,
        lease: 0,
    });
    kv.value = value;
    kv.mod_revision = rev;
    kv.version += 1;
}

fn holds(kvs: &BTreeMap<String, KeyValue>, c: &Compare) -> bool {
    let kv = kvs.get(&c.key);
    let ord = match &c.target {
        CmpTarget::PrefixModRevision(r) => {
            let mut revs: Vec<Revision> = kvs
                .values()
                .filter(|kv| kv.key.starts_with(&c.key))
                .map(|kv| kv.mod_revision)
                .collect();
            if revs.is_empty() {
                revs.push(0);
            }
            return revs.into_iter().all(|m| op_holds(c.op, m.cmp(r)));
        }
        CmpTarget::ModRevision(r) => kv.map_or(0, |k| k.mod_revision).cmp(r),
        CmpTarget::CreateRevision(r) => kv.map_or(0, |k| k.create_revision).cmp(r),
        CmpTarget::Version(v) => kv.map_or(0, |k| k.version).cmp(v),
        CmpTarget::Value(v) => kv.map_or(&[][..], |k| &k.value[..]).cmp(&v[..]),
    };
    op_holds(c.op, ord)
}

fn op_holds(op: CmpOp, ord: std::cmp::Ordering) -> bool {
    match op {
        CmpOp::Equal => ord.is_eq(),
        CmpOp::NotEqual => ord.is_ne(),
        CmpOp::Less => ord.is_lt(),
        CmpOp::Greater => ord.is_gt(),
    }
}

#[async_trait::async_trait]
impl Coordinator for Fake {
    async fn grant(&self, ttl: Duration) -> Result<Lease, crate::coordinator::Error> {
        Ok(Lease { id: 1, ttl })
    }
    async fn keep_alive(&self, _: LeaseId) -> Result<Duration, crate::coordinator::Error> {
        Ok(Duration::from_secs(10))
    }
    async fn revoke(&self, _: LeaseId) -> Result<(), crate::coordinator::Error> {
        Ok(())
    }
    async fn get(
        &self,
        key: &str,
    ) -> Result<(Option<KeyValue>, Revision), crate::coordinator::Error> {
        let g = self.kvs.lock().unwrap();
        Ok((g.1.get(key).cloned(), g.0))
    }
    async fn get_prefix(
        &self,
        prefix: &str,
    ) -> Result<(Vec<KeyValue>, Revision), crate::coordinator::Error> {
        let g = self.kvs.lock().unwrap();
        Ok((g.1.values().filter(|kv| kv.key.starts_with(prefix)).cloned().collect(), g.0))
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, crate::coordinator::Error> {
        let mut g = self.kvs.lock().unwrap();
        let (rev, kvs) = &mut *g;
        for c in &txn.compares {
            if matches!(c.target, CmpTarget::ModRevision(_))
                && self.races.load(Ordering::SeqCst) > 0
            {
                self.races.fetch_sub(1, Ordering::SeqCst);
                let v = kvs.get(&c.key).map(|kv| kv.value.clone()).unwrap_or_default();
                *rev += 1;
                write(kvs, &c.key, v, *rev);
            }
        }
        let succeeded = txn.compares.iter().all(|c| holds(kvs, c));
        let ops = if succeeded { &txn.success } else { &txn.failure };
        let next = *rev + 1;
        let mut wrote = false;
        let mut reads = Vec::new();
        for op in ops {
            match op {
                Op::Put { key, value, .. } => {
                    write(kvs, key, value.clone(), next);
                    wrote = true;
                }
                Op::Delete { key } => wrote |= kvs.remove(key).is_some(),
                Op::DeletePrefix { prefix } => {
                    let before = kvs.len();
                    kvs.retain(|k, _| !k.starts_with(prefix));
                    wrote |= kvs.len() < before;
                }
                Op::Get { key } => reads.push(kvs.get(key).cloned().into_iter().collect()),
                Op::GetPrefix { prefix } => reads
                    .push(kvs.values().filter(|kv| kv.key.starts_with(prefix)).cloned().collect()),
            }
        }
        if wrote {
            *rev = next;
        }
        Ok(TxnResponse { succeeded, revision: *rev, reads })
    }
    async fn watch(&self, _: &str, _: Revision) -> Result<WatchStream, crate::coordinator::Error> {
        Err(crate::coordinator::Error::Refused { call: "watch", reason: "not in the fake".into() })
    }
}

/// The engine the tests run against.
fn coordinator() -> (Arc<Fake>, Arc<dyn Coordinator>) {
    let f = Arc::new(Fake::default());
    (Arc::clone(&f), f)
}

fn keys() -> Keys {
    Keys::new("/hasync/v1/", "c1")
}

fn voter(name: &str) -> Voter {
    Voter { name: name.into(), data_dir_id: format!("dd-{name}") }
}

fn state(master: &str, voters: &[&str], k: u32) -> GroupState {
    let voters = voters.iter().map(|v| voter(v)).collect();
    GroupState {
        token: "t3".into(),
        epoch_revision: 17,
        confirm_offset: 900,
        last_decision: "bootstrap".into(),
        controller: "ctl-a".into(),
        time_unix_ms: 1,
        ..GroupState::stable(3, Some(master), voters, k, Mode::Sync)
    }
}

fn record(name: &str, role: MemberRole, max_offset: u64) -> MemberRecord {
    MemberRecord {
        name: name.into(),
        data_dir_id: format!("dd-{name}"),
        role,
        epoch: 3,
        promised_epoch: 3,
        last_record_epoch: 3,
        max_offset,
        confirm_offset: 900,
        fenced: false,
        master_frame_age_ms: None,
        following: String::new(),
        mode: None,
        k: 0,
        advertise_ha: format!("{name}:10912"),
        advertise_grpc: format!("{name}:10920"),
        never_promote: false,
        priority: 0,
        truncated_bytes: 0,
        readable_offset: 0,
        replicas: Vec::new(),
        time_unix_ms: now_ms() - 1500,
    }
}

/// Group g1: n1 master, n2 and n3 slaves (n3 500 bytes behind), k = 1, all live.
fn seed(f: &Fake) {
    let k = keys();
    f.put(&k.state("g1"), records::encode(&state("n1", &["n1", "n2", "n3"], 1)));
    f.put(&k.leader("g1"), records::encode(&LeaderRecord { name: "n1".into(), epoch: 3 }));
    for (n, role, off) in [
        ("n1", MemberRole::Master, 1000),
        ("n2", MemberRole::Slave, 1000),
        ("n3", MemberRole::Slave, 500),
    ] {
        f.put(&k.member("g1", n), records::encode(&record(n, role, off)));
    }
    f.put(&k.controller(), b"ctl-a".to_vec());
}

#[test]
fn blocked_reasons_in_their_order() {
    let s = state("n1", &["n1", "n2", "n3"], 1);
    let (m, n2, n3) = (
        record("n1", MemberRole::Master, 1000),
        record("n2", MemberRole::Slave, 1000),
        record("n3", MemberRole::Slave, 500),
    );
    let all = [m.clone(), n2.clone(), n3.clone()];
    assert_eq!(blocked_reason(&s, &all, false), None);
    assert_eq!(blocked_reason(&s, &all, true).as_deref(), Some(reason::PAUSED));
    let paused = GroupState { paused: true, ..s.clone() };
    assert_eq!(blocked_reason(&paused, &all, false).as_deref(), Some(reason::PAUSED));
    let degraded = GroupState { k: 0, ..s.clone() };
    assert_eq!(blocked_reason(&degraded, &all, false).as_deref(), Some(reason::SYNC_DEGRADED));
    // |V| - k = 2 voters other than the master must be live; the master does not count.
    assert_eq!(
        blocked_reason(&s, &[m.clone(), n2.clone()], false).as_deref(),
        Some(reason::TOO_FEW_FENCED)
    );
    // With k = 2 one is enough.
    let k2 = GroupState { k: 2, ..s.clone() };
    assert_eq!(blocked_reason(&k2, &[m.clone(), n3.clone()], false), None);
    // A live record under another data-dir id is not the voter.
    let impostor = MemberRecord { data_dir_id: "other".into(), ..n2.clone() };
    assert_eq!(
        blocked_reason(&s, &[m.clone(), impostor, n3.clone()], false).as_deref(),
        Some(reason::TOO_FEW_FENCED)
    );
    // The most complete (n2) is never-promote: n3 is behind it, so nobody can be promoted.
    let tagged = MemberRecord { never_promote: true, ..n2.clone() };
    assert_eq!(
        blocked_reason(&s, &[m.clone(), tagged.clone(), n3.clone()], false).as_deref(),
        Some(reason::BEST_CANDIDATE_NOT_PROMOTABLE)
    );
    // An equally complete promotable one is enough.
    let even = MemberRecord { max_offset: 1000, ..n3.clone() };
    assert_eq!(blocked_reason(&s, &[m.clone(), tagged, even], false), None);
    // A later record epoch beats a longer log.
    let newer = MemberRecord { last_record_epoch: 4, max_offset: 10, never_promote: true, ..n3 };
    assert_eq!(
        blocked_reason(&s, &[m.clone(), n2.clone(), newer], false).as_deref(),
        Some(reason::BEST_CANDIDATE_NOT_PROMOTABLE)
    );
    // Otherwise the state record's own reason.
    let said = GroupState { blocked_reason: Some("async_lag_too_large".into()), ..s };
    assert_eq!(blocked_reason(&said, &all, false).as_deref(), Some("async_lag_too_large"));
}

#[tokio::test]
async fn status_mirrors_the_records() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    // A voter whose lease expired (no record), and a group not bootstrapped yet.
    f.put(&k.state("g1"), records::encode(&state("n1", &["n1", "n2", "n3", "n4"], 2)));
    f.put(&k.member("g2", "x1"), records::encode(&record("x1", MemberRole::Slave, 0)));
    let view = ClusterView::new(coord, k);
    let st = view.status(None).await.unwrap();
    assert_eq!(st.controller, "ctl-a");
    assert!(!st.paused);
    assert!(st.revision > 0);
    let names: Vec<&str> = st.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["g1", "g2"]);
    let g = &st.groups[0];
    assert_eq!((g.epoch, g.master.as_deref(), g.k), (3, Some("n1"), 2));
    assert_eq!(g.voters, ["n1", "n2", "n3", "n4"]);
    assert_eq!((g.leader.as_deref(), g.leader_epoch), (Some("n1"), 3));
    assert_eq!(g.phase(), pb::GroupPhase::Stable);
    assert_eq!(g.mode(), pb::ReplicationMode::Sync);
    assert!(g.failover_possible, "{g:?}");
    assert_eq!(g.blocked_reason, None);
    let m: Vec<_> = g.members.iter().map(|m| (m.name.as_str(), m.live, m.lag_bytes)).collect();
    assert_eq!(
        m,
        [
            ("n1", true, Some(0)),
            ("n2", true, Some(0)),
            ("n3", true, Some(500)),
            ("n4", false, None)
        ]
    );
    let n3 = &g.members[2];
    assert_eq!((n3.role(), n3.max_offset, n3.promised_epoch), (pb::Role::Slave, 500, 3));
    assert!((1500..60_000).contains(&n3.lease_age_ms), "{n3:?}");
    assert_eq!(n3.advertise_grpc, "n3:10920");
    let g2 = &st.groups[1];
    assert!(!g2.bootstrapped && !g2.failover_possible);
    assert_eq!(g2.blocked_reason.as_deref(), Some(reason::NOT_BOOTSTRAPPED));
    assert_eq!(g2.master, None);

    let one = view.status(Some("g1")).await.unwrap();
    assert_eq!(one.groups.len(), 1);
    let e = view.status(Some("g9")).await.unwrap_err();
    assert!(matches!(e, ClusterError::NotFound(ref m) if m.contains("g9")), "{e:?}");
}

#[tokio::test]
async fn status_says_why_a_failover_is_blocked() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    let view = ClusterView::new(coord, k.clone());
    // n3's lease expired: 1 live voter besides the master, |V| - k = 2 needed.
    f.txn(Txn { success: vec![Op::Delete { key: k.member("g1", "n3") }], ..Default::default() })
        .await
        .unwrap();
    let g = view.status(Some("g1")).await.unwrap().groups.remove(0);
    assert!(!g.failover_possible);
    assert_eq!(g.blocked_reason.as_deref(), Some(reason::TOO_FEW_FENCED));
    view.pause(None).await.unwrap();
    let st = view.status(Some("g1")).await.unwrap();
    assert!(st.paused);
    assert_eq!(st.groups[0].blocked_reason.as_deref(), Some(reason::PAUSED));
}

/// Plays the controller: answers the next request of `group` with `done` and deletes it.
fn answer_requests(
    f: Arc<Fake>,
    group: &'static str,
    pause_ms: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let k = keys();
        loop {
            if let Some(v) = f.value(&k.request(group)) {
                let r: OperatorRequest = records::decode("r", &v).unwrap();
                let o = RequestOutcome {
                    id: r.id,
                    done: true,
                    master: r.to.clone(),
                    epoch: 4,
                    refusal: None,
                    write_pause_ms: Some(pause_ms),
                    loss_bound_bytes: r.accept_data_loss.then_some(500),
                    time_unix_ms: now_ms(),
                };
                let txn = Txn {
                    success: vec![
                        Op::Delete { key: k.request(group) },
                        Op::Put { key: k.outcome(group), value: records::encode(&o), lease: None },
                    ],
                    ..Default::default()
                };
                f.txn(txn).await.unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_switchover_is_requested_once_and_its_outcome_returned() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    // An older outcome of another request is not this one's.
    let old = RequestOutcome {
        id: "old".into(),
        done: false,
        master: None,
        epoch: 0,
        refusal: Some("x".into()),
        write_pause_ms: None,
        loss_bound_bytes: None,
        time_unix_ms: 1,
    };
    f.put(&k.outcome("g1"), records::encode(&old));
    let view = ClusterView::new(coord, k.clone());
    let controller = answer_requests(Arc::clone(&f), "g1", 42);
    let req = pb::SwitchoverRequest { group: "g1".into(), to: "n2".into(), timeout_ms: 0 };
    let out = view.switchover(req).await.unwrap();
    assert!(out.done, "{out:?}");
    assert_eq!((out.master.as_deref(), out.epoch, out.write_pause_ms), (Some("n2"), 4, Some(42)));
    assert_ne!(out.id, "old");
    assert_eq!(out.group, "g1");
    controller.await.unwrap();
    assert!(f.value(&k.request("g1")).is_none(), "the controller took it");

    // A manual failover carries accept_data_loss and answers the loss bound.
    let controller = answer_requests(Arc::clone(&f), "g1", 0);
    let req = pb::FailoverRequest {
        group: "g1".into(),
        to: "n3".into(),
        accept_data_loss: true,
        timeout_ms: 0,
    };
    let out = view.failover(req).await.unwrap();
    assert_eq!((out.master.as_deref(), out.loss_bound_bytes), (Some("n3"), Some(500)));
    controller.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pending_request_refuses_the_next_and_a_silent_controller_times_out() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    let view = ClusterView::new(coord, k.clone());
    let req = pb::SwitchoverRequest { group: "g1".into(), to: String::new(), timeout_ms: 1500 };
    let started = tokio::time::Instant::now();
    let e = view.switchover(req.clone()).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let ClusterError::Timeout(m) = &e else { panic!("{e:?}") };
    assert!(m.contains("still pending") && m.contains(&k.request("g1")), "{m}");
    let pending: OperatorRequest =
        records::decode("r", &f.value(&k.request("g1")).unwrap()).unwrap();
    assert_eq!((pending.kind, pending.to.as_deref()), (DecisionKind::Switchover, None));
    // The next request is refused at once, naming the pending one; nothing is overwritten.
    let e = view.switchover(req).await.unwrap_err();
    let ClusterError::FailedPrecondition(m) = &e else { panic!("{e:?}") };
    assert!(m.contains(&pending.id) && m.contains("switchover"), "{m}");
    let still: OperatorRequest = records::decode("r", &f.value(&k.request("g1")).unwrap()).unwrap();
    assert_eq!(still, pending);
}

#[tokio::test]
async fn requests_are_validated_before_anything_is_written() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    let view = ClusterView::new(coord, k.clone());
    let invalid = |e: ClusterError, words: &[&str]| {
        let ClusterError::InvalidArgument(m) = &e else { panic!("{e:?}") };
        for w in words {
            assert!(m.contains(w), "{w} in {m}");
        }
    };
    let s = |to: &str| pb::SwitchoverRequest { group: "g1".into(), to: to.into(), timeout_ms: 0 };
    invalid(view.switchover(s("n9")).await.unwrap_err(), &["n9", "not a voter", "n1, n2, n3"]);
    invalid(view.switchover(s("n1")).await.unwrap_err(), &["already the master"]);
    let f_no = pb::FailoverRequest {
        group: "g1".into(),
        to: "n2".into(),
        accept_data_loss: false,
        timeout_ms: 0,
    };
    invalid(view.failover(f_no).await.unwrap_err(), &["--accept-data-loss"]);
    let f_to = pb::FailoverRequest {
        group: "g1".into(),
        to: String::new(),
        accept_data_loss: true,
        timeout_ms: 0,
    };
    invalid(view.failover(f_to).await.unwrap_err(), &["--to"]);
    let e = view
        .switchover(pb::SwitchoverRequest { group: "g9".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::NotFound(_)), "{e:?}");
    assert!(f.value(&k.request("g1")).is_none() && f.value(&k.request("g9")).is_none());
}

#[tokio::test]
async fn pause_and_resume_the_cluster_or_one_group() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    let view = ClusterView::new(coord, k.clone());
    let p = view.pause(None).await.unwrap();
    assert!(p.paused && p.changed);
    assert!(f.value(&k.paused()).is_some());
    assert!(!view.pause(None).await.unwrap().changed, "idempotent");
    assert!(view.resume(None).await.unwrap().changed);
    assert!(f.value(&k.paused()).is_none());
    assert!(!view.resume(None).await.unwrap().changed);

    // A field this build does not know survives the group's switch.
    let mut v: serde_json::Value =
        serde_json::from_slice(&f.value(&k.state("g1")).unwrap()).unwrap();
    v["from_a_newer_build"] = serde_json::json!(7);
    f.put(&k.state("g1"), v.to_string().into_bytes());
    // Two lost races, then it lands.
    f.races.store(2, Ordering::SeqCst);
    let p = view.pause(Some("g1")).await.unwrap();
    assert!(p.paused && p.changed && p.group == "g1");
    let v: serde_json::Value = serde_json::from_slice(&f.value(&k.state("g1")).unwrap()).unwrap();
    assert_eq!((v["paused"].as_bool(), v["from_a_newer_build"].as_u64()), (Some(true), Some(7)));
    assert!(!view.pause(Some("g1")).await.unwrap().changed);
    let g = view.status(Some("g1")).await.unwrap().groups.remove(0);
    assert!(g.paused && !g.failover_possible);
    // A controller that always wins gives up after the bound, changing nothing.
    f.races.store(100, Ordering::SeqCst);
    let e = view.resume(Some("g1")).await.unwrap_err();
    assert!(matches!(e, ClusterError::Conflict(_)), "{e:?}");
    f.races.store(0, Ordering::SeqCst);
    assert!(view.resume(Some("g1")).await.unwrap().changed);
    assert!(matches!(view.pause(Some("g9")).await.unwrap_err(), ClusterError::NotFound(_)));
}

#[tokio::test]
async fn history_is_newest_first() {
    let (f, coord) = coordinator();
    seed(&f);
    let k = keys();
    for epoch in [1u64, 2, 10] {
        let h = HistoryRecord {
            epoch,
            token: format!("t{epoch}"),
            kind: if epoch == 1 { DecisionKind::Bootstrap } else { DecisionKind::Failover },
            old_master: (epoch > 1).then(|| "n1".into()),
            new_master: Some("n2".into()),
            candidates: vec![CandidateReport {
                name: "n2".into(),
                fenced: true,
                epoch,
                last_record_epoch: epoch - 1,
                end_offset: 100 * epoch,
                chosen: true,
                why: "most complete".into(),
            }],
            rule: "r".into(),
            fencing: "f".into(),
            blocked_reason: None,
            blocked_detail: String::new(),
            loss_bound_bytes: (epoch == 10).then_some(64),
            revision: epoch as i64,
            controller: "ctl-a".into(),
            time_unix_ms: epoch as i64,
        };
        f.put(&k.history_of("g1", epoch), records::encode(&h));
    }
    let view = ClusterView::new(coord, k);
    let h = view.history("g1", 0).await.unwrap();
    let epochs: Vec<u64> = h.entries.iter().map(|e| e.epoch).collect();
    assert_eq!(epochs, [10, 2, 1]);
    assert_eq!(h.entries[0].loss_bound_bytes, Some(64));
    assert_eq!(h.entries[2].kind(), pb::DecisionKind::Bootstrap);
    assert_eq!(h.entries[0].candidates[0].end_offset, 1000);
    assert_eq!(view.history("g1", 2).await.unwrap().entries.len(), 2);
    assert!(matches!(view.history("g9", 0).await.unwrap_err(), ClusterError::NotFound(_)));
}
