//! The put path: append on the master, then wait for the flush (under sync flush) and for `k`
//! slave acks (in SYNC mode), and answer with RocketMQ's put status.

use std::sync::atomic::Ordering;

use crate::config::{FlushMode, ReplicationMode};
use crate::ha::group_transfer::{Admission, SyncWaiters, TransferStatus};
use crate::ha::master::Master;
use crate::node::Node;
use crate::store::record::Message;
use crate::store::{AppendedRecord, Error as StoreError};

/// RocketMQ's put statuses that hasync produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PutStatus {
    /// Stored, flushed as the flush mode asks, and acked by `k` slaves in SYNC mode.
    PutOk,
    /// Stored, but not flushed within `sync-flush-timeout` (sync flush). Code 10.
    FlushDiskTimeout,
    /// Stored, but `k` slaves did not ack within `slave-timeout`. Code 12.
    FlushSlaveTimeout,
    /// Stored, but fewer than `k` slaves were in sync, so the put did not wait. Code 11.
    SlaveNotAvailable,
    /// Not a master, shutting down, disk full; or, for a put that was waiting, outcome unknown
    /// (the record may be truncated by a later role change). Code 14.
    ServiceNotAvailable,
    /// The message cannot be stored (too large, bad topic or properties). Code 13.
    MessageIllegal,
}

impl PutStatus {
    /// The RocketMQ name.
    pub fn as_str(self) -> &'static str {
        match self {
            PutStatus::PutOk => "PUT_OK",
            PutStatus::FlushDiskTimeout => "FLUSH_DISK_TIMEOUT",
            PutStatus::FlushSlaveTimeout => "FLUSH_SLAVE_TIMEOUT",
            PutStatus::SlaveNotAvailable => "SLAVE_NOT_AVAILABLE",
            PutStatus::ServiceNotAvailable => "SERVICE_NOT_AVAILABLE",
            PutStatus::MessageIllegal => "MESSAGE_ILLEGAL",
        }
    }
}

impl std::fmt::Display for PutStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a put did: its status, whether the records are stored on the master (explicitly, so a
/// client never has to guess), where they landed, and why when it is not PUT_OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutcome {
    /// The status.
    pub status: PutStatus,
    /// Whether the records are in the master's commitlog.
    pub stored: bool,
    /// Each record's offset, size and queue offset (empty when not stored).
    pub records: Vec<AppendedRecord>,
    /// The end of the batch (0 when not stored).
    pub end_offset: u64,
    /// Why, when the status is not PUT_OK.
    pub detail: Option<String>,
    /// The epoch the put was admitted in (read with the role, under one lock): a waiting put
    /// that a role change ends keeps it. A put refused before admission carries the epoch in
    /// force at the refusal.
    pub epoch: u64,
}

impl PutOutcome {
    fn refused(status: PutStatus, detail: String, epoch: u64) -> Self {
        let detail = Some(detail);
        Self { status, stored: false, records: Vec::new(), end_offset: 0, detail, epoch }
    }
}

/// An admitted put: the master role's sync waiters, the settings it runs under, the epoch it
/// was admitted in, the rule's token (held until the outcome) and the master's data plane (a
/// SYNC put pushes its frame through it).
struct Admitted {
    waiters: std::sync::Arc<SyncWaiters>,
    settings: super::ReplicationSettings,
    epoch: u64,
    rule: std::sync::Arc<()>,
    plane: Option<std::sync::Arc<Master>>,
}

/// A put that was admitted and appended, waiting for its flush and its acks (or already
/// decided); it owns what it needs, so it can be awaited anywhere, in the order puts were
/// begun (the streaming put answers in order) or detached to finish alone.
#[must_use = "a put's outcome is only known when awaited"]
pub struct PendingPut {
    node: std::sync::Arc<Node>,
    stage: Stage,
}

impl std::fmt::Debug for PendingPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingPut").finish_non_exhaustive()
    }
}

impl PendingPut {
    /// The put's outcome: at once for a refused put, else when its records are flushed (sync
    /// flush) and acked by `k` slaves (SYNC) or the wait ended.
    pub async fn outcome(self) -> PutOutcome {
        self.node.finish_put(self.stage).await
    }
}

/// Where a begun put stands: decided (refused, or nothing to wait for), or appended and
/// admitted to the sync waiters.
enum Stage {
    Decided { outcome: PutOutcome, mode: ReplicationMode, started: std::time::Instant },
    Appended(Box<Appended>),
}

