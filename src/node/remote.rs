//! What a node needs from the network beyond the data plane, defined here by its consumer and
//! implemented by the control plane (`control::remote`): a slave compares epoch histories with
//! its master before every (re)connect, registers its identity right after every connect, learns
//! the master's confirm offset, and pulls the master's metadata.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use crate::node::epoch::EpochHistory;

/// A master's epoch history and where its log ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MasterEpochs {
    /// The master's epoch history.
    pub(crate) history: EpochHistory,
    /// The master's max offset.
    pub(crate) max_offset: u64,
}

/// What a master says of its confirm offset (its GetStatus).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MasterConfirm {
    /// Whether the node answered as a master.
    pub(crate) is_master: bool,
    /// Its epoch.
    pub(crate) epoch: u64,
    /// Its confirm offset.
    pub(crate) confirm_offset: u64,
    /// Its replication mode (a slave's readable end follows it).
    pub(crate) mode: crate::config::ReplicationMode,
}

/// What a slave registers with its master for one HA connection (`RegisterReplica`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicaClaim {
    /// The slave's data-dir id.
    pub(crate) data_dir_id: String,
    /// The slave's node name.
    pub(crate) node_name: String,
    /// The local address of the slave's HA connection (the master's peer address for it).
    pub(crate) ha_local_address: SocketAddr,
}

/// Why a master's API could not answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// No connection, a broken one, or no answer in time.
    #[error("cannot reach the master at {master}: {reason}")]
    Unreachable {
        /// The master's gRPC address.
        master: String,
        /// Why.
        reason: String,
    },
    /// The master answered the call with an error.
    #[error("{call} on the master at {master} was refused: {reason}")]
    Refused {
        /// The master's gRPC address.
        master: String,
        /// The call.
        call: &'static str,
        /// The code and message.
        reason: String,
    },
    /// The master's answer makes no sense (e.g. an epoch history that goes backwards).
    #[error("the master at {master} answered an invalid {what}: {reason}")]
    Invalid {
        /// The master's gRPC address.
        master: String,
        /// What was invalid.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// The future a [`MasterApi`] call returns.
pub(crate) type RemoteFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, RemoteError>> + Send + 'a>>;

/// What a slave asks of its master's API.
pub(crate) trait MasterApi: Send + Sync + std::fmt::Debug {
    /// The epoch history and max offset of the master whose gRPC address is `master_grpc`.
    fn epochs<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, MasterEpochs>;
    /// The role, epoch and confirm offset of the node whose gRPC address is `master_grpc`.
    fn confirm<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, MasterConfirm>;
    /// The data-dir id the node whose gRPC address is `master_grpc` reports (its GetStatus).
    fn data_dir_id<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, String>;

    /// Registers `claim` with the master whose gRPC address is `master_grpc`; what the master
    /// mapped the connection to, for the link status.
    fn register_replica<'a>(
        &'a self,
        master_grpc: &'a str,
        claim: &'a ReplicaClaim,
    ) -> RemoteFuture<'a, String>;
}

/// The network a node reaches beyond its data plane: the master's epochs and its metadata.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    /// Epoch histories (a slave's check before every connect and at a session's first bytes,
    /// and a demotion's) and the
    /// master's confirm offset (a slave's readable end).
    pub(crate) master: Arc<dyn MasterApi>,
    /// The metadata pull.
    pub(crate) metadata: Arc<dyn crate::metadata::pull::Source>,
}
