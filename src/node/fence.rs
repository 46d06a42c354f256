//! The fence (issue 17): `Replication.Fence` makes a node promise an epoch. The promise is
//! written (`<data-dir>/promise`, kind "promise" in the common state-file format, atomically and
//! fsynced through the file-system seam) before anything else changes, then the node closes its
//! HA link (a slave stops following, a master stops its data plane: waiting SYNC puts end
//! SERVICE_NOT_AVAILABLE, as at a shutdown) and raises the commitlog's write fence, and only then
//! reads the offsets it answers. From then on it follows and acks no master whose last epoch is
//! below the promise and accepts no ChangeRole below it; it stays fenced (across restarts too,
//! over its persisted role) until a ChangeRole to an epoch at or above the promise completes.
//! Nothing else, a timeout least of all, lowers it.
//!
//! In coordinator mode the fence must match the decision (`node::coordination`); in static mode
//! it is checked against the node's own epochs only. A repeat at the promised epoch answers the
//! node's state again and changes nothing.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::Role;
use crate::node::epoch::{EpochEntry, EpochHistory};
use crate::node::role::plan::MAX_EPOCH;
use crate::node::{Error, Node};
use crate::store::fs::FileSystem;
use crate::store::state_file::{self, StateFileError};

/// The promise file's name inside the data directory.
pub const PROMISE_FILE: &str = "promise";
/// The state-file kind of the promise file.
const KIND: &str = "promise";

/// The promised epoch, as the promise file holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Promise {
    /// The epoch promised (at least 1).
    pub(crate) epoch: u64,
    /// The token of the fence that asked for it (kept for people; never compared).
    #[serde(default)]
    pub(crate) token: String,
}

impl Promise {
    /// The promise in `<dir>`, if any, read through `fs`.
    pub(crate) fn load(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>, StateFileError> {
        let path = dir.join(PROMISE_FILE);
        let legacy = |_: &[u8]| Err("not a promise file (no state-file header)".to_owned());
        let promise: Option<Self> = state_file::load(fs, KIND, &path, legacy)?;
        if let Some(p) = &promise
            && (p.epoch == 0 || p.epoch > MAX_EPOCH)
        {
            return Err(StateFileError::Corrupt {
                kind: KIND,
                path,
                reason: format!("promised epoch {} is outside 1..={MAX_EPOCH}", p.epoch),
            });
        }
        Ok(promise)
    }

    /// Writes it to `<dir>` atomically (temporary file, fsync, rename, directory fsync).
    pub(crate) fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<(), StateFileError> {
        debug_assert!(self.epoch >= 1 && self.epoch <= MAX_EPOCH);
        state_file::store(fs, KIND, &dir.join(PROMISE_FILE), self)
    }
}

/// What a fenced node answers: who it is and where its log ends, read once its append path is
/// blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceOutcome {
    /// The epoch this node promised.
    pub promised_epoch: u64,
    /// `node.name`.
    pub node_name: String,
    /// This data directory's id.
    pub data_dir_id: String,
    /// The role in force (fenced: it takes no writes of it).
    pub role: Role,
    /// The role's epoch.
    pub epoch: u64,
    /// The epoch history.
    pub history: Vec<EpochEntry>,
    /// The epoch of the last record: the history's epoch covering `end_offset - 1` (0 for an
    /// empty log).
    pub last_record_epoch: u64,
    /// The end of the last whole record (a slave's partial last record is not counted).
    pub end_offset: u64,
    /// With a drain: whether the target acked `end_offset` before the HA link closed.
    pub drained: bool,
}

/// The epoch of the history covering `offset` (the last entry starting at or below it).
pub(crate) fn epoch_covering(history: &EpochHistory, offset: u64) -> u64 {
    let entries = history.entries();
    let covering = entries.iter().rev().find(|e| e.start_offset <= offset);
    covering.map_or(0, |e| e.epoch)
}

impl Node {
    /// Fences the node at `epoch` (see the module docs): persists the promise, closes the HA
    /// link, raises the write fence, then answers what it holds.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for epoch 0 or 2^53 and above; [`Error::Coordinated`] when
    /// the request does not match the decision (coordinator mode); [`Error::FenceRefused`] for
    /// an epoch below the promise, or not above the node's epoch; [`Error::StateFile`] when the
    /// promise cannot be written (nothing changed).
    pub async fn fence(&self, epoch: u64, token: &str) -> Result<FenceOutcome, Error> {
        self.fence_draining(epoch, token, "").await
    }

