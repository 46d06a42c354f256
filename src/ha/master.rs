//! The master side of RocketMQ's classic HA protocol: accept slaves, stream the commitlog to
//! each from the offset it reports, take its acks.
//!
//! One owner task per connection, as a reader/writer pair under one cancellation token:
//! - the reader takes the slave's 8-byte reports; the first decides where streaming starts,
//!   later ones are acks (only the last complete value in what was read counts), which the
//!   replica table (`ha::progress`, owned by the [`SyncWaiters`]) checks to be monotonic and
//!   never beyond what this connection was sent; no bytes for the housekeeping interval closes
//!   the connection;
//! - the writer sends frames straight from the mapped files, at most `transfer-batch-size` and
//!   never across a segment file, woken the moment the store's max offset moves (a `watch`, no
//!   polling), and a heartbeat carrying the next offset after `heartbeat-interval` of idleness;
//!   before writing a frame it stores the frame's end in its cursor (one atomic per connection);
//! - a SYNC put pushes its frame from its own task ([`Master::push`]) when the connection's
//!   link is idle, with one non-blocking write, so the frame it waits for does not wait for the
//!   writer's wake-up; the link (`link`, the write half and the next offset under one lock the
//!   writer holds while it writes and a push only tries) keeps the frames one stream, and the
//!   writer sends what a push left unwritten before anything else.
//!
//! The replica table is the only per-replica record (address, first offset, sent, acked, ack
//! time, rate), and it alone decides what is accepted: with each ack the reader hands it the
//! writer's cursor, which it records as the replica's sent offset and checks the ack against, in
//! one step. This module keeps connection bookkeeping (which connection owns a replica id, its
//! cancel token, the writer's cursor, the open-connection count); the status reports the
//! cursor as the sent offset, being newer than the table's copy as of the last ack. Lock
//! order: the connections, then the table; the append clock, then the table. The table never
//! calls back.
//!
//! What counts as one replica is `ha::identity`'s to say: at the first report of a connection,
//! and again when its registration (`Replication.RegisterReplica`, through [`Master::register`])
//! arrives after that report, which moves its table entry to the identity registered. A newer
//! connection of an identity replaces the older one at once: the older one's entry goes, its
//! acks are refused and it is closed. A second live registration of a node name with another
//! data-dir id is refused. An identity keeps its replica id after its connection went (bounded,
//! `progress::HELD_CAP`), so its next connection takes what the table still credits it with
//! (the writer's cursor is handed to the table when a connection goes); under `connection`,
//! where every connection is its own identity, the credit of a connection that went while no
//! other connection from its IP was live is kept (a few per IP) for a new connection from that
//! IP, which takes it only when exactly one kept credit covers its report; a connection live
//! when another went never takes that one's credit. A connection moved by its registration to
//! another identity than the one it was counted as drops the credit it took as that one.
//!
//! A report the master cannot serve (garbage, below its min offset, above its max offset) is
//! answered with one heartbeat carrying the master's boundary, so a slave can tell why, and the
//! connection is closed: it never becomes an ack and never streams over a slave's bytes.
//!
//! Slots: a connection takes one of the `ha.max-connections` slots at its first report (a newer
//! connection of a live replica takes over its slot); a first report while every slot is held by
//! another replica is refused (`limit`). Connections without a report hold no slot: they have their
//! own bound, [`unreported_limit`] (beyond it the oldest connection of the address holding the most
//! of them is closed, `limit`: a flood from one address evicts its own connections, not a slave
//! from another host that has not reported yet), and are closed when no report came within twice
//! the heartbeat interval of the accept (`no_report`; bytes that are not yet a whole report do not
//! extend it). A connection told to close closes in its own task; until the open connections are
//! back within the slots and the unreported bound, the port accepts no more (at most
//! [`CLOSE_WAIT`]), so a flood never holds more sockets than the fd reserve keeps for it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, EmptySlaveStart, ReplicaIdentity};
use crate::ha::codec;
use crate::ha::error::MasterError;
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::identity::{self, Claim, Identity, Resolved};
use crate::ha::progress::{AppendTimes, HELD_CAP, ReplicaId, ReplicaView, StreamStart};
use crate::ha::status::{CloseReason, ReplicaStatus, identity_status, replica_status};
use crate::metrics::HaCounters;
use crate::store::CommitLog;

