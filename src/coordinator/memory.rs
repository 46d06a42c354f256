//! An in-memory [`Coordinator`] with etcd v3's semantics, on tokio's clock (virtual under
//! `tokio::time::pause()`), for the tests of the decision logic.
//!
//! What it keeps like etcd: one global revision, starting at 1 and raised by one per write
//! transaction that changes something (a lease expiry or revoke that deletes keys is one);
//! each key's create/mod revision and version; leases whose TTL runs on
//! [`tokio::time::Instant`] and whose expiry deletes their keys (watchers see Delete events);
//! compares on absent keys (revisions and version 0; a value compare on an absent key is
//! false, whatever the operator, as in etcd); watches from a revision replaying the event log,
//! and [`Error::Compacted`] (as the stream's first item, as etcd sends it) for a revision
//! below the last [`MemoryCoordinator::compact`].
//!
//! Test knobs: [`MemoryCoordinator::set_unavailable`] cuts one client off (every call fails
//! with [`Error::Unavailable`], its watches end with that error; leases still expire), and
//! [`MemoryCoordinator::new_client`] gives another client of the same store with its own knob
//! (two nodes, one cut off).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{
    CmpOp, CmpTarget, Compare, Coordinator, Error, KeyValue, Lease, LeaseId, Op, Revision, Txn,
    TxnResponse, WatchBatch, WatchEvent, WatchStream,
};

/// How many batches a watch stream buffers before its task waits for the reader.
const WATCH_BUFFER: usize = 64;
/// The most events one watch batch carries.
const WATCH_BATCH_EVENTS: usize = 1000;
/// The first lease id handed out (etcd's are large, random; ours count up from here).
const FIRST_LEASE_ID: LeaseId = 0x1000;

/// One client of an in-memory store (see the module docs). Clones share the store and the
/// availability knob; [`MemoryCoordinator::new_client`] shares only the store.
#[derive(Debug, Clone)]
pub struct MemoryCoordinator {
    store: Arc<Store>,
    cut: Arc<AtomicBool>,
}

#[derive(Debug)]
struct Store {
    state: Mutex<State>,
    /// Bumped on every change of the store and every availability flip: wakes the watches.
    changed: watch::Sender<u64>,
}

#[derive(Debug)]
struct State {
    /// The revision of the last change (1 for an empty store, as in etcd).
    revision: Revision,
    /// Revisions below this are compacted away.
    compact_revision: Revision,
    kv: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, LeaseState>,
    next_lease: LeaseId,
    /// Every event since the compact revision, in revision order.
    log: Vec<(Revision, WatchEvent)>,
}

#[derive(Debug)]
struct LeaseState {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryCoordinator {
    /// An empty store (revision 1) and its first client.
    pub fn new() -> Self {
        let state = State {
            revision: 1,
            compact_revision: 0,
            kv: BTreeMap::new(),
            leases: HashMap::new(),
            next_lease: FIRST_LEASE_ID,
            log: Vec::new(),
        };
        let store = Store { state: Mutex::new(state), changed: watch::channel(0).0 };
        Self { store: Arc::new(store), cut: Arc::new(AtomicBool::new(false)) }
    }

    /// Another client of the same store, with its own [`MemoryCoordinator::set_unavailable`].
    pub fn new_client(&self) -> Self {
        Self { store: Arc::clone(&self.store), cut: Arc::new(AtomicBool::new(false)) }
    }

    /// Cuts this client off the store (every call fails with [`Error::Unavailable`] and its
    /// watches end with it) or reconnects it. Leases still expire while it is cut off.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.cut.store(unavailable, Ordering::SeqCst);
        self.store.changed.send_modify(|n| *n += 1);
    }

    /// The store's current revision (a test's view; works while cut off).
    pub fn revision(&self) -> Revision {
        self.store.lock_expired().revision
    }

