//! A prefix of the engine kept in memory by one watch: a read of every key under the prefix
//! (revision R), then a watch from R + 1 whose Put and Delete events are applied in order.
//!
//! The cache is **live** while that read and the watch after it hold without a break; only a
//! live cache answers [`PrefixCache::snapshot`]. When the watch breaks (its stream ends, an
//! error, a compaction) the cache stops being live at once, and a task reads and watches
//! again after a backoff (doubling from `retry_min` to `retry_max`; back to the minimum once
//! a read and watch held). [`PrefixCache::resync`] asks for a fresh read at once (a reader that
//! found the cache behind), and the task also reads again every `refresh`, which bounds what
//! a watch that stays open without delivering could hide.
//!
//! What a live cache reflects is every change under the prefix up to at least
//! [`Snapshot::revision`] (the read's revision, then each applied event's): a reader that
//! wrote at revision W waits with [`PrefixCache::wait_for`] until the cache reached W before
//! it trusts it (read-your-writes). The cache never claims more than that: how recent it is
//! beyond the last change it saw, only a linearizable read can tell.
//!
//! The task holds no reference to its owner: dropping the cache stops it (and its watch).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Coordinator, Error, KeyValue, Revision, WatchBatch, WatchEvent};

/// What a change under the prefix tells the cache's owner (called on the cache's task, after
/// the batch is applied; it must not block).
pub type OnChange = Arc<dyn Fn(&[WatchEvent]) + Send + Sync>;

/// How the cache's task paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePace {
    /// The first wait after a broken read or watch.
    pub retry_min: Duration,
    /// The longest wait between two attempts.
    pub retry_max: Duration,
    /// A fresh read this often, even while the watch holds.
    pub refresh: Duration,
}

/// The prefix as the cache holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Every key under the prefix, sorted by key (as [`Coordinator::get_prefix`] answers).
    pub kvs: Vec<KeyValue>,
    /// Every change under the prefix up to this revision is in `kvs`.
    pub revision: Revision,
}

/// A prefix of the engine kept by one watch (see the module docs).
#[derive(Debug)]
pub struct PrefixCache {
    shared: Arc<Shared>,
    _stop: DropGuard,
}

#[derive(Debug)]
struct Shared {
    prefix: String,
    held: Mutex<Held>,
    /// The revision a live cache reflects; None while it is not live.
    live: watch::Sender<Option<Revision>>,
    /// Bumped by each [`PrefixCache::resync`]: a session started before it ends.
    resyncs: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Held {
    kvs: BTreeMap<String, KeyValue>,
    revision: Revision,
    live: bool,
    /// Reads so far (the first is 1): which session the cache holds.
    reads: u64,
}

impl PrefixCache {
    /// Starts keeping `prefix` of `coord` (the first read runs on the cache's task: the cache
    /// is not live until it answered). `on_change` hears every applied batch.
    pub fn start(
        coord: Arc<dyn Coordinator>,
        prefix: &str,
        pace: CachePace,
        on_change: OnChange,
    ) -> Self {
        assert!(pace.retry_min > Duration::ZERO && pace.retry_min <= pace.retry_max);
        assert!(pace.refresh > Duration::ZERO);
        let shared = Arc::new(Shared {
            prefix: prefix.to_owned(),
            held: Mutex::new(Held::default()),
            live: watch::channel(None).0,
            resyncs: watch::channel(0).0,
        });
        let stop = CancellationToken::new();
        tokio::spawn(run(Arc::clone(&shared), coord, pace, on_change, stop.clone()));
        Self { shared, _stop: stop.drop_guard() }
    }

    /// What the cache holds, when it is live.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let held = self.shared.lock();
        held.live.then(|| Snapshot {
            kvs: held.kvs.values().cloned().collect(),
            revision: held.revision,
        })
    }

    /// The revision a live cache reflects (None: not live).
    pub fn revision(&self) -> Option<Revision> {
        *self.shared.live.borrow()
    }

    /// How many reads the cache made so far (tests and logs: a resync is one more).
    pub fn reads(&self) -> u64 {
        self.shared.lock().reads
    }

