//! The coordination engine: leases, linearizable reads with revisions, transactions with
//! compares, watches from a revision, and a campaign for a leader key, behind the
//! [`Coordinator`] trait. etcd v3 is the first backend ([`etcd`]); [`memory`] is an in-memory
//! one with tokio's (virtual, in tests) clock for the decision logic's tests; [`campaign`] wins
//! a leader key over any backend; [`cache`] keeps a prefix in memory by one watch. A Kubernetes Lease backend would implement the same trait
//! (docs/deployment.md, "What a Kubernetes Lease backend would need").
//!
//! What lives in the engine, per broker group, is in [`records`] (the JSON values) and
//! [`keys`] (where they live). hasync writes no consensus of its own: every decision is a
//! compare-and-swap on a record's revision.

pub mod agent;
pub mod cache;
pub mod campaign;
pub mod etcd;
pub mod keys;
pub mod kube;
pub mod memory;
pub mod mode;
pub mod records;
pub mod refusal;
pub mod rule_b;
pub mod view;

use std::fmt::Debug;
use std::time::Duration;

/// An etcd revision (the store's logical clock; every change raises it by one).
pub type Revision = i64;
/// A lease id.
pub type LeaseId = i64;

/// One key with its value and revisions, as the engine stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the change that created the key (0: absent, in compares).
    pub create_revision: Revision,
    /// The revision of the last change of the key.
    pub mod_revision: Revision,
    /// Changes since the key was created (1 after the create).
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: LeaseId,
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Its id.
    pub id: LeaseId,
    /// The TTL the engine granted.
    pub ttl: Duration,
}

/// How a compare compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `<`
    Less,
    /// `>`
    Greater,
}

/// What a compare reads of a key. An absent key has revisions and version 0; a value compare
/// on an absent key fails whatever the operator (etcd's rule: a missing value cannot be told
/// from an empty one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmpTarget {
    /// The key's mod revision.
    ModRevision(Revision),
    /// The key's create revision (`Equal, 0`: the key is absent).
    CreateRevision(Revision),
    /// The key's version.
    Version(i64),
    /// The key's value.
    Value(Vec<u8>),
    /// The mod revision of every key under the compare's key, taken as a prefix (etcd's range
    /// compare): the compare holds when each of them satisfies it, and for no key at all it
    /// compares an absent key's (0). [`Compare::prefix_unchanged_since`] is its use.
    PrefixModRevision(Revision),
}

/// One compare of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    /// The key.
    pub key: String,
    /// How.
    pub op: CmpOp,
    /// Against what.
    pub target: CmpTarget,
}

/// One operation of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Put a value, attached to a lease when given.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease (None: no lease).
        lease: Option<LeaseId>,
    },
    /// Delete one key.
    Delete {
        /// The key.
        key: String,
    },
    /// Delete every key under a prefix (one operation, however many keys).
    DeletePrefix {
        /// The prefix (not empty).
        prefix: String,
    },
    /// Read one key.
    Get {
        /// The key.
        key: String,
    },
    /// Read every key under a prefix.
    GetPrefix {
        /// The prefix.
        prefix: String,
    },
}

/// A transaction: if every compare holds, the success branch runs, else the failure branch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    /// All must hold.
    pub compares: Vec<Compare>,
    /// Run when they do.
    pub success: Vec<Op>,
    /// Run when one does not.
    pub failure: Vec<Op>,
}

impl Compare {
    /// Holds while `key` is absent (never created, or deleted).
    pub fn absent(key: &str) -> Self {
        Self { key: key.to_owned(), op: CmpOp::Equal, target: CmpTarget::CreateRevision(0) }
    }

    /// Holds while `key` was last changed at `revision`.
    pub fn unchanged_since(key: &str, revision: Revision) -> Self {
        Self { key: key.to_owned(), op: CmpOp::Equal, target: CmpTarget::ModRevision(revision) }
    }

    /// Holds while no key under `prefix` was created or changed after `revision` (a key
    /// deleted since is not seen: it is gone either way).
    pub fn prefix_unchanged_since(prefix: &str, revision: Revision) -> Self {
        Self {
            key: prefix.to_owned(),
            op: CmpOp::Less,
            target: CmpTarget::PrefixModRevision(revision.saturating_add(1)),
        }
    }
}

