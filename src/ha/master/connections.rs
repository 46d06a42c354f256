//! The master's connection bookkeeping (`ha::master`): which connection owns which replica id,
//! the identities behind them, and the connections that have not reported yet.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio_util::sync::CancellationToken;

use super::MasterOptions;
use crate::ha::identity::{self, Claim, Identity, Registry, Resolved};
use crate::ha::progress::{HELD_CAP, ReplicaId};

/// The connection that currently owns a replica id (a newer one replaces it).
#[derive(Debug)]
pub(super) struct Owner {
    pub(super) conn_id: u64,
    /// The slave's address of this connection.
    pub(super) peer: SocketAddr,
    /// What the connection counts as, and the registration behind it.
    pub(super) resolved: Resolved,
    pub(super) cancel: CancellationToken,
    /// The writer's cursor: everything below it is being or was sent. Only the link's holder
    /// (the writer, or a put's push) stores it (one atomic store per frame, before the frame is
    /// written); the reader hands it to the replica table with each ack, which records it as
    /// the replica's sent offset and checks the ack against it, in pure code, under the one
    /// lock the ack takes anyway.
    pub(super) sent: Arc<AtomicU64>,
    /// The connection's write side, for a put's push ([`super::Master::push`]).
    pub(super) link: Arc<super::Link>,
}

/// Connection bookkeeping only; what is known of each replica's progress is in the replica table of
/// [`SyncWaiters`](crate::ha::group_transfer::SyncWaiters). A replica id has an owner exactly while
/// the table has its entry, an identity has an id exactly while that id has an owner, and a
/// connection is in `by_conn` exactly while it owns an id (all change under this lock). Lock order:
/// this, then the table.
#[derive(Debug)]
pub(super) struct Connections {
    pub(super) owners: HashMap<ReplicaId, Owner>,
    pub(super) ids: HashMap<Identity, ReplicaId>,
    /// The replica id of each identity (not `connection`) whose connection went, at most
    /// [`HELD_CAP`]: its next connection takes the same id, and with it what the replica
    /// table still credits that id with.
    pub(super) past_ids: HashMap<Identity, ReplicaId>,
    /// Under `connection`, per IP (at most [`HELD_CAP`] IPs), the replica ids of its last
    /// connections (at most [`PAST_PER_IP`], oldest first) that went while no other connection
    /// from that IP was live: a new connection from the IP takes what the table still credits
    /// one of them with, when exactly one's credit covers its report (and it is then removed).
    pub(super) past_by_ip: HashMap<std::net::IpAddr, Vec<ReplicaId>>,
    pub(super) by_conn: HashMap<u64, ReplicaId>,
    pub(super) registry: Registry,
    pub(super) open: usize,
    /// The most `open` ever was (tests check the socket bound with it).
    pub(super) peak_open: usize,
    /// Connections without a first report yet, oldest (lowest id) first, with their peer IP;
    /// cancelling the token closes one (an eviction beyond [`unreported_limit`]).
    pub(super) unreported: std::collections::BTreeMap<u64, (std::net::IpAddr, CancellationToken)>,
    /// The data-dir ids of the voters (None: every replica counts). See [`Self::is_voter`].
    pub(super) voters: Option<HashSet<String>>,
    /// The owners' links, for a put's push without this lock: replaced whenever an owner is
    /// installed or removed (lock order: this, then that).
    pub(super) links: Arc<std::sync::RwLock<Vec<Arc<super::Link>>>>,
}

/// The most gone connections per IP whose credit is kept under `connection` (see
/// [`Connections::past_by_ip`]); beyond it the oldest is forgotten.
pub(super) const PAST_PER_IP: usize = 4;

/// The connection to close among `unreported` (oldest first): the oldest of the IP holding the
/// most entries, ties going to the IP whose oldest entry is oldest. `None` when it is empty.
pub(super) fn evict_from_busiest_ip(
    unreported: &std::collections::BTreeMap<u64, (std::net::IpAddr, CancellationToken)>,
) -> Option<u64> {
    // IP -> (count, its oldest conn id); ids ascend, so the first seen is the oldest.
    let mut per_ip: HashMap<std::net::IpAddr, (usize, u64)> = HashMap::new();
    for (&id, (ip, _)) in unreported {
        per_ip.entry(*ip).or_insert((0, id)).0 += 1;
    }
    per_ip.into_values().max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1))).map(|(_, oldest)| oldest)
}

