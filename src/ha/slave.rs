//! The slave side of RocketMQ's classic HA protocol: connect to the master, report the local
//! max offset, apply the frames it sends at exactly their offsets, ack, reconnect.
//!
//! Unlike upstream, the slave reports at once on connect (upstream may wait 5 s), after every
//! batch of applied frames, and every `heartbeat-interval`; a failed append is fatal for the
//! connection and surfaced in the link status (upstream ignores it); a frame larger than the read
//! buffer is an error, not a livelock. Every complete record a frame brings is checked (CRC and
//! structure, [`CommitLog::append_at_checked`]) before it is stored: at a damaged one the link
//! stops (nothing from it on is stored; the link status names it) and retries with the refusal
//! backoff. A record a frame ends inside waits, stored but not dispatched, for the next frame.
//!
//! Between two sessions the slave waits as [`Backoff`] decides: briefly after a session that got
//! as far as its first report or failed for a reason that may pass, longer (at most 30 s) after a
//! refusal the operator must fix. Right after connecting, before its first report, it runs the
//! node's after-connect hook (registration of its identity with the master, bounded in time);
//! whatever the hook answers, the session goes on.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{AckMode, Config};
use crate::ha::backoff::{Backoff, Outcome};
use crate::ha::close_log::{CloseLine, CloseLog};
use crate::ha::codec::{self, TransferDecoder};
use crate::ha::error::SlaveError;
use crate::ha::status::{DamagedRecord, MasterLinkStatus, now_millis};
use crate::metrics::HaCounters;
use crate::store::{CommitLog, Error as StoreError};

/// The slave's settings (from `[slave]` and `[ha]`).
#[derive(Debug, Clone)]
pub(crate) struct SlaveOptions {
    /// The master's HA address, host:port.
    pub(crate) master_ha: String,
    /// Read buffer; a frame body larger than this minus 12 is refused.
    pub(crate) read_buffer_size: usize,
    /// Connect timeout.
    pub(crate) connect_timeout: Duration,
    /// First reconnect delay (see [`Backoff`]).
    pub(crate) reconnect_backoff: Duration,
    /// Largest reconnect delay after a transient failure (see [`Backoff`]).
    pub(crate) reconnect_backoff_max: Duration,
    /// Source address to bind before connecting.
    pub(crate) source_address: Option<IpAddr>,
    /// Ack the received (max) offset or the flushed offset.
    pub(crate) ack_mode: AckMode,
    /// Report at least this often.
    pub(crate) report_interval: Duration,
    /// Close after this long without bytes from the master.
    pub(crate) housekeeping_interval: Duration,
}

impl SlaveOptions {
    /// From the configuration.
    pub(crate) fn from_config(c: &Config) -> Self {
        Self {
            master_ha: c.slave.master_ha.clone(),
            read_buffer_size: c.slave.read_buffer_size.0 as usize,
            connect_timeout: c.slave.connect_timeout,
            reconnect_backoff: c.slave.reconnect_backoff,
            reconnect_backoff_max: c.slave.reconnect_backoff_max,
            source_address: c.slave.source_address,
            ack_mode: c.slave.ack_mode,
            report_interval: c.ha.heartbeat_interval,
            housekeeping_interval: c.ha.housekeeping_interval,
        }
    }
}

impl Default for SlaveOptions {
    /// The configuration's defaults.
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

/// The future a hook returns.
pub(crate) type HookFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// A check run before every (re)connect of the data plane: the node compares epoch histories
/// with the master and truncates a divergent tail. `Ok(checked)` lets the connection go ahead
/// (its note goes into the link status; its epoch is what the session's first bytes are
/// verified against, see [`TermProbe`]); `Err(refusal)` refuses it (retried after the backoff,
/// a long one when the operator must fix the cause).
pub(crate) type LinkCheck =
    Arc<dyn Fn() -> HookFuture<Result<Checked, CheckRefusal>> + Send + Sync>;

/// What a passed [`LinkCheck`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// What the link status shows.
    pub(crate) note: String,
    /// The last epoch of the master's history the check adopted.
    pub(crate) master_epoch: u64,
}

