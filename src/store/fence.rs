//! The commitlog's write fence: which writes it takes ([`Writes`], set by the node's role),
//! checked under the writer lock by [`CommitLog::append`] and [`CommitLog::append_at`], with a
//! token that refuses a write admitted before a change of the fence even once its path is open
//! again, and a test hook at the entry of every write.

use std::sync::Arc;

use crate::store::CommitLog;

/// The write fence as a writer saw it when it was admitted ([`CommitLog::fence_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceToken(pub(crate) u64);

/// Which writes the commitlog takes: its write fence, set by the node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Writes {
    /// Both paths (a store used on its own).
    #[default]
    Any,
    /// Only [`CommitLog::append`] (a master's puts).
    Appends,
    /// Only [`CommitLog::append_at`] (a slave's replicated bytes).
    Replicated,
    /// None: the fence is raised (a role change runs or failed, or the node promised an epoch
    /// to a fence).
    Fenced,
}

/// What runs at the entry of every write, before the writer lock (a test's pause point).
#[derive(Default)]
pub(crate) struct WriteHook(std::sync::RwLock<Option<Arc<dyn Fn() + Send + Sync>>>);

impl std::fmt::Debug for WriteHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteHook")
    }
}

impl CommitLog {
    /// Sets which writes are taken (the write fence); the others are refused with
    /// [`Error::Fenced`]. Takes the writer lock, so when this returns no write of a path now
    /// closed is in flight: what it appended is in the max offset, nothing more can land.
    /// Truncate and wipe are not fenced (a role change runs them behind the fence).
    /// A call that changes them changes the [`FenceToken`] too.
    pub fn set_writes(&self, writes: Writes) {
        let mut w = self.shared.writer();
        if w.writes != writes {
            w.writes = writes;
            w.fence_generation += 1;
        }
        *self.shared.writes.lock().unwrap_or_else(|e| e.into_inner()) =
            (w.writes, w.fence_generation);
    }

    /// Raises the fence only where it takes a master's appends ([`Writes::Appends`] or
    /// [`Writes::Any`]): a compare-and-set under the writer lock, so a fence decided on a
    /// master never closes the replicated path of a node that became a slave meanwhile.
    /// Whether it raised the fence.
    pub fn fence_appends(&self) -> bool {
        let mut w = self.shared.writer();
        if !matches!(w.writes, Writes::Appends | Writes::Any) {
            return false;
        }
        w.writes = Writes::Fenced;
        w.fence_generation += 1;
        *self.shared.writes.lock().unwrap_or_else(|e| e.into_inner()) =
            (w.writes, w.fence_generation);
        true
    }

    /// The fence as of now, for [`CommitLog::append_admitted`]: take it before the checks that
    /// admit the write. Read from the mirror (never waits on the writer lock); the mirror is
    /// stored after the writer state under the writer lock, so a token can only be older than
    /// the fence, which refuses the write, never admits one the fence closed.
    pub fn fence_token(&self) -> FenceToken {
        FenceToken(self.shared.writes.lock().unwrap_or_else(|e| e.into_inner()).1)
    }

    /// Which writes are taken (as last set; never waits on the writer lock).
    pub fn writes(&self) -> Writes {
        self.shared.writes.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Sets (or clears, with `None`) a hook that runs at the entry of every [`CommitLog::append`]
    /// and [`CommitLog::append_at`], after validation and before the writer lock: a pause point
    /// for race tests (a hook that blocks parks the write there). Not for production use.
    pub fn set_write_hook(&self, hook: Option<Arc<dyn Fn() + Send + Sync>>) {
        *self.write_hook.0.write().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    pub(crate) fn run_write_hook(&self) {
        let hook = self.write_hook.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}
