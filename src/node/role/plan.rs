//! The pure half of a role change: every check and every refusal, from a snapshot of the node
//! (no I/O; the new master's epochs are fetched by the caller and passed in). A plan says what
//! the execution will do; a refusal here changes nothing.

use std::net::{IpAddr, SocketAddr};

use crate::config::Role;
use crate::node::Error;
use crate::node::epoch::{EpochHistory, consistent_point};
use crate::node::remote::MasterEpochs;
use crate::node::role::{RoleChange, RoleRequest};

/// What a slave does with its log against a master's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing to cut.
    Keep,
    /// Cut at this offset.
    Truncate(u64),
    /// Empty the log (force_resync).
    Wipe,
}

/// Decides how a slave's log (history `local`, max `local_max`) converges with its master's.
pub(crate) fn verdict(
    local: &EpochHistory,
    local_max: u64,
    master: &EpochHistory,
    master_max: u64,
    force_resync: bool,
) -> Result<Verdict, String> {
    let (l, m) = (local.last(), master.last());
    let refuse = |why: String| if force_resync { Ok(Verdict::Wipe) } else { Err(why) };
    if m.epoch < l.epoch {
        return refuse(format!(
            "the master's last epoch {} is lower than this node's {}: it is stale",
            m.epoch, l.epoch
        ));
    }
    let Some(point) = consistent_point(local, local_max, master, master_max) else {
        return refuse("no epoch shared with the master: the logs cannot converge".into());
    };
    if point >= local_max {
        return Ok(Verdict::Keep);
    }
    if m.epoch == l.epoch {
        return refuse(format!(
            "the master is behind this node in the same epoch {}: its log ends at {master_max}, \
             this node's at {local_max}; refusing to truncate (promote this node instead, or \
             force_resync)",
            m.epoch
        ));
    }
    Ok(Verdict::Truncate(point))
}

/// The highest epoch a ChangeRole may ask for: 2^53 - 1 (2^53 itself is refused too, as the
/// reviewed bound had it accepted). Exact in a double (so every JSON client reads it back as
/// sent), and beyond any real sequence of role changes. Any bound has a last epoch after which
/// only the request in force can be confirmed; this one keeps it out of reach of every real
/// sequence of changes, not of a request that asks for it.
pub(crate) const MAX_EPOCH: u64 = (1 << 53) - 1;

/// An address a demotion names, as the caller resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The request field.
    pub(crate) field: &'static str,
    /// What the request says.
    pub(crate) asked: String,
    /// What it resolved to, each with whether the IP is one of this host's (the unspecified
    /// address counts as local: connecting to it reaches this host).
    pub(crate) resolved: Vec<(SocketAddr, bool)>,
}

/// The node as a plan sees it (taken under the role-change lock, so nothing else changes it).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The epoch in force.
    pub(crate) epoch: u64,
    /// The request that set it (None before the first change, or when it failed).
    pub(crate) last_request: Option<RoleRequest>,
    /// A role change that failed (at `epoch`), if any.
    pub(crate) failed: Option<RoleChange>,
    /// The epoch history.
    pub(crate) history: EpochHistory,
    /// The store's max offset.
    pub(crate) max_offset: u64,
    /// The end of its last complete record.
    pub(crate) dispatched: u64,
    /// Whether a master data plane is running (a promotion that opens no epoch keeps it).
    pub(crate) master_plane: bool,
    /// This data directory's id (a master reporting it is this node).
    pub(crate) data_dir_id: String,
}

/// How a request relates to the epoch in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The exact repeat of the request in force: confirm the role (lower the fence).
    Confirm,
    /// A new change (a higher epoch), or the exact repeat of a failed one (resumed).
    Change {
        /// The exact repeat of a change that failed at this epoch.
        resume: bool,
    },
}

/// The epoch rules: a stale epoch is refused; at the epoch in force only the exact repeat of
/// the request that set it (confirmed) or of the change that failed at it (resumed) is
/// accepted; a higher epoch is a new change (which also ends a failed one).
pub(crate) fn admit(s: &Snapshot, req: &RoleRequest) -> Result<Admission, Error> {
    if req.epoch > MAX_EPOCH {
        return Err(Error::InvalidArgument {
            field: "epoch",
            reason: format!(
                "{} is at or above 2^53 (at most {MAX_EPOCH}): no higher epoch would be left \
                 for the next change",
                req.epoch
            ),
        });
    }
    if req.epoch < s.epoch {
        return Err(Error::StaleEpoch { asked: req.epoch, current: s.epoch });
    }
    if req.epoch > s.epoch {
        return Ok(Admission::Change { resume: false });
    }
    match &s.failed {
        Some(f) if f.request == *req => Ok(Admission::Change { resume: true }),
        Some(f) => Err(Error::RoleRefused(format!(
            "a role change to {} at epoch {} failed at step \"{}\"; only its exact repeat (which \
             resumes it) is accepted at this epoch; use a higher epoch for another change",
            f.request.role, f.epoch, f.failed_step
        ))),
        None if s.last_request.as_ref() == Some(req) => Ok(Admission::Confirm),
        None => Err(Error::RoleRefused(format!(
            "epoch {} is already in force; only an exact repeat of the request that set it is \
             accepted; use a higher epoch for a change",
            s.epoch
        ))),
    }
}

