//! The control plane's side of the traits `node` and `metadata` define for reaching a master:
//! epoch histories, replica registrations, the master's confirm offset (its GetStatus) and
//! metadata pulls over gRPC, through the one client builder
//! ([`crate::control::client`]) with the node's token and `slave.master-grpc-ca-file`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::control::client::{ClientOptions, GrpcClient};
use crate::control::metadata_wire::{self as wire, Assembler};
use crate::control::pb;
use crate::metadata::pull::{Pulled, Source};
use crate::metadata::{DataVersion, Table};
use crate::node::epoch::{EpochEntry, EpochHistory};
use crate::node::remote::{
    MasterApi, MasterConfirm, MasterEpochs, Remote, RemoteError, RemoteFuture, ReplicaClaim,
};

/// How long an epoch-history call may take.
const EPOCHS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registration may take (the slave bounds it too).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a whole metadata pull may take.
const PULL_TIMEOUT: Duration = Duration::from_secs(60);

/// A master's API over gRPC.
#[derive(Debug, Clone)]
pub(crate) struct GrpcMaster {
    token: String,
    ca_file: Option<PathBuf>,
    connect_timeout: Duration,
}

impl GrpcMaster {
    /// With the node's token (`grpc.token`, sent to the master as a bearer token) and CA file
    /// (`slave.master-grpc-ca-file`).
    pub(crate) fn from_config(config: &Config) -> Self {
        let ca = &config.slave.master_grpc_ca_file;
        Self {
            token: config.grpc.token.clone(),
            ca_file: (!ca.as_os_str().is_empty()).then(|| ca.clone()),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Both traits, as the node takes them.
    pub(crate) fn remote(config: &Config) -> Remote {
        let m = Arc::new(Self::from_config(config));
        Remote { master: Arc::clone(&m) as Arc<dyn MasterApi>, metadata: m }
    }

    async fn connect(&self, master: &str, timeout: Duration) -> Result<GrpcClient, RemoteError> {
        let opts = ClientOptions {
            address: master.to_owned(),
            token: self.token.clone(),
            connect_timeout: self.connect_timeout,
            request_timeout: Some(timeout),
            ca_file: self.ca_file.clone(),
            tls_domain: None,
        };
        GrpcClient::connect(&opts).await.map_err(|e| RemoteError::Unreachable {
            master: master.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The master's GetStatus (its role, epoch, confirm offset, mode, data-dir id).
    async fn status(&self, master: &str) -> Result<pb::ReplicationStatus, RemoteError> {
        let client = self.connect(master, EPOCHS_TIMEOUT).await?;
        let s = client
            .replication()
            .get_status(pb::GetStatusRequest {})
            .await
            .map_err(|s| refused_or_unreachable(master, "GetStatus", &s))?;
        Ok(s.into_inner())
    }

    async fn fetch_epochs(&self, master: &str) -> Result<MasterEpochs, RemoteError> {
        let client = self.connect(master, EPOCHS_TIMEOUT).await?;
        let resp = client
            .replication()
            .get_epoch_history(pb::GetEpochHistoryRequest {})
            .await
            .map_err(|s| refused_or_unreachable(master, "GetEpochHistory", &s))?
            .into_inner();
        let history = EpochHistory::from_entries(resp.entries.iter().map(|e| EpochEntry {
            epoch: e.epoch,
            start_offset: e.start_offset.max(0) as u64,
            master_name: e.master_name.clone(),
        }))
        .map_err(|e| RemoteError::Invalid {
            master: master.to_owned(),
            what: "epoch history",
            reason: e.to_string(),
        })?;
        Ok(MasterEpochs { history, max_offset: resp.max_offset.max(0) as u64 })
    }

    async fn fetch_confirm(&self, master: &str) -> Result<MasterConfirm, RemoteError> {
        let s = self.status(master).await?;
        Ok(MasterConfirm {
            is_master: s.role() == pb::Role::Master,
            epoch: s.epoch,
            confirm_offset: s.confirm_offset.max(0) as u64,
            mode: match s.mode() {
                pb::ReplicationMode::Sync => crate::config::ReplicationMode::Sync,
                _ => crate::config::ReplicationMode::Async,
            },
        })
    }

    async fn fetch_data_dir_id(&self, master: &str) -> Result<String, RemoteError> {
        Ok(self.status(master).await?.data_dir_id)
    }

    async fn register(&self, master: &str, claim: &ReplicaClaim) -> Result<String, RemoteError> {
        let client = self.connect(master, REGISTER_TIMEOUT).await?;
        let r = client
            .replication()
            .register_replica(pb::RegisterReplicaRequest {
                data_dir_id: claim.data_dir_id.clone(),
                node_name: claim.node_name.clone(),
                ha_local_address: claim.ha_local_address.to_string(),
            })
            .await
            .map_err(|s| refused_or_unreachable(master, "RegisterReplica", &s))?
            .into_inner();
        Ok(if r.matched {
            format!("registered as {} (replica {})", r.identity, r.replica_id)
        } else {
            format!("registered as {} (from the first report on)", r.identity)
        })
    }

    async fn fetch_metadata(
        &self,
        master: &str,
        held: &HashMap<Table, DataVersion>,
    ) -> Result<Pulled, String> {
        let client = self.connect(master, PULL_TIMEOUT).await.map_err(|e| e.to_string())?;
        let v = |t| held.get(&t).copied().map(wire::version_pb);
        let req = pb::PullRequest {
            topics: v(Table::Topics),
            consumer_offsets: v(Table::ConsumerOffsets),
            delay_offsets: v(Table::DelayOffsets),
            subscription_groups: v(Table::SubscriptionGroups),
        };
        let url = client.url().to_owned();
        let mut stream = client
            .metadata()
            .pull(req)
            .await
            .map_err(|s| format!("Pull refused by {url}: {:?}: {}", s.code(), s.message()))?
            .into_inner();
        let mut receiving: Option<Assembler> = None;
        let mut complete = Vec::new();
        while let Some(chunk) =
            stream.message().await.map_err(|s| format!("Pull stream broke: {}", s.message()))?
        {
            let table = wire::table_of(chunk.table).ok_or("chunk for an unknown table")?;
            if chunk.unchanged {
                continue;
            }
            let version = chunk.version.as_ref().map(wire::version_of).unwrap_or_default();
            let last = chunk.last;
            let asm = receiving.get_or_insert_with(|| Assembler::new(table));
            if asm.table() != table {
                return Err("chunks of two tables interleaved".into());
            }
            asm.add(chunk);
            if last {
                complete.push((version, receiving.take().expect("receiving").finish()));
            }
        }
        if receiving.is_some() {
            return Err("the stream ended inside a table; nothing of it adopted".into());
        }
        Ok(complete)
    }
}

/// A failed call: the transport's codes are "unreachable" (UNKNOWN too: tonic reports a
/// connection that broke in the call, e.g. plaintext to a TLS port, as UNKNOWN "transport
/// error"), and so is any status made from a failure of the connection
/// (`client::connection_failed`: that same plaintext call may instead read the TLS port's
/// alert as frames, INTERNAL "h2 protocol error"; a master's own refusals come as
/// grpc-status, never from the connection); the rest "refused".
fn refused_or_unreachable(master: &str, call: &'static str, s: &tonic::Status) -> RemoteError {
    use tonic::Code;
    let reason = format!("{:?}: {}", s.code(), s.message());
    match s.code() {
        _ if super::client::connection_failed(s) => RemoteError::Unreachable {
            master: master.to_owned(),
            reason: format!("{call}: {reason}"),
        },
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            RemoteError::Unreachable {
                master: master.to_owned(),
                reason: format!("{call}: {reason}"),
            }
        }
        _ => RemoteError::Refused { master: master.to_owned(), call, reason },
    }
}

impl MasterApi for GrpcMaster {
    fn epochs<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, MasterEpochs> {
        Box::pin(self.fetch_epochs(master_grpc))
    }

    fn confirm<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, MasterConfirm> {
        Box::pin(self.fetch_confirm(master_grpc))
    }

    fn data_dir_id<'a>(&'a self, master_grpc: &'a str) -> RemoteFuture<'a, String> {
        Box::pin(self.fetch_data_dir_id(master_grpc))
    }

    fn register_replica<'a>(
        &'a self,
        master_grpc: &'a str,
        claim: &'a ReplicaClaim,
    ) -> RemoteFuture<'a, String> {
        Box::pin(self.register(master_grpc, claim))
    }
}

impl Source for GrpcMaster {
    fn pull<'a>(
        &'a self,
        master: &'a str,
        held: &'a HashMap<Table, DataVersion>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Pulled, String>> + Send + 'a>>
    {
        Box::pin(self.fetch_metadata(master, held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_that_breaks_in_http2_is_unreachable_and_a_masters_refusal_is_refused() {
        // As tonic makes it: the call's error, its source an error whose source is h2's.
        #[derive(Debug)]
        struct Wrapper(h2::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("http2 error")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let mut broken = tonic::Status::internal("h2 protocol error: http2 error");
        broken.set_source(std::sync::Arc::new(Wrapper(h2::Reason::PROTOCOL_ERROR.into())));
        let e = refused_or_unreachable("m:1", "GetEpochHistory", &broken);
        assert!(matches!(e, RemoteError::Unreachable { .. }), "{e:?}");
        let refusal = tonic::Status::internal("the master's own INTERNAL answer");
        let e = refused_or_unreachable("m:1", "GetEpochHistory", &refusal);
        assert!(matches!(e, RemoteError::Refused { .. }), "{e:?}");
    }
}
