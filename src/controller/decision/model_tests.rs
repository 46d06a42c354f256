//! The property test: random action sequences against the simulated group in [`super::model`]
//! must keep invariant I and lose no PUT_OK record in a promotion; and the negative controls:
//! the same search with a deliberately broken rule must find a violation, so this test can
//! fail. A failure prints the seed (`PROPTEST_RNG_SEED=<seed>` reruns it) and the shrunk case.

use std::cell::Cell;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest::test_runner::RngSeed;
use proptest::test_runner::TestCaseError;
use proptest::test_runner::TestError;
use proptest::test_runner::TestRunner;

use super::BlockedReason;
use super::model::Act;
use super::model::ChangeAct;
use super::model::Model;
use super::model::Setup;
use super::model::Stats;
use super::model::Variant;
use super::model::Violation;

/// Cases of the property test (each up to `ACTS_MAX` actions).
const CASES: u32 = 5_000;
const ACTS_MAX: usize = 250;
/// A negative control must find a violation within this many cases.
const NEGATIVE_CASES: u32 = 3_000;
/// The negative controls' seed (deterministic: they must fail every time).
const NEGATIVE_SEED: u64 = 17;

fn setup() -> impl Strategy<Value = Setup> {
    let tags = (vec(0i32..3, 5), vec(prop::bool::weighted(0.15), 5));
    (3usize..=5, any::<u8>(), any::<u8>(), 0u32..=1, any::<bool>(), tags).prop_map(
        |(members, v, k, floor, allow_degrade, (priorities, never_promote))| {
            let voters = 2 + v as usize % (members - 1);
            let k = 1 + u32::from(k) % (voters as u32 - 1);
            Setup { members, voters, k, floor, allow_degrade, priorities, never_promote }
        },
    )
}

