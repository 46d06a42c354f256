//! The master side of RocketMQ's classic HA protocol: accept slaves, stream the commitlog to
//! each from the offset it reports, take its acks.
//!
//! One owner task per connection, as a reader/writer pair under one cancellation token:
//! - the reader takes the slave's 8-byte reports; the first decides where streaming starts,
//!   later ones are acks (only the last complete value in what was read counts), checked to be
//!   monotonic and never beyond what this connection was sent; no bytes for the housekeeping
//!   interval closes the connection;
//! - the writer sends frames straight from the mapped files, at most `transfer-batch-size` and
//!   never across a segment file, woken the moment the store's max offset moves (a `watch`, no
//!   polling), and a heartbeat carrying the next offset after `heartbeat-interval` of idleness.
//!
//! A report the master cannot serve (garbage, below its min offset, above its max offset) is
//! answered with one heartbeat carrying the master's boundary, so a slave can tell why, and the
//! connection is closed: it never becomes an ack and never streams over a slave's bytes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{EmptySlaveStart, HaConfig, ReplicaIdentity};
use crate::ha::codec;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::progress::AppendTimes;
use crate::ha::status::{CloseReason, ReplicaStatus, unix_millis};
use crate::store::CommitLog;

/// The master's settings (from `[ha]`).
#[derive(Debug, Clone)]
pub struct MasterOptions {
    /// Largest frame body.
    pub transfer_batch_size: usize,
    /// A heartbeat after this much idleness.
    pub heartbeat_interval: Duration,
    /// A connection silent this long is closed.
    pub housekeeping_interval: Duration,
    /// Where a slave reporting 0 starts.
    pub empty_slave_start: EmptySlaveStart,
    /// What counts as one replica.
    pub replica_identity: ReplicaIdentity,
    /// Most connections at once.
    pub max_connections: usize,
    /// Allowed slave networks (empty = all).
    pub allow_list: Vec<ipnet::IpNet>,
}

impl MasterOptions {
    /// From the `[ha]` section.
    pub fn from_config(c: &HaConfig) -> Self {
        Self {
            transfer_batch_size: c.transfer_batch_size.0 as usize,
            heartbeat_interval: c.heartbeat_interval,
            housekeeping_interval: c.housekeeping_interval,
            empty_slave_start: c.empty_slave_start,
            replica_identity: c.replica_identity,
            max_connections: c.max_connections as usize,
            allow_list: c.allow_list.clone(),
        }
    }
}

impl Default for MasterOptions {
    fn default() -> Self {
        Self::from_config(&HaConfig::default())
    }
}

/// What the master tells the replication bookkeeping (the sync waiters) about replicas.
pub trait ReplicaEvents: Send + Sync + 'static {
    /// A replica started streaming at `first_offset` (its first report).
    fn connected(&self, replica: u64, first_offset: u64);
    /// A replica acknowledged everything below `offset`.
    fn acked(&self, replica: u64, offset: u64);
    /// A replica's connection closed: its ack stops counting.
    fn disconnected(&self, replica: u64);
}

impl ReplicaEvents for SyncWaiters {
    fn connected(&self, replica: u64, first_offset: u64) {
        self.on_connect(replica, first_offset);
    }
    fn acked(&self, replica: u64, offset: u64) {
        // The master validated the ack against this connection; the table agrees by design.
        if let Err(e) = self.on_ack(replica, offset) {
            tracing::error!(replica, offset, error = %e, "ack table refused a validated ack");
        }
    }
    fn disconnected(&self, replica: u64) {
        self.on_disconnect(replica);
    }
}

struct NoEvents;
impl ReplicaEvents for NoEvents {
    fn connected(&self, _: u64, _: u64) {}
    fn acked(&self, _: u64, _: u64) {}
    fn disconnected(&self, _: u64) {}
}

#[derive(Debug)]
struct Replica {
    conn_id: u64,
    address: SocketAddr,
    first_offset: u64,
    ack: u64,
    sent: Arc<AtomicU64>,
    last_ack: Option<SystemTime>,
    connected_since: SystemTime,
    cancel: CancellationToken,
    rate_window: (Instant, u64),
    bytes_per_sec: f64,
}