/// An appended put: where it landed, the wait it was admitted to, and what it holds until the
/// outcome (the rule's token).
struct Appended {
    started: std::time::Instant,
    settings: super::ReplicationSettings,
    epoch: u64,
    records: Vec<AppendedRecord>,
    end: u64,
    admission: Admission,
    /// The rule's token, held until the outcome.
    rule: std::sync::Arc<()>,
}

impl Node {
    /// Puts one or more messages (waited on at the end of the last one). SYNC mode waits for
    /// `k` live slave acks at or beyond the end offset; ASYNC returns after the store (and the
    /// flush, under sync flush).
    pub async fn put(&self, msgs: Vec<Message>) -> PutOutcome {
        let stage = self.begin_stage(msgs);
        self.finish_put(stage).await
    }

    /// Admits and appends a put now (puts begun one after another land in that order, each
    /// admitted to the sync waiters with its own deadline from now) and gives the wait for its
    /// outcome, which owns what it needs.
    pub fn begin_put(self: &std::sync::Arc<Self>, msgs: Vec<Message>) -> PendingPut {
        PendingPut { node: std::sync::Arc::clone(self), stage: self.begin_stage(msgs) }
    }

    /// Waits for a begun put's flush and acks, and records the put's metric.
    async fn finish_put(&self, stage: Stage) -> PutOutcome {
        let (outcome, mode, started) = match stage {
            Stage::Decided { outcome, mode, started } => (outcome, mode, started),
            Stage::Appended(appended) => {
                let (started, mode) = (appended.started, appended.settings.mode);
                (self.wait_appended(*appended).await, mode, started)
            }
        };
        let mode = match mode {
            ReplicationMode::Sync => "sync",
            ReplicationMode::Async => "async",
        };
        self.metrics.observe_put(mode, outcome.status.as_str(), started.elapsed());
        outcome
    }

    /// The admission and the append: a refusal is decided here.
    fn begin_stage(&self, mut msgs: Vec<Message>) -> Stage {
        let started = std::time::Instant::now();
        let decided = |(outcome, mode)| Stage::Decided { outcome, mode, started };
        // Taken before the admission: a fence raised after it (even if lowered again by the
        // time the append runs) refuses the append.
        let fence = self.store.fence_token();
        let Admitted { waiters, settings, epoch, rule, plane } = match self.admit_put(&msgs) {
            Ok(admitted) => admitted,
            Err(refused) => return decided(refused),
        };
        let mode = settings.mode;
        let now = crate::ha::status::now_millis();
        for m in &mut msgs {
            m.store_timestamp_ms = now;
        }
        let appended = match self.store.append_admitted(&msgs, fence) {
            Ok(a) => a,
            Err(e @ (StoreError::MessageTooLarge { .. } | StoreError::Record(_))) => {
                let illegal = PutOutcome::refused(PutStatus::MessageIllegal, e.to_string(), epoch);
                return decided((illegal, mode));
            }
            // The fence was raised after this put was admitted (a role change began): the
            // store refused it under its writer lock, so nothing of it was written.
            Err(StoreError::Fenced) => {
                let why = if self.fenced() {
                    self.fence_reason()
                } else {
                    format!(
                        "refused by the write fence: the role changed after this put was admitted \
                         (now {}, epoch {}); nothing was stored",
                        self.role(),
                        self.epoch()
                    )
                };
                let refused = PutOutcome::refused(PutStatus::ServiceNotAvailable, why, epoch);
                return decided((refused, mode));
            }
            Err(e) => {
                let status = PutStatus::ServiceNotAvailable;
                return decided((PutOutcome::refused(status, e.to_string(), epoch), mode));
            }
        };
        let end = appended.end_offset;
        let start = appended.records.first().map_or(end, |r| r.offset);
        let admission = match settings.mode {
            ReplicationMode::Async => Admission::Done(TransferStatus::PutOk),
            ReplicationMode::Sync => waiters.admit(
                start..end,
                settings.sync_ack_replicas,
                self.config.replication.slave_timeout,
                self.store.max_offset(),
                self.config.replication.max_gap_not_in_sync.0,
            ),
        };
        if self.config.store.flush == FlushMode::Sync {
            self.store.request_flush(end);
        }
        // The frame a SYNC put waits for leaves from this task when a link is idle, without
        // waiting for the writer task's wake-up. An ASYNC put's frame is the writer's alone:
        // its reply does not wait for it.
        if let (Admission::Wait(_), Some(plane)) = (&admission, &plane) {
            plane.push();
        }
        let records = appended.records;
        Stage::Appended(Box::new(Appended {
            started,
            settings,
            epoch,
            records,
            end,
            admission,
            rule,
        }))
    }