/// Asks the master for the last epoch of its history. Run once per session, when the first
/// bytes from the master arrive and before they are applied: the check answered before the
/// connect, and the master may have opened a new epoch in between. A master opens an epoch only
/// with a new data plane, started after the new history is installed, so once bytes from the
/// plane arrived an answer asked for now is at least as new as the plane's term (also when a
/// proxy that terminates TCP sits between the two). An epoch other than the checked one ends
/// the session before a byte is applied (the next connect's check converges); otherwise the
/// slave would ack bytes of the new epoch filed under the old one, and cut them at its next
/// check.
pub(crate) type TermProbe = Arc<dyn Fn() -> HookFuture<Result<u64, String>> + Send + Sync>;

/// Run right after every connect, before the first report, with the local address of the HA
/// connection: the node registers its identity with the master. `Ok(note)` and `Err(reason)`
/// only go into the link status (`registration`); the session goes on either way.
pub(crate) type AfterConnect =
    Arc<dyn Fn(SocketAddr) -> HookFuture<Result<String, String>> + Send + Sync>;

/// The longest an after-connect hook may delay the first report.
pub(crate) const AFTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a [`LinkCheck`] refused the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub(crate) struct CheckRefusal {
    /// What the link status shows.
    pub(crate) reason: String,
    /// Whether the cause is one the operator must fix (the logs cannot converge, a disk
    /// error), as opposed to one that may pass (the master's API unreachable).
    pub(crate) operator_must_fix: bool,
}

/// The node's hooks around a connection (none in classic mode).
#[derive(Default)]
pub(crate) struct SlaveHooks {
    /// Before every (re)connect.
    pub(crate) check: Option<LinkCheck>,
    /// At the first bytes of every session (set with `check`).
    pub(crate) probe: Option<TermProbe>,
    /// Right after every connect.
    pub(crate) after_connect: Option<AfterConnect>,
}

/// The slave's data plane.
pub(crate) struct Slave {
    store: Arc<CommitLog>,
    opts: SlaveOptions,
    status: Mutex<MasterLinkStatus>,
    hooks: SlaveHooks,
    counters: HaCounters,
}

impl std::fmt::Debug for Slave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slave").field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// Why a session with the master ended.
enum SessionEnd {
    Cancelled,
    /// Closed; `reported` says whether the master answered the first report with a frame (it
    /// accepted the connection and streams: resets the backoff). A connection the master closes
    /// at accept (allow-list) or at its first report (every slot taken) got no frame.
    Closed {
        reason: SlaveError,
        reported: bool,
    },
}

impl SessionEnd {
    fn closed(reason: SlaveError, reported: bool) -> Self {
        Self::Closed { reason, reported }
    }
}

/// What a session's end means for the backoff: a refusal the operator must fix whenever it
/// came, else whether it got as far as its first report.
fn outcome(reason: &SlaveError, reported: bool) -> Outcome {
    let refused = match reason {
        SlaveError::Check(refusal) => refusal.operator_must_fix,
        SlaveError::MasterBehind { .. }
        | SlaveError::NeedsResync { .. }
        | SlaveError::SegmentSizeMismatch(_)
        | SlaveError::DamagedRecord(_)
        | SlaveError::Misaligned { .. } => true,
        _ => false,
    };
    match (refused, reported) {
        (true, _) => Outcome::Refused,
        (false, true) => Outcome::Reported,
        (false, false) => Outcome::Failed,
    }
}

impl Slave {
    /// A slave writing into `store`, incrementing `counters`.
    #[cfg(test)]
    pub(crate) fn new(
        store: Arc<CommitLog>,
        opts: SlaveOptions,
        counters: HaCounters,
    ) -> Arc<Self> {
        Self::with_hooks(store, opts, SlaveHooks::default(), counters)
    }

