//! Rule C, bootstrap and switchover, one behaviour per test; every blocked reason has one.

use super::*;

fn voter(name: &str) -> Voter {
    Voter { name: name.to_owned(), data_dir_id: format!("{name}-dir") }
}

fn group(names: &[&str], master: Option<&str>, k: u32, mode: Mode) -> GroupState {
    let voters = names.iter().map(|n| voter(n)).collect();
    GroupState {
        token: "t5".into(),
        epoch_revision: 50,
        controller: "c".into(),
        ..GroupState::stable(5, master, voters, k, mode)
    }
}

/// n1 master of n1..n3, SYNC k = 1, at epoch 5.
fn sync3() -> GroupState {
    group(&["n1", "n2", "n3"], Some("n1"), 1, Mode::Sync)
}

/// The e+1 record of `state` (what `choose` gets).
fn fencing(state: &GroupState) -> GroupState {
    let stamp = Stamp { token: "t6", controller: "c", now_unix_ms: NOW };
    fencing_state(state, &[], stamp)
}

const NOW: i64 = 1_000_000;

fn member(name: &str, role: MemberRole, last_epoch: u64, max_offset: u64) -> MemberRecord {
    MemberRecord {
        name: name.to_owned(),
        data_dir_id: format!("{name}-dir"),
        role,
        epoch: 5,
        promised_epoch: 0,
        last_record_epoch: last_epoch,
        max_offset,
        confirm_offset: 0,
        fenced: false,
        master_frame_age_ms: None,
        following: String::new(),
        mode: None,
        k: 0,
        advertise_ha: format!("{name}:10912"),
        advertise_grpc: format!("{name}:10920"),
        never_promote: false,
        priority: 0,
        truncated_bytes: 0,
        readable_offset: 0,
        replicas: Vec::new(),
        time_unix_ms: NOW,
    }
}

fn slave(name: &str, frame_age_ms: Option<u64>) -> MemberRecord {
    MemberRecord { master_frame_age_ms: frame_age_ms, ..member(name, MemberRole::Slave, 5, 100) }
}

fn reply(name: &str, last_epoch: u64, end_offset: u64) -> FenceReply {
    FenceReply {
        name: name.to_owned(),
        data_dir_id: format!("{name}-dir"),
        promised_epoch: 6,
        epoch: 5,
        last_record_epoch: last_epoch,
        end_offset,
        never_promote: false,
        priority: 0,
    }
}

fn policy() -> FailoverPolicy {
    FailoverPolicy {
        prevote_frame_age_ms_max: 3_000,
        hold_down_ms: 60_000,
        failovers_per_minute_max: 3,
        concurrent_failovers_max: 2,
        async_failover: true,
        async_lag_bytes_max: 1_000,
        async_lag_ms_max: 2_000,
        lease_ttl_ms: 10_000,
    }
}

fn ctx() -> DecisionContext<'static> {
    DecisionContext {
        now_unix_ms: NOW,
        group_last_failover_unix_ms: None,
        group_failovers_unix_ms: &[],
        decisions_running: 0,
        master_write_bytes_per_s: 100,
        master_last_report: None,
    }
}

fn slaves_unheard() -> Vec<MemberRecord> {
    vec![slave("n2", None), slave("n3", None)]
}

fn blocked_check(state: Option<&GroupState>, members: &[MemberRecord]) -> BlockedReason {
    check_failover(state, members, &policy(), &ctx()).expect_err("blocked").reason
}

fn blocked_choice(state: &GroupState, replies: &[FenceReply]) -> Blocked {
    choose(state, replies, &policy(), &ctx()).expect_err("blocked")
}

fn chosen(state: &GroupState, replies: &[FenceReply]) -> Decision {
    choose(state, replies, &policy(), &ctx()).expect("a choice")
}

fn why<'a>(d: &'a [CandidateReport], name: &str) -> &'a str {
    &d.iter().find(|c| c.name == name).expect("a report").why
}

#[test]
fn a_failover_may_start_when_the_master_is_unheard_of() {
    assert_eq!(check_failover(Some(&sync3()), &slaves_unheard(), &policy(), &ctx()), Ok(()));
}

