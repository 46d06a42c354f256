//! The readable end: where `Messages.Read` stops by default, so a reader never sees a record a
//! failover may cut.
//!
//! - ASYNC: the max offset (no promise is made about replicas).
//! - SYNC: the confirm offset the store keeps ([`crate::store::confirm`]), capped at the max
//!   offset. On a master it is its own: the master term's sync waiters start at it and raise
//!   it by the acks of this term, so a promoted master starts at the confirm offset it knew
//!   and a restarted one at the persisted value. On a slave it is the master's confirm offset
//!   as the slave last learned it (see below): a lower bound of the master's.
//!
//! Which of the two a slave applies follows its master's mode as the learner last saw it (its
//! own configured mode before it saw any, and always in classic mode), so a slave left at the
//! default ASYNC never serves past what its SYNC master confirmed.
//!
//! A slave with a master gRPC address learns it every `metadata.sync-interval` (first at once)
//! from the master's GetStatus, and takes it only while the master answers as a master in the
//! epoch the slave's history ends with (its log then agrees with the master's below its own max
//! offset), capped at its own max offset. The learned value trails the master's confirm offset
//! by at most one interval plus one call while the master answers, and stays put (still a lower
//! bound) while it does not. A slave without a master gRPC address (classic mode) learns
//! nothing: in SYNC mode it serves only up to what it had learned before.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{ReplicationMode, Role};
use crate::node::epoch::EpochHistory;
use crate::node::remote::{MasterApi, MasterConfirm};
use crate::node::{Node, RoleState};
use crate::store::CommitLog;

impl Node {
    /// Where Read stops by default (see the module docs): never past the max offset.
    pub fn readable_offset(&self) -> u64 {
        let (role, mode) = {
            let st = self.state();
            (st.role, st.replication.mode)
        };
        readable_end(self.readable_mode(role, mode), &self.store)
    }

    /// The mode that decides the readable end: a master's own; a slave's master's as it last
    /// learned it, or its own configured mode before it learned any (classic mode: always).
    pub(crate) fn readable_mode(&self, role: Role, own: ReplicationMode) -> ReplicationMode {
        match role {
            Role::Master => own,
            Role::Slave => {
                self.master_mode.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(own)
            }
        }
    }

    /// Starts learning the master's confirm offset on the slave plane in `st` (nothing in
    /// classic mode). Stopped with the plane, so nothing is learned after a role change.
    pub(super) fn learn_confirm_offset(&self, st: &RoleState) {
        if st.master_grpc.is_empty() {
            return;
        }
        // A new master: nothing is known of its mode until it answers.
        *self.master_mode.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let learner = Learner {
            master_mode: Arc::clone(&self.master_mode),
            store: Arc::clone(&self.store),
            api: Arc::clone(&self.remote.master),
            history: Arc::clone(&self.history),
            master_grpc: st.master_grpc.clone(),
        };
        let every = self.config.metadata.sync_interval;
        st.plane_tasks.spawn(learner.run(every, st.plane.child_token()));
    }
}

/// The readable end of `store` in `mode`.
pub(crate) fn readable_end(mode: ReplicationMode, store: &CommitLog) -> u64 {
    let max = store.max_offset();
    match mode {
        ReplicationMode::Async => max,
        ReplicationMode::Sync => store.confirm_offset().min(max),
    }
}

/// A slave's confirm-offset learner.
struct Learner {
    master_mode: Arc<Mutex<Option<ReplicationMode>>>,
    store: Arc<CommitLog>,
    api: Arc<dyn MasterApi>,
    history: Arc<Mutex<EpochHistory>>,
    master_grpc: String,
}

impl Learner {
    async fn run(self, every: Duration, cancel: CancellationToken) {
        loop {
            let answer = tokio::select! {
                _ = cancel.cancelled() => return,
                a = self.api.confirm(&self.master_grpc) => a,
            };
            match answer {
                Ok(m) => self.take(m),
                Err(e) => tracing::debug!(error = %e, "master's confirm offset not learned"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Raises the store's confirm offset to the master's when the master is one in the epoch
    /// this slave's history ends with.
    ///
    /// The history lock is held across the raise: the epoch check before a reconnect installs
    /// an adopted history under it after its truncate and before any byte of the new epoch is
    /// appended, so the raise is capped at a log that agrees with the epoch it checked.
    fn take(&self, m: MasterConfirm) {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = refusal(m, history.last().epoch) {
            tracing::debug!(?m, why, "master's confirm offset not taken");
            return;
        }
        self.store.raise_confirm_offset(m.confirm_offset);
        drop(history);
        *self.master_mode.lock().unwrap_or_else(|e| e.into_inner()) = Some(m.mode);
    }
}

/// Why a slave whose history ends with epoch `last` must not take `m`, if it must not.
fn refusal(m: MasterConfirm, last: u64) -> Option<&'static str> {
    if !m.is_master {
        return Some("the node does not answer as a master");
    }
    if m.epoch != last {
        return Some("the master's epoch is not the one this slave's history ends with");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_master_in_the_slaves_last_epoch_is_believed() {
        let m = MasterConfirm {
            is_master: true,
            epoch: 3,
            confirm_offset: 100,
            mode: ReplicationMode::Sync,
        };
        assert_eq!(refusal(m, 3), None);
        assert!(refusal(m, 2).is_some(), "the slave has not adopted the master's epoch yet");
        assert!(refusal(m, 4).is_some(), "a stale master");
        assert!(refusal(MasterConfirm { is_master: false, ..m }, 3).is_some());
    }
}
