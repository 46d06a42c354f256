//! `WatchTopology` over the coordinator: one stream's task.
//!
//! - It reads every key of the cluster (`<root>`, one read at one revision S), sends a
//!   snapshot, then watches `<root>` from S + 1 and keeps its copy of the keys current.
//! - A revision that changes what a group is (its state record or leader key: master, epoch,
//!   phase, voters, k, mode, pause, whether a failover is possible) is sent at once, as one
//!   CHANGE at that revision with the groups it changed; so is the cluster's controller and
//!   pause key (every group's failover depends on it). The master's confirm offset, which it
//!   writes into the state record as it moves, is not a CHANGE: offsets go with the samples.
//! - Member records (offsets, readable ends, liveness, renewed every
//!   `coordinator.renew-interval`) are not sent per change: every sample interval the groups
//!   whose status moved are sent as one SAMPLE.
//! - A resume from R reads the cluster as it was at R (etcd keeps history back to its
//!   compaction): that is what the client holds. The watch from R + 1 then brings every
//!   change after R, applied exactly as live ones, so a resumed stream sends what a live one
//!   sent. A compacted R (or one ahead of the coordinator) gets a snapshot flagged `resync`.
//! - Every second (whatever the sample interval) it reads one key beside the events: when
//!   that read or the watch fails it sends COORDINATOR_LOST with the error, keeps trying, and
//!   sends COORDINATOR_RESTORED, then the changes it missed (it resumes its own watch from
//!   what it sent), once the coordinator answers again.
//!
//! An update's revision is the last revision whose changes the client has been sent: resuming
//! from it never skips one and never repeats one. The task ends when the client goes away.
//!
//! Why a watch of the cluster's prefix and not one watch per state and leader key: the keys
//! of the groups are not one range, and separate watches are not ordered with one another
//! while they catch up (etcd 3.4's progress request, which could mark that point, is not
//! reliable before etcd's fix of issue 15220), so a client could not resume from "the
//! revision it saw" without skipping a change. One watch is ordered; the events it carries
//! beyond the state and leader keys (member renewals) are read and dropped here, not sent on.
//! The load on etcd is one watcher per open stream, and its events grow with the number of
//! members (docs/scaling.md).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{ClusterView, GroupRecords, group_status};
use crate::control::pb;
use crate::coordinator::{Error, KeyValue, Revision, WatchEvent};

/// Decisions per group in an update.
const RECENT_DECISIONS: usize = 5;
/// Updates buffered for a slow client before the task waits for it.
const BUFFER: usize = 64;
/// The longest wait between two attempts to reach a lost coordinator.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// How often the coordinator is probed (a read of one key), whatever the sample interval.
const PROBE: Duration = Duration::from_secs(1);
/// The longest a probe may take before the coordinator counts as lost.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Starts the task of one stream; its updates arrive on the receiver.
pub(super) fn start(
    view: &ClusterView,
    from_revision: Revision,
    sample: Duration,
) -> mpsc::Receiver<pb::TopologyUpdate> {
    let (tx, rx) = mpsc::channel(BUFFER);
    let task = Watcher {
        view: view.clone(),
        tx,
        sample,
        cache: BTreeMap::new(),
        cache_rev: 0,
        sent_rev: from_revision.max(0),
        emitted: BTreeMap::new(),
        lost: None,
    };
    tokio::spawn(task.run(from_revision.max(0)));
    rx
}

/// Why a watch loop ended.
enum Ended {
    /// The client went away.
    Closed,
    /// The revision asked for is compacted: a fresh snapshot, flagged.
    Compacted(String),
    /// The watch failed or ended: resume from what was sent.
    Lost(String),
}

struct Watcher {
    view: ClusterView,
    tx: mpsc::Sender<pb::TopologyUpdate>,
    sample: Duration,
    /// Every key of the cluster as of `cache_rev`.
    cache: BTreeMap<String, KeyValue>,
    cache_rev: Revision,
    /// Every change up to this revision has been sent.
    sent_rev: Revision,
    /// What the client holds of each group (lease ages zeroed), to send only what moved.
    emitted: BTreeMap<String, pb::GroupStatus>,
    /// The coordinator's error while it is lost.
    lost: Option<String>,
}

/// What the first read gave.
enum Start {
    /// The keys as of the revision to resume from: what the client holds.
    Resume(Vec<KeyValue>),
    /// The keys now, at this revision: a snapshot follows.
    Fresh(Vec<KeyValue>, Revision),
}