    /// Compacts the event log: revisions below `revision` are gone, and a watch from one of
    /// them gets [`Error::Compacted`]. Like etcd, compacting at or below the last compaction
    /// is [`Error::Compacted`] and above the current revision is [`Error::Refused`].
    pub fn compact(&self, revision: Revision) -> Result<(), Error> {
        self.check()?;
        let mut st = self.store.lock_expired();
        if revision <= st.compact_revision {
            return Err(Error::Compacted {
                requested: revision,
                compact_revision: st.compact_revision,
            });
        }
        if revision > st.revision {
            return Err(Error::Refused {
                call: "compact",
                reason: format!(
                    "required revision {revision} is a future revision (current {})",
                    st.revision
                ),
            });
        }
        st.compact_revision = revision;
        let keep = st.log.partition_point(|(r, _)| *r < revision);
        st.log.drain(..keep);
        drop(st);
        self.store.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    fn check(&self) -> Result<(), Error> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        Ok(())
    }
}

fn unavailable() -> Error {
    Error::Unavailable {
        endpoints: "memory".into(),
        reason: "this client is cut off from the in-memory coordinator".into(),
    }
}

impl Store {
    /// The state, with every lease that is due expired first (so a call right after
    /// `tokio::time::advance` sees the expiry even before the lease's own task ran).
    fn lock_expired(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.expire_due(Instant::now()) {
            self.changed.send_modify(|n| *n += 1);
        }
        st
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

impl State {
    /// Expires every lease whose deadline passed; whether anything changed.
    fn expire_due(&mut self, now: Instant) -> bool {
        let mut due: Vec<LeaseId> =
            self.leases.iter().filter(|(_, l)| l.deadline <= now).map(|(id, _)| *id).collect();
        due.sort_unstable();
        let mut changed = false;
        for id in due {
            changed |= self.remove_lease(id);
        }
        changed
    }

    /// Removes a lease and deletes its keys in one revision; whether a key was deleted.
    fn remove_lease(&mut self, id: LeaseId) -> bool {
        let Some(lease) = self.leases.remove(&id) else { return false };
        let keys: Vec<String> =
            lease.keys.into_iter().filter(|k| self.kv.contains_key(k)).collect();
        if keys.is_empty() {
            return false;
        }
        let rev = self.revision + 1;
        for key in keys {
            self.delete_key(&key, rev);
        }
        self.revision = rev;
        true
    }

    /// Deletes a present key at `rev` (the caller raises the revision).
    fn delete_key(&mut self, key: &str, rev: Revision) {
        if let Some(old) = self.kv.remove(key) {
            if let Some(l) = self.leases.get_mut(&old.lease) {
                l.keys.remove(key);
            }
            self.log.push((rev, WatchEvent::Delete { key: key.to_owned(), mod_revision: rev }));
        }
    }

    fn put_key(&mut self, key: &str, value: &[u8], lease: LeaseId, rev: Revision) {
        let kv = match self.kv.get(key) {
            Some(old) => {
                if old.lease != lease
                    && let Some(l) = self.leases.get_mut(&old.lease)
                {
                    l.keys.remove(key);
                }
                KeyValue {
                    key: key.to_owned(),
                    value: value.to_vec(),
                    create_revision: old.create_revision,
                    mod_revision: rev,
                    version: old.version + 1,
                    lease,
                }
            }
            None => KeyValue {
                key: key.to_owned(),
                value: value.to_vec(),
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                lease,
            },
        };
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.insert(key.to_owned());
        }
        self.log.push((rev, WatchEvent::Put(kv.clone())));
        self.kv.insert(key.to_owned(), kv);
    }

    fn range_prefix(&self, prefix: &str) -> Vec<KeyValue> {
        self.kv
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn compare(&self, c: &Compare) -> bool {
        let kv = self.kv.get(&c.key);
        let ord = match (&c.target, kv) {
            // etcd: every key of the range must hold; an empty range compares an absent key.
            (CmpTarget::PrefixModRevision(r), _) => {
                let under = self.range_prefix(&c.key);
                if under.is_empty() {
                    return holds(c.op, 0.cmp(r));
                }
                return under.iter().all(|kv| holds(c.op, kv.mod_revision.cmp(r)));
            }
            // etcd: a value compare on an absent key fails whatever the operator.
            (CmpTarget::Value(_), None) => return false,
            (CmpTarget::Value(v), Some(kv)) => kv.value.as_slice().cmp(v.as_slice()),
            (CmpTarget::ModRevision(r), kv) => kv.map_or(0, |kv| kv.mod_revision).cmp(r),
            (CmpTarget::CreateRevision(r), kv) => kv.map_or(0, |kv| kv.create_revision).cmp(r),
            (CmpTarget::Version(v), kv) => kv.map_or(0, |kv| kv.version).cmp(v),
        };
        holds(c.op, ord)
    }

    /// Runs a transaction: all or nothing, one revision for all its writes.
    fn txn(&mut self, txn: &Txn) -> Result<TxnResponse, Error> {
        check_branch(&txn.success)?;
        check_branch(&txn.failure)?;
        let succeeded = txn.compares.iter().all(|c| self.compare(c));
        let ops = if succeeded { &txn.success } else { &txn.failure };
        for op in ops {
            if let Op::Put { lease: Some(id), .. } = op
                && *id != 0
                && !self.leases.contains_key(id)
            {
                return Err(Error::LeaseNotFound(*id));
            }
        }
        let rev = self.revision + 1;
        let mut wrote = false;
        let mut reads = Vec::new();
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    self.put_key(key, value, lease.unwrap_or(0), rev);
                    wrote = true;
                }
                Op::Delete { key } => {
                    if self.kv.contains_key(key) {
                        self.delete_key(key, rev);
                        wrote = true;
                    }
                }
                Op::DeletePrefix { prefix } => {
                    for kv in self.range_prefix(prefix) {
                        self.delete_key(&kv.key, rev);
                        wrote = true;
                    }
                }
                Op::Get { key } => reads.push(self.kv.get(key).cloned().into_iter().collect()),
                Op::GetPrefix { prefix } => reads.push(self.range_prefix(prefix)),
            }
        }
        if wrote {
            self.revision = rev;
        }
        Ok(TxnResponse { succeeded, revision: self.revision, reads })
    }
}