/// What the execution of a change does, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The request.
    pub(crate) req: RoleRequest,
    /// A promotion that keeps the running master data plane: only one that opens no epoch (a
    /// resumed promotion whose entry is written; in practice a failed change has no plane, so
    /// this is a guard rather than a path). A running master promoted to a new epoch restarts
    /// its plane, so a new term starts: every slave reconnects through its epoch check and
    /// adopts the new history before a byte of the new epoch counts as its ack (a slave still
    /// on the old history would ack new-epoch bytes, then cut them as bytes the master never
    /// had).
    pub(crate) keep_plane: bool,
    /// What happens to the log (for a demotion: as of the plan; the execution re-checks it
    /// against the master's epochs fetched again once the data plane stopped).
    pub(crate) log: Verdict,
    /// A promotion: the history entry to append, `None` when a resumed promotion already wrote
    /// it. A demotion adopts the master's history instead.
    pub(crate) open_epoch: Option<u64>,
    /// A demotion's master (None in classic mode: no gRPC address, no epoch check).
    pub(crate) master: Option<MasterEpochs>,
}

/// Plans a promotion: the epoch must be above the history's last (a resumed promotion may find
/// its own epoch there already), and the log must be able to carry it (it may not end below the
/// start of the history's last epoch). A slave's partial last record is cut.
pub(crate) fn promote(s: &Snapshot, req: RoleRequest, resume: bool) -> Result<Plan, Error> {
    let last = s.history.last();
    let open_epoch = if resume && last.epoch == req.epoch {
        None
    } else if req.epoch <= last.epoch {
        return Err(Error::RoleRefused(format!(
            "promotion needs an epoch above the history's last ({}), got {}",
            last.epoch, req.epoch
        )));
    } else {
        s.history.clone().append(req.epoch, s.dispatched)?;
        Some(req.epoch)
    };
    let log =
        if s.max_offset > s.dispatched { Verdict::Truncate(s.dispatched) } else { Verdict::Keep };
    let keep_plane = s.master_plane && open_epoch.is_none();
    Ok(Plan { req, keep_plane, log, open_epoch, master: None })
}

/// Refuses a demotion without the master's HA address (before its master is asked anything).
pub(crate) fn check_demote(req: &RoleRequest) -> Result<(), Error> {
    if req.master_ha.trim().is_empty() {
        return Err(Error::InvalidArgument {
            field: "master_ha_address",
            reason: "a slave needs its master's HA address".into(),
        });
    }
    Ok(())
}

/// Refuses a demotion whose master address is one of this node's own `listeners` (HA and
/// gRPC): the same port at the same IP, or at any local IP when the listener (or the target)
/// is the unspecified address (0.0.0.0, [::]).
pub(crate) fn check_not_self(listeners: &[SocketAddr], targets: &[Target]) -> Result<(), Error> {
    let canon = |ip: IpAddr| ip.to_canonical();
    let is_own = |addr: SocketAddr, local: bool| {
        listeners.iter().any(|l| {
            l.port() == addr.port()
                && (canon(l.ip()) == canon(addr.ip())
                    || addr.ip().is_unspecified()
                    || (l.ip().is_unspecified() && local))
        })
    };
    for t in targets {
        if let Some((addr, _)) = t.resolved.iter().find(|(a, local)| is_own(*a, *local)) {
            return Err(Error::InvalidArgument {
                field: t.field,
                reason: format!(
                    "{} ({addr}) is this node's own listener: a node cannot follow itself",
                    t.asked
                ),
            });
        }
    }
    Ok(())
}