/// The longest the accept loop waits for connections told to close (a closing connection
/// gives its writer up to 1 s) before it accepts again.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// The master's settings (from `[ha]` and `[replication]`).
#[derive(Debug, Clone)]
pub(crate) struct MasterOptions {
    /// Largest frame body.
    pub(crate) transfer_batch_size: usize,
    /// A heartbeat after this much idleness.
    pub(crate) heartbeat_interval: Duration,
    /// A connection silent this long is closed.
    pub(crate) housekeeping_interval: Duration,
    /// Where a slave reporting 0 starts.
    pub(crate) empty_slave_start: EmptySlaveStart,
    /// What counts as one replica.
    pub(crate) replica_identity: ReplicaIdentity,
    /// Most live replicas (slots) at once; connections without a report have their own bound
    /// ([`unreported_limit`]).
    pub(crate) max_connections: usize,
    /// Allowed slave networks (empty = all).
    pub(crate) allow_list: Vec<ipnet::IpNet>,
    /// A replica is in sync while it lags less than this many bytes
    /// (`replication.max-gap-not-in-sync`).
    pub(crate) max_gap_not_in_sync: u64,
}

impl MasterOptions {
    /// From the `[ha]` and `[replication]` sections.
    pub(crate) fn from_config(c: &Config) -> Self {
        let ha = &c.ha;
        Self {
            transfer_batch_size: ha.transfer_batch_size.0 as usize,
            heartbeat_interval: ha.heartbeat_interval,
            housekeeping_interval: ha.housekeeping_interval,
            empty_slave_start: ha.empty_slave_start,
            replica_identity: ha.replica_identity,
            max_connections: ha.max_connections as usize,
            allow_list: ha.allow_list.clone(),
            max_gap_not_in_sync: c.replication.max_gap_not_in_sync.0,
        }
    }
}

impl Default for MasterOptions {
    /// The configuration's defaults.
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

mod connections;
mod link;

pub(crate) use connections::unreported_limit;
use connections::{Connections, Owner, PAST_PER_IP, evict_from_busiest_ip};
use link::Link;

/// What a registration did, for the slave's link status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registered {
    /// The identity the connection counts as (once it reports, when `matched` is false).
    pub(crate) identity: String,
    /// The replica id in the status, when the connection is streaming already.
    pub(crate) replica_id: Option<ReplicaId>,
    /// Whether a streaming connection had the address; otherwise the claim is held for the
    /// connection's first report.
    pub(crate) matched: bool,
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RegisterError {
    /// A live replica registered the same node name with another data-dir id.
    #[error(
        "node name {node_name:?} is registered by the live replica with data-dir id {live} \
         (at {live_address}); refusing the second claim with data-dir id {claimed}"
    )]
    NameTaken {
        /// The node name.
        node_name: String,
        /// The data-dir id of the live replica.
        live: String,
        /// Its connection's address.
        live_address: SocketAddr,
        /// The refused data-dir id.
        claimed: String,
    },
}

/// The master's data plane.
pub(crate) struct Master {
    store: Arc<CommitLog>,
    opts: MasterOptions,
    waiters: Arc<SyncWaiters>,
    connections: Mutex<Connections>,
    clock: Mutex<AppendTimes>,
    next_conn_id: AtomicU64,
    counters: HaCounters,
    /// Woken when a connection has closed (its `open` count taken back).
    closed_one: tokio::sync::Notify,
    /// The streaming connections' links (`Connections::links`), read by a put's push.
    links: Arc<std::sync::RwLock<Vec<Arc<Link>>>>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master").field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// A connection as its tasks know it.
struct Conn {
    peer: SocketAddr,
    id: u64,
    /// Cancelled when it is the oldest of too many connections without a report.
    evict: CancellationToken,
    /// Its write side, shared by the writer and (once it streams, through its owner entry)
    /// the put path.
    link: Arc<Link>,
}

/// The first report's verdict.
enum Start {
    /// Stream from `offset`, publishing what was sent in `sent`.
    At { offset: u64, sent: Arc<AtomicU64> },
    /// Refuse: send one heartbeat carrying this offset (the master's boundary), then close.
    Refuse(i64),
}

impl Master {
    /// A master over `store`. `waiters` holds the replica table (and the sync waiters of this
    /// master term); `counters` are the data-plane counters to increment.
    pub(crate) fn new(
        store: Arc<CommitLog>,
        opts: MasterOptions,
        waiters: Arc<SyncWaiters>,
        counters: HaCounters,
    ) -> Arc<Self> {
        let mut opts = opts;
        // Config validation keeps these in range; a caller building options by hand cannot
        // make the writer spin on empty frames or overflow the i32 size field.
        opts.transfer_batch_size = opts.transfer_batch_size.clamp(1, codec::MAX_TRANSFER_BODY_SIZE);
        opts.max_connections = opts.max_connections.max(1);
        let connections = Connections::new(&opts);
        Arc::new(Self {
            store,
            waiters,
            links: Arc::clone(&connections.links),
            connections: Mutex::new(connections),
            opts,
            clock: Mutex::default(),
            next_conn_id: AtomicU64::new(1),
            counters,
            closed_one: tokio::sync::Notify::new(),
        })
    }

