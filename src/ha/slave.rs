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
use crate::ha::status::{MasterLinkStatus, now_millis};
use crate::store::{CommitLog, Error as StoreError};

/// The slave's settings (from `[slave]` and `[ha]`).
#[derive(Debug, Clone)]
pub struct SlaveOptions {
    /// The master's HA address, host:port.
    pub master_ha: String,
    /// Read buffer; a frame body larger than this minus 12 is refused.
    pub read_buffer_size: usize,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// First reconnect delay (jittered, doubled per failure up to the max).
    pub reconnect_backoff: Duration,
    /// Largest reconnect delay.
    pub reconnect_backoff_max: Duration,
    /// Source address to bind before connecting.
    pub source_address: Option<IpAddr>,
    /// Ack the received (max) offset or the flushed offset.
    pub ack_mode: AckMode,
    /// Report at least this often.
    pub report_interval: Duration,
    /// Close after this long without bytes from the master.
    pub housekeeping_interval: Duration,
}

impl SlaveOptions {
    /// From the configuration.
    pub fn from_config(c: &Config) -> Self {
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

/// A check run before every (re)connect of the data plane: the node compares epoch histories
/// with the master and truncates a divergent tail. `Ok(note)` lets the connection go ahead
/// (the note goes into the link status); `Err(reason)` refuses it (retried after the backoff).
pub type BeforeConnect = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// The slave's data plane.
pub struct Slave {
    store: Arc<CommitLog>,
    opts: SlaveOptions,
    status: Mutex<MasterLinkStatus>,
    before_connect: Option<BeforeConnect>,
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
        reason: String,
        streamed: bool,
    },
}

impl Slave {
    /// A slave writing into `store`.
    pub fn new(store: Arc<CommitLog>, opts: SlaveOptions) -> Arc<Self> {
        Self::with_check(store, opts, None)
    }

    /// A slave that runs `before_connect` before every (re)connect.
    pub fn with_check(
        store: Arc<CommitLog>,
        opts: SlaveOptions,
        before_connect: Option<BeforeConnect>,
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
        Arc::new(Self { store, opts, status: Mutex::new(status), before_connect })
    }

    fn status_mut(&self) -> MutexGuard<'_, MasterLinkStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link to the master, as of now.
    pub fn status(&self) -> MasterLinkStatus {
        self.status_mut().clone()
    }

