//! `WatchTopology` over the coordinator: one stream's task.
//!
//! - It reads every key of the cluster (`<root>`, one read at one revision S), sends a
//!   snapshot, then watches `<root>` from S + 1 and keeps its copy of the keys current.
//! - A change of a group's state record or leader key (a failover, a switchover, V, k, the
//!   mode, a pause) is sent at once, as a CHANGE at the revision of the change: every revision
//!   that touched one is one update. So is the cluster's controller key and pause key.
//! - Member records (offsets, readable ends, liveness, renewed every
//!   `coordinator.renew-interval`) are not sent per change: every sample interval the groups
//!   whose status moved are sent as one SAMPLE.
//! - A resume from R watches from R + 1 on top of a fresh read at S: etcd replays every change
//!   after R, and each replayed change of a state record or leader key (revision <= S) is sent
//!   with that record as it was at its revision (the group's other records as read at S).
//!   A compacted R (or one ahead of the coordinator) gets a snapshot flagged `resync`.
//! - Every sample interval the task also reads one key: when that read or the watch fails it
//!   sends COORDINATOR_LOST with the error, keeps trying, and sends COORDINATOR_RESTORED and
//!   the changes it missed (by resuming its own watch) once the coordinator answers again.
//!
//! An update's revision is the last revision whose changes the client has been sent: resuming
//! from it never skips one. The task ends when the client goes away.
//!
//! Why a watch of the cluster's prefix and not one watch per state and leader key: the keys
//! of the groups are not one range, and one watch per key gives no order across keys (etcd
//! 3.4 has no progress barrier for a set of watches), so a client could not resume from "the
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
        sent_rev: 0,
        overlay: BTreeMap::new(),
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
    /// While replaying (revisions <= cache_rev): state and leader keys as of the replayed
    /// revision (None: absent then).
    overlay: BTreeMap<String, Option<KeyValue>>,
    /// What the client holds of each group (lease ages zeroed), to send only what moved.
    emitted: BTreeMap<String, pb::GroupStatus>,
    /// The coordinator's error while it is lost.
    lost: Option<String>,
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
            let read = self.view.coord.get_prefix(self.view.keys.root()).await;
            let (kvs, rev) = match read {
                Ok(r) => r,
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
            };
            wait = Duration::from_millis(100);
            self.cache = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
            self.cache_rev = rev;
            self.overlay.clear();
            if !self.restore().await {
                return;
            }
            if resume > rev {
                resync = Some(format!(
                    "revision {resume} is ahead of the coordinator's ({rev}): a fresh snapshot"
                ));
                resume = 0;
            }
            let watch_from = if resume > 0 {
                self.sent_rev = resume;
                resume + 1
            } else {
                if !self.snapshot(resync.take()).await {
                    return;
                }
                rev + 1
            };
            let ended = match self.view.coord.watch(self.view.keys.root(), watch_from).await {
                Ok(stream) => self.follow(stream).await,
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
                }
            }
        }
    }

    /// Follows a watch until it fails, the coordinator is compacted past it, or the client
    /// goes away; samples and checks the coordinator every sample interval.
    async fn follow(&mut self, mut stream: crate::coordinator::WatchStream) -> Ended {
        let mut tick = tokio::time::interval(self.sample);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
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
                _ = tick.tick() => {
                    let check = self.view.coord.get(&self.view.keys.paused()).await;
                    let ok = match check {
                        Ok(_) => self.restore().await,
                        Err(e) => self.lose(e.to_string()).await,
                    };
                    if !ok || !self.sample_groups().await {
                        return Ended::Closed;
                    }
                }
            }
        }
    }

    /// Applies a batch, one revision at a time; sends a CHANGE for each revision that touched
    /// a state record, a leader key or a cluster key. False when the client went away.
    async fn apply(&mut self, events: Vec<WatchEvent>) -> bool {
        let mut i = 0;
        while i < events.len() {
            let rev = revision_of(&events[i]);
            let mut j = i;
            while j < events.len() && revision_of(&events[j]) == rev {
                j += 1;
            }
            let replay = rev <= self.cache_rev;
            let mut dirty: Vec<String> = Vec::new();
            let mut cluster = false;
            for ev in &events[i..j] {
                let key = match ev {
                    WatchEvent::Put(kv) => kv.key.clone(),
                    WatchEvent::Delete { key, .. } => key.clone(),
                };
                let watched = self.watched(&key);
                match &watched {
                    Some(Some(g)) => dirty.push(g.clone()),
                    Some(None) => cluster = true,
                    None => {}
                }
                if replay {
                    if watched.is_some() {
                        let value = match ev {
                            WatchEvent::Put(kv) => Some(kv.clone()),
                            WatchEvent::Delete { .. } => None,
                        };
                        self.overlay.insert(key, value);
                    }
                } else {
                    match ev {
                        WatchEvent::Put(kv) => {
                            self.cache.insert(key, kv.clone());
                        }
                        WatchEvent::Delete { .. } => {
                            self.cache.remove(&key);
                        }
                    }
                }
            }
            if !replay {
                self.cache_rev = rev;
                self.overlay.clear();
            }
            dirty.sort();
            dirty.dedup();
            let removed: Vec<String> = if replay {
                Vec::new()
            } else {
                let now: Vec<String> = self.group_names();
                self.emitted.keys().filter(|g| !now.contains(g)).cloned().collect()
            };
            self.sent_rev = rev;
            if dirty.is_empty() && !cluster && removed.is_empty() {
                i = j;
                continue;
            }
            let now = crate::coordinator::unix_ms();
            let groups: Vec<pb::GroupStatus> =
                dirty.iter().filter_map(|g| self.group(g, now)).collect();
            for g in &groups {
                self.emitted.insert(g.group.clone(), normalized(g));
            }
            for g in &removed {
                self.emitted.remove(g);
            }
            let mut u = self.update(pb::TopologyUpdateKind::Change);
            u.groups = groups;
            u.removed_groups = removed;
            if self.tx.send(u).await.is_err() {
                return false;
            }
            i = j;
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

    /// A key as the client should see it now: the replayed value while replaying.
    fn current(&self, key: &str) -> Option<&KeyValue> {
        match self.overlay.get(key) {
            Some(v) => v.as_ref(),
            None => self.cache.get(key),
        }
    }

    /// Every group with a key.
    fn group_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .cache
            .range(self.view.keys.groups()..)
            .map_while(|(k, _)| self.view.keys.split_group(k).map(|(g, _)| g.to_owned()))
            .collect();
        names.dedup();
        names
    }

    /// A group's status as the client should see it (None: the group has no key).
    fn group(&self, group: &str, now: i64) -> Option<pb::GroupStatus> {
        let prefix = self.view.keys.group(group);
        let mut groups: BTreeMap<String, GroupRecords> = BTreeMap::new();
        let replayed = [self.view.keys.state(group), self.view.keys.leader(group)];
        for (k, kv) in self.cache.range(prefix.clone()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            if replayed.contains(k) {
                continue;
            }
            self.file(&mut groups, kv);
        }
        for k in &replayed {
            if let Some(kv) = self.current(k) {
                self.file(&mut groups, kv);
            }
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
