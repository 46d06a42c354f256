//! The one mapping of node errors to gRPC status codes. A client acts on the code: INTERNAL is
//! "the node failed" (a disk error, a task that died), never UNAVAILABLE, which clients read
//! as "unreachable"; FAILED_PRECONDITION is "not in this state" (not the master, a stale
//! epoch, logs that cannot converge, the new master not answering); INVALID_ARGUMENT is "your
//! request was wrong".
//!
//! A non-master's refusal names the master's gRPC address three ways, so any client can follow
//! it: in the message, in the response metadata [`MASTER_GRPC_KEY`] and in the status details
//! (a `google.rpc.Status` with a `google.rpc.ErrorInfo`, reason `NOT_MASTER`, domain
//! `hasync.v1`, metadata `master_grpc` and `master_ha`), as gRPC's richer error model has it.

use std::collections::HashMap;

use tonic::Status;
use tonic::metadata::{MetadataMap, MetadataValue};

use crate::control::cluster::ClusterError;
use crate::metadata::MetadataError;
use crate::node::Error as E;
use crate::node::epoch::EpochError;

/// The response metadata key of a non-master's refusal that holds its master's gRPC address.
pub const MASTER_GRPC_KEY: &str = "hasync-master-grpc";
/// The `google.rpc.ErrorInfo` reason of a non-master's refusal.
pub const NOT_MASTER_REASON: &str = "NOT_MASTER";
const ERROR_DOMAIN: &str = "hasync.v1";
const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// `google.rpc.Status` (google/rpc/status.proto), the parts used here.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.ErrorInfo` (google/rpc/error_details.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: HashMap<String, String>,
}

/// FAILED_PRECONDITION for a non-master, naming its master (see the module docs).
fn not_master(message: String, master_ha: &str, master_grpc: &str) -> Status {
    let code = tonic::Code::FailedPrecondition;
    if master_grpc.is_empty() {
        return Status::new(code, message);
    }
    let mut metadata = MetadataMap::new();
    if let Ok(v) = MetadataValue::try_from(master_grpc) {
        metadata.insert(MASTER_GRPC_KEY, v);
    }
    let info = ErrorInfo {
        reason: NOT_MASTER_REASON.into(),
        domain: ERROR_DOMAIN.into(),
        metadata: [("master_grpc", master_grpc), ("master_ha", master_ha)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    };
    let details = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details: vec![Any {
            type_url: ERROR_INFO_TYPE.into(),
            value: prost::Message::encode_to_vec(&info),
        }],
    };
    Status::with_details_and_metadata(
        code,
        message,
        prost::Message::encode_to_vec(&details).into(),
        metadata,
    )
}

/// The master's gRPC address a non-master's refusal names: from [`MASTER_GRPC_KEY`], else from
/// the status details; None for any other status.
pub fn master_grpc_of(status: &Status) -> Option<String> {
    if status.code() != tonic::Code::FailedPrecondition {
        return None;
    }
    let from_metadata = status.metadata().get(MASTER_GRPC_KEY).and_then(|v| v.to_str().ok());
    if let Some(addr) = from_metadata.filter(|a| !a.is_empty()) {
        return Some(addr.to_owned());
    }
    let details: RpcStatus = prost::Message::decode(status.details()).ok()?;
    details
        .details
        .iter()
        .filter(|a| a.type_url == ERROR_INFO_TYPE)
        .filter_map(|a| <ErrorInfo as prost::Message>::decode(a.value.as_slice()).ok())
        .find(|i| i.reason == NOT_MASTER_REASON && i.domain == ERROR_DOMAIN)
        .and_then(|i| i.metadata.get("master_grpc").cloned())
        .filter(|a| !a.is_empty())
}

impl From<ClusterError> for Status {
    fn from(e: ClusterError) -> Self {
        let message = e.to_string();
        match e {
            ClusterError::InvalidArgument(_) => Status::invalid_argument(message),
            ClusterError::NotFound(_) => Status::not_found(message),
            ClusterError::FailedPrecondition(_) => Status::failed_precondition(message),
            ClusterError::Conflict(_) => Status::aborted(message),
            ClusterError::Timeout(_) => Status::deadline_exceeded(message),
            ClusterError::Coordinator(_) => Status::internal(message),
        }
    }
}

