//! The controller's runtime against the in-memory engine, through a probe that can make
//! state compare-and-swaps meet (two groups deciding at the same moment), fail every watch
//! or deliver watches late: the limit of concurrent decisions holds under concurrent steps, a
//! member's lease expiry wakes the controller before its tick, the step after an epoch opens
//! follows at the busy pace, a broken watch falls back to prefix reads, a lagging one never
//! hides the controller's own last write, and a group whose records are gone is forgotten.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

use super::*;
use crate::coordinator::memory::MemoryCoordinator;
use crate::coordinator::records::{Mode, Voter};
use crate::coordinator::{CmpTarget, Lease, Op, Revision, TxnResponse, WatchStream};

/// What the probe does to watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watches {
    /// Passed through.
    Normal,
    /// Every watch is refused (the cache never becomes live).
    Fail,
    /// Every batch arrives this late.
    Late(Duration),
}

/// The in-memory engine behind a probe (see the module docs).
#[derive(Debug)]
struct Probe {
    inner: MemoryCoordinator,
    watches: Watches,
    /// State compare-and-swaps wait (at most 200 ms) until two of them are in flight.
    meet: bool,
    arrived: watch::Sender<usize>,
    /// A state compare-and-swap arrived while another one waited for it.
    met: AtomicBool,
    /// State compare-and-swaps that lost.
    lost: AtomicUsize,
}

impl Probe {
    fn new(watches: Watches, meet: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryCoordinator::new(),
            watches,
            meet,
            arrived: watch::channel(0).0,
            met: AtomicBool::new(false),
            lost: AtomicUsize::new(0),
        })
    }
}

fn is_state_cas(txn: &Txn) -> bool {
    txn.compares
        .iter()
        .any(|c| c.key.ends_with("/state") && matches!(c.target, CmpTarget::ModRevision(_)))
}

