//! Why the rules refuse an operator's request (a plan of rule B, a switchover target).

use crate::coordinator::records::Phase;

/// An operator's request that the rules refuse (a plan or a switchover); nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The member is not in V.
    #[error("{name} is not a voter")]
    NotAVoter {
        /// The member.
        name: String,
    },
    /// The member is in V already.
    #[error("{name} is a voter already")]
    AlreadyAVoter {
        /// The member.
        name: String,
    },
    /// Removing the master: switch over first.
    #[error("{name} is the master: switch over first")]
    RemovesMaster {
        /// The master.
        name: String,
    },
    /// k above the members of V other than the master: no put could reach PUT_OK.
    #[error("k = {k} needs {k} members of V besides the master; V would have {others}")]
    KAboveOthers {
        /// The k asked for.
        k: u32,
        /// Members of V other than the master.
        others: u32,
    },
    /// Lowering k below `min-sync-replicas` (k = 0 is the degrade, see `DegradeNotAllowed`).
    #[error("k = {k} is below min-sync-replicas = {floor}")]
    BelowFloor {
        /// The k asked for.
        k: u32,
        /// The floor.
        floor: u32,
    },
    /// Shrinking V so that fewer than `min-sync-replicas` members besides the master remain.
    #[error("V would keep {others} members besides the master, below min-sync-replicas = {floor}")]
    VotersBelowFloor {
        /// Members of V other than the master after the change.
        others: u32,
        /// The floor.
        floor: u32,
    },
    /// SYNC with k = 0, or SYNC to ASYNC, where the group does not allow degrading.
    #[error("degrading to k = 0 (or ASYNC) is not allowed for this group")]
    DegradeNotAllowed,
    /// The change asks for what is published already.
    #[error("nothing to change")]
    NoChange,
    /// The state names no master.
    #[error("the group has no master")]
    NoMaster,
    /// A failover or switchover is running.
    #[error("a decision is running (phase {phase:?})")]
    DecisionRunning {
        /// The state's phase.
        phase: Phase,
    },
    /// The target is the master already.
    #[error("{name} is the master already")]
    IsMaster {
        /// The member.
        name: String,
    },
    /// The target is tagged never-promote.
    #[error("{name} is tagged never-promote")]
    NeverPromote {
        /// The member.
        name: String,
    },
    /// The target has no member record with its voter's data-dir id.
    #[error("{name} has no member record (with the data dir V names)")]
    NotReachable {
        /// The member.
        name: String,
    },
    /// No voter besides the master could take over.
    #[error("no promotable voter besides the master has a member record")]
    NoPromotableVoter,
}
