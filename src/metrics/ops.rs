//! Operations metrics: the process-wide log writer's losses and the gRPC port's connection
//! limits.
//!
//! The log counters are the one process-wide value here (a process has one log destination,
//! however many nodes it runs): every node's registry exports the same counters.

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ReasonLabels;

/// Why a log line was not written.
#[derive(Debug, Default)]
pub(crate) struct LogCounters {
    /// Lines the destination refused (a write error: a closed pipe, a full disk).
    pub(crate) write_errors: Counter,
    /// Lines dropped unwritten because the destination was too slow (the queue was full).
    pub(crate) dropped: Counter,
}

static LOG: LazyLock<LogCounters> = LazyLock::new(LogCounters::default);

/// The process's log counters.
pub(crate) fn log_counters() -> &'static LogCounters {
    &LOG
}

/// Every reason the gRPC port refuses (closes at once) a new connection.
pub(crate) const GRPC_REFUSE_REASONS: [&str; 2] = ["max_connections", "fd_budget"];
/// Every reason the gRPC port closes an open connection.
pub(crate) const GRPC_CLOSE_REASONS: [&str; 2] = ["idle", "handshake"];

/// The gRPC port's connection counters of one node.
#[derive(Debug, Clone, Default)]
pub(crate) struct GrpcConnMetrics {
    /// Connections open now.
    pub(crate) open: Gauge,
    /// Connections accepted.
    pub(crate) accepted: Counter,
    refused: Family<ReasonLabels, Counter>,
    closed: Family<ReasonLabels, Counter>,
}

impl GrpcConnMetrics {
    /// Counts a connection refused for `reason` (one of [`GRPC_REFUSE_REASONS`]).
    pub(crate) fn refused(&self, reason: &str) -> Counter {
        debug_assert!(GRPC_REFUSE_REASONS.contains(&reason), "{reason}");
        self.refused.get_or_create_owned(&ReasonLabels { reason: reason.to_owned() })
    }

    /// Counts a connection closed for `reason` (one of [`GRPC_CLOSE_REASONS`]).
    pub(crate) fn closed(&self, reason: &str) -> Counter {
        debug_assert!(GRPC_CLOSE_REASONS.contains(&reason), "{reason}");
        self.closed.get_or_create_owned(&ReasonLabels { reason: reason.to_owned() })
    }
}

/// Registers the log and gRPC connection metrics, every labelled series pre-created at 0.
pub(super) fn register(r: &mut Registry, grpc: &GrpcConnMetrics) {
    let log = log_counters();
    r.register(
        "log_write_errors",
        "Log lines lost because the log destination refused the write (closed pipe, full disk)",
        log.write_errors.clone(),
    );
    r.register(
        "log_dropped",
        "Log lines dropped unwritten because the log destination did not keep up",
        log.dropped.clone(),
    );
    for reason in GRPC_REFUSE_REASONS {
        let _ = grpc.refused(reason);
    }
    for reason in GRPC_CLOSE_REASONS {
        let _ = grpc.closed(reason);
    }
    r.register("grpc_connections", "gRPC connections open", grpc.open.clone());
    r.register("grpc_connections_accepted", "gRPC connections accepted", grpc.accepted.clone());
    r.register(
        "grpc_connections_refused",
        "gRPC connections closed at accept, by reason (grpc.max-connections, the fd budget)",
        grpc.refused.clone(),
    );
    r.register(
        "grpc_connections_closed",
        "gRPC connections the server closed, by reason (grpc.idle-timeout, \
         grpc.handshake-timeout)",
        grpc.closed.clone(),
    );
}