    fn connections(&self) -> MutexGuard<'_, Connections> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections closed so far, by reason (read from the counters this master increments,
    /// which other data planes of the node may share).
    #[cfg(test)]
    pub(crate) fn closed(&self) -> HashMap<CloseReason, u64> {
        CloseReason::ALL
            .into_iter()
            .map(|reason| (reason, self.counters.closed(reason.as_str()).get()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn count_close(&self, reason: CloseReason) {
        self.counters.closed(reason.as_str()).inc();
    }

    /// Open connections (replicas and connections still waiting for their first report).
    pub(crate) fn connection_count(&self) -> usize {
        self.connections().open
    }

    /// The most connections ever open at once.
    #[cfg(test)]
    pub(crate) fn peak_connection_count(&self) -> usize {
        self.connections().peak_open
    }

    /// The most sockets the HA port holds: the slots and the unreported bound, as the fd
    /// reserve counts them ([`crate::control::conn::fd_reserve`]).
    fn socket_bound(&self) -> usize {
        self.opts.max_connections + unreported_limit(self.opts.max_connections)
    }

    /// Waits until no more than [`Self::socket_bound`] connections are open, at most
    /// [`CLOSE_WAIT`]. An evicted or replaced connection closes in its own task, which a
    /// flood of accepts could outrun: without this wait the port holds more sockets than the
    /// fd reserve keeps for it, and the store runs out of descriptors (EMFILE).
    async fn wait_for_room(&self, cancel: &CancellationToken) {
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        loop {
            let closed = self.closed_one.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            let open = self.connections().open;
            if open <= self.socket_bound() {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = closed => {}
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        open,
                        bound = self.socket_bound(),
                        "HA connections told to close are still open: accepting again"
                    );
                    return;
                }
            }
        }
    }

    /// One entry per live replica, from the replica table.
    pub(crate) fn replicas(&self) -> Vec<ReplicaStatus> {
        let max = self.store.max_offset();
        let now = tokio::time::Instant::now().into_std();
        let wall = SystemTime::now();
        let gap = self.opts.max_gap_not_in_sync;
        // The table's sent offset is as of the replica's last ack; the writer's cursor is newer.
        let owners: HashMap<ReplicaId, (u64, Resolved)> = {
            let conns = self.connections();
            let owner = |o: &Owner| (o.sent.load(Ordering::Acquire), o.resolved.clone());
            conns.owners.iter().map(|(id, o)| (*id, owner(o))).collect()
        };
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let mut views: Vec<ReplicaView> = self.waiters.read_table(|t| t.replicas().collect());
        for v in &mut views {
            if let Some(&(cursor, _)) = owners.get(&v.id) {
                v.sent_offset = Some(v.sent_offset.map_or(cursor, |s| s.max(cursor)));
            }
        }
        views
            .iter()
            .map(|r| {
                let mut st = replica_status(r, max, gap, &clock, now, wall);
                if let Some((_, resolved)) = owners.get(&r.id) {
                    (st.identity, st.node_name) = identity_status(resolved);
                }
                st
            })
            .collect()
    }

    /// Accepts slaves on `listener` until `cancel` fires, then closes every connection and
    /// returns once all are gone.
    pub(crate) async fn run(
        self: Arc<Self>,
        listener: Arc<TcpListener>,
        cancel: CancellationToken,
    ) {
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
            self.counters.connections_opened.inc();
            if let Some(reason) = self.refuse_at_accept(peer) {
                self.count_close(reason);
                tracing::warn!(%peer, reason = reason.as_str(), "HA connection refused");
                drop(stream);
                continue;
            }
            let conn_id = self.next_conn_id.fetch_add(1, Ordering::Relaxed);
            let evict = self.hold_unreported(conn_id, peer);
            let accepted = (peer, conn_id, evict);
            tasks.spawn(Arc::clone(&self).connection(stream, accepted, cancel.child_token()));
            self.wait_for_room(&cancel).await;
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
        let mut conns = self.connections();
        conns.open += 1;
        conns.peak_open = conns.peak_open.max(conns.open);
        None
    }

    /// Records connection `conn_id` from `peer` as one without a report; when that makes more
    /// than [`unreported_limit`], the oldest such connection of the IP holding the most of them
    /// is told to close (the oldest overall among IPs tied for the most). Returns the token that
    /// tells this one.
    fn hold_unreported(&self, conn_id: u64, peer: SocketAddr) -> CancellationToken {
        let evict = CancellationToken::new();
        let limit = unreported_limit(self.opts.max_connections);
        let mut conns = self.connections();
        conns.unreported.insert(conn_id, (peer.ip().to_canonical(), evict.clone()));
        if conns.unreported.len() > limit
            && let Some(victim) = evict_from_busiest_ip(&conns.unreported)
            && let Some((ip, token)) = conns.unreported.remove(&victim)
        {
            tracing::warn!(
                conn_id = victim,
                %ip,
                "too many HA connections without a report: closing the oldest of the address holding the most"
            );
            token.cancel();
        }
        debug_assert!(conns.unreported.len() <= limit);
        evict
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
        (peer, conn_id, evict): (SocketAddr, u64, CancellationToken),
        cancel: CancellationToken,
    ) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY");
        }
        tracing::info!(%peer, conn_id, "HA connection opened");
        let (rd, wr) = stream.into_split();
        let conn = Conn { peer, id: conn_id, evict, link: Arc::new(Link::new(wr)) };
        let (start_tx, start_rx) = oneshot::channel();
        let link = Arc::clone(&conn.link);
        let mut writer = tokio::spawn(Arc::clone(&self).writer(link, start_rx, cancel.clone()));
        let mut started = false;
        let end = tokio::select! {
            r = self.reader(rd, &conn, start_tx, &mut started, &cancel) => r,
            w = &mut writer => w.unwrap_or_else(MasterError::Writer),
        };
        cancel.cancel();
        if !writer.is_finished() {
            // A refused report's hint heartbeat gets a moment to leave.
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
            writer.abort();
        }
        let replaced = self.unregister(started, conn_id);
        let reason = match end.close_reason() {
            CloseReason::Shutdown if replaced => CloseReason::Replaced,
            reason => reason,
        };
        self.count_close(reason);
        // Counted out only once its close reason is counted: whoever sees the connection gone
        // (a test, a scrape) also sees why.
        self.connections().open -= 1;
        self.closed_one.notify_waiters();
        tracing::info!(%peer, conn_id, reason = reason.as_str(), detail = %end, "HA connection closed");
    }

