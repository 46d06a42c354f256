//! Where the active controller reads its groups' records from: one prefix watch of
//! `<root>groups/` (a [`PrefixCache`]), started when the controller becomes active and
//! dropped when it stops being, instead of a prefix read every round.
//!
//! A round takes the cache's snapshot only when the cache is live and reflects every write
//! this controller made under the prefix (read-your-writes: it waits at most
//! [`CATCH_UP_MAX`] for the watch to deliver them). Otherwise it reads the prefix directly,
//! as before the cache: while the watch is broken and not yet re-established (not live), when
//! it lags behind the controller's own writes (then the cache also reads again), and in the
//! round after a compare-and-swap of this controller lost its race (its view missed a
//! change). So a round never decides on records older than its own last decision, and a
//! broken watch costs a read per round, never a decision on records that are gone.
//!
//! What a cache that lags (in the milliseconds a watch takes) may still show, a direct read
//! may too, by the time the round acts on it: every state change is a compare-and-swap on
//! the state record's revision (a stale view makes it fail), and every Fence and ChangeRole
//! is checked by the node against a linearizable read of the state. What the member records
//! give (who is alive, who to fence, the pre-vote) is availability, not safety. A watch that
//! stays open and silent is what etcd's require-leader option and HTTP/2 keep-alives end;
//! the cache also reads again every [`REFRESH`], which bounds how long anything else could
//! delay a decision.
//!
//! Changes that call for a look at once wake the controller's loop (a key deleted, as a
//! member's lease expiring deletes its record; a key created; an operator request); the
//! member records' refreshes do not, and the tick stays as the fallback.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::coordinator::cache::{CachePace, OnChange, PrefixCache};
use crate::coordinator::keys::Keys;
use crate::coordinator::{Coordinator, Error, KeyValue, Revision, WatchEvent};

/// How long a round waits for the cache to deliver this controller's own last write.
pub const CATCH_UP_MAX: Duration = Duration::from_millis(500);
/// The cache reads the prefix again this often, even while its watch holds.
pub const REFRESH: Duration = Duration::from_secs(30);
/// The longest wait between two attempts to read and watch again.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Where a round's records came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The cache's snapshot.
    Cache,
    /// A prefix read.
    Read,
}

/// The groups' records for the active controller (see the module docs).
#[derive(Debug)]
pub struct GroupRecords {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    pace: CachePace,
    cache: Mutex<Option<Arc<PrefixCache>>>,
    wake: Arc<Notify>,
    /// The highest revision this controller wrote at under the prefix.
    written: AtomicI64,
    /// A compare-and-swap lost its race since the last read: the next one reads directly.
    lost: AtomicBool,
}

impl GroupRecords {
    /// The records of `keys`' groups in `coord`; a broken watch is retried from `retry`.
    pub fn new(coord: Arc<dyn Coordinator>, keys: Keys, retry: Duration) -> Self {
        let retry_min = retry.clamp(Duration::from_millis(10), RETRY_MAX);
        Self {
            coord,
            keys,
            pace: CachePace { retry_min, retry_max: RETRY_MAX, refresh: REFRESH },
            cache: Mutex::new(None),
            wake: Arc::new(Notify::new()),
            written: AtomicI64::new(0),
            lost: AtomicBool::new(false),
        }
    }

    /// Notified by a change the controller should look at at once.
    pub fn wake(&self) -> &Notify {
        &self.wake
    }

    /// Starts the watch (the controller became active); a running one is kept.
    pub fn start(&self) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.is_some() {
            return;
        }
        let (keys, wake) = (self.keys.clone(), Arc::clone(&self.wake));
        let on_change: OnChange = Arc::new(move |events: &[WatchEvent]| {
            if events.iter().any(|e| wakes(&keys, e)) {
                wake.notify_one();
            }
        });
        let prefix = self.keys.groups();
        tracing::info!(prefix = %prefix, "watching the groups");
        let started = PrefixCache::start(Arc::clone(&self.coord), &prefix, self.pace, on_change);
        *cache = Some(Arc::new(started));
    }

    /// Drops the watch (the controller is not active).
    pub fn stop(&self) {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner()).take();
        if cache.is_some() {
            tracing::info!("no longer watching the groups");
        }
    }

    /// Whether the watch is live now.
    pub fn watching(&self) -> bool {
        self.current().is_some_and(|c| c.revision().is_some())
    }

    /// This controller's transaction under the prefix succeeded at `revision`.
    pub fn wrote(&self, revision: Revision) {
        self.written.fetch_max(revision, Ordering::SeqCst);
    }

    /// This controller's compare-and-swap lost its race: its view missed a change.
    pub fn lost_race(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    fn current(&self) -> Option<Arc<PrefixCache>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every key under the groups' prefix and the revision they reflect (see the module
    /// docs for when they come from the cache).
    pub async fn read(&self) -> Result<(Vec<KeyValue>, Revision, Source), Error> {
        let lost = self.lost.swap(false, Ordering::SeqCst);
        if let Some(cache) = self.current().filter(|c| c.revision().is_some() && !lost) {
            let floor = self.written.load(Ordering::SeqCst);
            if let Some(s) = cache.wait_for(floor, CATCH_UP_MAX).await {
                return Ok((s.kvs, s.revision, Source::Cache));
            }
            if let Some(at) = cache.revision() {
                tracing::warn!(cache_revision = at, written = floor, wait = ?CATCH_UP_MAX,
                    "the groups' watch has not delivered this controller's own write; reading \
                     directly and watching again");
                cache.resync();
            }
        }
        let (kvs, revision) = self.coord.get_prefix(&self.keys.groups()).await?;
        Ok((kvs, revision, Source::Read))
    }
}

/// Whether a change calls for a round at once: a key deleted (a lease expired, a request
/// taken), a key created (a member joined, a leader key taken) or an operator request.
fn wakes(keys: &Keys, event: &WatchEvent) -> bool {
    match event {
        WatchEvent::Delete { .. } => true,
        WatchEvent::Put(kv) => {
            kv.version == 1 || keys.split_group(&kv.key).is_some_and(|(_, rest)| rest == "request")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, version: i64) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: key.into(),
            value: Vec::new(),
            create_revision: 5,
            mod_revision: 5 + version,
            version,
            lease: 0,
        })
    }

    #[test]
    fn deletes_creations_and_requests_wake_the_controller_but_record_refreshes_do_not() {
        let k = Keys::new("/hasync/v1/", "c1");
        let delete = WatchEvent::Delete { key: k.member("g1", "n1"), mod_revision: 9 };
        assert!(wakes(&k, &delete));
        assert!(wakes(&k, &put(&k.member("g1", "n2"), 1)), "a member joined");
        assert!(wakes(&k, &put(&k.request("g1"), 3)), "an operator request");
        assert!(!wakes(&k, &put(&k.member("g1", "n1"), 7)), "a member record refreshed");
        assert!(!wakes(&k, &put(&k.state("g1"), 7)), "the master published its confirm offset");
    }
}
