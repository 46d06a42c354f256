//! The controller's calls to nodes (Fence to every voter, ChangeRole) and its guarded writes:
//! the compare-and-swap of a group's state under the leadership's guard, what the groups'
//! records are told of it, and the status kept of being active and of blocked groups.

use crate::control::client::{ClientOptions, GrpcClient};
use crate::control::pb;
use crate::controller::decision::{BlockedReason, FenceReply};
use crate::coordinator::campaign::Leadership;
use crate::coordinator::records::{self, GroupState, HistoryRecord};
use crate::coordinator::{Compare, Error, Op, Txn};

use super::{Controller, GroupView};

impl Controller {
    pub(super) async fn fence_all(
        &self,
        view: &GroupView,
        state: &GroupState,
        drain_for: Option<&str>,
    ) -> Vec<FenceReply> {
        // A switchover's drain runs on the master while the target still follows it: the
        // master is fenced (and drained) first, the others only after it answered. Fenced at
        // once, the target would close its HA link before its last ack reached the drain, the
        // drain would time out and the old master, holding the most, be promoted again.
        let mut master_first = None;
        let mut pending = Vec::new();
        for v in &state.voters {
            let Some(m) = view.members.get(&v.name) else { continue };
            let opts = self.client_to(&m.advertise_grpc);
            let is_master = state.master.as_deref() == Some(v.name.as_str());
            let req = pb::FenceRequest {
                epoch: state.epoch,
                token: state.token.clone(),
                drain_for: if is_master {
                    drain_for.unwrap_or_default().to_owned()
                } else {
                    String::new()
                },
            };
            let name = v.name.clone();
            let (never_promote, priority) = (m.never_promote, m.priority);
            let call = async move {
                let r = async {
                    let c = GrpcClient::connect(&opts).await.map_err(|e| e.to_string())?;
                    c.replication()
                        .fence(req)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|s| s.message().to_owned())
                }
                .await;
                (name, never_promote, priority, r)
            };
            if is_master && drain_for.is_some() {
                master_first = Some(call);
            } else {
                pending.push(call);
            }
        }
        let mut answers = Vec::new();
        if let Some(call) = master_first {
            answers.push(call.await);
        }
        let mut calls = tokio::task::JoinSet::new();
        for call in pending {
            calls.spawn(call);
        }
        while let Some(joined) = calls.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        let mut reports = Vec::new();
        for (name, never_promote, priority, r) in answers {
            match r {
                Ok(f) => reports.push(FenceReply {
                    name: name.clone(),
                    data_dir_id: f.data_dir_id,
                    epoch: f.epoch,
                    promised_epoch: f.promised_epoch,
                    last_record_epoch: f.last_record_epoch,
                    end_offset: f.end_offset.max(0) as u64,
                    never_promote,
                    priority,
                }),
                Err(e) => {
                    tracing::info!(group = %view.group, member = %name, error = %e, "fence failed")
                }
            }
        }
        reports
    }

    fn client_to(&self, address: &str) -> ClientOptions {
        let mut o = self.opts.client.clone();
        o.address = address.to_owned();
        o
    }

    pub(super) async fn change_role(
        &self,
        address: &str,
        req: pb::ChangeRoleRequest,
    ) -> Result<(), String> {
        let c = GrpcClient::connect(&self.client_to(address)).await.map_err(|e| e.to_string())?;
        c.replication().change_role(req).await.map(|_| ()).map_err(|s| s.message().to_owned())
    }

    /// CAS the group's state from `rev` to `next` (with a history record); the revision of
    /// the transaction when it won.
    pub(super) async fn cas(
        &self,
        group: &str,
        rev: i64,
        next: &GroupState,
        history: Option<&HistoryRecord>,
    ) -> Result<Option<i64>, Error> {
        let key = self.keys.state(group);
        let mut success =
            vec![Op::Put { key: key.clone(), value: records::encode(next), lease: None }];
        if let Some(h) = history {
            success.push(Op::Put {
                key: self.keys.history_of(group, h.epoch),
                value: records::encode(h),
                lease: None,
            });
        }
        let r = self
            .coord
            .txn(Txn {
                compares: vec![Compare::unchanged_since(&key, rev), self.guard()?],
                success,
                failure: vec![],
            })
            .await?;
        self.settled(r.succeeded, r.revision);
        Ok(r.succeeded.then_some(r.revision))
    }

    /// Tells the groups' records what became of this controller's transaction under the
    /// prefix: written at `revision` (the next round's view must show it), or lost (its view
    /// missed a change).
    pub(super) fn settled(&self, succeeded: bool, revision: i64) {
        if succeeded {
            self.groups.wrote(revision);
        } else {
            self.groups.lost_race();
        }
    }

    /// The compare that holds only while this controller's leadership does: every change it
    /// makes carries it, so a deposed (paused, cut-off) controller changes nothing.
    pub(super) fn guard(&self) -> Result<Compare, Error> {
        self.leadership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Leadership::guard)
            .ok_or_else(|| Error::Refused {
                call: "state change",
                reason: "this controller is not active".into(),
            })
    }

    pub(super) fn deactivate(&self) {
        self.with_status(|s| s.active = false);
        *self.leadership.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.groups.stop();
    }

    pub(super) fn blocked(&self, group: &str, reason: BlockedReason) {
        self.with_status(|s| {
            s.blocked.insert(group.to_owned(), reason);
        });
    }

    pub(super) fn clear_blocked(&self, group: &str) {
        self.with_status(|s| {
            s.blocked.remove(group);
        });
    }
}