#[test]
fn blocked_state_behind_members_without_a_state_record_or_below_a_member_epoch() {
    assert_eq!(blocked_check(None, &slaves_unheard()), BlockedReason::StateBehindMembers);
    let mut members = slaves_unheard();
    members[1].promised_epoch = 9;
    assert_eq!(blocked_check(Some(&sync3()), &members), BlockedReason::StateBehindMembers);
    members[1].promised_epoch = 5;
    assert_eq!(check_failover(Some(&sync3()), &members, &policy(), &ctx()), Ok(()));
}

#[test]
fn blocked_paused() {
    let state = GroupState { paused: true, ..sync3() };
    assert_eq!(blocked_check(Some(&state), &slaves_unheard()), BlockedReason::Paused);
}

#[test]
fn blocked_hold_down_until_it_has_passed() {
    let members = slaves_unheard();
    let soon = DecisionContext { group_last_failover_unix_ms: Some(NOW - 59_999), ..ctx() };
    let b = check_failover(Some(&sync3()), &members, &policy(), &soon).unwrap_err();
    assert_eq!(b.reason, BlockedReason::HoldDown);
    assert!(b.detail.contains("59999 ms ago"), "{b}");
    let later = DecisionContext { group_last_failover_unix_ms: Some(NOW - 60_000), ..ctx() };
    assert_eq!(check_failover(Some(&sync3()), &members, &policy(), &later), Ok(()));
}

#[test]
fn blocked_rate_limited_counts_the_last_minute_only() {
    let members = slaves_unheard();
    let three = [NOW - 1, NOW - 30_000, NOW - 59_999];
    let full = DecisionContext { group_failovers_unix_ms: &three, ..ctx() };
    let b = check_failover(Some(&sync3()), &members, &policy(), &full).unwrap_err();
    assert_eq!(b.reason, BlockedReason::RateLimited);
    let old = [NOW - 1, NOW - 30_000, NOW - 60_000];
    let ok = DecisionContext { group_failovers_unix_ms: &old, ..ctx() };
    assert_eq!(check_failover(Some(&sync3()), &members, &policy(), &ok), Ok(()));
    let unlimited = FailoverPolicy { failovers_per_minute_max: 0, ..policy() };
    assert_eq!(check_failover(Some(&sync3()), &members, &unlimited, &full), Ok(()));
}

#[test]
fn blocked_concurrency_limited_while_other_groups_decide() {
    let members = slaves_unheard();
    let busy = DecisionContext { decisions_running: 2, ..ctx() };
    let b = check_failover(Some(&sync3()), &members, &policy(), &busy).unwrap_err();
    assert_eq!(b.reason, BlockedReason::ConcurrencyLimited);
    assert!(b.detail.contains("2 decisions of other groups"), "{b}");
    let one = DecisionContext { decisions_running: 1, ..ctx() };
    assert_eq!(check_failover(Some(&sync3()), &members, &policy(), &one), Ok(()));
    let unlimited = FailoverPolicy { concurrent_failovers_max: 0, ..policy() };
    assert_eq!(check_failover(Some(&sync3()), &members, &unlimited, &busy), Ok(()));
}

#[test]
fn blocked_sync_degraded_with_k_zero_before_and_after_fencing() {
    let state = GroupState { k: 0, ..sync3() };
    assert_eq!(blocked_check(Some(&state), &slaves_unheard()), BlockedReason::SyncDegraded);
    let all = [reply("n1", 5, 9), reply("n2", 5, 9), reply("n3", 5, 9)];
    assert_eq!(blocked_choice(&fencing(&state), &all).reason, BlockedReason::SyncDegraded);
}

#[test]
fn blocked_async_failover_disabled() {
    let state = GroupState { mode: Mode::Async, ..sync3() };
    let off = FailoverPolicy { async_failover: false, ..policy() };
    let b = check_failover(Some(&state), &slaves_unheard(), &off, &ctx()).unwrap_err();
    assert_eq!(b.reason, BlockedReason::AsyncFailoverDisabled);
}

