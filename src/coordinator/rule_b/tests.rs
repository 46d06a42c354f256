//! Rule B: each change's steps in order, and each refusal.

use super::*;

fn voter(name: &str) -> Voter {
    Voter { name: name.to_owned(), data_dir_id: format!("{name}-dir") }
}

fn voters(names: &[&str]) -> Vec<Voter> {
    names.iter().map(|n| voter(n)).collect()
}

/// m master of m, a, b; SYNC k = 1.
fn current() -> Published {
    Published { master: "m".into(), voters: voters(&["m", "a", "b"]), k: 1, mode: Mode::Sync }
}

fn plan(current: &Published, wanted: Change) -> Vec<Step> {
    plan_change(current, wanted, 1, true).expect("a plan")
}

fn publish(names: &[&str], k: u32, mode: Mode) -> Step {
    Step::Publish { voters: voters(names), k, mode }
}

fn apply(names: &[&str], k: u32, mode: Mode) -> Step {
    Step::Apply { counting: voters(names), k, mode }
}

fn wait(names: &[&str], k: u32, at_least: Target) -> Step {
    Step::WaitWatermark { over: voters(names), k, at_least }
}

#[test]
fn published_is_read_from_a_state_with_a_master_in_v() {
    let state = GroupState::stable(1, Some("m"), voters(&["m", "a", "b"]), 1, Mode::Sync);
    assert_eq!(Published::from_state(&state), Some(current()));
    assert_eq!(current().counting(), voters(&["a", "b"]));
    let outside = GroupState { master: Some("x".into()), ..state.clone() };
    assert_eq!(Published::from_state(&outside), None);
    assert_eq!(Published::from_state(&GroupState { master: None, ..state }), None);
}

#[test]
fn add_publishes_v_with_x_then_counts_x() {
    let steps = plan(&current(), Change::AddVoter(voter("x")));
    let all = ["m", "a", "b", "x"];
    assert_eq!(steps, [publish(&all, 1, Mode::Sync), apply(&["a", "b", "x"], 1, Mode::Sync)]);
}

#[test]
fn remove_stops_counting_x_waits_for_the_watermark_without_x_then_publishes() {
    let steps = plan(&current(), Change::RemoveVoter("b".into()));
    assert_eq!(
        steps,
        [
            apply(&["a"], 1, Mode::Sync),
            Step::WaitAdmittedUnderOldRule,
            wait(&["a"], 1, Target::ConfirmOffset),
            publish(&["m", "a"], 1, Mode::Sync),
        ]
    );
}

#[test]
fn remove_in_async_has_no_watermark_to_wait_for() {
    let async_ = Published { mode: Mode::Async, ..current() };
    let steps = plan(&async_, Change::RemoveVoter("b".into()));
    let expected = [
        apply(&["a"], 1, Mode::Async),
        Step::WaitAdmittedUnderOldRule,
        publish(&["m", "a"], 1, Mode::Async),
    ];
    assert_eq!(steps, expected);
}

#[test]
fn lower_k_publishes_then_applies() {
    let five = Published { k: 3, voters: voters(&["m", "a", "b", "c", "d"]), ..current() };
    let steps = plan(&five, Change::SetK(2));
    let all = ["m", "a", "b", "c", "d"];
    let others = ["a", "b", "c", "d"];
    assert_eq!(steps, [publish(&all, 2, Mode::Sync), apply(&others, 2, Mode::Sync)]);
}

#[test]
fn sync_to_async_publishes_then_applies() {
    let steps = plan(&current(), Change::SetMode(Mode::Async));
    let expected = [publish(&["m", "a", "b"], 1, Mode::Async), apply(&["a", "b"], 1, Mode::Async)];
    assert_eq!(steps, expected);
}

#[test]
fn raise_k_applies_waits_for_old_puts_and_the_confirm_offset_then_publishes() {
    let steps = plan(&current(), Change::SetK(2));
    assert_eq!(
        steps,
        [
            apply(&["a", "b"], 2, Mode::Sync),
            Step::WaitAdmittedUnderOldRule,
            wait(&["a", "b"], 2, Target::ConfirmOffset),
            publish(&["m", "a", "b"], 2, Mode::Sync),
        ]
    );
}