impl Watcher {
    async fn run(mut self, from: Revision) {
        let mut resume = from;
        let mut resync: Option<String> = None;
        let mut wait = Duration::from_millis(100);
        loop {
            if self.tx.is_closed() {
                return;
            }
            let root = self.view.keys.root().to_owned();
            let read = if resume > 0 {
                match self.view.coord.get_prefix_at(&root, resume).await {
                    Ok(kvs) => Ok(Start::Resume(kvs)),
                    Err(e @ (Error::Unavailable { .. } | Error::Auth(_))) => Err(e),
                    Err(Error::Compacted { .. }) => {
                        resync = Some(format!(
                            "revision {resume} is compacted in the coordinator: a fresh snapshot"
                        ));
                        resume = 0;
                        continue;
                    }
                    Err(e) => {
                        resync = Some(format!(
                            "revision {resume} cannot be resumed from ({e}): a fresh snapshot"
                        ));
                        resume = 0;
                        continue;
                    }
                }
            } else {
                self.view.coord.get_prefix(&root).await.map(|(kvs, rev)| Start::Fresh(kvs, rev))
            };
            let watch_from = match read {
                Err(e) => {
                    if !self.lose(e.to_string()).await {
                        return;
                    }
                    tokio::select! {
                        _ = self.tx.closed() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(RETRY_MAX);
                    continue;
                }
                Ok(Start::Resume(kvs)) => {
                    // The client holds the cluster as of `resume`: the watch brings every
                    // change after it, applied exactly as live ones.
                    self.cache = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
                    self.cache_rev = resume;
                    self.sent_rev = resume;
                    let now = crate::coordinator::unix_ms();
                    self.emitted = self
                        .group_names()
                        .iter()
                        .filter_map(|g| self.group(g, now))
                        .map(|g| (g.group.clone(), normalized(&g)))
                        .collect();
                    resume + 1
                }
                Ok(Start::Fresh(kvs, rev)) => {
                    self.cache = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
                    self.cache_rev = rev;
                    rev + 1
                }
            };
            let ended = match self.view.coord.watch(&root, watch_from).await {
                Ok(stream) => {
                    // Back only once the watch is: then the changes missed follow.
                    if !self.restore().await {
                        return;
                    }
                    if resume == 0 && !self.snapshot(resync.take()).await {
                        return;
                    }
                    wait = Duration::from_millis(100);
                    self.follow(stream).await
                }
                Err(Error::Compacted { requested, compact_revision }) => {
                    Ended::Compacted(compacted(requested, compact_revision))
                }
                Err(e) => Ended::Lost(e.to_string()),
            };
            match ended {
                Ended::Closed => return,
                Ended::Compacted(why) => {
                    resync = Some(why);
                    resume = 0;
                }
                Ended::Lost(why) => {
                    if !self.lose(why).await {
                        return;
                    }
                    resume = self.sent_rev;
                    tokio::select! {
                        _ = self.tx.closed() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Follows a watch until it fails, the coordinator is compacted past it, or the client
    /// goes away; samples every sample interval, and probes the coordinator every [`PROBE`]
    /// beside the events (a probe in flight never holds one up).
    async fn follow(&mut self, mut stream: crate::coordinator::WatchStream) -> Ended {
        let mut tick = tokio::time::interval(self.sample);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut probe_tick = tokio::time::interval(PROBE);
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        probe_tick.tick().await;
        let mut probe: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        loop {
            let in_flight = async {
                match probe.as_mut() {
                    Some(h) => h.await.unwrap_or_else(|e| Err(e.to_string())),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.tx.closed() => return Ended::Closed,
                item = stream.recv() => match item {
                    Some(Ok(batch)) => {
                        if !self.apply(batch.events).await {
                            return Ended::Closed;
                        }
                    }
                    Some(Err(Error::Compacted { requested, compact_revision })) => {
                        return Ended::Compacted(compacted(requested, compact_revision));
                    }
                    Some(Err(e)) => return Ended::Lost(format!("the watch failed: {e}")),
                    None => return Ended::Lost("the coordinator ended the watch".into()),
                },
                checked = in_flight => {
                    probe = None;
                    let ok = match checked {
                        Ok(()) => self.restore().await,
                        Err(e) => self.lose(e).await,
                    };
                    if !ok {
                        return Ended::Closed;
                    }
                }
                _ = probe_tick.tick() => {
                    if probe.is_none() {
                        let coord = std::sync::Arc::clone(&self.view.coord);
                        let key = self.view.keys.paused();
                        probe = Some(tokio::spawn(async move {
                            match tokio::time::timeout(PROBE_TIMEOUT, coord.get(&key)).await {
                                Ok(Ok(_)) => Ok(()),
                                Ok(Err(e)) => Err(e.to_string()),
                                Err(_) => Err(format!(
                                    "the coordinator did not answer a read within {PROBE_TIMEOUT:?}"
                                )),
                            }
                        }));
                    }
                }
                _ = tick.tick() => {
                    if !self.sample_groups().await {
                        return Ended::Closed;
                    }
                }
            }
        }
    }

    /// Applies a batch, one revision at a time; sends a CHANGE for each revision that changed
    /// what a group is (its master, epoch, phase, voters, k, mode, pause, leader key, whether
    /// a failover is possible ...: not its offsets, which the samples carry) or removed a
    /// group. False when the client went away.
    async fn apply(&mut self, events: Vec<WatchEvent>) -> bool {
        let mut i = 0;
        while i < events.len() {
            let rev = revision_of(&events[i]);
            let mut j = i;
            while j < events.len() && revision_of(&events[j]) == rev {
                j += 1;
            }
            let mut dirty: Vec<String> = Vec::new();
            let mut cluster = false;
            for ev in &events[i..j] {
                let key = match ev {
                    WatchEvent::Put(kv) => kv.key.clone(),
                    WatchEvent::Delete { key, .. } => key.clone(),
                };
                match self.watched(&key) {
                    Some(Some(g)) => dirty.push(g),
                    Some(None) => cluster = true,
                    None => {}
                }
                match ev {
                    WatchEvent::Put(kv) => {
                        self.cache.insert(key, kv.clone());
                    }
                    WatchEvent::Delete { .. } => {
                        self.cache.remove(&key);
                    }
                }
            }
            self.cache_rev = rev;
            let names = self.group_names();
            if cluster {
                // The pause and the controller bear on every group's failover.
                dirty.extend(names.iter().cloned());
            }
            dirty.sort();
            dirty.dedup();
            let now = crate::coordinator::unix_ms();
            let mut groups = Vec::new();
            for g in &dirty {
                let Some(s) = self.group(g, now) else { continue };
                let changed = self.emitted.get(g).is_none_or(|held| shape(held) != shape(&s));
                if changed {
                    self.emitted.insert(g.clone(), normalized(&s));
                    groups.push(s);
                }
            }
            // A group with no key left is gone only when its state record went in this
            // revision (a delete of the group's records), not when its members' leases expire
            // before the controller bootstrapped it.
            let removed: Vec<String> = self
                .emitted
                .keys()
                .filter(|g| !names.contains(g) && dirty.contains(g))
                .cloned()
                .collect();
            for g in &removed {
                self.emitted.remove(g);
            }
            self.sent_rev = rev;
            i = j;
            if groups.is_empty() && !cluster && removed.is_empty() {
                continue;
            }
            let mut u = self.update(pb::TopologyUpdateKind::Change);
            u.groups = groups;
            u.removed_groups = removed;
            if self.tx.send(u).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Sends the groups whose status moved since the client got them (and the groups that
    /// appeared or went without a state change). False when the client went away.
    async fn sample_groups(&mut self) -> bool {
        let now = crate::coordinator::unix_ms();
        let names = self.group_names();
        let mut groups = Vec::new();
        for g in &names {
            let Some(s) = self.group(g, now) else { continue };
            let n = normalized(&s);
            if self.emitted.get(g) != Some(&n) {
                self.emitted.insert(g.clone(), n);
                groups.push(s);
            }
        }
        let removed: Vec<String> =
            self.emitted.keys().filter(|g| !names.contains(g)).cloned().collect();
        for g in &removed {
            self.emitted.remove(g);
        }
        if groups.is_empty() && removed.is_empty() {
            return true;
        }
        let mut u = self.update(pb::TopologyUpdateKind::Sample);
        u.groups = groups;
        u.removed_groups = removed;
        self.tx.send(u).await.is_ok()
    }

    /// Sends every group. False when the client went away.
    async fn snapshot(&mut self, resync: Option<String>) -> bool {
        let now = crate::coordinator::unix_ms();
        let groups: Vec<pb::GroupStatus> =
            self.group_names().iter().filter_map(|g| self.group(g, now)).collect();
        self.emitted = groups.iter().map(|g| (g.group.clone(), normalized(g))).collect();
        self.sent_rev = self.cache_rev;
        let mut u = self.update(pb::TopologyUpdateKind::Snapshot);
        u.groups = groups;
        u.resync = resync.is_some();
        u.resync_reason = resync.unwrap_or_default();
        self.tx.send(u).await.is_ok()
    }

    /// Marks the coordinator lost (once) and says so. False when the client went away.
    async fn lose(&mut self, why: String) -> bool {
        if self.lost.is_some() {
            return !self.tx.is_closed();
        }
        tracing::warn!(error = %why, "topology stream: the coordinator is lost");
        self.lost = Some(why);
        let u = self.update(pb::TopologyUpdateKind::CoordinatorLost);
        self.tx.send(u).await.is_ok()
    }

    /// Marks the coordinator reached again, when it was lost, and says so.
    async fn restore(&mut self) -> bool {
        if self.lost.take().is_none() {
            return true;
        }
        tracing::info!("topology stream: the coordinator answers again");
        let u = self.update(pb::TopologyUpdateKind::CoordinatorRestored);
        self.tx.send(u).await.is_ok()
    }

    /// An empty update of `kind` with the cluster's fields.
    fn update(&self, kind: pb::TopologyUpdateKind) -> pb::TopologyUpdate {
        let keys = &self.view.keys;
        let controller = self
            .current(&keys.controller())
            .map(|kv| String::from_utf8_lossy(&kv.value).trim().to_owned())
            .unwrap_or_default();
        pb::TopologyUpdate {
            kind: kind as i32,
            revision: self.sent_rev,
            coordinator_connected: self.lost.is_none(),
            coordinator_error: self.lost.clone().unwrap_or_default(),
            controller,
            paused: self.current(&keys.paused()).is_some(),
            root: keys.root().to_owned(),
            time_unix_ms: crate::coordinator::unix_ms(),
            ..Default::default()
        }
    }

    /// `Some(Some(group))` for a group's state or leader key, `Some(None)` for a cluster key
    /// (controller, paused), None for the rest.
    fn watched(&self, key: &str) -> Option<Option<String>> {
        let keys = &self.view.keys;
        if key == keys.controller() || key == keys.paused() {
            return Some(None);
        }
        match keys.split_group(key) {
            Some((g, "state" | "leader")) => Some(Some(g.to_owned())),
            _ => None,
        }
    }

    /// A key as the cache holds it.
    fn current(&self, key: &str) -> Option<&KeyValue> {
        self.cache.get(key)
    }

    /// Every group with a key.
    fn group_names(&self) -> Vec<String> {
        let groups = self.view.keys.groups();
        let mut names: Vec<String> = self
            .cache
            .range(groups.clone()..)
            .take_while(|(k, _)| k.starts_with(&groups))
            .filter_map(|(k, _)| self.view.keys.split_group(k).map(|(g, _)| g.to_owned()))
            .collect();
        names.dedup();
        names
    }

    /// A group's status as the client should see it (None: the group has no key).
    fn group(&self, group: &str, now: i64) -> Option<pb::GroupStatus> {
        let prefix = self.view.keys.group(group);
        let mut groups: BTreeMap<String, GroupRecords> = BTreeMap::new();
        for (k, kv) in self.cache.range(prefix.clone()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            self.file(&mut groups, kv);
        }
        let recs = groups.remove(group)?;
        Some(group_status(
            group,
            &recs,
            now,
            self.current(&self.view.keys.paused()).is_some(),
            RECENT_DECISIONS,
        ))
    }

    /// Files one key; a value hasync did not write is skipped (and logged), never fatal.
    fn file(&self, groups: &mut BTreeMap<String, GroupRecords>, kv: &KeyValue) {
        if let Err(e) = self.view.file(groups, kv) {
            tracing::debug!(key = %kv.key, error = %e, "topology: a record skipped");
        }
    }
}

fn revision_of(ev: &WatchEvent) -> Revision {
    match ev {
        WatchEvent::Put(kv) => kv.mod_revision,
        WatchEvent::Delete { mod_revision, .. } => *mod_revision,
    }
}

fn compacted(requested: Revision, oldest: Revision) -> String {
    format!(
        "revision {requested} is compacted (the coordinator keeps from {oldest}): a fresh snapshot"
    )
}

/// What a CHANGE is about: the group without its members and its offsets (the samples carry
/// those; the master publishes its confirm offset into the state record as it moves).
fn shape(g: &pb::GroupStatus) -> pb::GroupStatus {
    let mut g = g.clone();
    g.members.clear();
    g.confirm_offset = 0;
    g
}

/// A status without what moves on its own (lease ages, a link's frame age), to tell whether
/// it changed.
fn normalized(g: &pb::GroupStatus) -> pb::GroupStatus {
    let mut g = g.clone();
    for m in &mut g.members {
        m.lease_age_ms = 0;
        m.master_frame_age_ms = m.master_frame_age_ms.map(|_| 0);
    }
    g
}