#[test]
fn blocked_async_lag_too_large_in_bytes_in_time_or_unknown() {
    let state = fencing(&GroupState { mode: Mode::Async, ..sync3() });
    let replies = [reply("n2", 5, 100), reply("n3", 5, 90)];
    let unknown = blocked_choice(&state, &replies);
    assert_eq!(unknown.reason, BlockedReason::AsyncLagTooLarge);
    assert!(unknown.detail.contains("unknown"), "{unknown}");
    let master = member("n1", MemberRole::Master, 5, 1_101);
    let far = DecisionContext { master_last_report: Some(&master), ..ctx() };
    let bytes = choose(&state, &replies, &policy(), &far).unwrap_err();
    assert_eq!(bytes.reason, BlockedReason::AsyncLagTooLarge);
    assert!(bytes.detail.contains("1001 bytes"), "{bytes}");
    // 300 bytes behind at 100 bytes/s is 3 s, above the 2 s allowed.
    let master = member("n1", MemberRole::Master, 5, 400);
    let slow = DecisionContext { master_last_report: Some(&master), ..ctx() };
    let time = choose(&state, &replies, &policy(), &slow).unwrap_err();
    assert_eq!(time.reason, BlockedReason::AsyncLagTooLarge);
    assert!(time.detail.contains("~3000 ms"), "{time}");
}

#[test]
fn blocked_no_voters_reachable_before_and_after_fencing() {
    let master_only = [member("n1", MemberRole::Master, 5, 100)];
    assert_eq!(blocked_check(Some(&sync3()), &master_only), BlockedReason::NoVotersReachable);
    let not_voters = [slave("x", None)];
    assert_eq!(blocked_check(Some(&sync3()), &not_voters), BlockedReason::NoVotersReachable);
    let b = blocked_choice(&fencing(&sync3()), &[]);
    assert_eq!(b.reason, BlockedReason::NoVotersReachable);
    assert_eq!(b.candidates.len(), 3, "every voter is reported, none fenced");
    assert!(b.candidates.iter().all(|c| !c.fenced && c.why == "not fenced"));
}

#[test]
fn blocked_master_alive_when_a_majority_of_the_others_hears_it() {
    let both = [slave("n2", Some(100)), slave("n3", Some(2_999))];
    let b = check_failover(Some(&sync3()), &both, &policy(), &ctx()).unwrap_err();
    assert_eq!(b.reason, BlockedReason::MasterAlive);
    assert!(b.detail.starts_with("2 of the 2 voters besides n1"), "{b}");
    // One of two is no majority.
    let one = [slave("n2", Some(100)), slave("n3", None)];
    assert_eq!(check_failover(Some(&sync3()), &one, &policy(), &ctx()), Ok(()));
    // A frame 100 ms old in a record written 2.9 s ago is 3 s old now: stale.
    let stale = MemberRecord { time_unix_ms: NOW - 2_900, ..slave("n3", Some(100)) };
    let aged = [slave("n2", Some(100)), stale];
    assert_eq!(check_failover(Some(&sync3()), &aged, &policy(), &ctx()), Ok(()));
    // |V| = 2: the one slave is the majority.
    let pair = group(&["n1", "n2"], Some("n1"), 1, Mode::Sync);
    assert_eq!(blocked_check(Some(&pair), &[slave("n2", Some(0))]), BlockedReason::MasterAlive);
}

#[test]
fn blocked_too_few_fenced_shows_how_many_of_how_many() {
    let state = fencing(&group(&["n1", "n2", "n3", "n4", "n5"], Some("n1"), 2, Mode::Sync));
    let b = blocked_choice(&state, &[reply("n2", 5, 10), reply("n3", 5, 10)]);
    assert_eq!(b.reason, BlockedReason::TooFewFenced);
    assert_eq!(b.detail, "2 of 5 voters fenced, need 3 (|V| - k, k = 2)");
    assert!(b.fencing.contains("too few"), "{}", b.fencing);
    let three = [reply("n2", 5, 10), reply("n3", 5, 10), reply("n4", 5, 10)];
    assert_eq!(chosen(&state, &three).chosen, "n2");
}