    /// Connects and streams until `cancel` fires, reconnecting with backoff.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut backoff = self.opts.reconnect_backoff;
        let mut sessions = 0u64;
        loop {
            if sessions > 0 {
                self.status_mut().reconnects += 1;
            }
            sessions += 1;
            let end = self.session(&cancel).await;
            {
                let mut st = self.status_mut();
                st.connected = false;
                if let SessionEnd::Closed { reason, .. } = &end {
                    st.last_error = Some(reason.clone());
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

    async fn connect(&self) -> Result<TcpStream, String> {
        let master = &self.opts.master_ha;
        let addr: SocketAddr = match tokio::net::lookup_host(master).await {
            Ok(mut addrs) => addrs.next().ok_or_else(|| format!("{master}: no address"))?,
            Err(e) => return Err(format!("cannot resolve {master}: {e}")),
        };
        let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }
            .map_err(|e| format!("socket: {e}"))?;
        if let Some(ip) = self.opts.source_address {
            socket
                .bind(SocketAddr::new(ip, 0))
                .map_err(|e| format!("cannot bind source address {ip}: {e}"))?;
        }
        let stream = tokio::time::timeout(self.opts.connect_timeout, socket.connect(addr))
            .await
            .map_err(|_| {
                format!("connect to {master} timed out after {:?}", self.opts.connect_timeout)
            })?
            .map_err(|e| format!("cannot connect to {master}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn ack_value(&self) -> u64 {
        match self.opts.ack_mode {
            AckMode::Received => self.store.max_offset(),
            AckMode::Flushed => self.store.flushed_offset(),
        }
    }

    async fn session(&self, cancel: &CancellationToken) -> SessionEnd {
        let closed = |reason: String, streamed| SessionEnd::Closed { reason, streamed };
        if let Some(check) = &self.before_connect {
            let verdict = tokio::select! {
                _ = cancel.cancelled() => return SessionEnd::Cancelled,
                v = check() => v,
            };
            match verdict {
                Ok(note) => self.status_mut().epoch_check = note,
                Err(reason) => {
                    self.status_mut().epoch_check = reason.clone();
                    return closed(reason, false);
                }
            }
        }
        let stream = tokio::select! {
            _ = cancel.cancelled() => return SessionEnd::Cancelled,
            s = self.connect() => match s { Ok(s) => s, Err(e) => return closed(e, false) },
        };
        if self.opts.ack_mode == AckMode::Flushed {
            // The first report (where the master starts) must be flushed too, so that acks
            // never go backwards.
            let store = Arc::clone(&self.store);
            match tokio::task::spawn_blocking(move || store.flush_blocking()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return closed(format!("flush before connect failed: {e}"), false),
                Err(e) => return closed(format!("flush before connect failed: {e}"), false),
            }
        }
        {
            let mut st = self.status_mut();
            st.connected = true;
            st.address = self.opts.master_ha.clone();
        }
        tracing::info!(master = %self.opts.master_ha, max_offset = self.store.max_offset(), "HA link up");
        let (mut rd, mut wr) = stream.into_split();
        let mut reported = self.ack_value();
        if let Err(e) = wr.write_all(&codec::encode_report(reported as i64)).await {
            return closed(format!("report failed: {e}"), false);
        }
        let decoder = TransferDecoder::new(self.opts.read_buffer_size);
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut flushed_rx = self.store.subscribe_flushed_offset();
        let mut last_read = Instant::now();
        let mut last_report = Instant::now();
        let mut streamed = false;
        loop {
            let housekeeping = last_read + self.opts.housekeeping_interval;
            let report_due = last_report + self.opts.report_interval;
            tokio::select! {
                _ = cancel.cancelled() => return SessionEnd::Cancelled,
                _ = tokio::time::sleep_until(housekeeping) => {
                    return closed(format!("no bytes from the master for {:?}", self.opts.housekeeping_interval), streamed);
                }
                _ = tokio::time::sleep_until(report_due) => {}
                r = flushed_rx.changed(), if self.opts.ack_mode == AckMode::Flushed => {
                    if r.is_err() { return closed("store closed".into(), streamed) }
                }
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => return closed("the master closed the connection".into(), streamed),
                    Err(e) => return closed(format!("read failed: {e}"), streamed),
                    Ok(_) => {
                        last_read = Instant::now();
                        match self.apply_frames(&decoder, &mut buf) {
                            Ok(applied) => streamed |= applied,
                            Err(reason) => return closed(reason, streamed),
                        }
                        if buf.capacity() - buf.len() < 16 * 1024 {
                            buf.reserve(64 * 1024);
                        }
                    }
                },
            }
            let ack = self.ack_value();
            if ack > reported || last_report.elapsed() >= self.opts.report_interval {
                let report = codec::encode_report(ack as i64);
                let write =
                    tokio::time::timeout(self.opts.housekeeping_interval, wr.write_all(&report));
                match write.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return closed(format!("report failed: {e}"), streamed),
                    Err(_) => return closed("report write timed out".into(), streamed),
                }
                reported = ack;
                last_report = Instant::now();
            }
        }
    }

    /// Applies every complete frame in `buf`; returns whether a valid frame (data or heartbeat)
    /// arrived, or why the connection must close.
    fn apply_frames(&self, decoder: &TransferDecoder, buf: &mut BytesMut) -> Result<bool, String> {
        let mut applied = false;
        loop {
            let header = match decoder.decode_header(buf) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(applied),
                Err(e) => return Err(format!("bad frame from the master: {e}")),
            };
            let offset = header.offset as u64;
            self.check_offset(offset, header.body_size == 0)?;
            if buf.len() < header.frame_len() {
                return Ok(applied);
            }
            let body = &buf[codec::TRANSFER_HEADER_SIZE..header.frame_len()];
            if !body.is_empty() {
                match self.store.append_at(offset, body) {
                    Ok(max) => {
                        if self.opts.ack_mode == AckMode::Flushed {
                            self.store.request_flush(max);
                        }
                    }
                    Err(
                        e @ (StoreError::CrossesSegment { .. }
                        | StoreError::SegmentSizeMismatch { .. }),
                    ) => {
                        return Err(format!("segment-size mismatch with the master: {e}"));
                    }
                    Err(e) => return Err(format!("append failed: {e}")),
                }
            }
            applied = true;
            let mut st = self.status_mut();
            st.frames_received += 1;
            st.bytes_received += body.len() as u64;
            st.last_frame_unix_ms = now_millis();
            let seen = offset + body.len() as u64;
            st.master_max_offset = Some(if body.is_empty() {
                seen
            } else {
                st.master_max_offset.unwrap_or(0).max(seen)
            });
            drop(st);
            buf.advance(header.frame_len());
        }
    }

    /// A frame must start exactly at this slave's max offset (an empty store takes the first
    /// data frame's offset; a heartbeat never creates a file).
    fn check_offset(&self, offset: u64, heartbeat: bool) -> Result<(), String> {
        if self.store.is_empty() {
            let seg = self.store.segment_size();
            if !heartbeat && !offset.is_multiple_of(seg) {
                return Err(format!(
                    "first frame at offset {offset} is not a multiple of this slave's segment \
                     size {seg}: segment-size mismatch with the master?"
                ));
            }
            return Ok(());
        }
        let max = self.store.max_offset();
        if offset == max {
            return Ok(());
        }
        Err(if heartbeat && offset < max {
            format!(
                "master is behind this slave: the master's offset is {offset}, this slave holds \
                 up to {max}"
            )
        } else if heartbeat {
            format!(
                "master sent offset {offset} past this slave's max offset {max}: this slave is \
                 below the master's min offset and needs a full resync"
            )
        } else {
            format!("master pushed offset {offset} but this slave's max offset is {max}")
        })
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}
