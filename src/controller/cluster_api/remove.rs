//! RemoveGroup: every record of a group deleted, once the group has no live member.
//!
//! A group exists by its records: starting nodes with its name creates it (their member
//! records, then the state record the controller bootstraps from them). Removing it deletes
//! everything under `<root>groups/<group>/`: the state record, the history, the name claims,
//! a pending request or change and their outcomes. It is refused while any member record
//! (each lives under its node's lease) or the leader key exists: stop the group's nodes and
//! wait for their leases to expire first.
//!
//! The check and the delete are one transaction: the group's keys are read at revision R and
//! checked, then deleted by one range delete under a compare that no key under the group's
//! prefix was created or changed after R (etcd's range compare). A node that starts between
//! the read and the delete creates its name claim or member record after R, so the compare
//! fails and nothing is deleted; the next attempt reads again and refuses, naming it. No race
//! is accepted: the group is either removed whole, with no live member at that revision, or
//! left as it was. A lost compare is retried at most [`REMOVE_ATTEMPTS`] times (the
//! controller may write a blocked reason into the state record meanwhile), then ABORTED.

use super::{ClusterView, engine, not_found};
use crate::control::{ClusterError, pb};
use crate::coordinator::records::{self, LeaderRecord};
use crate::coordinator::{Compare, KeyValue, Op, Txn};

/// How many times the read, check and delete are tried when the group's records change
/// between the read and the delete.
pub const REMOVE_ATTEMPTS: usize = 5;

impl ClusterView {
    /// Deletes every record of `group` (see the module docs).
    pub(super) async fn remove(
        &self,
        group: &str,
    ) -> Result<pb::RemoveGroupResponse, ClusterError> {
        let group = group.trim();
        if !crate::config::is_record_name(group) {
            return Err(ClusterError::InvalidArgument(format!(
                "group {group:?} is not a group name (1-64 of a-z A-Z 0-9 . _ -)"
            )));
        }
        let prefix = self.keys.group(group);
        for _ in 0..REMOVE_ATTEMPTS {
            let (kvs, revision) = self.coord.get_prefix(&prefix).await.map_err(engine)?;
            if kvs.is_empty() {
                return Err(not_found(group, &self.keys));
            }
            self.refuse_live(group, &kvs)?;
            let txn = Txn {
                compares: vec![Compare::prefix_unchanged_since(&prefix, revision)],
                success: vec![Op::DeletePrefix { prefix: prefix.clone() }],
                failure: vec![],
            };
            let resp = self.coord.txn(txn).await.map_err(engine)?;
            if resp.succeeded {
                let removed_keys = u32::try_from(kvs.len()).unwrap_or(u32::MAX);
                tracing::warn!(group, removed_keys, revision = resp.revision, "group removed");
                return Ok(pb::RemoveGroupResponse {
                    group: group.to_owned(),
                    removed_keys,
                    revision: resp.revision,
                });
            }
            tracing::info!(group, read_at = revision, "group records changed before the delete");
        }
        Err(ClusterError::Conflict(format!(
            "the records of group {group} changed between the read and the delete in each of \
             {REMOVE_ATTEMPTS} attempts; nothing was deleted; try again"
        )))
    }

    /// Refuses while a member record or the leader key exists, naming them.
    fn refuse_live(&self, group: &str, kvs: &[KeyValue]) -> Result<(), ClusterError> {
        let members_prefix = self.keys.members(group);
        let live: Vec<&str> =
            kvs.iter().filter_map(|kv| kv.key.strip_prefix(members_prefix.as_str())).collect();
        let leader_key = self.keys.leader(group);
        let leader = kvs.iter().find(|kv| kv.key == leader_key).map(|kv| {
            match records::decode::<LeaderRecord>(&kv.key, &kv.value) {
                Ok(l) => format!("the leader key is held by {} (epoch {})", l.name, l.epoch),
                Err(_) => "the leader key is held".to_owned(),
            }
        });
        let why = match (live.is_empty(), leader) {
            (true, None) => return Ok(()),
            (false, None) => format!("it has live members: {}", live.join(", ")),
            (false, Some(l)) => format!("it has live members: {}; {l}", live.join(", ")),
            (true, Some(l)) => l,
        };
        Err(ClusterError::FailedPrecondition(format!(
            "group {group} is not removed: {why}; stop its nodes and wait until their leases \
             expire (coordinator.ttl), then remove it"
        )))
    }
}

#[cfg(test)]
#[path = "remove_tests.rs"]
mod tests;
