//! Pure renderings of the Cluster service's answers: tables for people; the JSON for scripts
//! is `control::json`'s (its names are a public interface).

use std::fmt::Write as _;

use serde_json::Value;

use crate::cli::client::format::{bytes, millis};
use crate::control::json::{self, kind, mode, phase, role};
use crate::control::pb;

/// `hasync cluster status --json`.
pub(crate) fn status_json(st: &pb::ClusterStatus) -> Value {
    json::status(st)
}

/// `hasync cluster history --json`.
pub(crate) fn history_json(h: &pb::GetHistoryResponse) -> Value {
    json::history(h)
}

fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

/// One member's row of the table.
fn member_row(out: &mut String, m: &pb::ClusterMember) {
    if !m.live {
        let _ = writeln!(
            out,
            "  {:<16} {:<7} no live record (lease expired or never held)",
            m.name, "-"
        );
        return;
    }
    let lag = m.lag_bytes.map_or_else(|| "-".to_owned(), bytes);
    let mut tags = Vec::new();
    if !m.voter {
        tags.push("not a voter".to_owned());
    }
    if m.never_promote {
        tags.push("never-promote".to_owned());
    }
    if m.priority != 0 {
        tags.push(format!("priority {}", m.priority));
    }
    let _ = writeln!(
        out,
        "  {:<16} {:<7} {:>6} {:>14} {:>10} {:>8} {:<6} {:>9}  {}",
        m.name,
        or_dash(role(m.role())),
        m.epoch,
        m.max_offset,
        lag,
        m.promised_epoch,
        if m.fenced { "yes" } else { "no" },
        millis(m.lease_age_ms),
        tags.join(", ")
    );
}

fn group_table(out: &mut String, g: &pb::GroupStatus, now_ms: i64) {
    if !g.bootstrapped {
        let _ = writeln!(out, "group {}  not bootstrapped (no state record yet)", g.group);
    } else {
        let _ = writeln!(
            out,
            "group {}  epoch {}  master {}  {}  {} k={}  voters {}",
            g.group,
            g.epoch,
            or_dash(g.master.as_deref()),
            or_dash(phase(g.phase())),
            or_dash(mode(g.mode())).to_uppercase(),
            g.k,
            g.voters.join(" ")
        );
    }
    let leader = g.leader.as_ref().map_or_else(
        || "nobody holds it".to_owned(),
        |l| format!("{l} (epoch {})", g.leader_epoch),
    );
    let _ = writeln!(out, "  leader key   {leader}");
    let failover = match (&g.blocked_reason, g.failover_possible) {
        (_, true) => "possible".to_owned(),
        (Some(why), false) => format!("NOT possible: {why}"),
        (None, false) => "NOT possible".to_owned(),
    };
    let _ =
        writeln!(out, "  failover     {failover}{}", if g.paused { " (group paused)" } else { "" });
    if !g.last_decision.is_empty() {
        let _ = writeln!(out, "  last         {}", g.last_decision);
    }
    if let Some(r) = &g.pending_request {
        let to = if r.to.is_empty() { "the controller's pick" } else { &r.to };
        let age = millis(now_ms - r.time_unix_ms);
        let _ = writeln!(
            out,
            "  pending      request {} ({} to {to}, {age} ago)",
            r.id,
            kind(r.kind())
        );
    }
    let _ = writeln!(
        out,
        "  {:<16} {:<7} {:>6} {:>14} {:>10} {:>8} {:<6} {:>9}  tags",
        "member", "role", "epoch", "max offset", "lag", "promised", "fenced", "lease age"
    );
    for m in &g.members {
        member_row(out, m);
    }
}

/// `hasync cluster status`.
pub(crate) fn status_table(st: &pb::ClusterStatus) -> String {
    let mut out = String::new();
    let controller = if st.controller.is_empty() { "none active" } else { &st.controller };
    let _ = writeln!(out, "cluster {}  controller {controller}  revision {}", st.root, st.revision);
    if st.paused {
        let _ = writeln!(
            out,
            "PAUSED: automatic failover of the whole cluster (hasync cluster resume)"
        );
    }
    if st.groups.is_empty() {
        let _ = writeln!(out, "no groups");
    }
    for g in &st.groups {
        out.push('\n');
        group_table(&mut out, g, st.time_unix_ms);
    }
    out
}

/// `hasync cluster history`.
pub(crate) fn history_table(h: &pb::GetHistoryResponse, now_ms: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "group {}: {} decision(s), newest first", h.group, h.entries.len());
    let _ = writeln!(
        out,
        "{:>6}  {:<15} {:<12} {:<12} {:>10}  {:<12} {:>12}  rule",
        "epoch", "kind", "old master", "new master", "loss bound", "controller", "when"
    );
    for e in &h.entries {
        let loss = e.loss_bound_bytes.map_or_else(|| "0".to_owned(), bytes);
        let new = match (&e.new_master, &e.blocked_reason) {
            (Some(m), _) => m.clone(),
            (None, Some(why)) => format!("blocked: {why}"),
            (None, None) => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "{:>6}  {:<15} {:<12} {:<12} {:>10}  {:<12} {:>12}  {}",
            e.epoch,
            kind(e.kind()),
            or_dash(e.old_master.as_deref()),
            new,
            loss,
            e.controller,
            format!("{} ago", millis(now_ms - e.time_unix_ms)),
            e.rule
        );
    }
    out
}