#[test]
fn blocked_best_candidate_not_promotable_when_only_never_promote_holds_the_max() {
    let best = FenceReply { never_promote: true, ..reply("n3", 5, 200) };
    let b = blocked_choice(&fencing(&sync3()), &[reply("n2", 5, 100), best]);
    assert_eq!(b.reason, BlockedReason::BestCandidateNotPromotable);
    assert_eq!(why(&b.candidates, "n3"), "never-promote (holds the max (5, 200))");
    assert_eq!(why(&b.candidates, "n2"), "behind: (5, 100) < max (5, 200)");
}

#[test]
fn blocked_candidate_below_confirm_offset_is_an_alarm() {
    let state = fencing(&GroupState { confirm_offset: 150, ..sync3() });
    let b = blocked_choice(&state, &[reply("n2", 5, 100), reply("n3", 5, 120)]);
    assert_eq!(b.reason, BlockedReason::CandidateBelowConfirmOffset);
    assert!(b.reason.is_alarm());
    assert!(BlockedReason::ALL.iter().filter(|r| r.is_alarm()).count() == 1);
    let ok = chosen(&state, &[reply("n2", 5, 100), reply("n3", 5, 150)]);
    assert_eq!(ok.chosen, "n3");
}

#[test]
fn the_epoch_of_the_last_record_wins_over_a_longer_log() {
    // n3's longer log ends in an older epoch: its tail is one the new lineage never had.
    let d = chosen(&fencing(&sync3()), &[reply("n2", 5, 100), reply("n3", 4, 900)]);
    assert_eq!(d.chosen, "n2");
    assert_eq!(why(&d.candidates, "n3"), "behind: (4, 900) < max (5, 100)");
}

#[test]
fn priority_and_tags_only_break_ties() {
    let state = fencing(&group(&["n1", "n2", "n3", "n4"], Some("n1"), 1, Mode::Sync));
    let high_behind = FenceReply { priority: 9, ..reply("n2", 5, 99) };
    let low = reply("n3", 5, 100);
    let high = FenceReply { priority: 1, ..reply("n4", 5, 100) };
    let d = chosen(&state, &[high_behind, low, high]);
    assert_eq!(d.chosen, "n4");
    assert_eq!(why(&d.candidates, "n2"), "behind: (5, 99) < max (5, 100)");
    assert_eq!(why(&d.candidates, "n3"), "lower priority (0 < 1) at the max");
    assert_eq!(why(&d.candidates, "n4"), "chosen: holds the max (5, 100) over F");
    // Equal priority: the name decides; never-promote is skipped.
    let skip = FenceReply { never_promote: true, ..reply("n2", 5, 100) };
    let d = chosen(&state, &[skip, reply("n3", 5, 100), reply("n4", 5, 100)]);
    assert_eq!(d.chosen, "n3");
    assert_eq!(why(&d.candidates, "n4"), "tie at the max and priority: n3 comes first by name");
    assert!(why(&d.candidates, "n2").starts_with("never-promote"));
}

#[test]
fn the_old_master_is_last_among_equal_candidates() {
    let d = chosen(&fencing(&sync3()), &[reply("n1", 5, 100), reply("n3", 5, 100)]);
    assert_eq!(d.chosen, "n3");
    assert_eq!(why(&d.candidates, "n1"), "old master: last among equal candidates");
    // But a fenced old master that holds more is the one promoted.
    let d = chosen(&fencing(&sync3()), &[reply("n1", 5, 101), reply("n3", 5, 100)]);
    assert_eq!(d.chosen, "n1");
}

#[test]
fn two_voters_k1_fence_the_slave_and_promote_it() {
    let state = fencing(&group(&["n1", "n2"], Some("n1"), 1, Mode::Sync));
    assert_eq!(fenced_needed(&state), 1);
    let d = chosen(&state, &[reply("n2", 5, 10)]);
    assert_eq!((d.chosen.as_str(), d.epoch, d.loss_bound_bytes), ("n2", 6, None));
    assert_eq!(d.old_master.as_deref(), Some("n1"));
    assert_eq!(why(&d.candidates, "n1"), "not fenced");
}

