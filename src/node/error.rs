//! What can go wrong in a node's operations, typed so that the control plane maps each kind to
//! the gRPC code a client can act on (in one place: `control::error`).

use std::net::SocketAddr;

use crate::node::epoch::EpochError;
use crate::node::remote::RemoteError;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store refused to open, close, truncate or write.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The metadata refused to load or a write failed.
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
    /// A blocking task panicked.
    #[error("store task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The request needs the master role.
    #[error(
        "this node is a slave (its master is {master}{}); {what} needs the master",
        grpc_of(master_grpc)
    )]
    NotMaster {
        /// What was asked.
        what: &'static str,
        /// The HA address of the master this node follows now.
        master: String,
        /// That master's gRPC address (`slave.master-grpc`, or a ChangeRole's); empty when
        /// not known (classic mode). Clients follow the refusal there.
        master_grpc: String,
    },
    /// The epoch history is invalid or its file could not be read or written.
    #[error(transparent)]
    Epoch(#[from] EpochError),
    /// A role change with an epoch below the node's.
    #[error("role change refused: stale epoch {asked}: this node is at epoch {current}")]
    StaleEpoch {
        /// The epoch asked for.
        asked: u64,
        /// The node's epoch.
        current: u64,
    },
    /// The logs of this node and of the new master cannot converge without losing data.
    #[error("role change refused: {0}")]
    Diverged(String),
    /// The new master's API could not tell its epoch history.
    #[error("role change refused: {0}")]
    MasterUnreachable(#[from] RemoteError),
    /// A role change refused for another reason (same epoch, different request; shutting
    /// down); nothing was changed.
    #[error("role change refused: {0}")]
    RoleRefused(String),
    /// A write refused by the write fence (a role change running or failed, or a master that
    /// stopped uncleanly and waits for a ChangeRole).
    #[error("{what} refused: {why}")]
    Fenced {
        /// What was asked.
        what: &'static str,
        /// Why the node is fenced, and how to end it.
        why: String,
    },
    /// A role change failed in a step after its plan was accepted: the node is at the new
    /// epoch, fenced, in the failed state until the exact repeat of the request (which resumes
    /// it) or a change with a higher epoch.
    #[error(
        "role change to {role} at epoch {epoch} failed at step \"{step}\": {source}; the node is \
         fenced: repeat the exact request to resume it, or use a higher epoch"
    )]
    RoleChangeFailed {
        /// The role asked for.
        role: crate::config::Role,
        /// The change's epoch.
        epoch: u64,
        /// The step that failed.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A request argument is out of range.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A replica registration refused: a live replica registered the node name with another
    /// data-dir id (the message names both).
    #[error("replica registration refused: {0}")]
    ReplicaNameTaken(String),
    /// A Fence refused: an epoch below the promise or not above the node's epoch, or the node
    /// shutting down; nothing was changed.
    #[error("fence refused: {0}")]
    FenceRefused(String),
    /// Coordinator mode: a request that does not match the controller's decision (the message
    /// says what differs), the decision unreadable, or a call the controller owns.
    #[error("{0}")]
    Coordinated(String),
    /// A state file (the role file) could not be read or written, or is damaged.
    #[error(transparent)]
    StateFile(#[from] crate::store::state_file::StateFileError),
}

/// `, gRPC <addr>` when a master's gRPC address is known.
fn grpc_of(master_grpc: &str) -> String {
    if master_grpc.is_empty() { String::new() } else { format!(", gRPC {master_grpc}") }
}
