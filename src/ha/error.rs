//! Why a data-plane connection ended: one enum for the master's side, one for the slave's.
//!
//! Each keeps its cause (`#[source]`); its text is what the connection log and the link status
//! show. A master's error maps to the [`CloseReason`] its metric label counts.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::ha::codec::CodecError;
use crate::ha::progress::ProgressError;
use crate::ha::status::CloseReason;
use crate::store::Error as StoreError;

/// Why the master closed (or refused) a slave connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MasterError {
    /// The first report is negative: the peer is not a slave.
    #[error("negative report {report}: not a slave")]
    NegativeReport {
        /// The report.
        report: i64,
    },
    /// The first report is beyond the master's max offset.
    #[error(
        "slave reports offset {report} but the master's max offset is {max}: the master is \
         behind its slave (or this is not a slave); refusing to stream over the slave's bytes"
    )]
    MasterBehind {
        /// The report.
        report: u64,
        /// The master's max offset.
        max: u64,
    },
    /// The first report is below the master's min offset.
    #[error(
        "slave reports offset {report} below the master's min offset {min}: it needs a full \
         resync (wipe its store)"
    )]
    BelowMin {
        /// The report.
        report: u64,
        /// The master's min offset.
        min: u64,
    },
    /// The writer sent the refusal's hint heartbeat and stopped.
    #[error("refused")]
    Refused,
    /// A later report (an ack) is negative.
    #[error("negative ack {value}")]
    NegativeAck {
        /// The report.
        value: i64,
    },
    /// The replica table refused an ack (backwards, beyond what was sent).
    #[error(transparent)]
    Ack(ProgressError),
    /// An ack arrived on a connection a newer one of the same replica had replaced.
    #[error("replaced by a newer connection")]
    Replaced,
    /// No bytes from the slave within the housekeeping interval.
    #[error("nothing from the slave for {0:?}")]
    Silent(Duration),
    /// No first report within twice the heartbeat interval of the accept.
    #[error("no report within {0:?} of the connect")]
    NoReport(Duration),
    /// Closed before its first report: the bound on connections without one was reached and
    /// this was the oldest.
    #[error("closed before its first report: too many connections without one (at most {0})")]
    Evicted(usize),
    /// A first report while every slot (`ha.max-connections`) is taken by a live replica.
    #[error("every slot is taken by a live replica (ha.max-connections = {0})")]
    Limit(usize),
    /// The slave closed the connection.
    #[error("slave closed the connection")]
    PeerClosed,
    /// Reading from the slave failed.
    #[error("{0}")]
    Read(#[source] io::Error),
    /// Writing to the slave failed.
    #[error("write failed: {0}")]
    Write(#[source] io::Error),
    /// The store could not give the bytes to send (deleted by retention while streaming).
    #[error("{0}")]
    Store(#[source] StoreError),
    /// The writer task panicked.
    #[error("writer task failed")]
    Writer(#[source] tokio::task::JoinError),
    /// The store's max-offset channel closed (the store is gone).
    #[error("store closed")]
    StoreClosed,
    /// The master is stopping (shutdown, role change) or the connection was cancelled.
    #[error("")]
    Shutdown,
}

impl MasterError {
    /// The `reason` label this close counts under (before `Replaced` is told from `Shutdown`).
    pub(crate) fn close_reason(&self) -> CloseReason {
        match self {
            Self::NegativeReport { .. }
            | Self::MasterBehind { .. }
            | Self::BelowMin { .. }
            | Self::Refused => CloseReason::BadReport,
            Self::NegativeAck { .. } | Self::Ack(_) | Self::Replaced => CloseReason::BadAck,
            Self::Silent(_) => CloseReason::Housekeeping,
            Self::NoReport(_) => CloseReason::NoReport,
            Self::Evicted(_) | Self::Limit(_) => CloseReason::Limit,
            Self::PeerClosed | Self::Read(_) | Self::Write(_) | Self::Writer(_) => {
                CloseReason::PeerClosed
            }
            Self::Store(_) => CloseReason::OffsetDeleted,
            Self::StoreClosed | Self::Shutdown => CloseReason::Shutdown,
        }
    }

    /// The master's boundary a refused first report is answered with (one heartbeat carrying
    /// it), if the refusal has one.
    pub(crate) fn hint(&self) -> Option<i64> {
        match self {
            Self::MasterBehind { max, .. } => Some(*max as i64),
            Self::BelowMin { min, .. } => Some(*min as i64),
            _ => None,
        }
    }
}

/// Why a slave's session with its master ended (or never started).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlaveError {
    /// The check before connecting (epochs) refused the connection.
    #[error("{0}")]
    Check(#[source] crate::ha::slave::CheckRefusal),
    /// The master opened a new epoch between the check and the session's first bytes.
    #[error(
        "the master opened epoch {now} after this slave's epoch check (at epoch {checked}): nothing of the session applied, reconnecting to check again"
    )]
    TermChanged {
        /// The master's last epoch the check adopted.
        checked: u64,
        /// Its last epoch when the session's first bytes arrived.
        now: u64,
    },
    /// The master's epoch could not be read back at the session's first bytes.
    #[error("could not confirm the master's epoch at the session's first bytes: {0}")]
    TermUnknown(String),
    /// The master's address resolved to nothing.
    #[error("{master}: no address")]
    NoAddress {
        /// The master's HA address.
        master: String,
    },
    /// The master's address did not resolve.
    #[error("cannot resolve {master}: {source}")]
    Resolve {
        /// The master's HA address.
        master: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// No socket could be made.
    #[error("socket: {0}")]
    Socket(#[source] io::Error),
    /// The source address could not be bound.
    #[error("cannot bind source address {ip}: {source}")]
    BindSource {
        /// `slave.source-address`.
        ip: IpAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Connecting took longer than `slave.connect-timeout`.
    #[error("connect to {master} timed out after {timeout:?}")]
    ConnectTimeout {
        /// The master's HA address.
        master: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Connecting failed.
    #[error("cannot connect to {master}: {source}")]
    Connect {
        /// The master's HA address.
        master: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The flush before the first report (ack mode `flushed`) failed.
    #[error("flush before connect failed: {0}")]
    Flush(#[source] StoreError),
    /// The flush task before the first report panicked.
    #[error("flush before connect failed: {0}")]
    FlushTask(#[source] tokio::task::JoinError),
    /// Writing a report failed.
    #[error("report failed: {0}")]
    Report(#[source] io::Error),
    /// Writing a report took longer than the housekeeping interval.
    #[error("report write timed out")]
    ReportTimeout,
    /// No bytes from the master within the housekeeping interval.
    #[error("no bytes from the master for {0:?}")]
    Silent(Duration),
    /// The store's flushed-offset channel closed (the store is gone).
    #[error("store closed")]
    StoreClosed,
    /// The master closed the connection.
    #[error("the master closed the connection")]
    MasterClosed,
    /// Reading from the master failed.
    #[error("read failed: {0}")]
    Read(#[source] io::Error),
    /// A frame broke the protocol.
    #[error("bad frame from the master: {0}")]
    BadFrame(#[source] CodecError),
    /// A frame does not fit this slave's segment files.
    #[error("segment-size mismatch with the master: {0}")]
    SegmentSizeMismatch(#[source] StoreError),
    /// Appending a frame failed.
    #[error("append failed: {0}")]
    Append(#[source] StoreError),
    /// The master sent a complete record that fails its CRC or structure check: the records
    /// before it are stored, nothing from it on.
    #[error("stopped: {0}; nothing from that offset on was stored")]
    DamagedRecord(crate::ha::status::DamagedRecord),
    /// An empty slave's first data frame is not at a segment boundary.
    #[error(
        "first frame at offset {offset} is not a multiple of this slave's segment size \
         {segment_size}: segment-size mismatch with the master?"
    )]
    Misaligned {
        /// The frame's offset.
        offset: u64,
        /// This slave's segment size.
        segment_size: u64,
    },
    /// A heartbeat below this slave's max offset: the master has less than this slave.
    #[error(
        "master is behind this slave: the master's offset is {offset}, this slave holds up to \
         {max}"
    )]
    MasterBehind {
        /// The master's offset.
        offset: u64,
        /// This slave's max offset.
        max: u64,
    },
    /// A heartbeat beyond this slave's max offset: it is below the master's min offset.
    #[error(
        "master sent offset {offset} past this slave's max offset {max}: this slave is below the \
         master's min offset and needs a full resync"
    )]
    NeedsResync {
        /// The master's offset.
        offset: u64,
        /// This slave's max offset.
        max: u64,
    },
    /// A data frame not at this slave's max offset.
    #[error("master pushed offset {offset} but this slave's max offset is {max}")]
    OffsetMismatch {
        /// The frame's offset.
        offset: u64,
        /// This slave's max offset.
        max: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_errors_map_to_their_close_reasons_and_hints() {
        let behind = MasterError::MasterBehind { report: 9, max: 5 };
        assert_eq!((behind.close_reason(), behind.hint()), (CloseReason::BadReport, Some(5)));
        let below = MasterError::BelowMin { report: 1, min: 4 };
        assert_eq!((below.close_reason(), below.hint()), (CloseReason::BadReport, Some(4)));
        let negative = MasterError::NegativeReport { report: -1 };
        assert_eq!((negative.close_reason(), negative.hint()), (CloseReason::BadReport, None));
        let ack =
            MasterError::Ack(ProgressError::Backwards { id: 1, previous_offset: 5, offset: 4 });
        assert_eq!(ack.close_reason(), CloseReason::BadAck);
        assert_eq!(
            MasterError::Silent(Duration::from_secs(2)).close_reason(),
            CloseReason::Housekeeping
        );
        let write = MasterError::Write(io::Error::other("boom"));
        assert_eq!(write.to_string(), "write failed: boom");
        assert!(std::error::Error::source(&write).is_some(), "the cause is kept");
        assert_eq!(MasterError::Shutdown.close_reason(), CloseReason::Shutdown);
        assert_eq!(MasterError::Shutdown.to_string(), "");
    }

    #[test]
    fn slave_errors_keep_their_cause_and_texts() {
        let e = SlaveError::Read(io::Error::other("reset"));
        assert_eq!(e.to_string(), "read failed: reset");
        assert!(std::error::Error::source(&e).is_some());
        let e = SlaveError::MasterBehind { offset: 10, max: 20 };
        assert!(e.to_string().starts_with("master is behind this slave"));
    }
}
