//! Who a replica is (`ha.replica-identity`), as pure bookkeeping: the master's connection
//! owner (`ha::master`) asks it, under its connections lock, what identity a connection has;
//! the replica table counts one entry per identity.
//!
//! With `registered` (the default): an hasync slave registers (`Replication.RegisterReplica`)
//! its data-dir id, its node name and the local address of its HA connection. The master
//! matches that address with the peer address of a connection it accepted:
//!
//! - a connection whose registration matched is the identity `data-dir <id>`, whether the
//!   registration arrived before its first report ([`Registry::hold`], then
//!   [`Registry::resolve`]) or after it ([`Registry::claim`]);
//! - an unregistered connection from an IP that a registration matched before counts as the
//!   identity last registered from that IP (a slave whose registration failed, or has not
//!   arrived yet, must not count beside its own older connection);
//! - any other unregistered connection (a stock Java slave, or a registration that cannot
//!   match behind NAT or a proxy) is the identity `ip <address>`.
//!
//! With `ip` every connection is `ip <address>`, with `connection` (upstream's) each connection
//! is its own identity; registrations then only name the connection in the status.
//!
//! Bounded: claims held for connections not seen yet expire after a time to live and at most
//! `capacity` are held (the oldest goes first); the IP map grows only with registrations that
//! matched an accepted connection.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::config::ReplicaIdentity;

/// `address` with an IPv4-mapped IPv6 address as IPv4: a dual-stack `[::]` listener sees an
/// IPv4 slave as `::ffff:a.b.c.d`, while the slave registers the IPv4 local address of its
/// connection. Registrations are matched on this form.
pub(crate) fn canonical(address: SocketAddr) -> SocketAddr {
    SocketAddr::new(address.ip().to_canonical(), address.port())
}

/// What one replica is, for counting acks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Identity {
    /// The data-dir id a slave registered.
    DataDir(String),
    /// The peer IP of an unregistered connection (or every connection under `ip`).
    Ip(IpAddr),
    /// One connection (`connection`), by the master's connection id.
    Connection(u64),
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::DataDir(id) => write!(f, "data-dir {id}"),
            Identity::Ip(ip) => write!(f, "ip {ip}"),
            Identity::Connection(n) => write!(f, "connection {n}"),
        }
    }
}

/// A slave's registration: who it says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The random id of its data directory.
    pub(crate) data_dir_id: String,
    /// Its node name (for display).
    pub(crate) node_name: String,
}

/// A connection's identity and how it came by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// What it counts as.
    pub(crate) identity: Identity,
    /// The registration it matched, or (counted by its IP) the one registered from its IP.
    pub(crate) claim: Option<Claim>,
    /// Whether its own registration matched (not only its IP's).
    pub(crate) registered: bool,
}

#[derive(Debug, Clone)]
struct Held {
    claim: Claim,
    since: Instant,
}

/// Registrations by address and by IP; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    mode: ReplicaIdentity,
    held: HashMap<SocketAddr, Held>,
    by_ip: HashMap<IpAddr, Claim>,
    capacity: usize,
    ttl: Duration,
}

impl Registry {
    /// An empty registry for `mode`, holding at most `capacity` (at least 1) claims for
    /// connections not seen yet, each for at most `ttl`.
    pub(crate) fn new(mode: ReplicaIdentity, capacity: usize, ttl: Duration) -> Self {
        let capacity = capacity.max(1);
        Self { mode, held: HashMap::new(), by_ip: HashMap::new(), capacity, ttl }
    }

    /// Holds `claim` for the connection from `address` that has not made its first report yet
    /// (registration before the first report). A newer claim for the address replaces one.
    pub(crate) fn hold(&mut self, address: SocketAddr, claim: Claim, now: Instant) {
        let address = canonical(address);
        self.expire(now);
        if !self.held.contains_key(&address) && self.held.len() >= self.capacity {
            let oldest = self.held.iter().min_by_key(|(_, h)| h.since).map(|(a, _)| *a);
            if let Some(a) = oldest {
                self.held.remove(&a);
            }
        }
        self.held.insert(address, Held { claim, since: now });
        debug_assert!(self.held.len() <= self.capacity);
    }

    /// The claim held for the connection from `address`, if any.
    pub(crate) fn held_claim(&self, address: SocketAddr) -> Option<&Claim> {
        self.held.get(&canonical(address)).map(|h| &h.claim)
    }

    /// Drops the claim held for the connection from `address` (refused at its first report).
    pub(crate) fn forget_held(&mut self, address: SocketAddr) {
        self.held.remove(&canonical(address));
    }

