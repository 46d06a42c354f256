//! A node's HA port while it is not the master. Once a node has an HA listener (bound up front
//! in coordinator mode, or by its first master plane), it keeps it for its whole life: a
//! promotion then serves on the socket it already holds, and cannot fail because another
//! process took the port while the node was a slave ("address in use"). While no master plane
//! serves it (a slave, a fenced node, a failed role change: `node::ha_port` runs this then),
//! whatever connects to that port is accepted and closed at once, counted as
//! `not_master`, and logged by peer without flooding the log (a misdirected slave reconnects
//! every few seconds: the first close of a peer is logged, its repeats are summarised).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ha::close_log::{CloseLine, CloseLog};
use crate::ha::status::CloseReason;
use crate::metrics::HaCounters;

/// The most peer addresses whose closes are remembered for the log; past it the memory starts
/// over (each peer's next close is logged again).
const PEERS_REMEMBERED: usize = 1024;

/// Accepts on `listener` and closes every connection at once, until `cancel` fires (the node
/// becomes master, or stops).
pub(crate) async fn refuse_while_not_master(
    listener: Arc<TcpListener>,
    counters: HaCounters,
    cancel: CancellationToken,
) {
    let mut logs: HashMap<IpAddr, CloseLog> = HashMap::new();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let peer = match accepted {
            Ok((stream, peer)) => {
                counters.connections_opened.inc();
                counters.closed(CloseReason::NotMaster.as_str()).inc();
                drop(stream);
                peer
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "HA accept failed (not the master)");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => continue,
                }
            }
        };
        if logs.len() >= PEERS_REMEMBERED && !logs.contains_key(&peer.ip()) {
            logs.clear();
        }
        let log = logs
            .entry(peer.ip())
            .or_insert_with(|| CloseLog::new(crate::store::disk::SUMMARY_EVERY));
        match log.close(CloseReason::NotMaster.as_str(), false, Instant::now()) {
            CloseLine::First => tracing::warn!(
                %peer,
                "HA connection closed: this node is not the master (point the slave at the \
                 master: `hasync status` names it)"
            ),
            CloseLine::Summary { repeats } => tracing::warn!(
                %peer,
                repeats,
                "HA connections closed again: this node is not the master"
            ),
            CloseLine::Quiet => {}
        }
    }
}