/// The most connections without a first report held at once, apart from the slots of live
/// replicas: twice `ha.max-connections`, at least 16. With the slots, the HA port holds at most
/// `max_connections + unreported_limit(max_connections)` sockets.
pub(crate) fn unreported_limit(max_connections: usize) -> usize {
    (2 * max_connections).max(16)
}

impl Connections {
    /// The live replica that registered `claim`'s node name with another data-dir id from
    /// another address than `address`, if any (the claim is then refused).
    pub(super) fn name_taken(&self, address: SocketAddr, claim: &Claim) -> Option<&Owner> {
        let at = |o: &Owner| identity::canonical(o.peer) == identity::canonical(address);
        self.owners.values().find(|o| {
            o.resolved.registered
                && !at(o)
                && o.resolved.claim.as_ref().is_some_and(|c| {
                    c.node_name == claim.node_name && c.data_dir_id != claim.data_dir_id
                })
        })
    }

    pub(super) fn new(opts: &MasterOptions) -> Self {
        Self {
            owners: HashMap::new(),
            ids: HashMap::new(),
            past_ids: HashMap::new(),
            past_by_ip: HashMap::new(),
            by_conn: HashMap::new(),
            registry: Registry::new(
                opts.replica_identity,
                2 * opts.max_connections,
                opts.housekeeping_interval,
            ),
            open: 0,
            peak_open: 0,
            unreported: std::collections::BTreeMap::new(),
            voters: None,
            links: Arc::default(),
        }
    }

    /// Publishes the owners' links for [`super::Master::push`].
    fn publish_links(&self) {
        let links = self.owners.values().map(|o| Arc::clone(&o.link)).collect();
        *self.links.write().unwrap_or_else(|e| e.into_inner()) = links;
    }

    /// Whether a connection resolved as `r` counts for acks: always without a voter set, else
    /// only when its own registration named the data-dir id of a voter (a connection counted
    /// by its IP, or as the identity registered from its IP, never does).
    pub(super) fn is_voter(&self, r: &Resolved) -> bool {
        match (&self.voters, &r.identity) {
            (None, _) => true,
            (Some(v), Identity::DataDir(id)) => r.registered && v.contains(id),
            (Some(_), _) => false,
        }
    }

    /// The replica ids of the live owners that are voters (None without a voter set).
    pub(super) fn voter_ids(&self) -> Option<BTreeSet<ReplicaId>> {
        self.voters.as_ref()?;
        Some(
            self.owners
                .iter()
                .filter(|(_, o)| self.is_voter(&o.resolved))
                .map(|(id, _)| *id)
                .collect(),
        )
    }

    /// Makes `owner` the owner of `id` under `identity`; returns the owner it replaced.
    pub(super) fn install(&mut self, id: ReplicaId, owner: Owner) -> Option<Owner> {
        self.past_ids.remove(&owner.resolved.identity);
        self.ids.insert(owner.resolved.identity.clone(), id);
        self.by_conn.insert(owner.conn_id, id);
        let old = self.owners.insert(id, owner);
        if let Some(old) = &old {
            self.by_conn.remove(&old.conn_id);
        }
        debug_assert!(self.owners.len() == self.ids.len() && self.ids.len() == self.by_conn.len());
        self.publish_links();
        old
    }

    /// The replica id of `identity`: its live connection's, or its last one's.
    pub(super) fn id_of(&self, identity: &Identity) -> Option<ReplicaId> {
        self.ids.get(identity).or_else(|| self.past_ids.get(identity)).copied()
    }

    /// Removes the owner of `id`.
    pub(super) fn uninstall(&mut self, id: ReplicaId) -> Option<Owner> {
        let owner = self.owners.remove(&id)?;
        if self.ids.get(&owner.resolved.identity) == Some(&id) {
            self.ids.remove(&owner.resolved.identity);
            if !matches!(owner.resolved.identity, Identity::Connection(_)) {
                self.past_ids.insert(owner.resolved.identity.clone(), id);
            }
            if self.past_ids.len() > HELD_CAP
                && let Some(oldest) = self.past_ids.iter().min_by_key(|(_, id)| **id)
            {
                let oldest = oldest.0.clone();
                self.past_ids.remove(&oldest);
            }
        }
        self.by_conn.remove(&owner.conn_id);
        self.publish_links();
        Some(owner)
    }
}