    /// A slave that runs `hooks` around every (re)connect.
    pub(crate) fn with_hooks(
        store: Arc<CommitLog>,
        opts: SlaveOptions,
        hooks: SlaveHooks,
        counters: HaCounters,
    ) -> Arc<Self> {
        let classic = |what: &str, hook: bool| {
            if hook { String::new() } else { format!("classic mode: {what}") }
        };
        let status = MasterLinkStatus {
            address: opts.master_ha.clone(),
            epoch_check: classic("epochs not checked", hooks.check.is_some()),
            registration: classic(
                "not registered (identified by IP)",
                hooks.after_connect.is_some(),
            ),
            ..Default::default()
        };
        Arc::new(Self { store, opts, status: Mutex::new(status), hooks, counters })
    }

    fn status_mut(&self) -> MutexGuard<'_, MasterLinkStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link to the master, as of now.
    pub(crate) fn status(&self) -> MasterLinkStatus {
        self.status_mut().clone()
    }

    /// Connects and streams until `cancel` fires, reconnecting with backoff.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut backoff =
            Backoff::new(self.opts.reconnect_backoff, self.opts.reconnect_backoff_max);
        let mut sessions = 0u64;
        let mut closes = CloseLog::new(crate::store::disk::SUMMARY_EVERY);
        loop {
            if sessions > 0 {
                self.status_mut().reconnects += 1;
                self.counters.slave_reconnects.inc();
            }
            sessions += 1;
            let stored_before = self.store.max_offset();
            let end = self.session(&cancel).await;
            {
                let mut st = self.status_mut();
                st.connected = false;
                if let SessionEnd::Closed { reason, .. } = &end {
                    st.last_error = Some(reason.to_string());
                }
            }
            let delay = match end {
                SessionEnd::Cancelled => return,
                SessionEnd::Closed { reason, reported } => {
                    let outcome = outcome(&reason, reported);
                    let delay = backoff.next(outcome, rand::rng().random_range(0.0..1.0));
                    let progressed = self.store.max_offset() != stored_before;
                    self.log_close(&mut closes, &reason, progressed, (outcome, delay));
                    delay
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Logs a close through `closes`: a new reason at once, the same one again at most once
    /// per summary interval, with the number of closes since.
    fn log_close(
        &self,
        closes: &mut CloseLog,
        reason: &SlaveError,
        progressed: bool,
        (outcome, delay): (Outcome, Duration),
    ) {
        let master = &self.opts.master_ha;
        let text = reason.to_string();
        let unlogged = closes.suppressed();
        let every = crate::store::disk::SUMMARY_EVERY;
        match closes.close(&text, progressed, std::time::Instant::now()) {
            CloseLine::First => tracing::warn!(%master, %reason, ?outcome, ?delay,
                unlogged_closes_before = unlogged,
                "HA link closed; while it closes for this reason, one summary every {every:?}"),
            CloseLine::Summary { repeats } => tracing::warn!(%master, %reason, ?outcome,
                ?delay, repeats, "HA link still closing ({repeats} closes for this reason)"),
            CloseLine::Quiet => tracing::debug!(%master, %reason, ?outcome, ?delay,
                "HA link closed"),
        }
    }

    async fn connect(&self) -> Result<TcpStream, SlaveError> {
        let master = &self.opts.master_ha;
        let addr: SocketAddr = match tokio::net::lookup_host(master).await {
            Ok(mut addrs) => {
                addrs.next().ok_or_else(|| SlaveError::NoAddress { master: master.clone() })?
            }
            Err(source) => return Err(SlaveError::Resolve { master: master.clone(), source }),
        };
        let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }
            .map_err(SlaveError::Socket)?;
        if let Some(ip) = self.opts.source_address {
            socket
                .bind(SocketAddr::new(ip, 0))
                .map_err(|source| SlaveError::BindSource { ip, source })?;
        }
        let timeout = self.opts.connect_timeout;
        let stream = tokio::time::timeout(timeout, socket.connect(addr))
            .await
            .map_err(|_| SlaveError::ConnectTimeout { master: master.clone(), timeout })?
            .map_err(|source| SlaveError::Connect { master: master.clone(), source })?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn ack_value(&self) -> u64 {
        match self.opts.ack_mode {
            AckMode::Received => self.store.max_offset(),
            AckMode::Flushed => self.store.flushed_offset(),
        }
    }

    /// One session: the check, the connection, the first report, then frames and reports.
    async fn session(&self, cancel: &CancellationToken) -> SessionEnd {
        let (stream, checked) = tokio::select! {
            _ = cancel.cancelled() => return SessionEnd::Cancelled,
            s = self.open() => match s {
                Ok(s) => s,
                Err(e) => return SessionEnd::closed(e, false),
            },
        };
        tracing::info!(master = %self.opts.master_ha, max_offset = self.store.max_offset(), "HA link up");
        if let Some(hook) = &self.hooks.after_connect {
            tokio::select! {
                _ = cancel.cancelled() => return SessionEnd::Cancelled,
                () = self.after_connect(hook, &stream) => {}
            }
        }
        let (rd, mut wr) = stream.into_split();
        let reported = self.ack_value();
        if let Err(e) = wr.write_all(&codec::encode_report(reported as i64)).await {
            return SessionEnd::closed(SlaveError::Report(e), false);
        }
        self.follow(rd, wr, reported, checked, cancel).await
    }

    /// The [`TermProbe`] at a session's first bytes: `Ok` when the master's last epoch is still
    /// the one the check adopted (or nothing is checked).
    async fn verify_term(&self, checked: Option<u64>) -> Result<(), SlaveError> {
        let (Some(checked), Some(probe)) = (checked, &self.hooks.probe) else { return Ok(()) };
        let now = tokio::time::timeout(AFTER_CONNECT_TIMEOUT, probe())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {AFTER_CONNECT_TIMEOUT:?}")))
            .map_err(SlaveError::TermUnknown)?;
        if now != checked {
            return Err(SlaveError::TermChanged { checked, now });
        }
        Ok(())
    }

    /// Runs the after-connect hook with the connection's local address, bounded by
    /// [`AFTER_CONNECT_TIMEOUT`]; its outcome only goes into the link status.
    async fn after_connect(&self, hook: &AfterConnect, stream: &TcpStream) {
        let outcome = match stream.local_addr() {
            Err(e) => Err(format!("the HA connection's local address is unknown: {e}")),
            Ok(local) => tokio::time::timeout(AFTER_CONNECT_TIMEOUT, hook(local))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {AFTER_CONNECT_TIMEOUT:?}"))),
        };
        let note = match outcome {
            Ok(note) => note,
            Err(reason) => {
                tracing::warn!(master = %self.opts.master_ha, %reason, "replica registration failed; the master identifies this slave by its IP");
                format!("registration failed ({reason}); identified by IP")
            }
        };
        self.status_mut().registration = note;
    }

    /// Runs the check before connecting, connects, and (ack mode `flushed`) flushes so the
    /// first report is durable; marks the link up. Returns the master epoch the check adopted.
    async fn open(&self) -> Result<(TcpStream, Option<u64>), SlaveError> {
        let mut checked = None;
        if let Some(check) = &self.hooks.check {
            match check().await {
                Ok(c) => {
                    checked = Some(c.master_epoch);
                    self.status_mut().epoch_check = c.note;
                }
                Err(refusal) => {
                    self.status_mut().epoch_check = refusal.reason.clone();
                    return Err(SlaveError::Check(refusal));
                }
            }
        }
        let stream = self.connect().await?;
        if self.opts.ack_mode == AckMode::Flushed {
            // The first report (where the master starts) must be flushed too, so that acks
            // never go backwards.
            let store = Arc::clone(&self.store);
            tokio::task::spawn_blocking(move || store.flush_blocking())
                .await
                .map_err(SlaveError::FlushTask)?
                .map_err(SlaveError::Flush)?;
        }
        let mut st = self.status_mut();
        st.connected = true;
        st.address = self.opts.master_ha.clone();
        Ok((stream, checked))
    }

    /// Applies frames and reports progress until the connection ends.
    async fn follow(
        &self,
        mut rd: OwnedReadHalf,
        mut wr: OwnedWriteHalf,
        mut reported: u64,
        checked: Option<u64>,
        cancel: &CancellationToken,
    ) -> SessionEnd {
        let decoder = TransferDecoder::new(self.opts.read_buffer_size);
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut flushed_rx = self.store.subscribe_flushed_offset();
        let mut last_read = Instant::now();
        let mut last_report = Instant::now();
        let mut answered = false;
        let mut term_verified = false;
        loop {
            let housekeeping = last_read + self.opts.housekeeping_interval;
            let report_due = last_report + self.opts.report_interval;
            let read = tokio::select! {
                _ = cancel.cancelled() => return SessionEnd::Cancelled,
                _ = tokio::time::sleep_until(housekeeping) => {
                    Err(SlaveError::Silent(self.opts.housekeeping_interval))
                }
                _ = tokio::time::sleep_until(report_due) => Ok(()),
                r = flushed_rx.changed(), if self.opts.ack_mode == AckMode::Flushed => {
                    r.map_err(|_| SlaveError::StoreClosed)
                }
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => Err(SlaveError::MasterClosed),
                    Err(e) => Err(SlaveError::Read(e)),
                    Ok(_) => {
                        last_read = Instant::now();
                        if !term_verified {
                            if let Err(e) = self.verify_term(checked).await {
                                tracing::warn!(master = %self.opts.master_ha, error = %e, "HA session ended before its first bytes were applied");
                                self.status_mut().epoch_check = e.to_string();
                                return SessionEnd::closed(e, answered);
                            }
                            term_verified = true;
                        }
                        self.apply_frames(&decoder, &mut buf).map(|a| answered |= a)
                    }
                },
            };
            if let Err(e) = read {
                return SessionEnd::closed(e, answered);
            }
            if buf.capacity() - buf.len() < 16 * 1024 {
                buf.reserve(64 * 1024);
            }
            let ack = self.ack_value();
            if ack > reported || last_report.elapsed() >= self.opts.report_interval {
                if let Err(e) = self.report(&mut wr, ack).await {
                    return SessionEnd::closed(e, answered);
                }
                reported = ack;
                last_report = Instant::now();
            }
        }
    }

    /// Writes one report, bounded by the housekeeping interval.
    async fn report(&self, wr: &mut OwnedWriteHalf, ack: u64) -> Result<(), SlaveError> {
        let report = codec::encode_report(ack as i64);
        match tokio::time::timeout(self.opts.housekeeping_interval, wr.write_all(&report)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SlaveError::Report(e)),
            Err(_) => Err(SlaveError::ReportTimeout),
        }
    }

    /// Applies every complete frame in `buf`; returns whether a valid frame (data or heartbeat)
    /// arrived, or says why the connection must close.
    fn apply_frames(
        &self,
        decoder: &TransferDecoder,
        buf: &mut BytesMut,
    ) -> Result<bool, SlaveError> {
        let mut applied = false;
        loop {
            let header = match decoder.decode_header(buf) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(applied),
                Err(e) => return Err(SlaveError::BadFrame(e)),
            };
            let offset = header.offset as u64;
            self.check_offset(offset, header.body_size == 0)?;
            if buf.len() < header.frame_len() {
                return Ok(applied);
            }
            let body = &buf[codec::TRANSFER_HEADER_SIZE..header.frame_len()];
            if !body.is_empty() {
                self.append(offset, body)?;
            }
            applied = true;
            self.record_frame(offset, body.len() as u64);
            buf.advance(header.frame_len());
        }
    }

