//! The slave side of RocketMQ's classic HA protocol: connect to the master, report the local
//! max offset, apply the frames it sends at exactly their offsets, ack, reconnect.
//!
//! Unlike upstream, the slave reports at once on connect (upstream may wait 5 s), after every
//! batch of applied frames, and every `heartbeat-interval`; a failed append is fatal for the
//! connection and surfaced in the link status (upstream ignores it); a frame larger than the read
//! buffer is an error, not a livelock.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{AckMode, Config};
use crate::ha::codec::{self, TransferDecoder};
use crate::ha::error::SlaveError;
use crate::ha::status::{MasterLinkStatus, now_millis};
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
    /// First reconnect delay (jittered, doubled per failure up to the max).
    pub(crate) reconnect_backoff: Duration,
    /// Largest reconnect delay.
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

/// A check run before every (re)connect of the data plane: the node compares epoch histories
/// with the master and truncates a divergent tail. `Ok(note)` lets the connection go ahead
/// (the note goes into the link status); `Err(reason)` refuses it (retried after the backoff).
pub(crate) type BeforeConnect = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// The slave's data plane.
pub(crate) struct Slave {
    store: Arc<CommitLog>,
    opts: SlaveOptions,
    status: Mutex<MasterLinkStatus>,
    before_connect: Option<BeforeConnect>,
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
    /// Closed; `streamed` says whether frames were applied (resets the backoff).
    Closed {
        reason: SlaveError,
        streamed: bool,
    },
}

impl SessionEnd {
    fn closed(reason: SlaveError, streamed: bool) -> Self {
        Self::Closed { reason, streamed }
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
        Self::with_check(store, opts, None, counters)
    }

    /// A slave that runs `before_connect` before every (re)connect.
    pub(crate) fn with_check(
        store: Arc<CommitLog>,
        opts: SlaveOptions,
        before_connect: Option<BeforeConnect>,
        counters: HaCounters,
    ) -> Arc<Self> {
        let status = MasterLinkStatus {
            address: opts.master_ha.clone(),
            epoch_check: if before_connect.is_some() {
                String::new()
            } else {
                "classic mode: epochs not checked".into()
            },
            ..Default::default()
        };
        Arc::new(Self { store, opts, status: Mutex::new(status), before_connect, counters })
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
        let mut backoff = self.opts.reconnect_backoff;
        let mut sessions = 0u64;
        loop {
            if sessions > 0 {
                self.status_mut().reconnects += 1;
                self.counters.slave_reconnects.inc();
            }
            sessions += 1;
            let end = self.session(&cancel).await;
            {
                let mut st = self.status_mut();
                st.connected = false;
                if let SessionEnd::Closed { reason, .. } = &end {
                    st.last_error = Some(reason.to_string());
                }
            }
            match end {
                SessionEnd::Cancelled => return,
                SessionEnd::Closed { reason, streamed } => {
                    tracing::warn!(master = %self.opts.master_ha, %reason, "HA link closed");
                    if streamed {
                        backoff = self.opts.reconnect_backoff;
                    }
                }
            }
            let delay = jitter(backoff);
            backoff = (backoff * 2).min(self.opts.reconnect_backoff_max);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
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
        let stream = tokio::select! {
            _ = cancel.cancelled() => return SessionEnd::Cancelled,
            s = self.open() => match s {
                Ok(s) => s,
                Err(e) => return SessionEnd::closed(e, false),
            },
        };
        tracing::info!(master = %self.opts.master_ha, max_offset = self.store.max_offset(), "HA link up");
        let (rd, mut wr) = stream.into_split();
        let reported = self.ack_value();
        if let Err(e) = wr.write_all(&codec::encode_report(reported as i64)).await {
            return SessionEnd::closed(SlaveError::Report(e), false);
        }
        self.follow(rd, wr, reported, cancel).await
    }

    /// Runs the check before connecting, connects, and (ack mode `flushed`) flushes so the
    /// first report is durable; marks the link up.
    async fn open(&self) -> Result<TcpStream, SlaveError> {
        if let Some(check) = &self.before_connect {
            match check().await {
                Ok(note) => self.status_mut().epoch_check = note,
                Err(reason) => {
                    self.status_mut().epoch_check = reason.clone();
                    return Err(SlaveError::Check(reason));
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
        Ok(stream)
    }

    /// Applies frames and reports progress until the connection ends.
    async fn follow(
        &self,
        mut rd: tokio::net::tcp::OwnedReadHalf,
        mut wr: tokio::net::tcp::OwnedWriteHalf,
        mut reported: u64,
        cancel: &CancellationToken,
    ) -> SessionEnd {
        let decoder = TransferDecoder::new(self.opts.read_buffer_size);
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut flushed_rx = self.store.subscribe_flushed_offset();
        let mut last_read = Instant::now();
        let mut last_report = Instant::now();
        let mut streamed = false;
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
                        self.apply_frames(&decoder, &mut buf).map(|applied| streamed |= applied)
                    }
                },
            };
            if let Err(e) = read {
                return SessionEnd::closed(e, streamed);
            }
            if buf.capacity() - buf.len() < 16 * 1024 {
                buf.reserve(64 * 1024);
            }
            let ack = self.ack_value();
            if ack > reported || last_report.elapsed() >= self.opts.report_interval {
                if let Err(e) = self.report(&mut wr, ack).await {
                    return SessionEnd::closed(e, streamed);
                }
                reported = ack;
                last_report = Instant::now();
            }
        }
    }

    /// Writes one report, bounded by the housekeeping interval.
    async fn report(
        &self,
        wr: &mut tokio::net::tcp::OwnedWriteHalf,
        ack: u64,
    ) -> Result<(), SlaveError> {
        let report = codec::encode_report(ack as i64);
        match tokio::time::timeout(self.opts.housekeeping_interval, wr.write_all(&report)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SlaveError::Report(e)),
            Err(_) => Err(SlaveError::ReportTimeout),
        }
    }

    /// Applies every complete frame in `buf`; returns whether a valid frame (data or heartbeat)
    /// arrived, or why the connection must close.
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
        match self.store.append_at(offset, body) {
            Ok(max) => {
                if self.opts.ack_mode == AckMode::Flushed {
                    self.store.request_flush(max);
                }
                Ok(())
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

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}