    /// The number of claims held for connections not seen yet.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    fn expire(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.held.retain(|_, h| now.saturating_duration_since(h.since) < ttl);
    }

    /// The identity of connection `conn_id` from `peer` at its first report, taking the claim
    /// held for `peer` if there is one.
    pub(crate) fn resolve(&mut self, peer: SocketAddr, conn_id: u64, now: Instant) -> Resolved {
        self.expire(now);
        let ip = peer.ip().to_canonical();
        match self.held.remove(&canonical(peer)) {
            Some(held) => self.claim(ip, held.claim, conn_id),
            None => match self.mode {
                ReplicaIdentity::Registered => match self.by_ip.get(&ip) {
                    Some(claim) => Resolved {
                        identity: Identity::DataDir(claim.data_dir_id.clone()),
                        claim: Some(claim.clone()),
                        registered: false,
                    },
                    None => Resolved { identity: Identity::Ip(ip), claim: None, registered: false },
                },
                ReplicaIdentity::Ip => {
                    Resolved { identity: Identity::Ip(ip), claim: None, registered: false }
                }
                ReplicaIdentity::Connection => Resolved {
                    identity: Identity::Connection(conn_id),
                    claim: None,
                    registered: false,
                },
            },
        }
    }

    /// The identity a claim from `ip` held now will give its connection (under `connection`
    /// the connection's id is not known yet).
    pub(crate) fn claim_preview(&self, ip: IpAddr, claim: &Claim) -> String {
        match self.mode {
            ReplicaIdentity::Registered => Identity::DataDir(claim.data_dir_id.clone()).to_string(),
            ReplicaIdentity::Ip => Identity::Ip(ip.to_canonical()).to_string(),
            ReplicaIdentity::Connection => "its connection".to_owned(),
        }
    }

    /// The identity of connection `conn_id` from `ip` whose registration `claim` matched
    /// (before or after its first report); remembers the claim as its IP's.
    pub(crate) fn claim(&mut self, ip: IpAddr, claim: Claim, conn_id: u64) -> Resolved {
        let ip = ip.to_canonical();
        let identity = match self.mode {
            ReplicaIdentity::Registered => {
                self.by_ip.insert(ip, claim.clone());
                Identity::DataDir(claim.data_dir_id.clone())
            }
            ReplicaIdentity::Ip => Identity::Ip(ip),
            ReplicaIdentity::Connection => Identity::Connection(conn_id),
        };
        Resolved { identity, claim: Some(claim), registered: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: &str, name: &str) -> Claim {
        Claim { data_dir_id: id.into(), node_name: name.into() }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn registry(mode: ReplicaIdentity) -> Registry {
        Registry::new(mode, 4, Duration::from_secs(10))
    }

    #[test]
    fn a_claim_held_before_the_first_report_names_the_connection() {
        let now = Instant::now();
        let mut r = registry(ReplicaIdentity::Registered);
        r.hold(addr("10.0.0.5:40000"), claim("aa", "b"), now);
        let got = r.resolve(addr("10.0.0.5:40000"), 7, now);
        assert_eq!(got.identity, Identity::DataDir("aa".into()));
        assert!(got.registered);
        assert_eq!(r.held(), 0, "taken");
        assert_eq!(got.identity.to_string(), "data-dir aa");
    }

    #[test]
    fn an_unregistered_connection_counts_as_its_ips_registration_else_as_its_ip() {
        let now = Instant::now();
        let mut r = registry(ReplicaIdentity::Registered);
        let java = r.resolve(addr("10.0.0.9:1234"), 1, now);
        assert_eq!(
            (java.identity.clone(), java.registered),
            (Identity::Ip(addr("10.0.0.9:1").ip()), false)
        );
        assert_eq!(java.identity.to_string(), "ip 10.0.0.9");
        r.claim(addr("10.0.0.5:1").ip(), claim("aa", "b"), 2);
        let later = r.resolve(addr("10.0.0.5:40001"), 3, now);
        assert_eq!(later.identity, Identity::DataDir("aa".into()));
        assert_eq!((later.registered, later.claim), (false, Some(claim("aa", "b"))));
        // The IP's identity is the one registered last from it.
        r.claim(addr("10.0.0.5:1").ip(), claim("cc", "d"), 4);
        assert_eq!(
            r.resolve(addr("10.0.0.5:40002"), 5, now).identity,
            Identity::DataDir("cc".into())
        );
    }

    #[test]
    fn ip_and_connection_modes_ignore_registrations_for_counting() {
        let now = Instant::now();
        let mut ip = registry(ReplicaIdentity::Ip);
        ip.hold(addr("10.0.0.5:40000"), claim("aa", "b"), now);
        let got = ip.resolve(addr("10.0.0.5:40000"), 7, now);
        assert_eq!(got.identity, Identity::Ip(addr("10.0.0.5:1").ip()));
        assert_eq!(got.claim.map(|c| c.node_name), Some("b".into()), "shown in the status");
        let mut conn = registry(ReplicaIdentity::Connection);
        assert_eq!(conn.resolve(addr("10.0.0.5:40000"), 7, now).identity, Identity::Connection(7));
        assert_eq!(
            conn.claim(addr("10.0.0.5:1").ip(), claim("aa", "b"), 8).identity,
            Identity::Connection(8)
        );
        assert_eq!(conn.resolve(addr("10.0.0.5:40001"), 9, now).identity, Identity::Connection(9));
    }

    #[test]
    fn held_claims_are_bounded_and_expire() {
        let now = Instant::now();
        let mut r = registry(ReplicaIdentity::Registered);
        for port in 0..10u16 {
            r.hold(
                SocketAddr::new(addr("10.0.0.1:1").ip(), 1000 + port),
                claim("x", "n"),
                now + Duration::from_millis(port.into()),
            );
        }
        assert_eq!(r.held(), 4);
        // The oldest went first: 1009 is still held, 1000 is not.
        let at = now + Duration::from_millis(20);
        assert!(!r.resolve(addr("10.0.0.1:1000"), 1, at).registered);
        assert!(r.resolve(addr("10.0.0.1:1009"), 2, at).registered);
        r.hold(addr("10.0.0.2:5"), claim("y", "m"), at);
        let late = at + Duration::from_secs(10);
        let got = r.resolve(addr("10.0.0.2:5"), 3, late);
        assert_eq!(got.identity, Identity::Ip(addr("10.0.0.2:1").ip()), "expired");
    }
}