#[test]
fn every_voter_is_reported_fenced_or_not() {
    let d = chosen(&fencing(&sync3()), &[reply("n2", 5, 70), reply("n3", 5, 80)]);
    let names: Vec<&str> = d.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["n1", "n2", "n3"]);
    let n3 = &d.candidates[2];
    assert!(n3.fenced && n3.chosen && n3.end_offset == 80 && n3.last_record_epoch == 5);
    assert_eq!(d.candidates.iter().filter(|c| c.chosen).count(), 1);
    assert!(d.rule.starts_with("SYNC, k = 1: fence |F| >= |V| - k = 2 of V at epoch 6"));
    assert_eq!(d.fencing, "fenced 2 of 3 voters at epoch 6 (need 2, enough): [n2, n3]");
}

#[test]
fn replies_from_another_data_dir_or_epoch_or_a_non_voter_do_not_count() {
    let wiped = FenceReply { data_dir_id: "new".into(), ..reply("n2", 5, 900) };
    let old = FenceReply { promised_epoch: 5, ..reply("n3", 5, 900) };
    let b = blocked_choice(&fencing(&sync3()), &[wiped, old, reply("x", 5, 999)]);
    assert_eq!(b.reason, BlockedReason::NoVotersReachable);
    assert_eq!(why(&b.candidates, "n2"), "not fenced: answered from data dir new, V has n2-dir");
    assert_eq!(why(&b.candidates, "n3"), "not fenced: promised epoch 5, not 6");
    assert_eq!(b.candidates.len(), 3);
}

#[test]
fn an_async_decision_records_the_loss_bound() {
    let state = fencing(&GroupState { mode: Mode::Async, ..sync3() });
    // ASYNC fences |V| - max(k, 1): with k = 1, two of three.
    assert_eq!(fenced_needed(&state), 2);
    let master = member("n1", MemberRole::Master, 5, 250);
    let c = DecisionContext { master_last_report: Some(&master), ..ctx() };
    let d = choose(&state, &[reply("n2", 5, 100), reply("n3", 5, 200)], &policy(), &c).unwrap();
    // 50 bytes behind the last report, plus 10 s of TTL at 100 bytes/s.
    assert_eq!((d.chosen.as_str(), d.loss_bound_bytes), ("n3", Some(1_050)));
    assert!(d.rule.starts_with("ASYNC"), "{}", d.rule);
}

#[test]
fn history_records_are_written_from_the_outcome() {
    let meta = HistoryMeta {
        epoch: 6,
        token: "t6",
        kind: DecisionKind::Failover,
        old_master: Some("n1"),
        revision: 77,
        controller: "c",
        time_unix_ms: NOW,
    };
    let d = chosen(&fencing(&sync3()), &[reply("n2", 5, 70), reply("n3", 5, 80)]);
    let h = d.to_history(&meta);
    assert_eq!((h.new_master.as_deref(), h.blocked_reason.as_deref()), (Some("n3"), None));
    assert_eq!((h.rule, h.candidates, h.fencing), (d.rule, d.candidates, d.fencing));
    let b = blocked_choice(&fencing(&sync3()), &[reply("n2", 5, 70)]);
    let h = b.to_history(&meta);
    assert_eq!(h.blocked_reason.as_deref(), Some("too_few_fenced"));
    assert_eq!(h.blocked_detail, "1 of 3 voters fenced, need 2 (|V| - k, k = 1)");
    assert_eq!((h.new_master, h.revision, h.old_master.as_deref()), (None, 77, Some("n1")));
}

#[test]
fn a_new_epoch_is_above_the_state_and_every_member_epoch() {
    let mut members = slaves_unheard();
    assert_eq!(next_epoch(&sync3(), &members), 6);
    members[0].promised_epoch = 8;
    assert_eq!(next_epoch(&sync3(), &members), 9);
    members[1].epoch = 11;
    let stamp = Stamp { token: "fresh", controller: "c2", now_unix_ms: NOW };
    let e = fencing_state(&sync3(), &members, stamp);
    assert_eq!((e.epoch, e.phase, e.token.as_str(), e.chosen), (12, Phase::Fencing, "fresh", None));
    assert_eq!((e.voters, e.k, e.mode, e.master), (sync3().voters, 1, Mode::Sync, sync3().master));
}

fn stamp() -> Stamp<'static> {
    Stamp { token: "boot", controller: "c", now_unix_ms: NOW }
}

const DEFAULTS: RuleDefaults = RuleDefaults { k: 1, mode: Mode::Sync };

