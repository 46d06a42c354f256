//! The one mapping of node errors to gRPC status codes. A client acts on the code: INTERNAL is
//! "the node failed" (a disk error, a task that died), never UNAVAILABLE, which clients read
//! as "unreachable"; FAILED_PRECONDITION is "not in this state" (not the master, a stale
//! epoch, logs that cannot converge, the new master not answering); INVALID_ARGUMENT is "your
//! request was wrong".

use tonic::Status;

use crate::control::cluster::ClusterError;
use crate::metadata::MetadataError;
use crate::node::Error as E;
use crate::node::epoch::EpochError;

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
            E::NotMaster { .. }
            | E::StaleEpoch { .. }
            | E::Diverged(_)
            | E::MasterUnreachable(_)
            | E::RoleRefused(_)
            | E::Fenced { .. }
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
            code(E::NotMaster { what: "a put", master: "m:10912".into() }),
            Code::FailedPrecondition
        );
        assert_eq!(code(E::Diverged("x".into())), Code::FailedPrecondition);
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
}