    /// Removes the connection (its `open` count the caller takes back once the close is counted);
    /// returns whether a newer connection had replaced its replica.
    fn unregister(&self, started: bool, conn_id: u64) -> bool {
        let mut conns = self.connections();
        conns.unreported.remove(&conn_id);
        let Some(&id) = conns.by_conn.get(&conn_id) else { return started };
        // Under the connections lock, so a newer connection's events cannot interleave.
        let owner = conns.uninstall(id);
        if let Some(owner) = &owner {
            self.record_sent(id, owner);
        }
        self.waiters.on_disconnect(id);
        if let Some(owner) =
            owner.filter(|o| matches!(o.resolved.identity, Identity::Connection(_)))
        {
            self.hand_over_by_ip(&mut conns, id, owner.peer);
        }
        false
    }

    /// Under `connection`: what connection `id` from `peer` (gone) is credited with is kept for
    /// a new connection from its IP, only when no other connection from that IP is live (two
    /// slaves on one host that overlap would be told apart by nothing: their credit is dropped,
    /// never guessed). A connection that is live now never takes it.
    fn hand_over_by_ip(&self, conns: &mut Connections, id: ReplicaId, peer: SocketAddr) {
        let ip = peer.ip().to_canonical();
        if conns.owners.values().any(|o| o.peer.ip().to_canonical() == ip) {
            return;
        }
        let past = conns.past_by_ip.entry(ip).or_default();
        past.push(id);
        if past.len() > PAST_PER_IP {
            past.remove(0);
        }
        debug_assert!(past.len() <= PAST_PER_IP);
        if conns.past_by_ip.len() > HELD_CAP
            && let Some(oldest) = conns
                .past_by_ip
                .iter()
                .min_by_key(|(_, ids)| ids.last().copied())
                .map(|(&ip, _)| ip)
        {
            conns.past_by_ip.remove(&oldest);
        }
    }