#[derive(Debug, Default)]
struct Registry {
    replicas: HashMap<u64, Replica>,
    by_ip: HashMap<IpAddr, u64>,
    connections: usize,
}

/// Counters of the data plane (metrics read them).
#[derive(Debug, Default)]
pub struct MasterCounters {
    /// Connections accepted (including ones refused right away).
    pub accepted: AtomicU64,
    /// Frames sent, heartbeats included.
    pub frames_sent: AtomicU64,
    /// Body bytes sent.
    pub bytes_sent: AtomicU64,
    /// Report bytes received.
    pub bytes_received: AtomicU64,
    closed: Mutex<HashMap<CloseReason, u64>>,
}

impl MasterCounters {
    /// Connections closed, by reason.
    pub fn closed(&self) -> HashMap<CloseReason, u64> {
        self.closed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn count_close(&self, reason: CloseReason) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
    }
}

/// The master's data plane.
pub struct Master {
    store: Arc<CommitLog>,
    opts: MasterOptions,
    events: Arc<dyn ReplicaEvents>,
    registry: Mutex<Registry>,
    clock: Mutex<AppendTimes>,
    next_conn_id: AtomicU64,
    counters: MasterCounters,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master").field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// The first report's verdict.
enum Start {
    At(u64),
    /// Refuse: send one heartbeat carrying this offset (the master's boundary), then close.
    Refuse(i64),
}

impl Master {
    /// A master over `store`; `events` hears about replicas (pass `None` for no bookkeeping).
    pub fn new(
        store: Arc<CommitLog>,
        opts: MasterOptions,
        events: Option<Arc<dyn ReplicaEvents>>,
    ) -> Arc<Self> {
        let mut opts = opts;
        // Config validation keeps these in range; a caller building options by hand cannot
        // make the writer spin on empty frames or overflow the i32 size field.
        opts.transfer_batch_size = opts.transfer_batch_size.clamp(1, codec::MAX_TRANSFER_BODY_SIZE);
        opts.max_connections = opts.max_connections.max(1);
        Arc::new(Self {
            store,
            opts,
            events: events.unwrap_or_else(|| Arc::new(NoEvents)),
            registry: Mutex::default(),
            clock: Mutex::default(),
            next_conn_id: AtomicU64::new(1),
            counters: MasterCounters::default(),
        })
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The data-plane counters.
    pub fn counters(&self) -> &MasterCounters {
        &self.counters
    }

    /// Open connections (replicas and connections still waiting for their first report).
    pub fn connection_count(&self) -> usize {
        self.registry().connections
    }

    /// One entry per live replica.
    pub fn replicas(&self) -> Vec<ReplicaStatus> {
        let max = self.store.max_offset();
        let now = Instant::now();
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = self
            .registry()
            .replicas
            .iter()
            .map(|(id, r)| ReplicaStatus {
                id: *id,
                address: r.address,
                first_offset: r.first_offset,
                ack_offset: r.ack,
                sent_offset: r.sent.load(Ordering::Acquire),
                lag_bytes: max.saturating_sub(r.ack),
                lag_millis: if r.ack >= max { 0 } else { clock.lag_ms(r.ack, now) },
                last_ack_unix_ms: r.last_ack.map_or(0, unix_millis),
                bytes_per_sec: r.bytes_per_sec,
                connected_since_unix_ms: unix_millis(r.connected_since),
            })
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }

    /// Accepts slaves on `listener` until `cancel` fires, then closes every connection and
    /// returns once all are gone.
    pub async fn run(self: Arc<Self>, listener: TcpListener, cancel: CancellationToken) {
        let tasks = TaskTracker::new();
        tasks.spawn(Arc::clone(&self).track_appends(cancel.clone()));
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => break,
                a = listener.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "HA accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            self.counters.accepted.fetch_add(1, Ordering::Relaxed);
            if let Some(reason) = self.refuse_at_accept(peer) {
                self.counters.count_close(reason);
                tracing::warn!(%peer, reason = reason.as_str(), "HA connection refused");
                drop(stream);
                continue;
            }
            let conn_id = self.next_conn_id.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(Arc::clone(&self).connection(stream, peer, conn_id, cancel.child_token()));
        }
        tasks.close();
        tasks.wait().await;
    }

