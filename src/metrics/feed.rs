//! The console's document: produced above (the app follows the topology stream and renders
//! it as JSON), served here (the console's JSON URL and its event stream). The metrics layer
//! knows no coordinator: it only holds the latest document.
//!
//! The producer works only while someone looks: a subscriber (an open event stream) or a
//! request of the document within [`LINGER`]. An idle node therefore holds no watch on the
//! coordinator for its console (one watch per node of a large cluster would multiply etcd's
//! load by the number of nodes).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long after a request of the document the producer keeps it current (a page polling
/// the JSON URL keeps it warm).
pub const LINGER: Duration = Duration::from_secs(30);

/// The latest console document, and who wants it.
#[derive(Debug, Clone)]
pub struct Feed {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: watch::Sender<Arc<String>>,
    /// When the document was last asked for (not by a subscriber).
    asked: Mutex<Option<Instant>>,
    /// Woken when someone starts looking.
    wanted: Notify,
    /// Whether the producer's document is current (false while it is idle).
    current: watch::Sender<bool>,
}

impl Feed {
    /// A feed whose document is `initial` until the producer publishes one.
    pub fn new(initial: String) -> Self {
        let (tx, _) = watch::channel(Arc::new(initial));
        let (current, _) = watch::channel(false);
        Self {
            inner: Arc::new(Inner { tx, asked: Mutex::new(None), wanted: Notify::new(), current }),
        }
    }

    /// A subscriber (an event stream): while it is held the producer keeps the document
    /// current, and it sees each new one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<String>> {
        let rx = self.inner.tx.subscribe();
        self.inner.wanted.notify_one();
        rx
    }

    /// The document now. When the producer was idle it is woken, and the call waits up to
    /// `wait` for a current document (the last one it had, otherwise).
    pub async fn document(&self, wait: Duration) -> Arc<String> {
        *self.inner.asked.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.inner.wanted.notify_one();
        let mut current = self.inner.current.subscribe();
        let _ = tokio::time::timeout(wait, current.wait_for(|c| *c)).await;
        Arc::clone(&self.inner.tx.borrow())
    }

    /// Whether anyone looks now (the producer stops its work when not).
    pub fn wanted(&self) -> bool {
        self.inner.tx.receiver_count() > 0
            || self
                .inner
                .asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|at| at.elapsed() < LINGER)
    }

    /// Waits until someone looks.
    pub async fn until_wanted(&self) {
        loop {
            let woken = self.inner.wanted.notified();
            if self.wanted() {
                return;
            }
            // A bounded sleep as well: a request's linger may start between the check and
            // the wait.
            let _ = tokio::time::timeout(Duration::from_secs(1), woken).await;
        }
    }

    /// Publishes a current document.
    pub fn publish(&self, doc: String) {
        self.inner.tx.send_replace(Arc::new(doc));
        self.inner.current.send_replace(true);
    }

    /// The producer went idle: the document it left is no longer kept current.
    pub fn idle(&self) {
        self.inner.current.send_replace(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_wakes_the_producer_and_gets_its_document() {
        let feed = Feed::new("{}".into());
        assert!(!feed.wanted());
        let producer = feed.clone();
        let task = tokio::spawn(async move {
            producer.until_wanted().await;
            producer.publish("{\"groups\":[]}".into());
        });
        let doc = feed.document(Duration::from_secs(5)).await;
        assert_eq!(doc.as_str(), "{\"groups\":[]}");
        assert!(feed.wanted(), "a request keeps the producer going for LINGER");
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_subscriber_is_wanted_while_held_and_sees_each_document() {
        let feed = Feed::new("a".into());
        let mut rx = feed.subscribe();
        assert!(feed.wanted());
        feed.publish("b".into());
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow().as_str(), "b");
        drop(rx);
        assert!(!feed.wanted());
        // An idle producer's document is served as it was, after the wait.
        feed.idle();
        let doc = feed.document(Duration::from_millis(10)).await;
        assert_eq!(doc.as_str(), "b");
    }
}
