//! etcd's wire forms of the coordinator's types, and the one mapping of etcd's gRPC errors to
//! [`Error`].

use tonic::{Code, Status};

use super::pb::etcdserverpb as rpc;
use super::pb::mvccpb;
use crate::coordinator::{
    CmpOp, CmpTarget, Compare, Error, KeyValue, LeaseId, Op, Revision, Txn, TxnResponse, WatchEvent,
};

/// The end of the range of every key starting with `prefix` (etcd's "prefix + 1"); for an
/// empty prefix, or one of only 0xff bytes, `\0`: every key from the start key on.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The `[key, range_end)` of a prefix (the empty prefix: every key).
pub(super) fn prefix_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    (prefix.as_bytes().to_vec(), prefix_end(prefix.as_bytes()))
}

/// A linearizable read of one key.
pub(super) fn range_key(key: &str) -> rpc::RangeRequest {
    rpc::RangeRequest { key: key.as_bytes().to_vec(), serializable: false, ..Default::default() }
}

/// A linearizable read of a prefix, sorted by key (etcd's default order).
pub(super) fn range_prefix(prefix: &str) -> rpc::RangeRequest {
    let (key, range_end) = prefix_range(prefix);
    rpc::RangeRequest { key, range_end, serializable: false, ..Default::default() }
}

/// A key etcd returned.
pub(super) fn key_value(kv: mvccpb::KeyValue) -> Result<KeyValue, Error> {
    let key = String::from_utf8(kv.key).map_err(|e| Error::InvalidValue {
        key: String::from_utf8_lossy(e.as_bytes()).into_owned(),
        reason: "the key is not UTF-8".into(),
    })?;
    Ok(KeyValue {
        key,
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    })
}

/// The keys of a range answer. A key that is not UTF-8 is none hasync wrote: it is skipped
/// (and logged), so a stray key under the prefix cannot fail every read of it.
pub(super) fn key_values(kvs: Vec<mvccpb::KeyValue>) -> Result<Vec<KeyValue>, Error> {
    Ok(kvs.into_iter().filter_map(|kv| readable(key_value(kv))).collect())
}

/// A key, or None (logged) for one that is not UTF-8.
fn readable<T>(r: Result<T, Error>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, "a key hasync cannot have written is skipped");
            None
        }
    }
}

/// The store revision an answer's header carries.
pub(super) fn revision(header: Option<&rpc::ResponseHeader>) -> Revision {
    header.map_or(0, |h| h.revision)
}

fn compare(c: &Compare) -> rpc::Compare {
    use rpc::compare::{CompareResult, CompareTarget, TargetUnion};
    let result = match c.op {
        CmpOp::Equal => CompareResult::Equal,
        CmpOp::NotEqual => CompareResult::NotEqual,
        CmpOp::Less => CompareResult::Less,
        CmpOp::Greater => CompareResult::Greater,
    };
    let mut range_end = Vec::new();
    let mut key = c.key.as_bytes().to_vec();
    let (target, union) = match &c.target {
        CmpTarget::ModRevision(r) => (CompareTarget::Mod, TargetUnion::ModRevision(*r)),
        CmpTarget::PrefixModRevision(r) => {
            (key, range_end) = prefix_range(&c.key);
            (CompareTarget::Mod, TargetUnion::ModRevision(*r))
        }
        CmpTarget::CreateRevision(r) => (CompareTarget::Create, TargetUnion::CreateRevision(*r)),
        CmpTarget::Version(v) => (CompareTarget::Version, TargetUnion::Version(*v)),
        CmpTarget::Value(v) => (CompareTarget::Value, TargetUnion::Value(v.clone())),
    };
    rpc::Compare {
        result: result as i32,
        target: target as i32,
        key,
        range_end,
        target_union: Some(union),
    }
}

fn request_op(op: &Op) -> rpc::RequestOp {
    use rpc::request_op::Request;
    let request = match op {
        Op::Put { key, value, lease } => Request::RequestPut(rpc::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.clone(),
            lease: lease.unwrap_or(0),
            prev_kv: false,
        }),
        Op::Delete { key } => Request::RequestDeleteRange(rpc::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
        Op::DeletePrefix { prefix } => {
            let (key, range_end) = prefix_range(prefix);
            Request::RequestDeleteRange(rpc::DeleteRangeRequest {
                key,
                range_end,
                ..Default::default()
            })
        }
        Op::Get { key } => Request::RequestRange(range_key(key)),
        Op::GetPrefix { prefix } => Request::RequestRange(range_prefix(prefix)),
    };
    rpc::RequestOp { request: Some(request) }
}

/// etcd's form of a transaction.
pub(super) fn txn_request(txn: &Txn) -> rpc::TxnRequest {
    rpc::TxnRequest {
        compare: txn.compares.iter().map(compare).collect(),
        success: txn.success.iter().map(request_op).collect(),
        failure: txn.failure.iter().map(request_op).collect(),
    }
}

/// Whether a transaction writes (a put or a delete in either branch).
pub(super) fn txn_writes(txn: &Txn) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .any(|op| matches!(op, Op::Put { .. } | Op::Delete { .. } | Op::DeletePrefix { .. }))
}

/// The first lease a transaction puts a key under (to name it in a lease-not-found error).
pub(super) fn txn_lease(txn: &Txn) -> LeaseId {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            Op::Put { lease: Some(l), .. } if *l != 0 => Some(*l),
            _ => None,
        })
        .unwrap_or(0)
}