    /// Hands the table what `owner`'s writer has sent (the table learns it with each ack
    /// otherwise), before its entry for `id` goes: what the identity keeps is then up to date.
    fn record_sent(&self, id: ReplicaId, owner: &Owner) {
        if let Err(e) = self.waiters.on_sent(id, owner.sent.load(Ordering::Acquire)) {
            debug_assert!(false, "an owned id has its entry and its cursor only grows: {e}");
        }
    }

    /// Decides where a slave that reported `report` starts.
    fn start_for(&self, report: i64) -> Result<u64, MasterError> {
        let (min, max) = (self.store.min_offset(), self.store.max_offset());
        let seg = self.store.segment_size();
        let Ok(r) = u64::try_from(report) else {
            return Err(MasterError::NegativeReport { report });
        };
        if r == 0 {
            let start = match self.opts.empty_slave_start {
                EmptySlaveStart::LastFile => max - max % seg,
                EmptySlaveStart::Earliest => min,
            };
            return Ok(start.max(min));
        }
        if r > max {
            return Err(MasterError::MasterBehind { report: r, max });
        }
        if r < min {
            return Err(MasterError::BelowMin { report: r, min });
        }
        Ok(r)
    }

    /// Reads the slave's reports until the connection ends: the first starts the stream, the
    /// others are acks. The first must come within twice the heartbeat interval of the accept
    /// (or the housekeeping interval, when shorter), whatever bytes come before it.
    async fn reader(
        &self,
        mut rd: OwnedReadHalf,
        conn: &Conn,
        start_tx: oneshot::Sender<Start>,
        started: &mut bool,
        cancel: &CancellationToken,
    ) -> MasterError {
        let mut buf = BytesMut::with_capacity(1024);
        let mut start_tx = Some(start_tx);
        let housekeeping = self.opts.housekeeping_interval;
        let no_report = 2 * self.opts.heartbeat_interval;
        let mut deadline = tokio::time::Instant::now() + no_report.min(housekeeping);
        loop {
            let read = tokio::select! {
                _ = cancel.cancelled() => return MasterError::Shutdown,
                // Once it reported it holds a slot: an eviction that raced the report is moot.
                _ = conn.evict.cancelled(), if start_tx.is_some() => {
                    return MasterError::Evicted(unreported_limit(self.opts.max_connections));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return if start_tx.is_none() || housekeeping < no_report {
                        MasterError::Silent(housekeeping)
                    } else {
                        MasterError::NoReport(no_report)
                    };
                }
                r = rd.read_buf(&mut buf) => r,
            };
            match read {
                Ok(0) => return MasterError::PeerClosed,
                Err(e) => return MasterError::Read(e),
                Ok(n) => {
                    self.counters.received_bytes.inc_by(n as u64);
                    if start_tx.is_none() {
                        deadline = tokio::time::Instant::now() + housekeeping;
                    }
                }
            }
            let Some((value, used)) = codec::decode_reports(&buf) else { continue };
            buf.advance(used);
            if buf.capacity() > 1 << 20 {
                buf = BytesMut::from(&buf[..]);
            }
            deadline = tokio::time::Instant::now() + housekeeping;
            let result = match start_tx.take() {
                Some(tx) => {
                    self.connections().unreported.remove(&conn.id);
                    self.first_report(value, conn, cancel, tx).map(|_| *started = true)
                }
                None => self.ack(conn.id, value).map(|offset| conn.link.acked(offset)),
            };
            if let Err(e) = result {
                return e;
            }
        }
    }