/// Whether a compare's operator holds for the ordering of the compared value to the target.
fn holds(op: CmpOp, ord: std::cmp::Ordering) -> bool {
    match op {
        CmpOp::Equal => ord.is_eq(),
        CmpOp::NotEqual => ord.is_ne(),
        CmpOp::Less => ord.is_lt(),
        CmpOp::Greater => ord.is_gt(),
    }
}

/// etcd refuses a branch that writes one key twice, or a key and a range holding it
/// ("duplicate key given in txn request"), and a delete of an empty prefix (the whole store).
fn check_branch(ops: &[Op]) -> Result<(), Error> {
    let mut seen = BTreeSet::new();
    let prefixes: Vec<&str> = ops
        .iter()
        .filter_map(|op| match op {
            Op::DeletePrefix { prefix } => Some(prefix.as_str()),
            _ => None,
        })
        .collect();
    for op in ops {
        let key = match op {
            Op::Put { key, .. } | Op::Delete { key } => key,
            Op::DeletePrefix { prefix } if prefix.is_empty() => {
                return Err(Error::Refused {
                    call: "txn",
                    reason: "a delete of the empty prefix (every key) is refused".into(),
                });
            }
            Op::DeletePrefix { .. } | Op::Get { .. } | Op::GetPrefix { .. } => continue,
        };
        let in_range = prefixes.iter().any(|p| key.starts_with(p));
        if !seen.insert(key.as_str()) || in_range {
            return Err(Error::Refused {
                call: "txn",
                reason: format!("duplicate key given in txn request: {key}"),
            });
        }
    }
    Ok(())
}

