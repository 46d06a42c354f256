//! What a node needs of the coordinator (issue 17), defined here by its consumer: one
//! linearizable read of its group's decision ([`Coordination::decision`]). The coordinator
//! module (above the node) implements it over etcd; the node knows nothing of etcd. A node
//! without it ([`None`] in `NodeParts`) runs in static mode, exactly as before: Fence and
//! ChangeRole are checked against its own state only, and SetReplicationMode works.
//!
//! In coordinator mode every Fence and every ChangeRole must match the decision ([`check_fence`],
//! [`check_change_role`], pure), so that an old runbook Job cannot fight the controller, and
//! SetReplicationMode is refused (the controller owns the mode).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::config::Role;
use crate::node::Error;
use crate::node::role::RoleRequest;

/// The future a [`Coordination`] call returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest the node waits for a decision read (it holds the role-change lock meanwhile, so
/// a coordinator that never answers must not hold role changes and the shutdown forever).
pub const DECISION_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the controller's decision for the group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionPhase {
    /// The group runs with its master; ChangeRoles with the decision's token (a confirm, a
    /// slave pointed at the master) are accepted.
    Stable,
    /// The controller fences the voters (Fence at the decision's epoch and token).
    Fencing,
    /// The controller promotes `chosen` and points the others at it (ChangeRole at the
    /// decision's epoch and token; a Fence retried at it is accepted too).
    Promoting,
}

impl DecisionPhase {
    fn name(self) -> &'static str {
        match self {
            DecisionPhase::Stable => "STABLE",
            DecisionPhase::Fencing => "FENCING",
            DecisionPhase::Promoting => "PROMOTING",
        }
    }
}

impl std::fmt::Display for DecisionPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// This node's group state, as far as the node needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The decision's epoch (the epoch of its fence and of its role changes).
    pub epoch: u64,
    /// The decision's token: Fence and ChangeRole carry it.
    pub token: String,
    /// Where the decision is.
    pub phase: DecisionPhase,
    /// The member name (`node.name`) to become master, once chosen.
    pub chosen: Option<String>,
    /// The member name of the master in force, if any.
    pub master: Option<String>,
    /// The voters V: `(member name, data-dir id)`. A SYNC put answers PUT_OK only once `k`
    /// members of V other than the master acked it.
    pub voters: Vec<(String, String)>,
    /// `k`: voter acks a SYNC put waits for.
    pub k: u32,
    /// Whether the group publishes SYNC: a master the decision promotes then runs SYNC from
    /// its first put, whatever its own `replication.mode` (the agent's next round applies the
    /// rest of the group's rule).
    pub sync: bool,
}

/// What a node asks of the coordinator.
pub trait Coordination: Send + Sync + Debug {
    /// A linearizable read of this node's group decision; `Ok(None)` when there is none yet,
    /// `Err` (what failed) when it cannot be read.
    fn decision(&self) -> BoxFuture<'_, Result<Option<Decision>, String>>;
}

/// Reads the decision, bounded by [`DECISION_TIMEOUT`]; a failure is a refusal naming it.
pub(crate) async fn read(c: &dyn Coordination) -> Result<Option<Decision>, Error> {
    match tokio::time::timeout(DECISION_TIMEOUT, c.decision()).await {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(refused(format!("the decision could not be read: {e}"))),
        Err(_) => {
            Err(refused(format!("the decision could not be read within {DECISION_TIMEOUT:?}")))
        }
    }
}

fn refused(what: String) -> Error {
    Error::Coordinated(format!("refused: coordinator mode, {what}"))
}

/// Whether a Fence at `epoch` with `token` fits the decision: the same epoch and token, phase
/// FENCING or PROMOTING.
pub(crate) fn check_fence(
    decision: Option<&Decision>,
    epoch: u64,
    token: &str,
) -> Result<(), Error> {
    let Some(d) = decision else {
        return Err(refused(format!(
            "there is no decision: a fence at epoch {epoch} (token {token:?}) has nothing to match"
        )));
    };
    let mut differs = Vec::new();
    if d.epoch != epoch {
        differs.push(format!("the fence's epoch {epoch} is not the decision's {}", d.epoch));
    }
    if d.token != token {
        differs.push(format!("the fence's token {token:?} is not the decision's {:?}", d.token));
    }
    if d.phase == DecisionPhase::Stable {
        differs.push("the decision is STABLE (a fence needs FENCING or PROMOTING)".to_owned());
    }
    if differs.is_empty() { Ok(()) } else { Err(refused(differs.join("; "))) }
}