#[test]
fn async_to_sync_waits_for_the_max_offset_at_the_switch() {
    let async_ = Published { mode: Mode::Async, ..current() };
    let steps = plan(&async_, Change::SetMode(Mode::Sync));
    assert_eq!(
        steps,
        [
            apply(&["a", "b"], 1, Mode::Sync),
            Step::WaitAdmittedUnderOldRule,
            wait(&["a", "b"], 1, Target::MaxOffset),
            publish(&["m", "a", "b"], 1, Mode::Sync),
        ]
    );
}

#[test]
fn raising_k_from_a_degraded_zero_waits_for_the_max_offset() {
    let degraded = Published { k: 0, ..current() };
    let steps = plan(&degraded, Change::SetK(1));
    assert_eq!(steps[2], wait(&["a", "b"], 1, Target::MaxOffset));
    assert_eq!(steps[3], publish(&["m", "a", "b"], 1, Mode::Sync));
}

#[test]
fn changes_of_k_in_async_publish_first_and_wait_for_nothing() {
    let async_ = Published { mode: Mode::Async, ..current() };
    let steps = plan(&async_, Change::SetK(2));
    assert_eq!(
        steps,
        [publish(&["m", "a", "b"], 2, Mode::Async), apply(&["a", "b"], 2, Mode::Async)]
    );
}

#[test]
fn refused_below_the_floor() {
    let five = Published { k: 3, voters: voters(&["m", "a", "b", "c", "d"]), ..current() };
    assert_eq!(
        plan_change(&five, Change::SetK(1), 2, true),
        Err(Refusal::BelowFloor { k: 1, floor: 2 })
    );
    assert!(plan_change(&five, Change::SetK(2), 2, true).is_ok());
    // A group below its floor (bootstrapped so) may still raise k toward it.
    let low = Published { k: 1, ..five.clone() };
    assert!(plan_change(&low, Change::SetK(2), 3, false).is_ok());
    // Removal that leaves fewer members besides the master than the floor.
    let two = Published { k: 1, ..current() };
    let refused = plan_change(&two, Change::RemoveVoter("a".into()), 2, true);
    assert_eq!(refused, Err(Refusal::VotersBelowFloor { others: 1, floor: 2 }));
}

#[test]
fn refused_degrading_unless_allowed() {
    let refused = plan_change(&current(), Change::SetK(0), 1, false);
    assert_eq!(refused, Err(Refusal::DegradeNotAllowed));
    let refused = plan_change(&current(), Change::SetMode(Mode::Async), 1, false);
    assert_eq!(refused, Err(Refusal::DegradeNotAllowed));
    // Allowed, the floor does not apply to k = 0: publish, then apply.
    let steps = plan_change(&current(), Change::SetK(0), 1, true).unwrap();
    assert_eq!(
        steps,
        [publish(&["m", "a", "b"], 0, Mode::Sync), apply(&["a", "b"], 0, Mode::Sync)]
    );
    // ASYNC with k = 0 back to SYNC is a degraded SYNC: refused too.
    let async0 = Published { k: 0, mode: Mode::Async, ..current() };
    let refused = plan_change(&async0, Change::SetMode(Mode::Sync), 0, false);
    assert_eq!(refused, Err(Refusal::DegradeNotAllowed));
}

#[test]
fn refused_k_above_the_members_besides_the_master() {
    let refused = plan_change(&current(), Change::SetK(3), 0, true);
    assert_eq!(refused, Err(Refusal::KAboveOthers { k: 3, others: 2 }));
    let k2 = Published { k: 2, ..current() };
    let refused = plan_change(&k2, Change::RemoveVoter("a".into()), 0, true);
    assert_eq!(refused, Err(Refusal::KAboveOthers { k: 2, others: 1 }));
}

#[test]
fn refused_membership_changes_that_make_no_sense() {
    let c = current();
    let refused = |w| plan_change(&c, w, 0, true).unwrap_err();
    assert_eq!(
        refused(Change::RemoveVoter("m".into())),
        Refusal::RemovesMaster { name: "m".into() }
    );
    assert_eq!(refused(Change::RemoveVoter("x".into())), Refusal::NotAVoter { name: "x".into() });
    assert_eq!(refused(Change::AddVoter(voter("a"))), Refusal::AlreadyAVoter { name: "a".into() });
    assert_eq!(refused(Change::SetK(1)), Refusal::NoChange);
    assert_eq!(refused(Change::SetMode(Mode::Sync)), Refusal::NoChange);
}