    fn append(&self, offset: u64, body: &[u8]) -> Result<(), SlaveError> {
        match self.store.append_at_checked(offset, body) {
            Ok(max) => {
                if self.opts.ack_mode == AckMode::Flushed {
                    self.store.request_flush(max);
                }
                Ok(())
            }
            Err(StoreError::DamagedRecord { offset, reason }) => {
                let damage = DamagedRecord { offset, master: self.opts.master_ha.clone(), reason };
                tracing::error!(%damage, "the master sent a damaged record; nothing from it on is stored, the link stops and retries with the refusal backoff");
                self.status_mut().damaged_record = Some(damage.clone());
                Err(SlaveError::DamagedRecord(damage))
            }
            Err(
                e @ (StoreError::CrossesSegment { .. } | StoreError::SegmentSizeMismatch { .. }),
            ) => Err(SlaveError::SegmentSizeMismatch(e)),
            Err(e) => Err(SlaveError::Append(e)),
        }
    }

    /// Counts a valid frame of `len` body bytes at `offset` in the link status and counters.
    fn record_frame(&self, offset: u64, len: u64) {
        self.counters.received_frames.inc();
        self.counters.received_bytes.inc_by(len);
        let mut st = self.status_mut();
        st.frames_received += 1;
        st.bytes_received += len;
        st.last_frame_unix_ms = now_millis();
        if st.damaged_record.as_ref().is_some_and(|d| self.store.dispatched_offset() > d.offset) {
            st.damaged_record = None;
        }
        let seen = offset + len;
        st.master_max_offset =
            Some(if len == 0 { seen } else { st.master_max_offset.unwrap_or(0).max(seen) });
    }