    fn refuse_at_accept(&self, peer: SocketAddr) -> Option<CloseReason> {
        let ip = peer.ip().to_canonical();
        if !self.opts.allow_list.is_empty() && !self.opts.allow_list.iter().any(|n| n.contains(&ip))
        {
            return Some(CloseReason::AllowList);
        }
        let mut reg = self.registry();
        if reg.connections >= self.opts.max_connections {
            return Some(CloseReason::Limit);
        }
        reg.connections += 1;
        None
    }

    /// Remembers when each new max offset appeared (for lag in time).
    async fn track_appends(self: Arc<Self>, cancel: CancellationToken) {
        let mut rx = self.store.subscribe_max_offset();
        loop {
            let max = *rx.borrow_and_update();
            self.clock.lock().unwrap_or_else(|e| e.into_inner()).record(max, Instant::now());
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        conn_id: u64,
        cancel: CancellationToken,
    ) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY");
        }
        tracing::info!(%peer, conn_id, "HA connection opened");
        let (rd, wr) = stream.into_split();
        let sent = Arc::new(AtomicU64::new(0));
        let (start_tx, start_rx) = oneshot::channel();
        let mut writer =
            tokio::spawn(Arc::clone(&self).writer(wr, start_rx, Arc::clone(&sent), cancel.clone()));
        let mut replica = None;
        let (reason, detail) = tokio::select! {
            r = self.reader(rd, peer, conn_id, start_tx, &sent, &mut replica, &cancel) => r,
            w = &mut writer => w.unwrap_or((CloseReason::PeerClosed, "writer task failed".into())),
        };
        cancel.cancel();
        if !writer.is_finished() {
            // A refused report's hint heartbeat gets a moment to leave.
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
            writer.abort();
        }
        let replaced = self.unregister(replica, conn_id);
        let reason = if replaced && reason == CloseReason::Shutdown {
            CloseReason::Replaced
        } else {
            reason
        };
        self.counters.count_close(reason);
        tracing::info!(%peer, conn_id, reason = reason.as_str(), %detail, "HA connection closed");
    }

    /// Removes the connection; returns whether a newer connection had replaced its replica.
    fn unregister(&self, replica: Option<u64>, conn_id: u64) -> bool {
        let mut reg = self.registry();
        reg.connections -= 1;
        let Some(id) = replica else { return false };
        if reg.replicas.get(&id).is_some_and(|r| r.conn_id == conn_id) {
            let r = reg.replicas.remove(&id).expect("checked above");
            let ip = r.address.ip().to_canonical();
            if reg.by_ip.get(&ip) == Some(&id) {
                reg.by_ip.remove(&ip);
            }
            // Under the registry lock, so a newer connection's events cannot interleave
            // (lock order: registry, then the ack table; the table never calls back).
            self.events.disconnected(id);
            return false;
        }
        true
    }

    /// Decides where a slave that reported `report` starts; a refusal carries the boundary
    /// offset for the hint heartbeat (none for garbage) and the reason.
    fn start_for(&self, report: i64) -> Result<u64, (Option<i64>, String)> {
        let (min, max) = (self.store.min_offset(), self.store.max_offset());
        let seg = self.store.segment_size();
        let Ok(r) = u64::try_from(report) else {
            return Err((None, format!("negative report {report}: not a slave")));
        };
        if r == 0 {
            let start = match self.opts.empty_slave_start {
                EmptySlaveStart::LastFile => max - max % seg,
                EmptySlaveStart::Earliest => min,
            };
            return Ok(start.max(min));
        }
        if r > max {
            return Err((
                Some(max as i64),
                format!(
                    "slave reports offset {r} but the master's max offset is {max}: the master \
                     is behind its slave (or this is not a slave); refusing to stream over the \
                     slave's bytes"
                ),
            ));
        }
        if r < min {
            return Err((
                Some(min as i64),
                format!(
                    "slave reports offset {r} below the master's min offset {min}: it needs a \
                     full resync (wipe its store)"
                ),
            ));
        }
        Ok(r)
    }