    /// The snapshot once the cache reflects `revision`, waiting at most `within`; None when
    /// the cache is not live (now, or at any moment of the wait) or still behind at the end.
    pub async fn wait_for(&self, revision: Revision, within: Duration) -> Option<Snapshot> {
        let mut live = self.shared.live.subscribe();
        let reached = tokio::time::timeout(within, async {
            loop {
                match *live.borrow_and_update() {
                    None => return false,
                    Some(r) if r >= revision => return true,
                    Some(_) => {}
                }
                if live.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await;
        if !matches!(reached, Ok(true)) {
            return None;
        }
        self.snapshot().filter(|s| s.revision >= revision)
    }

    /// Drops the watch and reads again at once: the cache is not live until that read and
    /// its watch hold.
    pub fn resync(&self) {
        self.shared.set_live(false);
        self.shared.resyncs.send_modify(|n| *n += 1);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_live(&self, live: bool) {
        let mut held = self.lock();
        held.live = live;
        let now = live.then_some(held.revision);
        self.live.send_replace(now);
    }

    /// A fresh read at `revision`, whose watch is open: the cache is live.
    fn install(&self, kvs: Vec<KeyValue>, revision: Revision) {
        let mut held = self.lock();
        held.kvs = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
        held.revision = revision;
        held.live = true;
        held.reads += 1;
        self.live.send_replace(Some(revision));
    }

    /// One batch of the watch, applied in order. A put replaces only an older version and a
    /// delete removes only an older one, so a batch can never move a key backwards.
    fn apply(&self, batch: &WatchBatch) {
        let mut held = self.lock();
        for event in &batch.events {
            match event {
                WatchEvent::Put(kv) => {
                    debug_assert!(kv.key.starts_with(&self.prefix), "{} outside", kv.key);
                    let newer =
                        held.kvs.get(&kv.key).is_none_or(|o| o.mod_revision < kv.mod_revision);
                    if newer {
                        held.kvs.insert(kv.key.clone(), kv.clone());
                    }
                    held.revision = held.revision.max(kv.mod_revision);
                }
                WatchEvent::Delete { key, mod_revision } => {
                    if held.kvs.get(key).is_some_and(|o| o.mod_revision < *mod_revision) {
                        held.kvs.remove(key);
                    }
                    held.revision = held.revision.max(*mod_revision);
                }
            }
        }
        if held.live {
            let r = held.revision;
            self.live.send_replace(Some(r));
        }
    }
}

/// Why a session (one read and its watch) ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The engine ended the watch stream.
    StreamEnded,
    /// A reader asked for a fresh read.
    Resync,
    /// Time for the periodic fresh read.
    Refresh,
}

async fn run(
    shared: Arc<Shared>,
    coord: Arc<dyn Coordinator>,
    pace: CachePace,
    on_change: OnChange,
    stop: CancellationToken,
) {
    let mut delay = pace.retry_min;
    loop {
        let reads = shared.lock().reads;
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            e = session(&shared, &*coord, pace.refresh, &on_change) => e,
        };
        shared.set_live(false);
        let held = shared.lock().reads > reads;
        let wait = match ended {
            Ok(End::Resync | End::Refresh) => Duration::ZERO,
            Ok(End::StreamEnded) => {
                tracing::info!(prefix = %shared.prefix, retry_in = ?delay, "watch ended; reading again");
                delay
            }
            Err(e) => {
                tracing::warn!(prefix = %shared.prefix, error = %e, retry_in = ?delay,
                    "watch broken; reading again");
                delay
            }
        };
        delay = if held { pace.retry_min } else { (delay * 2).min(pace.retry_max) };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One read and the watch from the revision after it, until the watch breaks, a resync is
/// asked for or the refresh is due.
async fn session(
    shared: &Shared,
    coord: &dyn Coordinator,
    refresh: Duration,
    on_change: &OnChange,
) -> Result<End, Error> {
    let mut resyncs = shared.resyncs.subscribe();
    resyncs.mark_unchanged();
    let (kvs, revision) = coord.get_prefix(&shared.prefix).await?;
    let mut stream = coord.watch(&shared.prefix, revision + 1).await?;
    shared.install(kvs, revision);
    let due = tokio::time::sleep(refresh);
    tokio::pin!(due);
    loop {
        tokio::select! {
            () = &mut due => return Ok(End::Refresh),
            // (An error would mean the sender is gone: it lives as long as this task.)
            _ = resyncs.changed() => return Ok(End::Resync),
            b = stream.recv() => match b {
                Some(Ok(batch)) => {
                    shared.apply(&batch);
                    on_change(&batch.events);
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(End::StreamEnded),
            },
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
