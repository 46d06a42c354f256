//! The HA port a node keeps across roles (see [`crate::ha::held_port`]): once the node holds a
//! listener, either its master data plane accepts on it or, whenever no master plane runs (a
//! slave, a fenced node, a failed role change, a start without a plane), a refuser closes what
//! connects at once. Nothing connects into a backlog nobody accepts from.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Node;

/// The refuser while it runs: its token and its task.
pub(super) type Refuser = (CancellationToken, tokio::task::JoinHandle<()>);

impl Node {
    /// The listener the node holds, if any.
    pub(super) fn held_ha_listener(&self) -> Option<Arc<tokio::net::TcpListener>> {
        self.ha_listener.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts refusing on the held port, unless a master plane serves it, the node stops, or a
    /// refuser already runs.
    pub(super) fn refuse_on_ha_port(&self) {
        // The listener is read under the refuser's lock, which the release takes too: no
        // refuser starts on a port the node has let go.
        let mut refuser = self.ha_refuser.lock().unwrap_or_else(|e| e.into_inner());
        let stopping = !self.accepting.load(std::sync::atomic::Ordering::SeqCst);
        if refuser.is_some() || stopping || self.cancel.is_cancelled() {
            return;
        }
        let Some(listener) = self.held_ha_listener() else { return };
        if self.state().master.is_some() {
            return;
        }
        let token = self.cancel.child_token();
        let refuse = crate::ha::held_port::refuse_while_not_master;
        let task = tokio::spawn(refuse(listener, self.metrics.ha_counters(), token.clone()));
        *refuser = Some((token, task));
    }

    /// Stops the refuser and waits until it no longer accepts (a master plane takes the port
    /// next, or the node lets it go).
    pub(super) async fn stop_refusing(&self) {
        let running = self.ha_refuser.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((token, task)) = running {
            token.cancel();
            let _ = task.await;
        }
    }

    /// Closes the held port (the node stops: a restart may bind it again). The planes' tasks
    /// have ended before.
    pub(super) async fn release_ha_port(&self) {
        let running = {
            let mut refuser = self.ha_refuser.lock().unwrap_or_else(|e| e.into_inner());
            self.ha_listener.lock().unwrap_or_else(|e| e.into_inner()).take();
            refuser.take()
        };
        if let Some((token, task)) = running {
            token.cancel();
            let _ = task.await;
        }
    }
}