#[async_trait::async_trait]
impl Coordinator for Probe {
    async fn grant(&self, ttl: Duration) -> Result<Lease, Error> {
        self.inner.grant(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, Error> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke(&self, lease: LeaseId) -> Result<(), Error> {
        self.inner.revoke(lease).await
    }
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), Error> {
        self.inner.get(key).await
    }
    async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), Error> {
        self.inner.get_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<crate::coordinator::TxnResponse, Error> {
        let cas = is_state_cas(&txn);
        if cas && self.meet {
            let mut before = 0;
            self.arrived.send_modify(|n| {
                before = *n;
                *n += 1;
            });
            if before == 1 {
                self.met.store(true, Ordering::SeqCst);
            }
            let mut arrived = self.arrived.subscribe();
            let both = arrived.wait_for(|n| *n >= 2);
            let _ = tokio::time::timeout(Duration::from_millis(200), both).await;
        }
        let r: TxnResponse = self.inner.txn(txn).await?;
        if cas && !r.succeeded {
            self.lost.fetch_add(1, Ordering::SeqCst);
        }
        Ok(r)
    }
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error> {
        let delay = match self.watches {
            Watches::Normal => return self.inner.watch(prefix, from).await,
            Watches::Fail => {
                let reason = "the probe refuses watches".into();
                return Err(Error::Refused { call: "Watch", reason });
            }
            Watches::Late(d) => d,
        };
        let mut inner = self.inner.watch(prefix, from).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            while let Some(b) = inner.recv().await {
                tokio::time::sleep(delay).await;
                if tx.send(b).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

fn keys() -> Keys {
    Keys::new("/hasync/v1/", "c1")
}

fn opts(max_concurrent: u32, tick: Duration) -> ControllerOptions {
    ControllerOptions {
        name: "ctl".into(),
        ttl: Duration::from_secs(10),
        tick,
        client: ClientOptions::to(""),
        policy: FailoverPolicy {
            prevote_frame_age_ms_max: 1000,
            hold_down_ms: 0,
            failovers_per_minute_max: 0,
            concurrent_failovers_max: max_concurrent,
            async_failover: false,
            async_lag_bytes_max: 0,
            async_lag_ms_max: 0,
            lease_ttl_ms: 3000,
        },
        defaults: RuleDefaults { k: 1, mode: Mode::Sync },
        retry: Duration::from_millis(100),
    }
}

fn member(name: &str, role: records::MemberRole) -> MemberRecord {
    MemberRecord {
        name: name.into(),
        data_dir_id: format!("dir-{name}"),
        role,
        epoch: 1,
        promised_epoch: 0,
        last_record_epoch: 1,
        max_offset: 100,
        confirm_offset: 100,
        fenced: false,
        master_frame_age_ms: None,
        following: String::new(),
        mode: None,
        k: 1,
        advertise_ha: String::new(),
        // No address: a Fence or ChangeRole to it fails at once.
        advertise_grpc: String::new(),
        never_promote: false,
        priority: 0,
        truncated_bytes: 0,
        readable_offset: 0,
        replicas: Vec::new(),
        time_unix_ms: crate::coordinator::unix_ms(),
    }
}

async fn put(c: &dyn Coordinator, key: String, value: Vec<u8>, lease: Option<LeaseId>) {
    let txn = Txn { success: vec![Op::Put { key, value, lease }], ..Txn::default() };
    assert!(c.txn(txn).await.unwrap().succeeded);
}

/// Group `g`: epoch 1, master `<g>-a` and slave `<g>-b` in V, k = 1, SYNC; `<g>-b`'s record,
/// and `<g>-a`'s under `master_lease` (None: the master's lease has expired: no record).
async fn group(c: &dyn Coordinator, g: &str, master_lease: Option<LeaseId>) {
    let (a, b) = (format!("{g}-a"), format!("{g}-b"));
    let voters = [&a, &b]
        .iter()
        .map(|n| Voter { name: (*n).clone(), data_dir_id: format!("dir-{n}") })
        .collect();
    let state = GroupState::stable(1, Some(&a), voters, 1, Mode::Sync);
    let k = keys();
    put(c, k.state(g), records::encode(&state), None).await;
    let slave = member(&b, records::MemberRole::Slave);
    put(c, k.member(g, &b), records::encode(&slave), None).await;
    if let Some(lease) = master_lease {
        let master = member(&a, records::MemberRole::Master);
        put(c, k.member(g, &a), records::encode(&master), Some(lease)).await;
    }
}

async fn state(c: &dyn Coordinator, g: &str) -> GroupState {
    let key = keys().state(g);
    let (kv, _) = c.get(&key).await.unwrap();
    records::decode(&key, &kv.expect("a state record").value).unwrap()
}

/// Waits (bounded, on the test clock) until `f` holds.
async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

#[tokio::test(start_paused = true)]
async fn two_groups_failing_over_at_the_same_moment_never_exceed_max_concurrent_failovers() {
    let probe = Probe::new(Watches::Normal, true);
    for g in ["g1", "g2"] {
        group(&*probe, g, None).await;
    }
    let ctl = Controller::new(probe.clone(), keys(), opts(1, Duration::from_secs(3600)));
    let mut lease = None;
    ctl.round(&mut lease).await.unwrap();
    assert!(probe.met.load(Ordering::SeqCst), "the two groups' steps ran at the same time");
    let (s1, s2) = (state(&*probe, "g1").await, state(&*probe, "g2").await);
    let deciding = [&s1, &s2].into_iter().filter(|s| s.phase != Phase::Stable).count();
    assert_eq!(deciding, 1, "max-concurrent-failovers = 1: {s1:?} {s2:?}");
    let waiting = if s1.phase == Phase::Stable { &s1 } else { &s2 };
    assert_eq!(waiting.blocked_reason.as_deref(), Some("concurrency_limited"), "{waiting:?}");
    assert_eq!(waiting.epoch, 1, "no epoch allocated for the group held back");
}

/// Group g1 under a running controller whose tick is an hour away, watched, with a live master
/// whose lease is then revoked; returns once the failover has opened epoch 2.
async fn a_failover_started_by_the_watch()
-> (Arc<Probe>, Arc<Controller>, CancellationToken, tokio::task::JoinHandle<()>) {
    let probe = Probe::new(Watches::Normal, false);
    let master_lease = probe.grant(Duration::from_secs(60)).await.unwrap();
    group(&*probe, "g1", Some(master_lease.id)).await;
    let ctl = Arc::new(Controller::new(probe.clone(), keys(), opts(4, Duration::from_secs(3600))));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&ctl).run(cancel.clone()));
    until("the controller watches the groups", async || ctl.watching()).await;
    assert_eq!(state(&*probe, "g1").await.epoch, 1, "a live master: nothing to do");
    probe.revoke(master_lease.id).await.unwrap();
    // The tick is an hour away: only the watch's wake-up can start the failover.
    until("the failover started", async || state(&*probe, "g1").await.epoch == 2).await;
    (probe, ctl, cancel, task)
}

#[tokio::test(start_paused = true)]
async fn a_masters_lease_expiry_wakes_the_controller_before_its_tick() {
    let (_probe, ctl, cancel, task) = a_failover_started_by_the_watch().await;
    cancel.cancel();
    task.await.unwrap();
    assert!(!ctl.watching(), "the watch stops with the controller");
}

#[tokio::test(start_paused = true)]
async fn the_step_after_an_epoch_opens_runs_at_the_busy_pace_not_the_tick() {
    let (probe, _ctl, cancel, task) = a_failover_started_by_the_watch().await;
    let opened = tokio::time::Instant::now();
    // The state record's own update wakes nobody, and the tick is an hour away: the fencing
    // step (nobody reachable here, so it writes why) must come from the round that opened the
    // epoch marking the controller busy.
    until("the fencing step ran", async || state(&*probe, "g1").await.blocked_reason.is_some())
        .await;
    assert!(opened.elapsed() <= Duration::from_millis(200), "{:?}", opened.elapsed());
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn while_the_watch_is_broken_every_round_reads_the_groups_directly() {
    let probe = Probe::new(Watches::Fail, false);
    let master_lease = probe.grant(Duration::from_secs(60)).await.unwrap();
    group(&*probe, "g1", Some(master_lease.id)).await;
    let ctl = Arc::new(Controller::new(probe.clone(), keys(), opts(4, Duration::from_millis(100))));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&ctl).run(cancel.clone()));
    until("the controller is active", async || ctl.status().active).await;
    probe.revoke(master_lease.id).await.unwrap();
    until("the failover started", async || state(&*probe, "g1").await.epoch == 2).await;
    assert!(!ctl.watching(), "the watch never held");
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lagging_watch_never_hides_the_controllers_own_last_write() {
    let probe = Probe::new(Watches::Late(Duration::from_secs(2)), false);
    group(&*probe, "g1", None).await;
    let ctl = Controller::new(probe.clone(), keys(), opts(4, Duration::from_secs(3600)));
    let mut lease = None;
    // The epoch allocated (the watch starts meanwhile; its first read sees it).
    ctl.round(&mut lease).await.unwrap();
    assert_eq!(state(&*probe, "g1").await.phase, Phase::Fencing);
    until("the watch is live", async || ctl.watching()).await;
    // Nobody can be fenced: the reason is written, and the watch tells it 2 s late.
    ctl.round(&mut lease).await.unwrap();
    let blocked = state(&*probe, "g1").await;
    assert!(blocked.blocked_reason.is_some(), "{blocked:?}");
    // The next round must see that write: read directly, not the lagging cache.
    ctl.round(&mut lease).await.unwrap();
    assert_eq!(state(&*probe, "g1").await, blocked, "nothing more to write");
    assert_eq!(probe.lost.load(Ordering::SeqCst), 0, "no compare-and-swap on a stale view");
}

#[tokio::test(start_paused = true)]
async fn a_group_whose_records_are_gone_is_forgotten() {
    let probe = Probe::new(Watches::Normal, false);
    group(&*probe, "g1", None).await;
    group(&*probe, "g2", None).await;
    let ctl = Controller::new(probe.clone(), keys(), opts(4, Duration::from_secs(3600)));
    let mut lease = None;
    // g2 paused: blocked, and the controller keeps the reason.
    let mut paused = state(&*probe, "g2").await;
    paused.paused = true;
    put(&*probe, keys().state("g2"), records::encode(&paused), None).await;
    ctl.round(&mut lease).await.unwrap();
    assert_eq!(ctl.status().blocked.get("g2"), Some(&BlockedReason::Paused));
    let (kvs, _) = probe.get_prefix(&keys().group("g2")).await.unwrap();
    for kv in kvs {
        let txn = Txn { success: vec![Op::Delete { key: kv.key }], ..Txn::default() };
        probe.txn(txn).await.unwrap();
    }
    until("the round forgets g2", async || {
        ctl.round(&mut lease).await.unwrap();
        !ctl.status().blocked.contains_key("g2")
    })
    .await;
    let (left, _) = probe.get_prefix(&keys().group("g2")).await.unwrap();
    assert!(left.is_empty(), "g2 is not bootstrapped again: {left:?}");
}