/// Plans a demotion against the new master's epochs (`None`: classic mode) and the data-dir id
/// its status reports: refused when that id is this node's (it is this node, at another
/// address), or when the logs cannot converge without losing data (unless `force_resync`,
/// which wipes).
pub(crate) fn demote(
    s: &Snapshot,
    req: RoleRequest,
    master: Option<MasterEpochs>,
    master_data_dir_id: Option<&str>,
) -> Result<Plan, Error> {
    check_demote(&req)?;
    debug_assert_eq!(req.role, Role::Slave);
    if master_data_dir_id == Some(s.data_dir_id.as_str()) {
        return Err(Error::InvalidArgument {
            field: "master_grpc_address",
            reason: format!(
                "the master at {} reports this node's own data-dir id {}: a node cannot follow \
                 itself",
                req.master_grpc, s.data_dir_id
            ),
        });
    }
    let log = match &master {
        None => Verdict::Keep,
        Some(m) => verdict(&s.history, s.max_offset, &m.history, m.max_offset, req.force_resync)
            .map_err(Error::Diverged)?,
    };
    Ok(Plan { req, keep_plane: false, log, open_epoch: None, master })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::epoch::history_of as h;
    use crate::node::role::{RoleChangeState, Step};

    #[test]
    fn a_master_behind_in_the_same_epoch_is_refused_a_newer_epoch_truncates() {
        let same = h(&[(1, 0)]);
        assert!(verdict(&same, 900, &same, 600, false).unwrap_err().contains("behind this node"));
        assert!(matches!(verdict(&same, 900, &same, 600, true), Ok(Verdict::Wipe)));
        let newer = h(&[(1, 0), (2, 500)]);
        assert!(matches!(verdict(&same, 900, &newer, 1000, false), Ok(Verdict::Truncate(500))));
        assert!(matches!(verdict(&same, 400, &newer, 1000, false), Ok(Verdict::Keep)));
        assert!(verdict(&newer, 900, &same, 900, false).unwrap_err().contains("stale"));
    }

    fn snapshot(epoch: u64) -> Snapshot {
        Snapshot {
            epoch,
            last_request: Some(RoleRequest::master(epoch)),
            failed: None,
            history: h(&[(epoch, 0)]),
            max_offset: 1000,
            dispatched: 1000,
            master_plane: true,
            data_dir_id: "0123456789abcdef0123456789abcdef".into(),
        }
    }

    fn failed(req: RoleRequest) -> RoleChange {
        RoleChange {
            state: RoleChangeState::Failed,
            failed_step: Step::WriteEpochFile.name(),
            error: "EIO".into(),
            epoch: req.epoch,
            request: req,
        }
    }

    #[test]
    fn the_epoch_rules_confirm_resume_and_refuse() {
        let s = snapshot(2);
        assert!(matches!(admit(&s, &RoleRequest::master(1)), Err(Error::StaleEpoch { .. })));
        assert_eq!(admit(&s, &RoleRequest::master(2)).unwrap(), Admission::Confirm);
        let other = RoleRequest::slave(2, "m:1", "");
        assert!(admit(&s, &other).unwrap_err().to_string().contains("already in force"));
        assert_eq!(
            admit(&s, &RoleRequest { epoch: 3, ..other.clone() }).unwrap(),
            Admission::Change { resume: false }
        );
        // A change failed at epoch 3: its exact repeat resumes, another request is refused, a
        // higher epoch is a new change.
        let req = RoleRequest::slave(3, "m:1", "m:2");
        let s = Snapshot { epoch: 3, last_request: None, failed: Some(failed(req.clone())), ..s };
        assert_eq!(admit(&s, &req).unwrap(), Admission::Change { resume: true });
        let err = admit(&s, &RoleRequest::master(3)).unwrap_err().to_string();
        assert!(err.contains("failed at step \"write epoch file\""), "{err}");
        assert_eq!(
            admit(&s, &RoleRequest::master(4)).unwrap(),
            Admission::Change { resume: false }
        );
    }

    #[test]
    fn a_promotion_plan_checks_the_history_and_cuts_a_partial_record() {
        let s = Snapshot { master_plane: false, max_offset: 1100, ..snapshot(2) };
        let err = promote(&s, RoleRequest::master(2), false).unwrap_err().to_string();
        assert!(err.contains("above the history's last (2)"), "{err}");
        let p = promote(&s, RoleRequest::master(3), false).unwrap();
        assert_eq!((p.log, p.open_epoch, p.keep_plane), (Verdict::Truncate(1000), Some(3), false));
        // Resumed after the epoch file was written: the entry is there already.
        let s = Snapshot { history: h(&[(2, 0), (3, 1000)]), max_offset: 1000, ..s };
        let p = promote(&s, RoleRequest::master(3), true).unwrap();
        assert_eq!((p.log, p.open_epoch), (Verdict::Keep, None));
        // A log that ends below the start of the history's last epoch cannot carry a new one.
        let s = Snapshot { history: h(&[(2, 5000)]), ..snapshot(2) };
        assert!(matches!(promote(&s, RoleRequest::master(3), false), Err(Error::Epoch(_))));
    }

    #[test]
    fn a_running_master_promoted_to_a_new_epoch_restarts_its_data_plane() {
        // The slaves of the old term must reconnect through their epoch check (found by the
        // fault harness: an old-term slave acked new-epoch bytes, then cut them).
        let s = Snapshot { max_offset: 1000, ..snapshot(2) };
        let p = promote(&s, RoleRequest::master(3), false).unwrap();
        assert_eq!((p.open_epoch, p.keep_plane), (Some(3), false));
        // A resumed promotion whose entry is written opens no epoch: its plane may stay.
        let s = Snapshot { history: h(&[(2, 0), (3, 1000)]), ..s };
        let p = promote(&s, RoleRequest::master(3), true).unwrap();
        assert_eq!((p.open_epoch, p.keep_plane), (None, true));
    }

    #[test]
    fn a_demotion_plan_refuses_divergence_and_says_where_it_cuts() {
        let s = snapshot(1);
        let newer = MasterEpochs { history: h(&[(1, 0), (2, 500)]), max_offset: 2000 };
        let p = demote(&s, RoleRequest::slave(2, "m:1", "m:2"), Some(newer), None).unwrap();
        assert_eq!(p.log, Verdict::Truncate(500));
        let behind = MasterEpochs { history: h(&[(1, 0)]), max_offset: 10 };
        let req = RoleRequest::slave(2, "m:1", "m:2");
        assert!(matches!(demote(&s, req, Some(behind), None), Err(Error::Diverged(_))));
        let classic = demote(&s, RoleRequest::slave(2, "m:1", ""), None, None).unwrap();
        assert_eq!(classic.log, Verdict::Keep);
        let no_ha = demote(&s, RoleRequest::slave(2, " ", ""), None, None);
        assert!(matches!(no_ha, Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn an_epoch_of_2_pow_53_or_above_is_refused_whatever_the_request() {
        let s = snapshot(2);
        assert_eq!(MAX_EPOCH + 1, 1 << 53);
        for epoch in [1 << 53, (1 << 53) + 1, u64::MAX] {
            for req in [RoleRequest::master(epoch), RoleRequest::slave(epoch, "m:1", "")] {
                let err = admit(&s, &req).unwrap_err();
                assert!(matches!(err, Error::InvalidArgument { field: "epoch", .. }), "{err}");
                assert!(err.to_string().contains("at or above 2^53"), "{err}");
            }
        }
        assert_eq!(
            admit(&s, &RoleRequest::master(MAX_EPOCH)).unwrap(),
            Admission::Change { resume: false }
        );
    }

    fn target(field: &'static str, addr: &str, local: bool) -> Target {
        Target { field, asked: addr.into(), resolved: vec![(addr.parse().unwrap(), local)] }
    }

    #[test]
    fn a_master_at_one_of_this_nodes_listeners_is_refused() {
        let listeners: Vec<SocketAddr> =
            vec!["127.0.0.1:10912".parse().unwrap(), "0.0.0.0:9876".parse().unwrap()];
        let own = |t: Target| check_not_self(&listeners, &[t]);
        let refused = |t: Target| {
            let err = own(t.clone()).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { field, .. } if field == t.field));
            assert!(err.to_string().contains("this node's own listener"), "{err}");
        };
        refused(target("master_ha_address", "127.0.0.1:10912", true));
        refused(target("master_ha_address", "0.0.0.0:10912", true));
        refused(target("master_ha_address", "[::ffff:127.0.0.1]:10912", true));
        // A wildcard listener is at every local address, this host's own included.
        refused(target("master_grpc_address", "127.0.0.1:9876", true));
        refused(target("master_grpc_address", "10.1.2.3:9876", true));
        refused(target("master_ha_address", "[::1]:9876", true));
        // Another host, another port, or another local IP than a specific listener's: fine.
        own(target("master_ha_address", "10.1.2.3:9876", false)).unwrap();
        own(target("master_ha_address", "127.0.0.1:10913", true)).unwrap();
        own(target("master_ha_address", "127.0.0.2:10912", true)).unwrap();
        own(Target { field: "master_ha_address", asked: "nowhere:1".into(), resolved: vec![] })
            .unwrap();
    }

    #[test]
    fn a_master_reporting_this_nodes_data_dir_id_is_refused() {
        let s = snapshot(1);
        let m = MasterEpochs { history: h(&[(1, 0)]), max_offset: 1000 };
        let req = RoleRequest::slave(2, "m:1", "m:2");
        let err = demote(&s, req.clone(), Some(m.clone()), Some(&s.data_dir_id)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { field: "master_grpc_address", .. }));
        assert!(err.to_string().contains(&s.data_dir_id), "{err}");
        demote(&s, req, Some(m), Some("ffffffffffffffffffffffffffffffff")).unwrap();
    }
}
