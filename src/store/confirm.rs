//! The confirm offset the store keeps for the node: the highest offset the node knows `k`
//! slaves of a master acknowledged (a master's own acks, or a slave's lower bound learned from
//! its master). Reads in SYNC mode stop there, so it is persisted with the checkpoint (a
//! restarted node is readable at once up to it) and it never exceeds the log end: a raise is
//! capped at the max offset, and a truncate or wipe lowers it to the new end (the checkpoint
//! that follows persists the clamp; the open clamps it to the recovered end too).
//!
//! Lock order: the confirm lock is a leaf. A truncate publishes its lower max offset before it
//! takes the lock to clamp, and a raise reads the max offset under the lock, so a raise racing a
//! truncate either sees the lower max or is clamped after it.

use crate::store::commitlog::Shared;

impl Shared {
    fn confirm_lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.confirm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The confirm offset.
    pub(crate) fn confirm_offset(&self) -> u64 {
        *self.confirm_lock()
    }

    /// Raises the confirm offset to `offset`, capped at the max offset; returns it.
    pub(crate) fn raise_confirm(&self, offset: u64) -> u64 {
        let mut confirm = self.confirm_lock();
        let max = self.max_offset();
        *confirm = (*confirm).max(offset.min(max));
        debug_assert!(*confirm <= max);
        *confirm
    }

    /// Lowers the confirm offset to `end` (a truncate or wipe published `end` as the max offset).
    pub(crate) fn clamp_confirm(&self, end: u64) {
        let mut confirm = self.confirm_lock();
        if *confirm > end {
            tracing::info!(from = *confirm, to = end, "confirm offset clamped to the new log end");
            *confirm = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::store::checkpoint::Checkpoint;
    use crate::store::fs::StdFs;
    use crate::store::record::Message;
    use crate::store::{CommitLog, StoreOptions};

    fn msg(body: &[u8]) -> Message {
        crate::store::record::test_message("T", body)
    }

    fn open(dir: &std::path::Path) -> CommitLog {
        let opts = StoreOptions { segment_size: 64 * 1024, ..StoreOptions::default() };
        CommitLog::open(Arc::new(StdFs), dir, opts).unwrap()
    }

    #[test]
    fn raised_capped_persisted_and_clamped_by_a_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let first = log.append(&[msg(b"a")]).unwrap().end_offset;
        let end = log.append(&[msg(b"b")]).unwrap().end_offset;
        assert_eq!(log.confirm_offset(), 0);
        assert_eq!(log.raise_confirm_offset(end + 100), end, "capped at the max offset");
        assert_eq!(log.raise_confirm_offset(first), end, "never lowered by a raise");
        log.close().unwrap();
        let log = open(dir.path());
        assert_eq!(log.confirm_offset(), end, "persisted with the checkpoint");
        log.truncate(first).unwrap();
        assert_eq!(log.confirm_offset(), first, "clamped to the new end");
        let cp = Checkpoint::load(&StdFs, dir.path()).unwrap().unwrap();
        assert_eq!(cp.confirm_offset, first, "the clamp is persisted");
        log.wipe().unwrap();
        assert_eq!(log.confirm_offset(), 0);
    }

    #[test]
    fn a_checkpoint_past_the_recovered_end_is_clamped_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let end = log.append(&[msg(b"a")]).unwrap().end_offset;
        log.close().unwrap();
        let mut cp = Checkpoint::load(&StdFs, dir.path()).unwrap().unwrap();
        cp.confirm_offset = end + 1000;
        cp.store(&StdFs, dir.path()).unwrap();
        let log = open(dir.path());
        assert_eq!(log.confirm_offset(), end);
    }
}