    /// Registers the replica for a valid first report and tells the writer where to start; a
    /// refusal tells the writer the hint heartbeat (if any) and returns why.
    fn first_report(
        &self,
        value: i64,
        conn: &Conn,
        cancel: &CancellationToken,
        tx: oneshot::Sender<Start>,
    ) -> Result<ReplicaId, MasterError> {
        let peer = conn.peer;
        let registered = self.start_for(value).and_then(|start| {
            let stream = StreamStart { address: peer, report: value as u64, start };
            self.start_stream(stream, conn, cancel).map(|(id, sent)| (id, start, sent))
        });
        match registered {
            Ok((id, start, sent)) => {
                tracing::info!(%peer, replica = id, report = value, start, "slave streaming starts");
                let _ = tx.send(Start::At { offset: start, sent });
                Ok(id)
            }
            Err(e) => {
                if let Some(hint) = e.hint() {
                    let _ = tx.send(Start::Refuse(hint));
                }
                Err(e)
            }
        }
    }

    /// Makes this connection the owner of its identity's replica id and records its stream in
    /// the table; an older connection of the same identity is cancelled.
    fn start_stream(
        &self,
        stream: StreamStart,
        conn: &Conn,
        cancel: &CancellationToken,
    ) -> Result<(ReplicaId, Arc<AtomicU64>), MasterError> {
        let (peer, conn_id) = (stream.address, conn.id);
        let mut conns = self.connections();
        let now = tokio::time::Instant::now().into_std();
        // A claim held since before the first report is checked again: a live replica may
        // have taken its node name meanwhile (the claim is then dropped: the IP rule applies).
        let taken = conns.registry.held_claim(peer).and_then(|c| conns.name_taken(peer, c));
        if let Some(live) = taken {
            tracing::warn!(%peer, live = %live.peer, "a held registration names a node name a live replica holds with another data-dir id; it is dropped");
            conns.registry.forget_held(peer);
        }
        let resolved = conns.registry.resolve(peer, conn_id, now);
        let id = conns.id_of(&resolved.identity).unwrap_or(conn_id);
        if !conns.owners.contains_key(&id) && conns.owners.len() >= self.opts.max_connections {
            return Err(MasterError::Limit(self.opts.max_connections));
        }
        if let Some(old) = conns.owners.get(&id) {
            self.record_sent(id, old);
        }
        let voter = conns.is_voter(&resolved);
        self.waiters.on_stream_start(id, stream, voter).map_err(MasterError::Ack)?;
        if matches!(resolved.identity, Identity::Connection(_))
            && let Some(past) = conns.past_by_ip.get_mut(&peer.ip().to_canonical())
            && let Some(taken) = self.waiters.on_inherit_unique(id, past)
        {
            past.retain(|&p| p != taken);
        }
        let sent = Arc::clone(&conn.link.sent);
        sent.store(stream.start, Ordering::Release);
        let identity = resolved.identity.to_string();
        let (cancel, link) = (cancel.clone(), Arc::clone(&conn.link));
        let owner = Owner { conn_id, peer, resolved, cancel, sent: Arc::clone(&sent), link };
        if let Some(old) = conns.install(id, owner) {
            tracing::info!(%peer, replica = id, %identity, old = %old.peer, "a newer connection replaces this replica's old one");
            old.cancel.cancel();
        }
        Ok((id, sent))
    }

