//! The cluster's count of running decisions (groups fencing or promoting), against
//! `coordinator.max-concurrent-failovers`. Groups are driven concurrently, so an automatic
//! failover takes its slot in one atomic step (a compare-and-swap on the count, only while it
//! is below the limit) before its epoch-allocating compare-and-swap, and gives it back when
//! that one loses or anything else stops it: two groups deciding at once can never both
//! take the last slot. An operator's switchover or manual failover is counted once its epoch
//! is allocated, but never held back.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The running decisions (see the module docs).
#[derive(Debug, Default)]
pub struct DecisionSlots {
    running: AtomicUsize,
}

/// A slot taken for one automatic failover: given back when dropped, unless kept.
#[derive(Debug)]
#[must_use = "a reservation not kept is given back when dropped"]
pub struct Reservation<'a> {
    slots: &'a DecisionSlots,
    before: usize,
    kept: bool,
}

impl DecisionSlots {
    /// The decisions the records show running, at the start of a round.
    pub fn set(&self, running: usize) {
        self.running.store(running, Ordering::SeqCst);
    }

    /// The decisions running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Takes a slot for an automatic failover while fewer than `max` decisions run (0: no
    /// limit); else the number running, which holds it back.
    pub fn reserve(&self, max: u32) -> Result<Reservation<'_>, usize> {
        let max = if max == 0 { usize::MAX } else { max as usize };
        let before = self
            .running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))?;
        debug_assert!(before < max);
        Ok(Reservation { slots: self, before, kept: false })
    }

    /// An operator's decision opened its epoch: counted, whatever the limit.
    pub fn add(&self) {
        self.running.fetch_add(1, Ordering::SeqCst);
    }
}

impl Reservation<'_> {
    /// The decisions running before this one took its slot.
    pub fn before(&self) -> usize {
        self.before
    }

    /// The failover opened its epoch: the slot stays taken until the next round counts the
    /// decisions from the records.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self
                .slots
                .running
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_taken_only_below_the_limit_and_given_back_unless_kept() {
        let s = DecisionSlots::default();
        s.set(1);
        let first = s.reserve(2).expect("1 of 2 running");
        assert_eq!((first.before(), s.running()), (1, 2));
        assert_eq!(s.reserve(2).err(), Some(2), "the limit holds the next one back");
        drop(first);
        assert_eq!(s.running(), 1, "a reservation not kept is given back");
        s.reserve(2).unwrap().keep();
        assert_eq!(s.running(), 2);
        s.add();
        assert_eq!(s.running(), 3, "an operator's decision is counted beyond the limit");
        assert!(s.reserve(0).is_ok(), "0: no limit");
    }

    #[test]
    fn concurrent_reservations_never_hold_more_slots_than_the_limit() {
        let s = DecisionSlots::default();
        let held = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..2000 {
                        if let Ok(r) = s.reserve(3) {
                            let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            held.fetch_sub(1, Ordering::SeqCst);
                            drop(r);
                        }
                    }
                });
            }
        });
        let most = most.into_inner();
        assert!(most <= 3, "{most} slots held at once");
        assert_eq!(s.running(), 0, "every slot given back");
    }
}