#[test]
fn bootstrap_takes_the_members_max_epoch_and_the_one_master_at_it() {
    let master = MemberRecord {
        epoch: 7,
        mode: Some(Mode::Sync),
        k: 2,
        ..member("b", MemberRole::Master, 7, 5)
    };
    let members =
        [master, member("a", MemberRole::Slave, 5, 4), member("c", MemberRole::Slave, 7, 5)];
    let s = bootstrap_state(&members, None, DEFAULTS, stamp()).unwrap();
    assert_eq!((s.epoch, s.master.as_deref(), s.k, s.mode), (7, Some("b"), 2, Mode::Sync));
    let names: Vec<&str> = s.voters.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!((s.phase, s.token.as_str(), s.epoch_revision), (Phase::Stable, "boot", 0));
    assert_eq!(next_epoch(&s, &members), 8);
}

#[test]
fn bootstrap_without_a_single_master_at_the_max_epoch_leaves_it_to_a_failover() {
    let m = |n| MemberRecord { epoch: 7, ..member(n, MemberRole::Master, 7, 5) };
    let s = bootstrap_state(&[m("a"), m("b")], None, DEFAULTS, stamp()).unwrap();
    assert_eq!((s.epoch, s.master, s.k, s.mode), (7, None, 1, Mode::Sync));
    // A member promised 8 (a controller fenced it, then the engine lost the state).
    let fenced = MemberRecord { promised_epoch: 8, ..member("c", MemberRole::Slave, 7, 5) };
    let s = bootstrap_state(&[m("a"), fenced.clone()], None, DEFAULTS, stamp()).unwrap();
    assert_eq!((s.epoch, s.master.as_deref()), (8, None));
    assert_eq!(next_epoch(&s, &[fenced]), 9);
}

#[test]
fn bootstrap_after_a_restore_keeps_the_previous_voters_and_clamps_k() {
    let previous = GroupState {
        confirm_offset: 40,
        paused: true,
        ..group(&["a", "b", "gone"], Some("a"), 2, Mode::Async)
    };
    let members = [
        MemberRecord { epoch: 9, confirm_offset: 30, ..member("a", MemberRole::Slave, 9, 50) },
        MemberRecord { data_dir_id: "wiped".into(), ..member("b", MemberRole::Slave, 5, 0) },
    ];
    let s = bootstrap_state(&members, Some(&previous), DEFAULTS, stamp()).unwrap();
    let ids: Vec<(&str, &str)> =
        s.voters.iter().map(|v| (v.name.as_str(), v.data_dir_id.as_str())).collect();
    assert_eq!(ids, [("a", "a-dir"), ("b", "wiped"), ("gone", "gone-dir")]);
    assert_eq!((s.epoch, s.master, s.k, s.mode), (9, None, 2, Mode::Async));
    assert_eq!((s.confirm_offset, s.paused), (40, true));
    // k above |V| - 1 is clamped (publishing a lower k than applied only fences more).
    let lone = MemberRecord {
        epoch: 3,
        mode: Some(Mode::Sync),
        k: 4,
        ..member("a", MemberRole::Master, 3, 1)
    };
    let b = MemberRecord { epoch: 3, ..member("b", MemberRole::Slave, 3, 1) };
    let s = bootstrap_state(&[lone, b], None, DEFAULTS, stamp());
    assert_eq!(s.unwrap().k, 1);
}

/// A rebuild claims no more acks than were published: a master running k = 2 (a raise not
/// yet published) under a published k = 1 rebuilds to k = 1, and a degraded master (running
/// ASYNC under a published SYNC k = 0) keeps the group SYNC with k = 0.
#[test]
fn a_rebuild_takes_the_lower_of_the_published_and_the_running_k() {
    let running = |k, mode| MemberRecord {
        epoch: 5,
        mode: Some(mode),
        k,
        ..member("a", MemberRole::Master, 4, 10)
    };
    let b = member("b", MemberRole::Slave, 4, 10);
    let c = member("c", MemberRole::Slave, 4, 10);
    let previous = GroupState { epoch: 5, ..group(&["a", "b", "c"], Some("a"), 1, Mode::Sync) };
    let members = [running(2, Mode::Sync), b.clone(), c.clone()];
    let s = bootstrap_state(&members, Some(&previous), DEFAULTS, stamp()).unwrap();
    assert_eq!(s.master.as_deref(), Some("a"), "the master reports its running rule");
    assert_eq!((s.k, s.mode), (1, Mode::Sync));
    let degraded = GroupState { k: 0, ..previous };
    let members = [running(1, Mode::Async), b, c];
    let s = bootstrap_state(&members, Some(&degraded), DEFAULTS, stamp()).unwrap();
    assert_eq!((s.k, s.mode), (0, Mode::Sync));
}

