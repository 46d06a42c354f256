//! `hasync cluster status|history|pause|resume|change|remove-group`, `hasync switchover` and
//! `hasync failover`: the operator interface of automatic failover (the Cluster service), from
//! any node of a cluster with a coordinator. The renderings (table and JSON) are in
//! `cluster_view`; `remove-group` is in `cluster_remove`.

use std::time::Duration;

use clap::{Args, Subcommand};

use crate::cli::client::cluster_view::{
    history_json, history_table, outcome_line, status_json, status_table,
};
use crate::cli::client::{Client, Connection, Failure, FailureKind, block_on};
use crate::control::pb;

/// How much longer than the request's own bound the client waits for the node's answer, so
/// that the node's DEADLINE_EXCEEDED ("still pending") arrives before the client gives up.
const ANSWER_MARGIN: Duration = Duration::from_secs(5);

/// `hasync cluster ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ClusterCommand {
    /// Every group's (or one group's) epoch, master, voters, members with roles, epochs,
    /// lag and lease ages, and whether a failover is possible now (GetClusterStatus).
    Status {
        /// One group only.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// The decisions that opened a group's epochs, newest first (GetHistory).
    History {
        /// The group.
        #[arg(long, value_name = "GROUP")]
        group: String,
        /// At most this many records (0: all).
        #[arg(long, value_name = "N", default_value_t = 0)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Pause automatic failover of the whole cluster, or of one group (Pause).
    Pause {
        /// One group only; without it the whole cluster.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Resume what `cluster pause` paused (Resume).
    Resume {
        /// One group only; without it the whole cluster.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Follow the cluster's topology (WatchTopology): a snapshot, then each change of a
    /// group's master, epoch, voters or rule as it happens, members' offsets sampled, and
    /// the node's loss of its coordinator; one line per update (JSON with --json). Ctrl-C
    /// stops; resume later with --from-revision (the last revision printed).
    Watch {
        /// Resume: the changes after this revision (0: start with a snapshot).
        #[arg(long, value_name = "REVISION", default_value_t = 0)]
        from_revision: i64,
        /// How often members' offsets are sampled.
        #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
        sample_interval: Duration,
        /// Print each update as one line of JSON.
        #[arg(long)]
        json: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Change the group's voters V, k or mode outside a failover, made by its master in the
    /// order that keeps every PUT_OK record on k+1 members of V (ChangeGroup; one change per
    /// call).
    Change(ChangeArgs),
    /// Remove a group from the cluster: delete all its records (state, history, name claims),
    /// refused while it has a live member or a leader key: stop its nodes and wait for their
    /// leases to expire first (RemoveGroup).
    RemoveGroup {
        /// The group.
        #[arg(long, value_name = "GROUP")]
        group: String,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
}

/// Arguments of `hasync cluster change`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("change").required(true).args(["remove_member", "k", "mode"])))]
pub struct ChangeArgs {
    /// The group.
    #[arg(long, value_name = "GROUP")]
    group: String,
    /// Remove this member from V (not the master: switch over first).
    #[arg(long, value_name = "NODE")]
    remove_member: Option<String>,
    /// Set k, the member acks a SYNC put needs (0 degrades: only with
    /// coordinator.allow-degrade).
    #[arg(long, value_name = "N")]
    k: Option<u32>,
    /// Set the mode (async only with coordinator.allow-degrade).
    #[arg(long, value_enum)]
    mode: Option<crate::config::ReplicationMode>,
    /// Where the node is and how to authenticate (--timeout bounds the wait for the outcome).
    #[command(flatten)]
    conn: Connection,
}

/// Arguments of `hasync switchover`.
#[derive(Debug, Clone, Args)]
pub struct SwitchoverArgs {
    /// The group.
    #[arg(long, value_name = "GROUP")]
    pub(crate) group: String,
    /// The voter to promote; without it the controller picks the most caught-up one.
    #[arg(long, value_name = "NODE")]
    pub(crate) to: Option<String>,
    /// Where the node is and how to authenticate (--timeout bounds the wait for the outcome).
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Arguments of `hasync failover`.
#[derive(Debug, Clone, Args)]
pub struct FailoverArgs {
    /// The group.
    #[arg(long, value_name = "GROUP")]
    pub(crate) group: String,
    /// The voter to promote.
    #[arg(long, value_name = "NODE")]
    pub(crate) to: String,
    /// Required: the failover may lose what only unreachable members hold (the bound is
    /// recorded and printed).
    #[arg(long)]
    pub(crate) accept_data_loss: bool,
    /// Where the node is and how to authenticate (--timeout bounds the wait for the outcome).
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync cluster`.
pub(crate) fn run(cmd: ClusterCommand) -> Result<(), Failure> {
    block_on(async move {
        match cmd {
            ClusterCommand::Status { group, json, conn } => {
                let client = Client::connect(&conn).await?;
                let req = pb::GetClusterStatusRequest { group: group.unwrap_or_default() };
                let mut c = client.cluster();
                let st = client.call("GetClusterStatus", c.get_cluster_status(req)).await?;
                if json {
                    println!("{}", status_json(&st));
                } else {
                    print!("{}", status_table(&st));
                }
            }
            ClusterCommand::History { group, limit, json, conn } => {
                let client = Client::connect(&conn).await?;
                let mut c = client.cluster();
                let req = pb::GetHistoryRequest { group, limit };
                let h = client.call("GetHistory", c.get_history(req)).await?;
                if json {
                    println!("{}", history_json(&h));
                } else {
                    print!("{}", history_table(&h, crate::ha::status::now_millis()));
                }
            }
            ClusterCommand::Pause { group, conn } => pause_switch(&conn, group, true).await?,
            ClusterCommand::Resume { group, conn } => pause_switch(&conn, group, false).await?,
            ClusterCommand::Change(args) => change(args).await?,
            ClusterCommand::Watch { from_revision, sample_interval, json, conn } => {
                watch(&conn, from_revision, sample_interval, json).await?
            }
            ClusterCommand::RemoveGroup { group, conn } => {
                super::cluster_remove::remove_group(&conn, group).await?;
            }
        }
        Ok(())
    })
}

async fn watch(
    conn: &Connection,
    from_revision: i64,
    sample: Duration,
    json: bool,
) -> Result<(), Failure> {
    use std::io::Write as _;
    let client = Client::connect(conn).await?;
    let mut c = client.cluster();
    let sample_interval_ms = u32::try_from(sample.as_millis()).unwrap_or(u32::MAX);
    let req = pb::WatchTopologyRequest { from_revision, sample_interval_ms };
    let stream = client.call("WatchTopology", c.watch_topology(req)).await?;
    super::follow(&client, "WatchTopology", stream, |u| {
        let line = if json {
            crate::control::json::topology_update(&u).to_string()
        } else {
            crate::cli::client::cluster_view::topology_line(&u)
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())
    })
    .await
}

async fn pause_switch(
    conn: &Connection,
    group: Option<String>,
    pause: bool,
) -> Result<(), Failure> {
    let client = Client::connect(conn).await?;
    let mut c = client.cluster();
    let group = group.unwrap_or_default();
    let st = if pause {
        client.call("Pause", c.pause(pb::PauseRequest { group })).await?
    } else {
        client.call("Resume", c.resume(pb::ResumeRequest { group })).await?
    };
    let what = if st.group.is_empty() {
        "the whole cluster".to_owned()
    } else {
        format!("group {}", st.group)
    };
    let now = if st.paused { "paused" } else { "resumed" };
    let already = if st.changed { "" } else { " (it already was)" };
    println!("automatic failover of {what} {now}{already}");
    Ok(())
}

async fn change(args: ChangeArgs) -> Result<(), Failure> {
    let (client, timeout_ms) = request_client(&args.conn).await?;
    let req = pb::ChangeGroupRequest {
        group: args.group,
        remove_member: args.remove_member.unwrap_or_default(),
        k: args.k,
        mode: match args.mode {
            None => pb::ReplicationMode::Unspecified as i32,
            Some(crate::config::ReplicationMode::Sync) => pb::ReplicationMode::Sync as i32,
            Some(crate::config::ReplicationMode::Async) => pb::ReplicationMode::Async as i32,
        },
        timeout_ms,
    };
    let mut c = client.cluster();
    let o = client.call("ChangeGroup", c.change_group(req)).await?;
    let mode = pb::ReplicationMode::try_from(o.mode).map_or("?", |m| match m {
        pb::ReplicationMode::Async => "ASYNC",
        _ => "SYNC",
    });
    let now = format!("V = [{}], k = {}, {mode} (master {})", o.voters.join(", "), o.k, o.master);
    if !o.done {
        let why = o.refusal.as_deref().unwrap_or("no reason given");
        return Err(Failure::new(
            FailureKind::Refused,
            format!(
                "change of group {} refused by its master: {why}; {now} (request {})",
                o.group, o.id
            ),
        ));
    }
    println!("group {}: {now}", o.group);
    Ok(())
}

/// The request's own bound (the call's --timeout) and a client that waits a little longer.
async fn request_client(conn: &Connection) -> Result<(Client, u32), Failure> {
    let timeout_ms = u32::try_from(conn.timeout.as_millis()).unwrap_or(u32::MAX).max(1);
    let mut longer = conn.clone();
    longer.timeout = conn.timeout + ANSWER_MARGIN;
    Ok((Client::connect(&longer).await?, timeout_ms))
}

/// The outcome of a request the controller refused is a refusal (exit 4).
fn done_or_refused(what: &str, o: &pb::OperatorOutcome) -> Result<(), Failure> {
    if o.done {
        return Ok(());
    }
    let why = o.refusal.as_deref().unwrap_or("no reason given");
    Err(Failure::new(
        FailureKind::Refused,
        format!("{what} of group {} refused by the controller: {why} (request {})", o.group, o.id),
    ))
}

/// Runs `hasync switchover`.
pub(crate) fn switchover(args: SwitchoverArgs) -> Result<(), Failure> {
    block_on(async move {
        let (client, timeout_ms) = request_client(&args.conn).await?;
        let req = pb::SwitchoverRequest {
            group: args.group,
            to: args.to.clone().unwrap_or_default(),
            timeout_ms,
        };
        let mut c = client.cluster();
        let o = client.call("Switchover", c.switchover(req)).await?;
        done_or_refused("switchover", &o)?;
        println!("{}", outcome_line("switchover", &o));
        let Some(to) = args.to.as_deref().filter(|to| o.master.as_deref() != Some(*to)) else {
            return Ok(());
        };
        // Another member was promoted: the decision's record of the epoch says why.
        let req = pb::GetHistoryRequest { group: o.group.clone(), limit: HISTORY_LOOKBACK };
        let entry = match client.call("GetHistory", c.get_history(req)).await {
            Ok(h) => h.entries.into_iter().find(|e| e.epoch == o.epoch),
            Err(_) => None,
        };
        Err(not_the_target(to, &o, entry.as_ref()))
    })
}

/// How many history records `switchover` reads to find the decision of the epoch it opened
/// (newest first: a failover right after it may have opened the next).
const HISTORY_LOOKBACK: u32 = 4;

/// A done switchover that promoted another member than `to` (exit 8): who was promoted and
/// why `to` was not, from the decision's record of the epoch (`entry`) when there is one.
fn not_the_target(to: &str, o: &pb::OperatorOutcome, entry: Option<&pb::HistoryEntry>) -> Failure {
    let promoted = o.master.as_deref().unwrap_or("no member");
    let why = |name: &str| {
        entry
            .and_then(|e| e.candidates.iter().find(|c| c.name == name))
            .filter(|c| !c.why.is_empty())
            .map(|c| format!("{name}: {}", c.why))
    };
    let reasons = match (why(to), why(promoted)) {
        (Some(t), Some(p)) => format!("{t}; {p}"),
        (Some(t), None) => t,
        _ => format!("no record of the decision at epoch {} says more", o.epoch),
    };
    Failure::new(
        FailureKind::NotTheTarget,
        format!(
            "switchover of group {} promoted {promoted} at epoch {}, not the requested {to} \
             ({reasons}): a switchover promotes its target only when the target is as complete \
             as the most complete fenced voter, else the most complete one; try again once \
             {to} has caught up (request {})",
            o.group, o.epoch, o.id
        ),
    )
}

/// Runs `hasync failover`.
pub(crate) fn failover(args: FailoverArgs) -> Result<(), Failure> {
    if !args.accept_data_loss {
        return Err(Failure::new(
            FailureKind::Usage,
            "failover needs --accept-data-loss: a manual failover may lose what only \
             unreachable members hold (the bound is recorded); for a zero-loss change use \
             `hasync switchover`",
        ));
    }
    block_on(async move {
        let (client, timeout_ms) = request_client(&args.conn).await?;
        let req = pb::FailoverRequest {
            group: args.group,
            to: args.to,
            accept_data_loss: true,
            timeout_ms,
        };
        let mut c = client.cluster();
        let o = client.call("Failover", c.failover(req)).await?;
        done_or_refused("failover", &o)?;
        println!("{}", outcome_line("failover", &o));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(master: &str) -> pb::OperatorOutcome {
        pb::OperatorOutcome {
            id: "r1".into(),
            group: "g1".into(),
            done: true,
            master: Some(master.into()),
            epoch: 4,
            ..Default::default()
        }
    }

    fn candidate(name: &str, why: &str) -> pb::HistoryCandidate {
        pb::HistoryCandidate {
            name: name.into(),
            fenced: true,
            why: why.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_switchover_that_promoted_another_member_exits_8_naming_it_and_why() {
        let entry = pb::HistoryEntry {
            epoch: 4,
            candidates: vec![
                candidate("n2", "chosen: holds the max (3, 5940) over F"),
                candidate("n3", "behind: (3, 1200) < max (3, 5940)"),
            ],
            ..Default::default()
        };
        let f = not_the_target("n3", &outcome("n2"), Some(&entry));
        assert_eq!(f.exit_code(), 8);
        let line = f.to_string();
        assert!(
            line.starts_with(
                "not the target: switchover of group g1 promoted n2 at epoch 4, not the \
                 requested n3 (n3: behind: (3, 1200) < max (3, 5940); n2: chosen: holds the max"
            ),
            "{line}"
        );
        assert!(line.ends_with("once n3 has caught up (request r1)"), "{line}");
        let bare = not_the_target("n3", &outcome("n1"), None).to_string();
        assert!(bare.contains("promoted n1 at epoch 4, not the requested n3 (no record"), "{bare}");
    }
}
