//! Replication status, kept in one place: what the control plane, the CLI and metrics report.
//! `ReplicaStatus`, `MasterLinkStatus` and its `DamagedRecord` are public: they are fields of
//! `node::NodeStatus`.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::ha::identity::Resolved;
use crate::ha::progress::{self, AppendTimes, ReplicaView};

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_millis() -> i64 {
    unix_millis(SystemTime::now())
}

/// One replica as the master sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaStatus {
    /// The master's id for the replica (one per identity, see `identity`).
    pub id: u64,
    /// The slave's address (of its current connection).
    pub address: SocketAddr,
    /// Where streaming started for this connection.
    pub first_offset: u64,
    /// The highest offset the replica acknowledged.
    pub ack_offset: u64,
    /// What the connection has been sent up to (the frame being written included).
    pub sent_offset: u64,
    /// The master's max offset minus the ack.
    pub lag_bytes: u64,
    /// Whether the replica is in sync (`ha::progress::is_in_sync` at the same max
    /// offset as `lag_bytes`).
    pub in_sync: bool,
    /// Age of the oldest byte the replica has not acked, in milliseconds (0 when caught up).
    pub lag_millis: u64,
    /// Unix ms of the last ack (0 before the first).
    pub last_ack_unix_ms: i64,
    /// Acked bytes per second, over the last second or so.
    pub bytes_per_sec: f64,
    /// Unix ms the connection was accepted.
    pub connected_since_unix_ms: i64,
    /// What the replica counts as for acks (`ha.replica-identity`): `data-dir <id>` (its
    /// registration, or `... (by IP)` when an unregistered connection counts as the identity
    /// registered from its IP), `ip <address>` or `connection <n>`.
    pub identity: String,
    /// The node name it registered (empty when unregistered).
    pub node_name: String,
    /// Whether its acks count for SYNC puts and the confirm offset: always without a voter set
    /// (`Node::set_voters`), else only for a replica registered with a voter's data-dir id.
    pub voter: bool,
}

/// A slave's link to its master.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterLinkStatus {
    /// The master's HA address.
    pub address: String,
    /// Whether a connection is up.
    pub connected: bool,
    /// Unix ms of the last frame received (0 before the first).
    pub last_frame_unix_ms: i64,
    /// The master's max offset as last seen (a heartbeat carries it when the link is idle).
    pub master_max_offset: Option<u64>,
    /// Body bytes received over all connections.
    pub bytes_received: u64,
    /// Frames received over all connections.
    pub frames_received: u64,
    /// Connections made after the first.
    pub reconnects: u64,
    /// The last reason a connection failed or closed, if any.
    pub last_error: Option<String>,
    /// The outcome of the last epoch-history check with the master, or why epochs are not
    /// checked (classic mode, e.g. following a stock Java broker).
    pub epoch_check: String,
    /// The outcome of the last registration of this slave's identity with the master (what
    /// the master mapped its HA connection to), why it failed, or why there is none.
    pub registration: String,
    /// The damaged record the slave stopped at, until a valid record at that offset is stored.
    pub damaged_record: Option<DamagedRecord>,
}

/// A record from the master that failed its CRC or structure check (the slave stored nothing
/// from it on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("damaged record at offset {offset} from master {master}: {reason}")]
pub struct DamagedRecord {
    /// Where the record starts.
    pub offset: u64,
    /// The master's HA address.
    pub master: String,
    /// What failed.
    pub reason: String,
}

/// Why the master closed a slave connection (also a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CloseReason {
    /// No bytes from the slave within the housekeeping interval.
    Housekeeping,
    /// A first report the master cannot serve (garbage, below min, above max).
    BadReport,
    /// An ack that went backwards or beyond what was sent.
    BadAck,
    /// The peer address is not in the allow-list.
    AllowList,
    /// The connection limit was reached: every slot taken at a first report, or the oldest of
    /// too many connections without a report.
    Limit,
    /// The peer closed the connection (or it failed).
    PeerClosed,
    /// A newer connection of the same replica (identity) replaced this one.
    Replaced,
    /// The master stopped (shutdown or role change).
    Shutdown,
    /// The offset to send was deleted by retention while streaming.
    OffsetDeleted,
    /// No first report within twice the heartbeat interval.
    NoReport,
    /// This node is not the master: it keeps its HA port between roles (so a promotion cannot
    /// lose it) and closes what connects meanwhile.
    NotMaster,
}

impl CloseReason {
    /// Every reason, in the order of `metrics::CLOSE_REASONS` (the label values).
    #[cfg(test)]
    pub(crate) const ALL: [CloseReason; 11] = [
        CloseReason::Housekeeping,
        CloseReason::BadReport,
        CloseReason::BadAck,
        CloseReason::AllowList,
        CloseReason::Limit,
        CloseReason::PeerClosed,
        CloseReason::Replaced,
        CloseReason::Shutdown,
        CloseReason::OffsetDeleted,
        CloseReason::NoReport,
        CloseReason::NotMaster,
    ];

    /// A short snake_case name, for logs and metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloseReason::Housekeeping => "housekeeping",
            CloseReason::BadReport => "bad_report",
            CloseReason::BadAck => "bad_ack",
            CloseReason::AllowList => "allow_list",
            CloseReason::Limit => "limit",
            CloseReason::PeerClosed => "peer_closed",
            CloseReason::Replaced => "replaced",
            CloseReason::Shutdown => "shutdown",
            CloseReason::OffsetDeleted => "offset_deleted",
            CloseReason::NoReport => "no_report",
            CloseReason::NotMaster => "not_master",
        }
    }
}

/// A replica table entry as the status reports it; "in sync" is [`progress::is_in_sync`].
pub(crate) fn replica_status(
    r: &ReplicaView,
    max: u64,
    gap: u64,
    clock: &AppendTimes,
    now: Instant,
    wall: SystemTime,
) -> ReplicaStatus {
    let unix_ms = |t: Instant| {
        unix_millis(wall.checked_sub(now.saturating_duration_since(t)).unwrap_or(UNIX_EPOCH))
    };
    ReplicaStatus {
        id: r.id,
        // Every entry the master makes has an address (`connect_stream`); only a table fed by
        // hand (tests of the waiters) has none.
        address: r.address.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
        first_offset: r.first_offset,
        ack_offset: r.ack_offset,
        sent_offset: r.sent_offset.unwrap_or(r.ack_offset),
        lag_bytes: progress::lag_bytes(max, r.ack_offset),
        lag_millis: if r.ack_offset >= max { 0 } else { clock.lag_ms(r.ack_offset, now) },
        in_sync: progress::is_in_sync(max, r.ack_offset, gap),
        last_ack_unix_ms: r.last_ack.map_or(0, unix_ms),
        bytes_per_sec: r.bytes_per_sec,
        connected_since_unix_ms: unix_ms(r.connected_since),
        identity: String::new(),
        node_name: String::new(),
        voter: r.voter,
    }
}

/// The status's identity (how it was found, when not by its own registration) and node name.
pub(crate) fn identity_status(r: &Resolved) -> (String, String) {
    let by_ip = if r.claim.is_some() && !r.registered { " (by IP)" } else { "" };
    let name = r.claim.as_ref().map(|c| c.node_name.clone()).unwrap_or_default();
    (format!("{}{by_ip}", r.identity), name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_the_metric_labels() {
        assert_eq!(CloseReason::ALL.map(CloseReason::as_str), crate::metrics::CLOSE_REASONS);
    }
}