#[test]
fn bootstrap_with_no_members_is_refused() {
    let refused = bootstrap_state(&[], Some(&sync3()), DEFAULTS, stamp());
    assert_eq!(refused, Err(BlockedReason::NoVotersReachable));
}

#[test]
fn switchover_picks_the_most_caught_up_promotable_voter() {
    let members = [
        member("n1", MemberRole::Master, 5, 500),
        MemberRecord { priority: 5, ..member("n2", MemberRole::Slave, 5, 400) },
        member("n3", MemberRole::Slave, 5, 450),
        MemberRecord { never_promote: true, ..member("n4", MemberRole::Slave, 5, 500) },
        member("x", MemberRole::Slave, 5, 999),
    ];
    let state = group(&["n1", "n2", "n3", "n4"], Some("n1"), 1, Mode::Sync);
    assert_eq!(switchover_target(&state, &members, None).unwrap().name, "n3");
    let tie = [
        members[0].clone(),
        members[1].clone(),
        MemberRecord { max_offset: 400, ..members[2].clone() },
    ];
    assert_eq!(switchover_target(&state, &tie, None).unwrap().name, "n2", "priority breaks ties");
    let none = [members[0].clone(), members[3].clone()];
    assert_eq!(switchover_target(&state, &none, None), Err(Refusal::NoPromotableVoter));
}

#[test]
fn switchover_checks_a_named_target() {
    let members = [
        member("n1", MemberRole::Master, 5, 500),
        member("n2", MemberRole::Slave, 5, 10),
        MemberRecord { never_promote: true, ..member("n3", MemberRole::Slave, 5, 500) },
    ];
    let state = group(&["n1", "n2", "n3", "n4"], Some("n1"), 1, Mode::Sync);
    let to = |name| switchover_target(&state, &members, Some(name));
    assert_eq!(
        to("n2").unwrap().name,
        "n2",
        "the named one, even if behind: the drain catches it up"
    );
    assert_eq!(to("n1"), Err(Refusal::IsMaster { name: "n1".into() }));
    assert_eq!(to("n3"), Err(Refusal::NeverPromote { name: "n3".into() }));
    assert_eq!(to("n4"), Err(Refusal::NotReachable { name: "n4".into() }));
    assert_eq!(to("x"), Err(Refusal::NotAVoter { name: "x".into() }));
}

#[test]
fn switchover_needs_a_stable_group_with_a_master() {
    let members = [member("n2", MemberRole::Slave, 5, 10)];
    let running = GroupState { phase: Phase::Fencing, ..sync3() };
    let refused = switchover_target(&running, &members, None);
    assert_eq!(refused, Err(Refusal::DecisionRunning { phase: Phase::Fencing }));
    let headless = group(&["n1", "n2"], None, 1, Mode::Sync);
    assert_eq!(switchover_target(&headless, &members, None), Err(Refusal::NoMaster));
}

#[test]
fn blocked_reasons_are_unique_snake_case_and_in_the_module_table() {
    let doc = include_str!("../decision.rs");
    let mut seen = std::collections::BTreeSet::new();
    for reason in BlockedReason::ALL {
        let s = reason.as_str();
        assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
        assert!(seen.insert(s), "{s} twice");
        assert_eq!(reason.to_string(), s);
        assert!(doc.contains(&format!("//! | `{s}` | ")), "{s} is missing from the table");
    }
    let rows = doc.lines().filter(|l| l.starts_with("//! | `")).count();
    assert_eq!(rows, BlockedReason::ALL.len(), "the table lists exactly ALL");
}