/// Whether ChangeRole `req` fits the decision for the node named `node_name`: the same epoch
/// and token, phase PROMOTING or STABLE, and MASTER only for the decision's chosen member; `k`
/// (applied with the change) at least 1 and at most `max_connections`.
pub(crate) fn check_change_role(
    decision: Option<&Decision>,
    req: &RoleRequest,
    node_name: &str,
    max_connections: usize,
) -> Result<(), Error> {
    let Some(d) = decision else {
        return Err(refused(format!(
            "there is no decision: a change to {} at epoch {} has nothing to match",
            req.role, req.epoch
        )));
    };
    let mut differs = Vec::new();
    if d.epoch != req.epoch {
        differs
            .push(format!("the request's epoch {} is not the decision's {}", req.epoch, d.epoch));
    }
    if d.token != req.decision_token {
        differs.push(format!(
            "the request's decision_token {:?} is not the decision's {:?}",
            req.decision_token, d.token
        ));
    }
    if d.phase == DecisionPhase::Fencing {
        differs.push("the decision is FENCING (a role change needs PROMOTING or STABLE)".into());
    }
    if req.role == Role::Master && d.chosen.as_deref() != Some(node_name) {
        differs.push(format!(
            "MASTER is for the decision's chosen member ({}), not this node ({node_name:?})",
            d.chosen.as_deref().map_or_else(|| "none yet".to_owned(), |c| format!("{c:?}"))
        ));
    }
    if d.k == 0 || d.k as usize > max_connections {
        differs.push(format!(
            "the decision's k = {} is outside 1..={max_connections} (ha.max-connections)",
            d.k
        ));
    }
    if differs.is_empty() { Ok(()) } else { Err(refused(differs.join("; "))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(phase: DecisionPhase) -> Decision {
        Decision {
            epoch: 7,
            token: "t7".into(),
            phase,
            chosen: Some("b".into()),
            master: Some("a".into()),
            voters: vec![("a".into(), "id-a".into()), ("b".into(), "id-b".into())],
            k: 1,
            sync: true,
        }
    }

    #[test]
    fn a_fence_must_match_epoch_token_and_phase() {
        let d = decision(DecisionPhase::Fencing);
        check_fence(Some(&d), 7, "t7").unwrap();
        check_fence(Some(&decision(DecisionPhase::Promoting)), 7, "t7").unwrap();
        let err = check_fence(Some(&d), 6, "old").unwrap_err().to_string();
        assert!(err.starts_with("refused: coordinator mode, "), "{err}");
        assert!(err.contains("epoch 6 is not the decision's 7"), "{err}");
        assert!(err.contains("\"old\" is not the decision's \"t7\""), "{err}");
        let stable = check_fence(Some(&decision(DecisionPhase::Stable)), 7, "t7").unwrap_err();
        assert!(stable.to_string().contains("STABLE"), "{stable}");
        assert!(check_fence(None, 7, "t7").unwrap_err().to_string().contains("no decision"));
    }

    #[test]
    fn a_change_role_must_match_the_decision_and_only_the_chosen_one_becomes_master() {
        let d = decision(DecisionPhase::Promoting);
        let mut req = RoleRequest::master(7);
        req.decision_token = "t7".into();
        check_change_role(Some(&d), &req, "b", 8).unwrap();
        let err = check_change_role(Some(&d), &req, "c", 8).unwrap_err().to_string();
        assert!(err.contains("chosen member (\"b\"), not this node (\"c\")"), "{err}");
        let mut slave = RoleRequest::slave(7, "b:1", "b:2");
        slave.decision_token = "t7".into();
        check_change_role(Some(&d), &slave, "c", 8).unwrap();
        check_change_role(Some(&decision(DecisionPhase::Stable)), &slave, "c", 8).unwrap();
        let err = check_change_role(Some(&decision(DecisionPhase::Fencing)), &slave, "c", 8)
            .unwrap_err()
            .to_string();
        assert!(err.contains("FENCING"), "{err}");
        // An old runbook's request: no token, another epoch.
        let runbook = RoleRequest::slave(8, "b:1", "b:2");
        let err = check_change_role(Some(&d), &runbook, "c", 8).unwrap_err().to_string();
        assert!(err.contains("epoch 8 is not the decision's 7"), "{err}");
        assert!(err.contains("decision_token \"\" is not the decision's \"t7\""), "{err}");
        let zero = Decision { k: 0, ..d.clone() };
        let err = check_change_role(Some(&zero), &slave, "c", 8).unwrap_err().to_string();
        assert!(err.contains("k = 0"), "{err}");
        assert!(check_change_role(None, &slave, "c", 8).is_err());
    }
}
