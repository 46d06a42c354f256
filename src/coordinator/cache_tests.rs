//! The prefix cache against the in-memory engine: it follows puts and deletes, is not live
//! while its watch is broken and catches up with what it missed when the watch is back, reads
//! again after a compaction and on a resync, and stops with its owner.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::coordinator::memory::MemoryCoordinator;
use crate::coordinator::{Lease, LeaseId, Op, Txn, TxnResponse, WatchStream};

const PACE: CachePace = CachePace {
    retry_min: Duration::from_millis(100),
    retry_max: Duration::from_secs(1),
    refresh: Duration::from_secs(3600),
};

fn quiet() -> OnChange {
    Arc::new(|_: &[WatchEvent]| {})
}

async fn put(c: &dyn Coordinator, key: &str, value: &str) -> Revision {
    let op = Op::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: None };
    c.txn(Txn { success: vec![op], ..Txn::default() }).await.unwrap().revision
}

async fn delete(c: &dyn Coordinator, key: &str) -> Revision {
    let op = Op::Delete { key: key.into() };
    c.txn(Txn { success: vec![op], ..Txn::default() }).await.unwrap().revision
}

fn keys(s: &Snapshot) -> Vec<(&str, &[u8])> {
    s.kvs.iter().map(|kv| (kv.key.as_str(), kv.value.as_slice())).collect()
}

/// The snapshot once the cache is live and reflects `revision` (bounded; a cache that is not
/// live answers at once, so the loop waits between attempts).
async fn caught_up(cache: &PrefixCache, revision: Revision) -> Snapshot {
    for _ in 0..100 {
        if let Some(s) = cache.wait_for(revision, Duration::from_millis(100)).await {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the cache did not reach revision {revision}: {:?}", cache.revision());
}

#[tokio::test(start_paused = true)]
async fn the_cache_follows_puts_and_deletes_under_its_prefix_only() {
    let c = MemoryCoordinator::new();
    put(&c, "/p/a", "1").await;
    put(&c, "/q/x", "outside").await;
    let changes = Arc::new(AtomicUsize::new(0));
    let heard = Arc::clone(&changes);
    let on_change: OnChange = Arc::new(move |e: &[WatchEvent]| {
        heard.fetch_add(e.len(), Ordering::SeqCst);
    });
    let cache = PrefixCache::start(Arc::new(c.clone()), "/p/", PACE, on_change);
    let first = caught_up(&cache, 0).await;
    assert_eq!(keys(&first), [("/p/a", &b"1"[..])]);
    put(&c, "/p/b", "2").await;
    put(&c, "/p/a", "3").await;
    put(&c, "/q/y", "outside").await;
    let r = delete(&c, "/p/b").await;
    let s = caught_up(&cache, r).await;
    assert_eq!(keys(&s), [("/p/a", &b"3"[..])]);
    assert_eq!(s.revision, r);
    let (direct, _) = c.get_prefix("/p/").await.unwrap();
    assert_eq!(s.kvs, direct, "the same keys, revisions and versions as a read");
    assert_eq!(changes.load(Ordering::SeqCst), 3, "the owner heard each event under /p/");
    assert_eq!(cache.reads(), 1, "one read, then the watch");
}

#[tokio::test(start_paused = true)]
async fn a_broken_watch_makes_the_cache_not_live_until_it_read_again_with_what_it_missed() {
    let store = MemoryCoordinator::new();
    let cut = store.new_client();
    put(&store, "/p/a", "1").await;
    let cache = PrefixCache::start(Arc::new(cut.clone()), "/p/", PACE, quiet());
    caught_up(&cache, 0).await;
    cut.set_unavailable(true);
    // The watch ends with the cut; from then on nothing is answered.
    for _ in 0..50 {
        if cache.snapshot().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cache.snapshot(), None, "not live while the watch is broken");
    assert_eq!(cache.wait_for(0, Duration::from_secs(1)).await, None);
    // Changes it cannot see, then a few failed attempts (the backoff) while cut off.
    put(&store, "/p/b", "2").await;
    let r = delete(&store, "/p/a").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cache.snapshot(), None);
    cut.set_unavailable(false);
    let s = caught_up(&cache, r).await;
    assert_eq!(keys(&s), [("/p/b", &b"2"[..])], "the read after the break has what it missed");
    assert_eq!(cache.reads(), 2);
}

/// An engine whose first watch answers Compacted (as etcd does when the revision is gone).
#[derive(Debug)]
struct CompactedOnce {
    inner: MemoryCoordinator,
    watches: AtomicUsize,
}

#[async_trait::async_trait]
impl Coordinator for CompactedOnce {
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
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        self.inner.txn(txn).await
    }
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error> {
        if self.watches.fetch_add(1, Ordering::SeqCst) > 0 {
            return self.inner.watch(prefix, from).await;
        }
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let e = Error::Compacted { requested: from, compact_revision: from + 1 };
        tx.send(Err(e)).await.unwrap();
        Ok(rx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_compacted_watch_is_followed_by_a_fresh_read_and_watch() {
    let inner = MemoryCoordinator::new();
    let coord = Arc::new(CompactedOnce { inner: inner.clone(), watches: AtomicUsize::new(0) });
    let cache = PrefixCache::start(coord.clone(), "/p/", PACE, quiet());
    let r = put(&inner, "/p/a", "1").await;
    let s = caught_up(&cache, r).await;
    assert_eq!(keys(&s), [("/p/a", &b"1"[..])]);
    assert_eq!(coord.watches.load(Ordering::SeqCst), 2, "watched again after the compaction");
    assert_eq!(cache.reads(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_resync_reads_again_and_dropping_the_cache_stops_its_task() {
    let c = MemoryCoordinator::new();
    let coord: Arc<dyn Coordinator> = Arc::new(c.clone());
    let cache = PrefixCache::start(Arc::clone(&coord), "/p/", PACE, quiet());
    caught_up(&cache, 0).await;
    cache.resync();
    assert_eq!(cache.snapshot(), None, "not live from the resync until the new read");
    let r = put(&c, "/p/a", "1").await;
    caught_up(&cache, r).await;
    assert_eq!(cache.reads(), 2);
    assert!(Arc::strong_count(&coord) > 1, "the task holds the engine");
    drop(cache);
    for _ in 0..50 {
        if Arc::strong_count(&coord) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cache's task still runs after the cache was dropped");
}

#[tokio::test(start_paused = true)]
async fn the_cache_reads_again_every_refresh() {
    let c = MemoryCoordinator::new();
    let pace = CachePace { refresh: Duration::from_secs(10), ..PACE };
    let cache = PrefixCache::start(Arc::new(c.clone()), "/p/", pace, quiet());
    caught_up(&cache, 0).await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    caught_up(&cache, 0).await;
    assert_eq!(cache.reads(), 3, "the first read and one each 10 s");
}