fn change() -> impl Strategy<Value = ChangeAct> {
    prop_oneof![
        3 => Just(ChangeAct::Add),
        3 => Just(ChangeAct::Remove),
        3 => Just(ChangeAct::RaiseK),
        1 => Just(ChangeAct::LowerK),
        1 => Just(ChangeAct::ToAsync),
        3 => Just(ChangeAct::ToSync),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    let node = any::<u8>;
    let controller = || 0u8..2;
    prop_oneof![
        16 => node().prop_map(Act::Put),
        6 => (node(), node()).prop_map(|(s, b)| Act::Replicate(s, b)),
        10 => node().prop_map(Act::ReplicateAll),
        2 => node().prop_map(Act::Rejoin),
        4 => Just(Act::RejoinAll),
        1 => node().prop_map(Act::TimeOut),
        1 => node().prop_map(Act::Crash),
        3 => node().prop_map(Act::Restart),
        1 => node().prop_map(Act::Pause),
        3 => node().prop_map(Act::Resume),
        2 => (node(), node()).prop_map(|(a, b)| Act::Cut(a, b)),
        2 => (node(), node()).prop_map(|(a, b)| Act::Heal(a, b)),
        1 => node().prop_map(Act::Isolate),
        2 => Just(Act::HealAll),
        1 => (controller(), node()).prop_map(|(c, n)| Act::CutController(c, n)),
        16 => (controller(), node()).prop_map(|(c, x)| Act::Controller(c, x)),
        1 => controller().prop_map(Act::ControllerRestart),
        5 => (change(), node()).prop_map(|(c, n)| Act::Change(c, n)),
        8 => Just(Act::ChangeStep),
        1 => Just(Act::PublishConfirm),
    ]
}

fn case() -> impl Strategy<Value = (Setup, Vec<Act>)> {
    (setup(), vec(act(), 1..ACTS_MAX))
}

/// Runs a case; Err: the step, what it broke, and the model then.
fn run_described(
    variant: Variant,
    setup: &Setup,
    acts: &[Act],
) -> Result<Stats, (usize, Violation, String)> {
    let mut model = Model::new(setup, variant);
    for (at, &act) in acts.iter().enumerate() {
        model.step(act).map_err(|v| (at, v, model.describe()))?;
    }
    Ok(model.stats)
}

fn run(variant: Variant, setup: &Setup, acts: &[Act]) -> Result<Stats, (usize, Violation)> {
    run_described(variant, setup, acts).map_err(|(at, v, _)| (at, v))
}

fn check(variant: Variant, setup: &Setup, acts: &[Act]) -> Result<Stats, TestCaseError> {
    run_described(variant, setup, acts).map_err(|(at, violation, model)| {
        TestCaseError::fail(format!("step {at} ({:?}): {violation:?}\n  then: {model}", acts[at]))
    })
}

fn runner(cases: u32, seed: u64) -> TestRunner {
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
}

#[test]
fn no_put_ok_is_lost_and_invariant_i_holds_under_faults_and_two_controllers() {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let totals = Cell::new(Stats::default());
    let result = runner(CASES, seed).run(&case(), |(setup, acts)| {
        let stats = check(Variant::Correct, &setup, &acts)?;
        totals.set(totals.get().add(stats));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\nreproduce with PROPTEST_RNG_SEED={seed}");
    }
    // Not vacuous: the cases answer PUT_OK, promote, finish plans, and reach the decisions
    // that refuse (about 4, 0.5, 0.35 per case, and hundreds of blocks per 1000 cases).
    let t = totals.get();
    let cases = CASES as usize;
    assert!(t.put_oks >= cases * 2, "{t:?} (seed {seed})");
    assert!(t.promotions >= cases / 5, "{t:?} (seed {seed})");
    assert!(t.plans_done >= cases / 10, "{t:?} (seed {seed})");
    for reason in [
        BlockedReason::MasterAlive,
        BlockedReason::TooFewFenced,
        BlockedReason::BestCandidateNotPromotable,
        BlockedReason::SyncDegraded,
        BlockedReason::AsyncFailoverDisabled,
        BlockedReason::NoVotersReachable,
    ] {
        assert!(t.blocked_by(reason) > 0, "{reason} never happened: {t:?} (seed {seed})");
    }
}

/// The broken `variant` must fail within `NEGATIVE_CASES` cases; returns the failure, with the
/// case that first failed (before shrinking).
fn caught(variant: Variant) -> String {
    let mut config = runner(NEGATIVE_CASES, NEGATIVE_SEED).config().clone();
    config.max_shrink_iters = 256;
    let (calls, first) = (Cell::new(0u32), Cell::new(None));
    let result = TestRunner::new(config).run(&case(), |(setup, acts)| {
        calls.set(calls.get() + 1);
        let outcome = check(variant, &setup, &acts).map(|_| ());
        if outcome.is_err() && first.get().is_none() {
            first.set(Some(calls.get()));
        }
        outcome
    });
    match result {
        Err(TestError::Fail(why, (setup, acts))) => {
            let (members, voters, k) = (setup.members, setup.voters, setup.k);
            let at = first.get().unwrap_or(0);
            let case =
                format!("{members} members, {voters} voters, k = {k}, {} actions", acts.len());
            eprintln!(
                "{variant:?}: first failing case {at} of {NEGATIVE_CASES}; shrunk: {case}\n{why}"
            );
            format!("{why} ({case})")
        }
        Err(TestError::Abort(why)) => panic!("{variant:?}: aborted: {why}"),
        Ok(()) => {
            panic!("{variant:?}: no violation in {NEGATIVE_CASES} cases: the test cannot fail")
        }
    }
}

#[test]
fn negative_control_fencing_one_member_short_loses_a_put_ok() {
    let why = caught(Variant::FenceOneShort);
    assert!(why.contains("PromotedWithoutPutOk") || why.contains("InvariantI"), "{why}");
}

#[test]
fn negative_control_choosing_by_priority_first_loses_a_put_ok() {
    let why = caught(Variant::PriorityFirst);
    assert!(why.contains("PromotedWithoutPutOk") || why.contains("InvariantI"), "{why}");
}

#[test]
fn negative_control_publishing_a_raised_k_first_breaks_invariant_i() {
    let why = caught(Variant::RaiseKPublishFirst);
    assert!(why.contains("InvariantI") || why.contains("PromotedWithoutPutOk"), "{why}");
}

#[test]
fn negative_control_removing_without_the_watermark_wait_breaks_invariant_i() {
    let why = caught(Variant::RemoveSkipWait);
    assert!(why.contains("InvariantI") || why.contains("PromotedWithoutPutOk"), "{why}");
}

/// Found by the property test: V = {n0, n1, n2}, k = 1; r is PUT_OK on n0 and n1; n1 is
/// promoted (it holds r) and at once removes n0. Its confirm offset is 0 (it never learned the
/// old master's), so a wait for "the confirm offset" passed at once and V = {n1, n2} held r
/// once. The wait must count the records the master inherited.
#[test]
fn t01_removing_a_voter_right_after_a_failover_waits_for_the_inherited_records() {
    let setup = Setup {
        members: 4,
        voters: 3,
        k: 1,
        floor: 0,
        allow_degrade: false,
        priorities: vec![0; 5],
        never_promote: vec![false; 5],
    };
    let acts = [
        Act::Put(0),
        Act::Replicate(73, 0),
        Act::Isolate(0),
        Act::Controller(1, 1),
        Act::Controller(1, 1),
        Act::Controller(1, 14),
        Act::Controller(1, 1),
        Act::Controller(1, 1),
        Act::Change(ChangeAct::Remove, 32),
        Act::ChangeStep,
        Act::ChangeStep,
        Act::ChangeStep,
        Act::ChangeStep,
    ];
    let stats = run(Variant::Correct, &setup, &acts).expect("the wait holds the plan back");
    assert_eq!((stats.put_oks, stats.promotions, stats.plans_done), (1, 1, 0));
    let (at, violation) = run(Variant::TargetIgnoresInherited, &setup, &acts).unwrap_err();
    assert_eq!(at, acts.len() - 1, "the Publish");
    assert!(matches!(violation, Violation::InvariantI { holders: 1, needed: 2, .. }));
}