    /// A slave's registration (`Replication.RegisterReplica`): `claim` for its HA connection
    /// from `address`. A streaming connection from that address takes the claim's identity at
    /// once (its entry moves; an older connection of that identity is replaced); otherwise the
    /// claim is held for the first report of the connection from `address`.
    ///
    /// # Errors
    ///
    /// [`RegisterError::NameTaken`] when a live replica registered the claim's node name with
    /// another data-dir id; nothing changes.
    pub(crate) fn register(
        &self,
        address: SocketAddr,
        claim: Claim,
    ) -> Result<Registered, RegisterError> {
        let mut conns = self.connections();
        let at = |o: &Owner| identity::canonical(o.peer) == identity::canonical(address);
        if let Some(live) = conns.name_taken(address, &claim) {
            let live_claim = live.resolved.claim.as_ref().expect("checked above");
            return Err(RegisterError::NameTaken {
                node_name: claim.node_name,
                live: live_claim.data_dir_id.clone(),
                live_address: live.peer,
                claimed: claim.data_dir_id,
            });
        }
        let streaming = conns.owners.iter().find(|(_, o)| at(o)).map(|(id, _)| *id);
        let Some(old_id) = streaming else {
            let now = tokio::time::Instant::now().into_std();
            let identity = conns.registry.claim_preview(address.ip(), &claim);
            conns.registry.hold(address, claim, now);
            return Ok(Registered { identity, replica_id: None, matched: false });
        };
        let mut owner = conns.uninstall(old_id).expect("found above");
        owner.resolved = conns.registry.claim(address.ip(), claim, owner.conn_id);
        let id = conns.id_of(&owner.resolved.identity).unwrap_or(old_id);
        let voter = conns.is_voter(&owner.resolved);
        if id != old_id {
            if let Some(old) = conns.owners.get(&id) {
                self.record_sent(id, old);
            }
            // Under the connections lock, as every change of the table's entries.
            if let Err(e) = self.waiters.on_rekey(old_id, id, voter) {
                debug_assert!(false, "an owned id has its entry: {e}");
            }
        } else {
            self.waiters.mark_voter(id, voter);
        }
        let identity = owner.resolved.identity.to_string();
        tracing::info!(%address, replica = id, %identity, "replica registered");
        if let Some(old) = conns.install(id, owner) {
            tracing::info!(replica = id, %identity, old = %old.peer, "a newer connection replaces this replica's old one");
            old.cancel.cancel();
        }
        Ok(Registered { identity, replica_id: Some(id), matched: true })
    }

    /// Sets the voters by their data-dir ids (None: every replica counts, the rule without a
    /// coordinator): from now on a replica's acks count for SYNC puts and the confirm offset
    /// only when its connection registered the data-dir id of a voter. The node leaves its own
    /// data-dir id out (the master never counts). Waiters the new set satisfies complete.
    pub(crate) fn set_voters(&self, data_dir_ids: Option<std::collections::HashSet<String>>) {
        let mut conns = self.connections();
        conns.voters = data_dir_ids;
        // Under the connections lock, as every change of the table's entries.
        self.waiters.set_voters(conns.voter_ids());
    }

    /// Records an ack with what this connection's writer has sent so far; the replica table
    /// checks that neither goes backwards and that the ack is not beyond what was sent. The
    /// accepted offset.
    fn ack(&self, conn_id: u64, value: i64) -> Result<u64, MasterError> {
        let conns = self.connections();
        let Some((&id, owner)) =
            conns.by_conn.get(&conn_id).and_then(|id| conns.owners.get_key_value(id))
        else {
            return Err(MasterError::Replaced);
        };
        let offset = u64::try_from(value).map_err(|_| MasterError::NegativeAck { value })?;
        let sent = owner.sent.load(Ordering::Acquire);
        self.waiters.on_ack_sent(id, sent, offset).map_err(MasterError::Ack)?;
        Ok(offset)
    }

    async fn writer(
        self: Arc<Self>,
        link: Arc<Link>,
        start_rx: oneshot::Receiver<Start>,
        cancel: CancellationToken,
    ) -> MasterError {
        // Not raced against `cancel`: a refusal's hint must still go out. The reader drops the
        // sender when it stops, which ends this wait.
        let start = start_rx.await;
        let mut st = link.lock().await;
        match start {
            Ok(Start::At { offset, sent }) => {
                link.acked(offset);
                st.stream = Some((offset, sent));
            }
            Ok(Start::Refuse(hint)) => {
                let _ = st.wr.write_all(&codec::encode_heartbeat(hint)).await;
                let _ = st.wr.shutdown().await;
                return MasterError::Refused;
            }
            Err(_) => return MasterError::Shutdown,
        };
        drop(st);
        let Err(e) = self.stream(&link, &cancel).await;
        // No push writes after the writer stopped (a cancelled write may have left part of a
        // frame or heartbeat on the socket).
        link.lock().await.stream = None;
        e
    }