/// One line of `hasync cluster watch` per update: its kind and revision, then per group its
/// master, epoch, phase and rule (members with their offsets on a snapshot or a sample).
pub(crate) fn topology_line(u: &pb::TopologyUpdate) -> String {
    let mut line = format!("{} rev {}", json::update_kind(u.kind()), u.revision);
    if u.resync {
        let _ = write!(line, " RESYNC ({})", u.resync_reason);
    }
    if !u.coordinator_connected {
        let _ = write!(line, " COORDINATOR LOST: {}", u.coordinator_error);
    }
    for g in &u.groups {
        let _ = write!(
            line,
            " | {} epoch {} master {} {} {} k={}",
            g.group,
            g.epoch,
            or_dash(g.master.as_deref()),
            or_dash(phase(g.phase())),
            or_dash(mode(g.mode())).to_uppercase(),
            g.k
        );
        for m in &g.members {
            let lag = m.lag_bytes.map_or_else(|| "-".to_owned(), bytes);
            let state = if m.live { or_dash(role(m.role())) } else { "gone" };
            let _ = write!(line, "; {} {state} @{} lag {lag}", m.name, m.max_offset);
        }
        if let Some(why) = &g.blocked_reason {
            let _ = write!(line, "; failover blocked: {why}");
        }
    }
    for g in &u.removed_groups {
        let _ = write!(line, " | {g} removed");
    }
    line
}

/// The line `hasync switchover` / `hasync failover` prints for an outcome that was done.
pub(crate) fn outcome_line(what: &str, o: &pb::OperatorOutcome) -> String {
    let master = or_dash(o.master.as_deref());
    let mut line =
        format!("{what} of group {}: {master} is the master at epoch {}", o.group, o.epoch);
    match what {
        "failover" => match o.loss_bound_bytes {
            Some(b) => {
                let _ = write!(
                    line,
                    "; up to {} ({b} bytes) of acknowledged data may be lost",
                    bytes(b)
                );
            }
            None => line.push_str("; no loss bound recorded"),
        },
        _ => match o.write_pause_ms {
            Some(ms) => {
                let _ = write!(line, "; writes paused {}", millis(ms as i64));
            }
            None => line.push_str("; write pause not measured"),
        },
    }
    let _ = write!(line, " (request {})", o.id);
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> pb::ClusterStatus {
        let live = pb::ClusterMember {
            name: "n1".into(),
            live: true,
            voter: true,
            role: pb::Role::Master as i32,
            epoch: 3,
            max_offset: 5940,
            lag_bytes: Some(0),
            promised_epoch: 3,
            lease_age_ms: 812,
            ..Default::default()
        };
        let gone = pb::ClusterMember { name: "n3".into(), voter: true, ..Default::default() };
        let g = pb::GroupStatus {
            group: "g1".into(),
            bootstrapped: true,
            epoch: 3,
            master: Some("n1".into()),
            phase: pb::GroupPhase::Stable as i32,
            voters: vec!["n1".into(), "n3".into()],
            k: 1,
            mode: pb::ReplicationMode::Sync as i32,
            members: vec![live, gone],
            blocked_reason: Some("too_few_fenced".into()),
            ..Default::default()
        };
        pb::ClusterStatus { root: "/hasync/v1/c1/".into(), groups: vec![g], ..Default::default() }
    }

    #[test]
    fn status_json_keeps_the_public_names() {
        let j = status_json(&sample());
        let g = &j["groups"][0];
        assert_eq!(g["group"], "g1");
        assert_eq!(g["epoch"], 3);
        assert_eq!(g["master"], "n1");
        assert_eq!(g["failover_possible"], false);
        assert_eq!(g["blocked_reason"], "too_few_fenced");
        assert_eq!((g["phase"].as_str(), g["mode"].as_str()), (Some("stable"), Some("sync")));
        let m = &g["members"][0];
        assert_eq!((m["name"].as_str(), m["role"].as_str()), (Some("n1"), Some("master")));
        assert_eq!((m["epoch"].as_u64(), m["max_offset"].as_u64()), (Some(3), Some(5940)));
        let gone = &g["members"][1];
        assert!(gone["role"].is_null() && gone["epoch"].is_null() && gone["max_offset"].is_null());
        assert!(j["controller"].is_null());
        // A group without a master, and one that can fail over: null and true.
        let mut st = sample();
        st.groups[0].master = None;
        st.groups[0].blocked_reason = None;
        st.groups[0].failover_possible = true;
        let g = &status_json(&st)["groups"][0];
        assert!(g["master"].is_null() && g["blocked_reason"].is_null(), "{g}");
        assert_eq!(g["failover_possible"], true);
    }

    #[test]
    fn the_table_says_why_a_failover_is_blocked() {
        let t = status_table(&sample());
        assert!(t.contains("failover     NOT possible: too_few_fenced"), "{t}");
        assert!(t.contains("n3") && t.contains("no live record"), "{t}");
        assert!(t.contains("voters n1 n3") && t.contains("SYNC k=1"), "{t}");
    }

    #[test]
    fn outcome_lines_name_the_pause_or_the_loss_bound() {
        let o = pb::OperatorOutcome {
            id: "r1".into(),
            group: "g1".into(),
            done: true,
            master: Some("n2".into()),
            epoch: 4,
            write_pause_ms: Some(312),
            loss_bound_bytes: Some(1536),
            ..Default::default()
        };
        assert_eq!(
            outcome_line("switchover", &o),
            "switchover of group g1: n2 is the master at epoch 4; writes paused 312ms (request r1)"
        );
        let f = outcome_line("failover", &o);
        assert!(f.contains("up to 1.5 KiB (1536 bytes)"), "{f}");
    }
}