    #[allow(clippy::too_many_arguments)]
    async fn reader(
        &self,
        mut rd: OwnedReadHalf,
        peer: SocketAddr,
        conn_id: u64,
        start_tx: oneshot::Sender<Start>,
        sent: &Arc<AtomicU64>,
        replica: &mut Option<u64>,
        cancel: &CancellationToken,
    ) -> (CloseReason, String) {
        let mut buf = BytesMut::with_capacity(1024);
        let mut start_tx = Some(start_tx);
        let housekeeping = self.opts.housekeeping_interval;
        let mut deadline = tokio::time::Instant::now() + housekeeping;
        loop {
            let read = tokio::select! {
                _ = cancel.cancelled() => return (CloseReason::Shutdown, String::new()),
                _ = tokio::time::sleep_until(deadline) => {
                    return (CloseReason::Housekeeping, format!("nothing from the slave for {housekeeping:?}"));
                }
                r = rd.read_buf(&mut buf) => r,
            };
            match read {
                Ok(0) => return (CloseReason::PeerClosed, "slave closed the connection".into()),
                Err(e) => return (CloseReason::PeerClosed, e.to_string()),
                Ok(n) => {
                    self.counters.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                    deadline = tokio::time::Instant::now() + housekeeping;
                }
            }
            let Some((value, used)) = codec::decode_reports(&buf) else { continue };
            buf.advance(used);
            if buf.capacity() > 1 << 20 {
                buf = BytesMut::from(&buf[..]);
            }
            if let Some(tx) = start_tx.take() {
                match self.first_report(value, peer, conn_id, sent, cancel) {
                    Ok((id, start)) => {
                        *replica = Some(id);
                        let _ = tx.send(Start::At(start));
                    }
                    Err((hint, why)) => {
                        if let Some(hint) = hint {
                            let _ = tx.send(Start::Refuse(hint));
                        }
                        return (CloseReason::BadReport, why);
                    }
                }
                continue;
            }
            if let Err(why) =
                self.ack(replica.expect("registered at the first report"), conn_id, value, sent)
            {
                return (CloseReason::BadAck, why);
            }
        }
    }

    /// Registers the replica for a valid first report; else the hint heartbeat and the reason.
    fn first_report(
        &self,
        value: i64,
        peer: SocketAddr,
        conn_id: u64,
        sent: &Arc<AtomicU64>,
        cancel: &CancellationToken,
    ) -> Result<(u64, u64), (Option<i64>, String)> {
        let start = self.start_for(value)?;
        sent.store(start, Ordering::Release);
        let report = value as u64;
        let id;
        {
            let mut reg = self.registry();
            id = match self.opts.replica_identity {
                ReplicaIdentity::Connection => conn_id,
                ReplicaIdentity::Ip => {
                    *reg.by_ip.entry(peer.ip().to_canonical()).or_insert(conn_id)
                }
            };
            if let Some(old) = reg.replicas.remove(&id) {
                tracing::info!(%peer, replica = id, "a newer connection replaces this replica's old one");
                old.cancel.cancel();
                self.events.disconnected(id);
            }
            let now = SystemTime::now();
            reg.replicas.insert(
                id,
                Replica {
                    conn_id,
                    address: peer,
                    first_offset: start,
                    ack: report,
                    sent: Arc::clone(sent),
                    last_ack: None,
                    connected_since: now,
                    cancel: cancel.clone(),
                    rate_window: (Instant::now(), report),
                    bytes_per_sec: 0.0,
                },
            );
            self.events.connected(id, report);
        }
        tracing::info!(%peer, replica = id, report = value, start, "slave streaming starts");
        Ok((id, start))
    }