    /// Sends frames from the link's cursor on, and heartbeats when idle, until an error ends
    /// it. A put may have pushed a frame meanwhile ([`Self::push`]): its unwritten end goes
    /// first, and its write error ends the connection.
    async fn stream(
        &self,
        link: &Link,
        cancel: &CancellationToken,
    ) -> Result<std::convert::Infallible, MasterError> {
        let mut max_rx = self.store.subscribe_max_offset();
        let heartbeat = self.opts.heartbeat_interval;
        loop {
            let max = *max_rx.borrow_and_update();
            let mut st = link.lock().await;
            if let Some(e) = st.failed.take() {
                return Err(MasterError::Write(e));
            }
            if let Some(mut rest) = st.rest.take() {
                write(st.wr.write_all_buf(&mut rest), cancel).await?;
                st.last_write = tokio::time::Instant::now();
            }
            let Some((next, _)) = st.stream else {
                debug_assert!(false, "the writer streams only once it started");
                return Err(MasterError::Shutdown);
            };
            if next < max {
                let Some(link::Frame { header, body }) = st
                    .next_frame(&self.store, self.opts.transfer_batch_size)
                    .map_err(MasterError::Store)?
                else {
                    // Nothing readable at `next` although max moved: wait for the next
                    // change rather than spin.
                    drop(st);
                    let _ = max_rx.changed().await;
                    continue;
                };
                let len = body.len() as u64;
                let mut frame = bytes::Buf::chain(&header[..], body);
                write(st.wr.write_all_buf(&mut frame), cancel).await?;
                link::Frame::count(len, &self.counters);
                st.last_write = tokio::time::Instant::now();
                continue;
            }
            let idle_since = st.last_write;
            drop(st);
            tokio::select! {
                _ = cancel.cancelled() => return Err(MasterError::Shutdown),
                r = max_rx.changed() => if r.is_err() { return Err(MasterError::StoreClosed) },
                () = link.kicked() => {}
                _ = tokio::time::sleep_until(idle_since + heartbeat) => {
                    let mut st = link.lock().await;
                    // A push may have written meanwhile, or left work for the loop.
                    if st.rest.is_some() || st.failed.is_some() || st.last_write != idle_since {
                        continue;
                    }
                    let next = st.stream.as_ref().map_or(0, |(next, _)| *next);
                    write(st.wr.write_all(&codec::encode_heartbeat(next as i64)), cancel).await?;
                    self.counters.sent_frames.inc();
                    st.last_write = tokio::time::Instant::now();
                }
            }
        }
    }

    /// Frames pushes wrote on the streaming connections.
    #[cfg(test)]
    pub(crate) fn pushed_frames(&self) -> u64 {
        self.links.read().unwrap_or_else(|e| e.into_inner()).iter().map(|l| l.pushed()).sum()
    }

    /// Pushes what was appended to every replica whose link is idle, from the caller's task
    /// (a SYNC put, right after its append): the frame leaves without waiting for the writer
    /// task's wake-up. Never waits; the writer sends whatever a push did not.
    pub(crate) fn push(&self) {
        let links = self.links.read().unwrap_or_else(|e| e.into_inner());
        for link in links.iter().filter(|l| l.may_push()) {
            link.try_push(&self.store, self.opts.transfer_batch_size, &self.counters);
        }
    }
}

/// One write, raced against `cancel`.
async fn write(
    w: impl std::future::Future<Output = std::io::Result<()>>,
    cancel: &CancellationToken,
) -> Result<(), MasterError> {
    tokio::select! {
        _ = cancel.cancelled() => Err(MasterError::Shutdown),
        w = w => w.map_err(MasterError::Write),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_the_configuration_defaults() {
        let c = Config::default();
        let o = MasterOptions::default();
        assert_eq!(o.transfer_batch_size as u64, c.ha.transfer_batch_size.0);
        assert_eq!(
            (o.heartbeat_interval, o.housekeeping_interval),
            (c.ha.heartbeat_interval, c.ha.housekeeping_interval)
        );
        assert_eq!(o.max_connections as u64, u64::from(c.ha.max_connections));
        assert_eq!(o.max_gap_not_in_sync, c.replication.max_gap_not_in_sync.0);
        let s = crate::ha::slave::SlaveOptions::default();
        assert_eq!(s.read_buffer_size as u64, c.slave.read_buffer_size.0);
        assert_eq!((s.report_interval, s.ack_mode), (c.ha.heartbeat_interval, c.slave.ack_mode));
    }
}