impl From<E> for Status {
    fn from(e: E) -> Self {
        let message = e.to_string();
        match e {
            E::NotMaster { master, master_grpc, .. } => not_master(message, &master, &master_grpc),
            E::StaleEpoch { .. }
            | E::Diverged(_)
            | E::MasterUnreachable(_)
            | E::RoleRefused(_)
            | E::Fenced { .. }
            | E::FenceRefused(_)
            | E::Coordinated(_)
            | E::Epoch(EpochError::NotIncreasing { .. }) => Status::failed_precondition(message),
            E::InvalidArgument { .. }
            | E::Metadata(MetadataError::Invalid { .. } | MetadataError::Name(_)) => {
                Status::invalid_argument(message)
            }
            E::Metadata(MetadataError::NotFound(_)) => Status::not_found(message),
            E::ReplicaNameTaken(_) => Status::already_exists(message),
            E::Store(crate::store::Error::OutOfRange { .. }) => Status::out_of_range(message),
            _ => Status::internal(message),
        }
    }
}

impl From<MetadataError> for Status {
    fn from(e: MetadataError) -> Self {
        E::Metadata(e).into()
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn code(e: E) -> Code {
        Status::from(e).code()
    }

    #[test]
    fn each_kind_of_node_error_has_its_code() {
        assert_eq!(code(E::StaleEpoch { asked: 1, current: 2 }), Code::FailedPrecondition);
        assert_eq!(
            code(E::NotMaster {
                what: "a put",
                master: "m:10912".into(),
                master_grpc: String::new()
            }),
            Code::FailedPrecondition
        );
        assert_eq!(code(E::Diverged("x".into())), Code::FailedPrecondition);
        assert_eq!(code(E::FenceRefused("below the promise".into())), Code::FailedPrecondition);
        assert_eq!(
            code(E::Coordinated("refused: coordinator mode".into())),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(E::InvalidArgument { field: "epoch", reason: "x".into() }),
            Code::InvalidArgument
        );
        let disk = std::io::Error::from_raw_os_error(28);
        let io = crate::store::state_file::StateFileError::Io {
            kind: "role",
            op: "write",
            path: "/d/role".into(),
            source: disk,
        };
        assert_eq!(code(E::StateFile(io)), Code::Internal);
        assert_eq!(code(E::Metadata(MetadataError::NotFound("topic T".into()))), Code::NotFound);
        assert_eq!(Status::from(ClusterError::Timeout("t".into())).code(), Code::DeadlineExceeded);
        assert_eq!(Status::from(ClusterError::Coordinator("c".into())).code(), Code::Internal);
    }

    #[test]
    fn a_non_master_names_its_master_in_the_message_the_metadata_and_the_details() {
        let e =
            E::NotMaster { what: "a put", master: "m:10912".into(), master_grpc: "m:10920".into() };
        let s = Status::from(e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("m:10912") && s.message().contains("m:10920"), "{s:?}");
        assert_eq!(s.metadata().get(MASTER_GRPC_KEY).unwrap(), "m:10920");
        assert_eq!(master_grpc_of(&s).as_deref(), Some("m:10920"));
        // The details alone are enough (a proxy may drop unknown metadata).
        let bare = Status::with_details(s.code(), s.message(), s.details().to_vec().into());
        assert_eq!(master_grpc_of(&bare).as_deref(), Some("m:10920"));
        // Classic mode: no gRPC address known, nothing to follow.
        let classic =
            E::NotMaster { what: "a put", master: "m:10912".into(), master_grpc: String::new() };
        let s = Status::from(classic);
        assert!(s.metadata().get(MASTER_GRPC_KEY).is_none() && s.details().is_empty());
        assert_eq!(master_grpc_of(&s), None);
        assert_eq!(master_grpc_of(&Status::internal("x")), None);
    }
}