impl Txn {
    /// Puts `value` at `key` (under `lease`) only when `key` is absent; otherwise reads it
    /// (the failure branch's one read).
    pub fn create_only(key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Self {
        Self {
            compares: vec![Compare::absent(key)],
            success: vec![Op::Put { key: key.to_owned(), value, lease }],
            failure: vec![Op::Get { key: key.to_owned() }],
        }
    }

    /// Puts `value` at `key` (no lease) only while it was last changed at `revision`: a
    /// compare-and-swap.
    pub fn swap(key: &str, revision: Revision, value: Vec<u8>) -> Self {
        Self {
            compares: vec![Compare::unchanged_since(key, revision)],
            success: vec![Op::Put { key: key.to_owned(), value, lease: None }],
            failure: vec![],
        }
    }
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether the compares held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction (the fencing token of an epoch allocation).
    pub revision: Revision,
    /// For each `Get`/`GetPrefix` of the branch that ran, in order, the keys read.
    pub reads: Vec<Vec<KeyValue>>,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or changed.
    Put(KeyValue),
    /// A key was deleted (or its lease expired).
    Delete {
        /// The key.
        key: String,
        /// The revision of the delete.
        mod_revision: Revision,
    },
}

/// The changes of one or more revisions, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// The store's revision when the batch was sent.
    pub revision: Revision,
    /// The events, by revision.
    pub events: Vec<WatchEvent>,
}

/// A stream of watch batches; it ends (None) or yields an error when the watch is lost, and
/// the caller re-reads and watches again from the revision it read.
pub type WatchStream = tokio::sync::mpsc::Receiver<Result<WatchBatch, Error>>;

/// Why the engine could not do what was asked. Every variant says what failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No endpoint answered (or not in time).
    #[error("coordinator unreachable ({endpoints}): {reason}")]
    Unavailable {
        /// The endpoints tried.
        endpoints: String,
        /// Why.
        reason: String,
    },
    /// The lease is gone (expired or revoked).
    #[error("lease {0:x} not found (expired or revoked)")]
    LeaseNotFound(LeaseId),
    /// A watch asked for a revision the engine compacted away.
    #[error("revision {requested} is compacted (oldest kept: {compact_revision})")]
    Compacted {
        /// The revision asked for.
        requested: Revision,
        /// The oldest revision still kept.
        compact_revision: Revision,
    },
    /// The engine refused the credentials.
    #[error("coordinator refused the credentials: {0}")]
    Auth(String),
    /// The engine refused the request (too large, no space, a bad key ...).
    #[error("coordinator refused {call}: {reason}")]
    Refused {
        /// The call.
        call: &'static str,
        /// Why.
        reason: String,
    },
    /// A value read is not what hasync wrote there.
    #[error("coordinator key {key} holds an invalid value: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The coordinator's configuration cannot work (a bad endpoint, a TLS file).
    #[error("coordinator configuration: {0}")]
    Config(String),
}

/// The coordination engine hasync needs (etcd v3 first).
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync + Debug {
    /// Grants a lease with this TTL (the engine may round it).
    async fn grant(&self, ttl: Duration) -> Result<Lease, Error>;
    /// Renews a lease once; the TTL left after the renewal. [`Error::LeaseNotFound`] when it
    /// is gone.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, Error>;
    /// Revokes a lease (its keys are deleted); revoking a lease that is gone is not an error.
    async fn revoke(&self, lease: LeaseId) -> Result<(), Error>;
    /// Linearizable read of one key, with the store's revision.
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), Error>;
    /// Linearizable read of every key under a prefix (sorted by key), with the revision.
    async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), Error>;
    /// Read of every key under a prefix as it was at `revision` (etcd keeps history back to
    /// its compaction): [`Error::Compacted`] below it, [`Error::Refused`] above the store's
    /// revision, or from an engine that keeps no history (the default).
    async fn get_prefix_at(
        &self,
        prefix: &str,
        revision: Revision,
    ) -> Result<Vec<KeyValue>, Error> {
        let _ = (prefix, revision);
        Err(Error::Refused {
            call: "get_prefix_at",
            reason: "this coordination engine keeps no history to read from".into(),
        })
    }
    /// Runs a transaction. [`Error::Unavailable`] for a transaction that writes may hide one
    /// that was applied (its answer was lost): re-read before deciding it did not happen.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error>;
    /// Watches every key under a prefix from a revision (inclusive; 0: from the next change).
    /// History since `from` comes first; a `from` below the engine's compaction is
    /// [`Error::Compacted`], as the stream's first item (etcd reports it after the watch is
    /// created), and the stream ends after it.
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, Error>;
}

/// The wall clock in Unix ms (records carry it for people; no decision depends on it).
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
