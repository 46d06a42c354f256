//! What ended a client command: the kind of failure (which picks the documented exit code)
//! and one line saying what failed.

use tonic::Code;

/// Every exit code of the client subcommands, with what it means (docs/operations.md lists
/// the same table; a test keeps them equal).
pub const EXIT_CODES: &[(u8, &str)] = &[
    (0, "success"),
    (1, "any other failure: INTERNAL, UNKNOWN or DATA_LOSS from the node, or a local error"),
    (2, "usage: a bad flag or value (from the argument parser), or a bad --grpc address"),
    (
        3,
        "unreachable: cannot connect, the connection broke (UNAVAILABLE, CANCELLED, or any \
         status made from a broken connection, such as a plaintext call to a TLS port), or no \
         answer in time (--timeout, DEADLINE_EXCEEDED)",
    ),
    (
        4,
        "refused: FAILED_PRECONDITION, INVALID_ARGUMENT, OUT_OF_RANGE, NOT_FOUND, \
         UNIMPLEMENTED, ALREADY_EXISTS, RESOURCE_EXHAUSTED or ABORTED, or a switchover or \
         failover the controller refused",
    ),
    (5, "unauthenticated: the token is missing or wrong (UNAUTHENTICATED, PERMISSION_DENIED)"),
    (6, "put not OK: a put answered a status other than PUT_OK (the line names it)"),
    (7, "not serving: a health check answered other than SERVING"),
    (
        8,
        "not the target: a switchover with --to was done but the controller promoted another \
         member, more complete than the target (the line names it and why)",
    ),
];

/// What kind of failure ended a client command; each has its own exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// Anything else. Exit 1.
    Other,
    /// A bad argument found after parsing (e.g. the address). Exit 2.
    Usage,
    /// No connection, a broken one, or no answer in time. Exit 3.
    Unreachable,
    /// The node refused the call (FAILED_PRECONDITION, INVALID_ARGUMENT, ...). Exit 4.
    Refused,
    /// Missing or wrong token. Exit 5.
    Unauthenticated,
    /// A put answered other than PUT_OK. Exit 6.
    PutNotOk,
    /// A health check answered other than SERVING. Exit 7.
    NotServing,
    /// A switchover promoted another member than the one asked for. Exit 8.
    NotTheTarget,
}

impl FailureKind {
    /// The process exit code.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            FailureKind::Other => 1,
            FailureKind::Usage => 2,
            FailureKind::Unreachable => 3,
            FailureKind::Refused => 4,
            FailureKind::Unauthenticated => 5,
            FailureKind::PutNotOk => 6,
            FailureKind::NotServing => 7,
            FailureKind::NotTheTarget => 8,
        }
    }

    fn label(self) -> &'static str {
        match self {
            FailureKind::Other => "failed",
            FailureKind::Usage => "usage",
            FailureKind::Unreachable => "unreachable",
            FailureKind::Refused => "refused",
            FailureKind::Unauthenticated => "unauthenticated",
            FailureKind::PutNotOk => "put not OK",
            FailureKind::NotServing => "not serving",
            FailureKind::NotTheTarget => "not the target",
        }
    }
}

/// A failed client command: its kind (the exit code) and one line saying what failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", kind.label())]
pub(crate) struct Failure {
    /// The kind, which picks the exit code.
    pub(crate) kind: FailureKind,
    /// What failed, on one line.
    pub(crate) message: String,
}

impl Failure {
    /// A failure of `kind`; newlines in `message` become spaces.
    pub(crate) fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        let message = message.into().replace(['\n', '\r'], " ");
        Self { kind, message }
    }

    /// The process exit code.
    pub(crate) fn exit_code(&self) -> u8 {
        self.kind.exit_code()
    }
}

/// The proto name of a gRPC status code (`FAILED_PRECONDITION`).
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Which failure kind a gRPC status code is.
pub(crate) fn kind_of(code: Code) -> FailureKind {
    match code {
        Code::Unauthenticated | Code::PermissionDenied => FailureKind::Unauthenticated,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => FailureKind::Unreachable,
        Code::FailedPrecondition
        | Code::InvalidArgument
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::NotFound
        | Code::AlreadyExists
        | Code::ResourceExhausted
        | Code::Aborted => FailureKind::Refused,
        _ => FailureKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_listed() {
        let kinds = [
            FailureKind::Other,
            FailureKind::Usage,
            FailureKind::Unreachable,
            FailureKind::Refused,
            FailureKind::Unauthenticated,
            FailureKind::PutNotOk,
            FailureKind::NotServing,
            FailureKind::NotTheTarget,
        ];
        let mut codes: Vec<u8> = kinds.iter().map(|k| k.exit_code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), kinds.len());
        for c in codes {
            assert!(EXIT_CODES.iter().any(|(n, _)| *n == c), "exit code {c} documented");
        }
        assert_eq!(kind_of(Code::FailedPrecondition), FailureKind::Refused);
        assert_eq!(kind_of(Code::Unauthenticated), FailureKind::Unauthenticated);
        assert_eq!(kind_of(Code::Unavailable), FailureKind::Unreachable);
        assert_eq!(kind_of(Code::Internal), FailureKind::Other);
    }

    #[test]
    fn a_failure_is_one_line() {
        let f = Failure::new(FailureKind::Refused, "a\nb");
        assert_eq!(f.to_string(), "refused: a b");
        assert_eq!(f.exit_code(), 4);
    }
}