    /// Records an ack after checking it is monotonic and not beyond what was sent.
    fn ack(&self, id: u64, conn_id: u64, value: i64, sent: &AtomicU64) -> Result<(), String> {
        let mut reg = self.registry();
        let Some(r) = reg.replicas.get_mut(&id).filter(|r| r.conn_id == conn_id) else {
            return Err("replaced by a newer connection".into());
        };
        let sent = sent.load(Ordering::Acquire);
        let Ok(v) = u64::try_from(value) else {
            return Err(format!("negative ack {value}"));
        };
        if v < r.ack {
            return Err(format!("ack went backwards from {} to {v}", r.ack));
        }
        if v > sent.max(r.ack) {
            return Err(format!("ack {v} is beyond what this connection was sent ({sent})"));
        }
        let now = Instant::now();
        r.ack = v;
        r.last_ack = Some(SystemTime::now());
        let (since, from) = r.rate_window;
        let elapsed = now.duration_since(since);
        if elapsed >= Duration::from_secs(1) {
            r.bytes_per_sec = (v - from) as f64 / elapsed.as_secs_f64();
            r.rate_window = (now, v);
        }
        self.events.acked(id, v);
        Ok(())
    }

    async fn writer(
        self: Arc<Self>,
        mut wr: OwnedWriteHalf,
        start_rx: oneshot::Receiver<Start>,
        sent: Arc<AtomicU64>,
        cancel: CancellationToken,
    ) -> (CloseReason, String) {
        // Not raced against `cancel`: a refusal's hint must still go out. The reader drops the
        // sender when it stops, which ends this wait.
        let mut next = match start_rx.await {
            Ok(Start::At(s)) => s,
            Ok(Start::Refuse(hint)) => {
                let _ = wr.write_all(&codec::encode_heartbeat(hint)).await;
                let _ = wr.shutdown().await;
                return (CloseReason::BadReport, "refused".into());
            }
            Err(_) => return (CloseReason::Shutdown, String::new()),
        };
        let mut max_rx = self.store.subscribe_max_offset();
        let heartbeat = self.opts.heartbeat_interval;
        let mut last_write = tokio::time::Instant::now();
        loop {
            let max = *max_rx.borrow_and_update();
            if next < max {
                let chunk = match self.store.read(next, self.opts.transfer_batch_size) {
                    Ok(Some(c)) => c,
                    Ok(None) => {
                        // Nothing readable at `next` although max moved: wait for the next
                        // change rather than spin.
                        let _ = max_rx.changed().await;
                        continue;
                    }
                    Err(e) => return (CloseReason::OffsetDeleted, e.to_string()),
                };
                let len = chunk.len();
                sent.store(next + len as u64, Ordering::Release);
                let header = codec::encode_transfer_header(next as i64, len as i32);
                let mut frame = bytes::Buf::chain(&header[..], chunk);
                let w = tokio::select! {
                    _ = cancel.cancelled() => return (CloseReason::Shutdown, String::new()),
                    w = wr.write_all_buf(&mut frame) => w,
                };
                if let Err(e) = w {
                    return (CloseReason::PeerClosed, format!("write failed: {e}"));
                }
                next += len as u64;
                self.counters.frames_sent.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_sent.fetch_add(len as u64, Ordering::Relaxed);
                last_write = tokio::time::Instant::now();
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => return (CloseReason::Shutdown, String::new()),
                r = max_rx.changed() => if r.is_err() { return (CloseReason::Shutdown, "store closed".into()) },
                _ = tokio::time::sleep_until(last_write + heartbeat) => {
                    let hb = codec::encode_heartbeat(next as i64);
                    let w = tokio::select! {
                        _ = cancel.cancelled() => return (CloseReason::Shutdown, String::new()),
                        w = wr.write_all(&hb) => w,
                    };
                    if let Err(e) = w {
                        return (CloseReason::PeerClosed, format!("write failed: {e}"));
                    }
                    self.counters.frames_sent.fetch_add(1, Ordering::Relaxed);
                    last_write = tokio::time::Instant::now();
                }
            }
        }
    }
}

/// Binds the HA listener (port 0 = OS-assigned).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
