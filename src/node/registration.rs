//! A replica's identity between slave and master (`Replication.RegisterReplica`): the slave's
//! after-connect hook registers this data directory's id, the node name and the local address
//! of its HA connection through the master's API; the master maps the connection to the id
//! (`ha::identity`). Also how the epoch check's errors count for the reconnect backoff.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::Role;
use crate::ha::identity::Claim;
use crate::ha::master::RegisterError;
use crate::ha::slave::{AfterConnect, CheckRefusal};
use crate::node::remote::{RemoteError, ReplicaClaim};
use crate::node::{Error, Node};

/// The longest node name a registration may carry (bytes).
const NODE_NAME_MAX: usize = 256;

/// What a master did with a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegisterOutcome {
    /// The identity the connection counts as.
    pub(crate) identity: String,
    /// The replica id in the master's status, once the connection streams.
    pub(crate) replica_id: Option<u64>,
    /// Whether the connection was streaming already (else the claim waits for its first
    /// report).
    pub(crate) matched: bool,
}

/// An epoch check's error as the slave's backoff sees it: only an unreachable master may pass
/// by itself; logs that cannot converge, a refused call and a disk error need the operator.
pub(crate) fn check_refusal<E: Into<Error> + Display>(e: E) -> CheckRefusal {
    let reason = e.to_string();
    let unreachable = matches!(e.into(), Error::MasterUnreachable(RemoteError::Unreachable { .. }));
    CheckRefusal { reason, operator_must_fix: !unreachable }
}

impl Node {
    /// The hook that registers this node's identity with the master at `master_grpc` right
    /// after every connect of the data plane; `None` in classic mode (no master gRPC address:
    /// the master identifies the connection by its IP).
    pub(crate) fn registration_hook(&self, master_grpc: &str) -> Option<AfterConnect> {
        if master_grpc.is_empty() {
            return None;
        }
        let api = Arc::clone(&self.remote.master);
        let (grpc, data_dir_id) = (master_grpc.to_owned(), self.data_dir_id.clone());
        let node_name = self.config.node.name.clone();
        Some(Arc::new(move |ha_local_address: SocketAddr| {
            let (api, grpc) = (Arc::clone(&api), grpc.clone());
            let claim = ReplicaClaim {
                data_dir_id: data_dir_id.clone(),
                node_name: node_name.clone(),
                ha_local_address,
            };
            Box::pin(
                async move { api.register_replica(&grpc, &claim).await.map_err(|e| e.to_string()) },
            )
        }))
    }

    /// A slave's registration of its HA connection from `address` (the master side of
    /// `RegisterReplica`).
    ///
    /// # Errors
    ///
    /// [`Error::NotMaster`] on a slave; [`Error::InvalidArgument`] for an empty data-dir id or
    /// node name, or one too long or with control characters;
    /// [`Error::ReplicaNameTaken`] when a live replica registered the node name with another
    /// data-dir id.
    pub(crate) fn register_replica(
        &self,
        data_dir_id: String,
        node_name: String,
        address: SocketAddr,
    ) -> Result<RegisterOutcome, Error> {
        let master = {
            let st = self.state();
            match (&st.master, st.role) {
                (Some(m), Role::Master) => Arc::clone(m),
                _ => return Err(super::not_master(&st, "a replica registration")),
            }
        };
        let printable = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control)
        };
        if !printable(&data_dir_id, 128) {
            return Err(Error::InvalidArgument {
                field: "data_dir_id",
                reason: "must be 1 to 128 printable characters".into(),
            });
        }
        // Held per connection, shown in the status and a metric label, and compared for the
        // name rule (an empty name would collide with every other empty one).
        if !printable(&node_name, NODE_NAME_MAX) {
            return Err(Error::InvalidArgument {
                field: "node_name",
                reason: format!("must be 1 to {NODE_NAME_MAX} printable characters"),
            });
        }
        let claim = Claim { data_dir_id, node_name };
        match master.register(address, claim) {
            Ok(r) => Ok(RegisterOutcome {
                identity: r.identity,
                replica_id: r.replica_id,
                matched: r.matched,
            }),
            Err(e @ RegisterError::NameTaken { .. }) => Err(Error::ReplicaNameTaken(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_master_is_a_transient_check_failure() {
        let unreachable = RemoteError::Unreachable { master: "m:1".into(), reason: "down".into() };
        let r = check_refusal(unreachable.clone());
        assert!(!r.operator_must_fix);
        assert_eq!(r.reason, unreachable.to_string(), "the text the status showed before");
        let refused = RemoteError::Refused {
            master: "m:1".into(),
            call: "GetEpochHistory",
            reason: "x".into(),
        };
        assert!(check_refusal(refused).operator_must_fix);
        let diverged = check_refusal(Error::Diverged("no epoch shared".into()));
        assert!(diverged.operator_must_fix && diverged.reason.contains("no epoch shared"));
    }
}