    /// The flush (under sync flush) and the acks (SYNC) of an appended put, and its status.
    async fn wait_appended(&self, appended: Appended) -> PutOutcome {
        let Appended { settings, epoch, records, end, admission, rule, .. } = appended;
        let flush = async {
            match self.config.store.flush {
                FlushMode::Sync => self.store.wait_flushed(end).await.err().map(|e| e.to_string()),
                FlushMode::Async => None,
            }
        };
        let (flush_error, replicated) = tokio::join!(flush, admission.outcome());
        let (status, detail) = self.put_status(end, settings, flush_error, replicated);
        drop(rule);
        PutOutcome { status, stored: true, records, end_offset: end, detail, epoch }
    }

    /// Refuses a put before it touches the store (not the master, fenced, shutting down, no
    /// messages), or admits it with the master role's waiters and the settings in force; a
    /// refusal comes with the mode in force.
    fn admit_put(&self, msgs: &[Message]) -> Result<Admitted, (PutOutcome, ReplicationMode)> {
        let (waiters, settings, epoch, rule, plane) = {
            let st = self.state();
            if st.role != crate::config::Role::Master {
                let why = super::not_master(&st, "a put").to_string();
                let refused = PutOutcome::refused(PutStatus::ServiceNotAvailable, why, st.epoch);
                return Err((refused, st.replication.mode));
            }
            let rule = std::sync::Arc::clone(&st.rule);
            let plane = st.master.clone();
            (std::sync::Arc::clone(&st.waiters), st.replication, st.epoch, rule, plane)
        };
        let refuse = |status, why: &str| {
            Err((PutOutcome::refused(status, why.into(), epoch), settings.mode))
        };
        // A fast refusal; the store checks the fence again under its writer lock (a fence
        // raised after this check still refuses the append).
        if self.fenced() {
            return refuse(PutStatus::ServiceNotAvailable, &self.fence_reason());
        }
        if !self.accepting.load(Ordering::SeqCst) {
            return refuse(PutStatus::ServiceNotAvailable, "node is shutting down");
        }
        if msgs.is_empty() {
            return refuse(PutStatus::MessageIllegal, "no messages");
        }
        // The one topic rule; a bad topic refuses the whole batch before anything is stored.
        for (i, m) in msgs.iter().enumerate() {
            if let Err(e) = crate::metadata::names::check_topic(&m.topic) {
                return refuse(PutStatus::MessageIllegal, &format!("message {i}: {e}"));
            }
        }
        Ok(Admitted { waiters, settings, epoch, rule, plane })
    }

    /// The put status of stored records and why it is not PUT_OK. As upstream: a flush
    /// failure is set first, then a replica failure overrides it.
    fn put_status(
        &self,
        end: u64,
        settings: super::ReplicationSettings,
        flush_error: Option<String>,
        replicated: TransferStatus,
    ) -> (PutStatus, Option<String>) {
        let k = settings.sync_ack_replicas;
        let timeout = self.config.replication.slave_timeout;
        match replicated {
            TransferStatus::PutOk => match flush_error {
                Some(e) => (PutStatus::FlushDiskTimeout, Some(e)),
                None => (PutStatus::PutOk, None),
            },
            TransferStatus::FlushSlaveTimeout => (
                PutStatus::FlushSlaveTimeout,
                Some(format!("{k} slave ack(s) at offset {end} not received within {timeout:?}")),
            ),
            TransferStatus::SlaveNotAvailable => (
                PutStatus::SlaveNotAvailable,
                Some(format!(
                    "fewer than {k} slave(s) in sync (connected and within \
                     replication.max-gap-not-in-sync)"
                )),
            ),
            TransferStatus::ServiceNotAvailable => (
                PutStatus::ServiceNotAvailable,
                Some("shutdown or loss of the master role ended the wait: outcome unknown".into()),
            ),
        }
    }
}