/// etcd's TTLs are whole seconds, at least one.
fn round_ttl(ttl: Duration) -> Duration {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

#[async_trait::async_trait]
impl Coordinator for MemoryCoordinator {
    async fn grant(&self, ttl: Duration) -> Result<Lease, Error> {
        self.check()?;
        let ttl = round_ttl(ttl);
        let id = {
            let mut st = self.store.lock_expired();
            let id = st.next_lease;
            st.next_lease += 1;
            let deadline = Instant::now() + ttl;
            st.leases.insert(id, LeaseState { ttl, deadline, keys: BTreeSet::new() });
            id
        };
        tokio::spawn(expire_task(Arc::downgrade(&self.store), id));
        Ok(Lease { id, ttl })
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, Error> {
        self.check()?;
        let mut st = self.store.lock_expired();
        let l = st.leases.get_mut(&lease).ok_or(Error::LeaseNotFound(lease))?;
        l.deadline = Instant::now() + l.ttl;
        Ok(l.ttl)
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), Error> {
        self.check()?;
        let changed = self.store.lock_expired().remove_lease(lease);
        if changed {
            self.store.notify();
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), Error> {
        self.check()?;
        let st = self.store.lock_expired();
        Ok((st.kv.get(key).cloned(), st.revision))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), Error> {
        self.check()?;
        let st = self.store.lock_expired();
        Ok((st.range_prefix(prefix), st.revision))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        self.check()?;
        let (resp, before) = {
            let mut st = self.store.lock_expired();
            let before = st.revision;
            (st.txn(&txn)?, before)
        };
        if resp.revision != before {
            self.store.notify();
        }
        Ok(resp)
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error> {
        self.check()?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let changed = self.store.changed.subscribe();
        // etcd: a start revision of 0 (or below) watches from the next change.
        let from = if from <= 0 { self.store.lock_expired().revision + 1 } else { from };
        let w = Watcher {
            store: Arc::downgrade(&self.store),
            cut: Arc::clone(&self.cut),
            prefix: prefix.to_owned(),
            next: from,
            tx,
            changed,
        };
        tokio::spawn(w.run());
        Ok(rx)
    }
}

/// Expires one lease when its deadline passes (keep-alives move the deadline on).
async fn expire_task(store: Weak<Store>, id: LeaseId) {
    loop {
        let deadline = {
            let Some(store) = store.upgrade() else { return };
            let st = store.lock_expired();
            match st.leases.get(&id) {
                Some(l) => l.deadline,
                None => return,
            }
        };
        tokio::time::sleep_until(deadline).await;
    }
}

/// One watch: sends what the log holds from `next` on, then waits for the next change.
struct Watcher {
    store: Weak<Store>,
    cut: Arc<AtomicBool>,
    prefix: String,
    next: Revision,
    tx: mpsc::Sender<Result<WatchBatch, Error>>,
    changed: watch::Receiver<u64>,
}

impl Watcher {
    async fn run(mut self) {
        loop {
            match self.step() {
                Some(Ok((batch, more))) => {
                    if self.tx.send(Ok(batch)).await.is_err() {
                        return;
                    }
                    if more {
                        continue;
                    }
                }
                Some(Err(e)) => {
                    let _ = self.tx.send(Err(e)).await;
                    return;
                }
                None => {}
            }
            tokio::select! {
                r = self.changed.changed() => if r.is_err() { return },
                () = self.tx.closed() => return,
            }
        }
    }

    /// The next batch (and whether more is already waiting), an error that ends the watch, or
    /// None when nothing new matched.
    fn step(&mut self) -> Option<Result<(WatchBatch, bool), Error>> {
        let Some(store) = self.store.upgrade() else { return Some(Err(unavailable())) };
        if self.cut.load(Ordering::SeqCst) {
            return Some(Err(unavailable()));
        }
        self.changed.mark_unchanged();
        let st = store.lock_expired();
        if self.next < st.compact_revision {
            return Some(Err(Error::Compacted {
                requested: self.next,
                compact_revision: st.compact_revision,
            }));
        }
        let start = st.log.partition_point(|(r, _)| *r < self.next);
        let mut events = Vec::new();
        let mut last_sent = 0;
        let mut next = st.revision + 1;
        for (rev, ev) in &st.log[start..] {
            // A full batch ends before the next revision: revisions are never split.
            if events.len() >= WATCH_BATCH_EVENTS && *rev != last_sent {
                next = *rev;
                break;
            }
            let key = match ev {
                WatchEvent::Put(kv) => &kv.key,
                WatchEvent::Delete { key, .. } => key,
            };
            if key.starts_with(&self.prefix) {
                events.push(ev.clone());
                last_sent = *rev;
            }
        }
        self.next = next;
        if events.is_empty() {
            return None;
        }
        let more = next <= st.revision;
        Some(Ok((WatchBatch { revision: st.revision, events }, more)))
    }
}

#[cfg(test)]
mod tests;
