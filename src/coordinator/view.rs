//! What the member agent last saw of its group, in the two forms the rest of the node needs:
//! the role the state record gives the node (the pod's `hasync.io/role` label,
//! [`super::kube`]) and whether the coordinator's view lets readiness be SERVING
//! (`control::health`). The agent publishes a [`GroupView`] after every round on a
//! `tokio::sync::watch` channel; readers never call into the agent, so nothing they do can
//! hold its lease renewals.
//!
//! Pure: the lease's end is an instant the agent computed, and [`GroupView::ready`] takes the
//! time as an argument.

use tokio::time::Instant;

use crate::config::Role;
use crate::coordinator::records::{GroupState, Phase};

/// The role the group's state record gives this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRole {
    /// The record (stable) names this node the master of its epoch, and the node runs as
    /// master at that epoch.
    Master,
    /// The record (stable) names another member the master, and this node runs as a slave at
    /// the record's epoch (the controller pointed it at that master).
    Following,
    /// Neither: a decision is running, the node has not taken the role the record gives it
    /// yet, or it is behind the record's epoch.
    Other,
}

/// The value of the pod label `hasync.io/role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleLabel {
    /// The state record names this node the master of its epoch.
    Master,
    /// Anything else.
    Slave,
}

impl RoleLabel {
    /// The label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleLabel::Master => "master",
            RoleLabel::Slave => "slave",
        }
    }
}

/// What the member agent last saw (see the module docs). The default is "nothing yet".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupView {
    /// The role the state record gives the node; None until a state record was read.
    pub role: Option<StateRole>,
    /// The state record's epoch (0 without one).
    pub epoch: u64,
    /// The master the state record names.
    pub master: Option<String>,
    /// Until when the member's lease holds as far as the agent knows: the send time of the
    /// last acknowledged renewal plus the TTL the engine said was left. None: no lease.
    pub lease_until: Option<Instant>,
}

impl GroupView {
    /// The view of member `name` whose node runs as `role` at `epoch`, given the state record
    /// last read (None: none yet) and the lease's end.
    pub fn of(
        name: &str,
        state: Option<&GroupState>,
        role: Role,
        epoch: u64,
        lease_until: Option<Instant>,
    ) -> Self {
        let Some(s) = state else {
            return Self { lease_until, ..Self::default() };
        };
        let stable_at_epoch = s.phase == Phase::Stable && epoch == s.epoch;
        let named = s.master.as_deref() == Some(name);
        let state_role = match role {
            Role::Master if stable_at_epoch && named => StateRole::Master,
            Role::Slave if stable_at_epoch && !named && s.master.is_some() => StateRole::Following,
            _ => StateRole::Other,
        };
        Self { role: Some(state_role), epoch: s.epoch, master: s.master.clone(), lease_until }
    }

    /// The pod label this view asks for; None before a state record was read (the label is
    /// left as it is).
    pub fn label(&self) -> Option<RoleLabel> {
        self.role.map(|r| match r {
            StateRole::Master => RoleLabel::Master,
            StateRole::Following | StateRole::Other => RoleLabel::Slave,
        })
    }

    /// Whether readiness may be SERVING by the coordinator's view at `now`: the node holds
    /// its lease, and the state record makes it the master of its epoch or a slave following
    /// the record's master. Err: why not, in words. (The node's own conditions, a SYNC master
    /// with its in-sync slaves and a slave in sync, come on top.)
    pub fn ready(&self, now: Instant) -> Result<(), String> {
        match self.lease_until {
            None => return Err("coordinator: no member lease".into()),
            Some(until) if until <= now => {
                return Err(
                    "coordinator: the member lease is not renewed (etcd unreachable?)".into()
                );
            }
            Some(_) => {}
        }
        let master = self.master.as_deref().unwrap_or("none");
        match self.role {
            None => Err("coordinator: no state record for the group yet".into()),
            Some(StateRole::Master | StateRole::Following) => Ok(()),
            Some(StateRole::Other) => Err(format!(
                "coordinator: the state record (epoch {}, master {master}) gives this node no \
                 role yet",
                self.epoch
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::coordinator::records::Mode;

    fn state(epoch: u64, master: Option<&str>, phase: Phase) -> GroupState {
        GroupState {
            phase,
            token: "t".into(),
            chosen: None,
            epoch_revision: 1,
            ..GroupState::stable(epoch, master, vec![], 1, Mode::Sync)
        }
    }

    #[test]
    fn the_role_is_what_the_state_record_says_at_its_epoch() {
        let s = state(3, Some("n1"), Phase::Stable);
        let role = |name, r, e| GroupView::of(name, Some(&s), r, e, None).role;
        assert_eq!(role("n1", Role::Master, 3), Some(StateRole::Master));
        assert_eq!(role("n2", Role::Slave, 3), Some(StateRole::Following));
        // Not at the record's epoch, or not in the record's role: neither.
        assert_eq!(role("n1", Role::Master, 2), Some(StateRole::Other));
        assert_eq!(role("n1", Role::Slave, 3), Some(StateRole::Other));
        assert_eq!(role("n2", Role::Master, 3), Some(StateRole::Other));
        assert_eq!(role("n2", Role::Slave, 2), Some(StateRole::Other));
        // While a decision runs, nobody is master or following.
        let fencing = state(4, Some("n1"), Phase::Fencing);
        assert_eq!(
            GroupView::of("n1", Some(&fencing), Role::Master, 4, None).role,
            Some(StateRole::Other)
        );
        let none = state(4, None, Phase::Stable);
        assert_eq!(
            GroupView::of("n2", Some(&none), Role::Slave, 4, None).role,
            Some(StateRole::Other)
        );
        assert_eq!(GroupView::of("n1", None, Role::Master, 0, None).role, None);
    }

    #[test]
    fn the_label_is_master_only_for_the_master_of_the_state() {
        let s = state(3, Some("n1"), Phase::Stable);
        let label = |name, r, e| GroupView::of(name, Some(&s), r, e, None).label();
        assert_eq!(label("n1", Role::Master, 3), Some(RoleLabel::Master));
        assert_eq!(label("n1", Role::Master, 2), Some(RoleLabel::Slave));
        assert_eq!(label("n2", Role::Slave, 3), Some(RoleLabel::Slave));
        assert_eq!(GroupView::of("n1", None, Role::Master, 0, None).label(), None);
        assert_eq!(RoleLabel::Master.as_str(), "master");
        assert_eq!(RoleLabel::Slave.as_str(), "slave");
    }

    #[tokio::test(start_paused = true)]
    async fn ready_needs_the_lease_and_a_role() {
        let now = Instant::now();
        let later = Some(now + Duration::from_secs(5));
        let s = state(3, Some("n1"), Phase::Stable);
        let master = GroupView::of("n1", Some(&s), Role::Master, 3, later);
        assert_eq!(master.ready(now), Ok(()));
        let slave = GroupView::of("n2", Some(&s), Role::Slave, 3, later);
        assert_eq!(slave.ready(now), Ok(()));
        // The lease ran out (renewals fail), or there is none.
        let e = master.ready(now + Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("lease is not renewed"), "{e}");
        let e = GroupView::of("n1", Some(&s), Role::Master, 3, None).ready(now).unwrap_err();
        assert!(e.contains("no member lease"), "{e}");
        // A lease but no role.
        let e = GroupView::of("n1", Some(&s), Role::Master, 2, later).ready(now).unwrap_err();
        assert!(e.contains("epoch 3, master n1"), "{e}");
        let e = GroupView::of("n1", None, Role::Master, 0, later).ready(now).unwrap_err();
        assert!(e.contains("no state record"), "{e}");
    }
}
