//! ChangeGroup: a change of V, k or the mode handed to the group's master through
//! `<group>/change` (created only when absent) and answered from `<group>/change-outcome`.

use std::time::Duration;

use super::{ClusterView, engine, not_found, now_ms, request_timeout};
use crate::control::{ClusterError, pb};
use crate::coordinator::Txn;
use crate::coordinator::agent::change_of;
use crate::coordinator::records::{self, ChangeOutcome, ChangeRequest, Mode};

/// How often the outcome key is read while a change waits.
const OUTCOME_POLL: Duration = Duration::from_millis(50);

fn mode_of(m: i32) -> Result<Option<Mode>, ClusterError> {
    match pb::ReplicationMode::try_from(m) {
        Ok(pb::ReplicationMode::Unspecified) => Ok(None),
        Ok(pb::ReplicationMode::Sync) => Ok(Some(Mode::Sync)),
        Ok(pb::ReplicationMode::Async) => Ok(Some(Mode::Async)),
        Err(_) => Err(ClusterError::InvalidArgument(format!("mode {m} is not a replication mode"))),
    }
}

fn pb_mode(m: Mode) -> i32 {
    match m {
        Mode::Sync => pb::ReplicationMode::Sync as i32,
        Mode::Async => pb::ReplicationMode::Async as i32,
    }
}

fn answer(group: &str, o: ChangeOutcome) -> pb::ChangeGroupOutcome {
    pb::ChangeGroupOutcome {
        id: o.id,
        group: group.to_owned(),
        done: o.done,
        refusal: o.refusal,
        voters: o.voters,
        k: o.k,
        mode: pb_mode(o.mode),
        master: o.master,
        time_unix_ms: o.time_unix_ms,
    }
}

impl ClusterView {
    /// Creates the change request and waits for the master's outcome.
    pub(super) async fn change(
        &self,
        r: pb::ChangeGroupRequest,
    ) -> Result<pb::ChangeGroupOutcome, ClusterError> {
        let group = r.group.trim();
        if group.is_empty() {
            return Err(ClusterError::InvalidArgument("group is empty: name the group".into()));
        }
        let remove = Some(r.remove_member.trim().to_owned()).filter(|n| !n.is_empty());
        let timeout = request_timeout(r.timeout_ms);
        let now = now_ms();
        let request = ChangeRequest {
            id: format!("{:032x}", rand::random::<u128>()),
            remove_member: remove,
            k: r.k,
            mode: mode_of(r.mode)?,
            time_unix_ms: now,
            expires_unix_ms: Some(now + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        };
        change_of(&request).map_err(ClusterError::InvalidArgument)?;
        self.state(group).await?.ok_or_else(|| not_found(group, &self.keys))?;
        let key = self.keys.change(group);
        let txn = Txn::create_only(&key, records::encode(&request), None);
        let resp = self.coord.txn(txn).await.map_err(engine)?;
        if !resp.succeeded {
            let held = resp.reads.first().and_then(|r| r.first());
            let what = held
                .and_then(|kv| records::decode::<ChangeRequest>(&key, &kv.value).ok())
                .map_or_else(|| "a change".to_owned(), |c| format!("change {}", c.id));
            return Err(ClusterError::FailedPrecondition(format!(
                "group {group}: {what} is pending (key {key}); wait for it, or delete the key \
                 to withdraw it"
            )));
        }
        tracing::info!(group, id = %request.id, ?request, "change request created");
        let outcome_key = self.keys.change_outcome(group);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (kv, _) = self.coord.get(&outcome_key).await.map_err(engine)?;
            if let Some(kv) = kv {
                let o: ChangeOutcome = records::decode(&outcome_key, &kv.value)
                    .map_err(|e| ClusterError::Coordinator(e.to_string()))?;
                if o.id == request.id {
                    return Ok(answer(group, o));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::Timeout(format!(
                    "change {} of group {group}: no outcome within {}s; it is still pending (key \
                     {key}): a master that takes it from now on refuses it as expired, unless \
                     it is running it already; delete the key to withdraw it",
                    request.id,
                    timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + OUTCOME_POLL))
                .await;
        }
    }
}