    /// A frame must start exactly at this slave's max offset (an empty store takes the first
    /// data frame's offset; a heartbeat never creates a file).
    fn check_offset(&self, offset: u64, heartbeat: bool) -> Result<(), SlaveError> {
        if self.store.is_empty() {
            let segment_size = self.store.segment_size();
            if !heartbeat && !offset.is_multiple_of(segment_size) {
                return Err(SlaveError::Misaligned { offset, segment_size });
            }
            return Ok(());
        }
        let max = self.store.max_offset();
        if offset == max {
            return Ok(());
        }
        Err(if heartbeat && offset < max {
            SlaveError::MasterBehind { offset, max }
        } else if heartbeat {
            SlaveError::NeedsResync { offset, max }
        } else {
            SlaveError::OffsetMismatch { offset, max }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_the_operator_must_fix_get_the_long_backoff_whenever_they_come() {
        let check = |operator_must_fix| {
            SlaveError::Check(CheckRefusal { reason: "x".into(), operator_must_fix })
        };
        assert_eq!(outcome(&check(true), false), Outcome::Refused);
        assert_eq!(outcome(&check(false), false), Outcome::Failed);
        let behind = SlaveError::MasterBehind { offset: 1, max: 2 };
        assert_eq!(outcome(&behind, true), Outcome::Refused, "after the report too");
        let resync = SlaveError::NeedsResync { offset: 9, max: 2 };
        assert_eq!(outcome(&resync, true), Outcome::Refused);
        let misaligned = SlaveError::Misaligned { offset: 1, segment_size: 4096 };
        assert_eq!(outcome(&misaligned, true), Outcome::Refused);
        let damage = DamagedRecord { offset: 7, master: "m:1".into(), reason: "crc".into() };
        assert_eq!(outcome(&SlaveError::DamagedRecord(damage), true), Outcome::Refused);
        assert_eq!(outcome(&SlaveError::MasterClosed, true), Outcome::Reported);
        assert_eq!(outcome(&SlaveError::MasterClosed, false), Outcome::Failed);
        let refused = SlaveError::Connect {
            master: "m:1".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(outcome(&refused, false), Outcome::Failed);
    }
}