    /// [`Node::fence`] with a switchover's drain: on a master with `drain_for` a member name,
    /// puts stop first (the write fence), then the fence waits at most
    /// `replication.slave-timeout` until the replica registered under that name acked the max
    /// offset, then promises as a plain fence does. `drained` in the answer says whether it
    /// caught up.
    pub async fn fence_draining(
        &self,
        epoch: u64,
        token: &str,
        drain_for: &str,
    ) -> Result<FenceOutcome, Error> {
        let _one_at_a_time = self.role_change.lock().await;
        if !self.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::FenceRefused("the node is shutting down".into()));
        }
        if epoch == 0 || epoch > MAX_EPOCH {
            return Err(Error::InvalidArgument {
                field: "epoch",
                reason: format!("a fence needs an epoch in 1..={MAX_EPOCH}, got {epoch}"),
            });
        }
        if let Some(c) = &self.coordination {
            let decision = super::coordination::read(c.as_ref()).await?;
            super::coordination::check_fence(decision.as_ref(), epoch, token)?;
        }
        let promised = self.promised_epoch();
        if epoch < promised {
            return Err(Error::FenceRefused(format!(
                "epoch {epoch} is below this node's promised epoch {promised}"
            )));
        }
        let mut drained = false;
        if epoch > promised {
            if !drain_for.is_empty() && self.role() == crate::config::Role::Master {
                drained = self.drain(drain_for).await;
            }
            self.promise(epoch, token).await?;
        }
        let mut outcome = self.fence_outcome();
        outcome.drained = drained;
        Ok(outcome)
    }

    /// Stops puts, then waits (at most `replication.slave-timeout`) until the replica
    /// registered as `member` acked the max offset; whether it did.
    async fn drain(&self, member: &str) -> bool {
        self.raise_fence().await;
        let end = self.store.max_offset();
        let deadline = tokio::time::Instant::now() + self.config.replication.slave_timeout;
        loop {
            let acked = self
                .status()
                .slaves
                .iter()
                .filter(|r| r.node_name == member)
                .map(|r| r.ack_offset)
                .max()
                .unwrap_or(0);
            if acked >= end {
                tracing::info!(member, end, "switchover drain: the target acked the max offset");
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    member,
                    end,
                    acked,
                    "switchover drain: the target did not catch up in time"
                );
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Promises `epoch` (above the promise in force): refused unless it is above every epoch
    /// the node knows; then the promise file, then the HA link closed and the write fence.
    async fn promise(&self, epoch: u64, token: &str) -> Result<(), Error> {
        let known = {
            let st = self.state();
            st.epoch.max(self.history.lock().unwrap_or_else(|e| e.into_inner()).last().epoch)
        };
        if epoch <= known {
            return Err(Error::FenceRefused(format!(
                "epoch {epoch} is not above this node's epoch {known}: a fence needs a new epoch"
            )));
        }
        let promise = Promise { epoch, token: token.to_owned() };
        promise.store(self.fs.as_ref(), &self.config.node.data_dir)?;
        self.state().promise_fenced = true;
        self.promised.store(epoch, std::sync::atomic::Ordering::SeqCst);
        self.raise_fence().await;
        self.stop_plane().await;
        tracing::warn!(
            epoch,
            token,
            "fenced: promised epoch; no writes, no HA link until a \
            ChangeRole at this epoch or above"
        );
        Ok(())
    }

    /// Coordinator mode: fences this master's puts at once, decided by the agent on what it
    /// saw (another master in the state record, or an ASYNC lease past its margin). Only a
    /// master's appends close (a compare-and-set on the write fence): a node that a role
    /// change made a slave meanwhile keeps replicating. Then metadata writes drain. With
    /// `stop_plane_at` the epoch the decision saw, the master plane (its HA connections)
    /// stops too, under the role-change lock so that no role change runs beside it, and only
    /// if the node is still the master at that epoch and still fenced: a role change that
    /// came in between keeps the plane it started. Whether the fence was raised here.
    pub async fn fence_master_writes(&self, stop_plane_at: Option<u64>) -> bool {
        let master_at = |epoch| {
            let st = self.state();
            st.role == Role::Master && st.epoch == epoch
        };
        if stop_plane_at.is_some_and(|epoch| !master_at(epoch)) {
            return false;
        }
        let raised = self.store.fence_appends();
        drop(self.metadata_gate.write().await);
        let Some(epoch) = stop_plane_at else { return raised };
        let _one_at_a_time = self.role_change.lock().await;
        let still = master_at(epoch) && self.state().master.is_some();
        if still && self.fenced() && self.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            self.stop_plane().await;
        }
        raised
    }

    /// The epoch this node promised to a fence (0: none).
    pub fn promised_epoch(&self) -> u64 {
        self.promised.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The fence's answer, read under the role-state and history locks.
    fn fence_outcome(&self) -> FenceOutcome {
        let (role, epoch, history) = {
            let st = self.state();
            let history = self.history.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (st.role, st.epoch, history)
        };
        let end_offset = self.store.dispatched_offset();
        let last_record_epoch =
            if end_offset == 0 { 0 } else { epoch_covering(&history, end_offset - 1) };
        FenceOutcome {
            promised_epoch: self.promised_epoch(),
            node_name: self.config.node.name.clone(),
            data_dir_id: self.data_dir_id.clone(),
            role,
            epoch,
            history: history.entries().to_vec(),
            last_record_epoch,
            end_offset,
            drained: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::epoch::history_of;
    use crate::store::fs::{SimFs, StdFs};

    #[test]
    fn the_promise_file_round_trips_in_the_state_file_format() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Promise::load(&StdFs, dir.path()).unwrap(), None);
        let p = Promise { epoch: 9, token: "tok-9".into() };
        p.store(&StdFs, dir.path()).unwrap();
        let bytes = std::fs::read(dir.path().join(PROMISE_FILE)).unwrap();
        assert!(bytes.starts_with(b"hasync-state promise v1 "), "{bytes:?}");
        assert_eq!(Promise::load(&StdFs, dir.path()).unwrap(), Some(p));
    }

    #[test]
    fn a_damaged_promise_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROMISE_FILE);
        Promise { epoch: 3, token: String::new() }.store(&StdFs, dir.path()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap().replace("\"epoch\":3", "\"epoch\":1");
        std::fs::write(&path, text).unwrap();
        let err = Promise::load(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(err, StateFileError::Corrupt { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("promise file") && text.contains("checksum"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        // A cut file, a file of another kind and an epoch out of range are refused too.
        let whole = state_file::encode(KIND, br#"{"epoch":3,"token":""}"#);
        std::fs::write(&path, &whole[..whole.len() - 2]).unwrap();
        let err = Promise::load(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(err, StateFileError::Truncated { .. }), "{err}");
        std::fs::write(&path, state_file::encode("role", b"{}")).unwrap();
        assert!(Promise::load(&StdFs, dir.path()).unwrap_err().to_string().contains("\"role\""));
        std::fs::write(&path, state_file::encode(KIND, br#"{"epoch":0}"#)).unwrap();
        let err = Promise::load(&StdFs, dir.path()).unwrap_err().to_string();
        assert!(err.contains("promised epoch 0"), "{err}");
        std::fs::write(&path, b"{\"epoch\":3}").unwrap();
        let err = Promise::load(&StdFs, dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a promise file"), "{err}");
    }

    #[test]
    fn a_failed_promise_write_keeps_the_old_promise_and_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let fs = SimFs::new();
        let old = Promise { epoch: 2, token: "a".into() };
        old.store(&fs, dir.path()).unwrap();
        fs.fail_writes(|p| p.ends_with(PROMISE_FILE));
        let err = Promise { epoch: 3, token: "b".into() }.store(&fs, dir.path()).unwrap_err();
        assert!(matches!(&err, StateFileError::Io { op: "write", .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(Promise::load(&fs, dir.path()).unwrap(), Some(old));
    }

    #[test]
    fn the_last_record_epoch_is_the_entry_covering_it() {
        let h = history_of(&[(1, 100), (2, 100), (4, 300)]);
        assert_eq!(epoch_covering(&h, 0), 0);
        assert_eq!(epoch_covering(&h, 99), 0);
        // Epoch 1 opened and held nothing: epoch 2 starts at the same offset.
        assert_eq!(epoch_covering(&h, 100), 2);
        assert_eq!(epoch_covering(&h, 299), 2);
        assert_eq!(epoch_covering(&h, 300), 4);
        assert_eq!(epoch_covering(&h, u64::MAX), 4);
    }
}