/// The coordinator's form of a transaction's answer: the reads of the branch that ran.
pub(super) fn txn_response(resp: rpc::TxnResponse) -> Result<TxnResponse, Error> {
    use rpc::response_op::Response;
    let mut reads = Vec::new();
    for r in resp.responses {
        if let Some(Response::ResponseRange(range)) = r.response {
            reads.push(key_values(range.kvs)?);
        }
    }
    Ok(TxnResponse { succeeded: resp.succeeded, revision: revision(resp.header.as_ref()), reads })
}

/// One event of a watch answer.
/// One event of a watch; Ok(None) for a key that is not UTF-8 (none hasync wrote: skipped
/// and logged, so that it cannot end every watch of its prefix at its revision).
pub(super) fn watch_event(ev: mvccpb::Event) -> Result<Option<WatchEvent>, Error> {
    let kv = ev.kv.ok_or_else(|| Error::Refused {
        call: "Watch",
        reason: "etcd sent an event without its key".into(),
    })?;
    let mod_revision = kv.mod_revision;
    let Some(kv) = readable(key_value(kv)) else {
        tracing::debug!(mod_revision, "a watch event of a non-UTF-8 key skipped");
        return Ok(None);
    };
    if ev.r#type == mvccpb::event::EventType::Delete as i32 {
        return Ok(Some(WatchEvent::Delete { key: kv.key, mod_revision }));
    }
    Ok(Some(WatchEvent::Put(kv)))
}

/// What a failed call says about the endpoint that answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The endpoint cannot serve now: another one may. `unsent`: the request surely did not
    /// reach the store (a write may be sent again elsewhere).
    Endpoint {
        /// The request was surely not applied.
        unsent: bool,
    },
    /// The auth token is no longer valid: authenticate again and resend.
    Token,
    /// etcd's answer to the request itself.
    Answer,
}

/// etcd's messages (all `UNAVAILABLE`) for a member that refused a request before proposing
/// it: safe to send to another member, writes included.
const NOT_PROPOSED: &[&str] =
    &["etcdserver: no leader", "etcdserver: not capable", "etcdserver: server stopped"];

/// Classifies a failed call.
pub(super) fn failure(status: &Status) -> Failure {
    let msg = status.message();
    match status.code() {
        Code::Unauthenticated if msg.contains("invalid auth token") => Failure::Token,
        // The auth store changed since the token was issued (etcd 3.4 and 3.5 phrase it
        // differently).
        Code::InvalidArgument | Code::FailedPrecondition
            if msg.contains("auth store is old") || msg.contains("revision in header is old") =>
        {
            Failure::Token
        }
        Code::Unavailable => Failure::Endpoint {
            unsent: is_connect_error(status) || NOT_PROPOSED.iter().any(|m| msg.contains(m)),
        },
        Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Internal => {
            Failure::Endpoint { unsent: is_connect_error(status) }
        }
        _ => Failure::Answer,
    }
}

/// Whether the call failed connecting (nothing was sent).
fn is_connect_error(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// A failed call's error chain in one line.
pub(super) fn describe(status: &Status) -> String {
    let mut s = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let part = e.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        source = e.source();
    }
    s
}

/// What the call was about, to name in its error.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Subject {
    /// The lease (keep-alive, revoke, a txn's put).
    pub lease: LeaseId,
    /// The revision (compact).
    pub revision: Revision,
}

/// etcd's answer to a request, as an [`Error`].
pub(super) fn answer_error(call: &'static str, status: &Status, subject: Subject) -> Error {
    let msg = status.message();
    match status.code() {
        Code::NotFound if msg.contains("lease not found") => Error::LeaseNotFound(subject.lease),
        Code::OutOfRange if msg.contains("compacted") => {
            Error::Compacted { requested: subject.revision, compact_revision: subject.revision }
        }
        Code::Unauthenticated | Code::PermissionDenied => Error::Auth(format!("{call}: {msg}")),
        Code::InvalidArgument | Code::FailedPrecondition
            if msg.contains("authentication") || msg.contains("user name") =>
        {
            Error::Auth(format!("{call}: {msg}"))
        }
        _ => Error::Refused { call, reason: describe(status) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_at_the_prefix_plus_one() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_range(""), (vec![0], vec![0]));
    }

    #[test]
    fn etcd_errors_map_to_the_coordinators_and_name_the_call() {
        let s = Status::not_found("etcdserver: requested lease not found");
        assert!(matches!(
            answer_error("LeaseRevoke", &s, Subject { lease: 7, revision: 0 }),
            Error::LeaseNotFound(7)
        ));
        let s = Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        let e = answer_error("Authenticate", &s, Subject::default());
        assert!(matches!(&e, Error::Auth(m) if m.contains("Authenticate")), "{e}");
        let s = Status::invalid_argument("etcdserver: duplicate key given in txn request");
        let e = answer_error("Txn", &s, Subject::default());
        assert!(e.to_string().contains("duplicate key"), "{e}");
        assert_eq!(
            failure(&Status::unauthenticated("etcdserver: invalid auth token")),
            Failure::Token
        );
        assert_eq!(
            failure(&Status::unavailable("etcdserver: no leader")),
            Failure::Endpoint { unsent: true }
        );
        assert_eq!(
            failure(&Status::unavailable("etcdserver: request timed out")),
            Failure::Endpoint { unsent: false }
        );
    }
}
