//! The node: opens the store, starts the data plane for its role, owns the shutdown token and
//! the task set. The control plane (gRPC) calls into it. It knows nothing of gRPC: what it needs
//! from a master's API (epoch histories, metadata pulls) it names in [`remote`], and the
//! control plane implements it.
//!
//! Lock order: `role_change` (async, one role change or fence at a time) -> `metadata_gate`
//! -> `ha_refuser` -> `ha_listener` (alone, or inside `ha_refuser`) -> `state` -> `history`. No lock is held across an await except `role_change` and
//! `metadata_gate` (a metadata write holds it shared while it runs; a role change or a fence
//! takes it exclusively, briefly, after raising the write fence).
//!
//! The write fence lives in the commitlog ([`CommitLog::set_writes`]), checked under its
//! writer lock by every append (a master's node opens only appends, a slave's only replicated
//! writes); metadata writes check it under the metadata gate. It is raised
//! while a role change runs, after it failed, and (with `node.fence-on-unclean-start`) on a
//! master that stopped uncleanly; [`Node::fenced`] reads it. A [`Node::fence`] raises it too,
//! with a promised epoch that survives restarts ([`fence`]): then only a ChangeRole to that
//! epoch or above lowers it.
//!
//! Coordinator mode (issue 17): with a [`coordination::Coordination`] (given through
//! `NodeParts`), Fence and ChangeRole must match the controller's decision and the controller
//! owns the replication mode; without one (static mode) the node behaves as before.

pub mod coordination;
pub mod epoch;
mod error;
pub mod fence;
mod ha_port;
mod put;
mod readable;
mod registration;
pub(crate) mod remote;
pub mod role;
mod status;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The per-replica and master-link parts of [`NodeStatus`] (owned by the data plane).
pub use crate::ha::status::{MasterLinkStatus, ReplicaStatus};
pub use error::Error;
pub use fence::FenceOutcome;
pub use put::{PendingPut, PutOutcome, PutStatus};
pub use remote::RemoteError;
pub use status::NodeStatus;

use crate::config::{Config, ReplicationMode, Role};
use crate::ha::group_transfer::SyncWaiters;
use crate::ha::master::Master;
use crate::ha::slave::Slave;
use crate::metadata::MetadataStore;
use crate::metadata::pull::Puller;
use crate::store::fs::FileSystem;
use crate::store::{CommitLog, StoreOptions, Writes};

/// The replication mode in force and the number of slave acks a sync put waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// SYNC or ASYNC.
    pub mode: ReplicationMode,
    /// `k`: slave acks a SYNC put waits for (slaves only, never the master).
    pub sync_ack_replicas: usize,
}

/// The role-dependent part of a node, replaced by role changes.
#[derive(Debug)]
struct RoleState {
    role: Role,
    epoch: u64,
    master: Option<Arc<Master>>,
    slave: Option<Arc<Slave>>,
    puller: Option<Arc<Puller>>,
    ha_addr: Option<SocketAddr>,
    master_ha: String,
    master_grpc: String,
    waiters: Arc<SyncWaiters>,
    replication: ReplicationSettings,
    /// Cancels this role's data-plane tasks.
    plane: CancellationToken,
    plane_tasks: TaskTracker,
    last_request: Option<role::RoleRequest>,
    /// A role change running or failed (None once the last one completed).
    role_change: Option<role::RoleChange>,
    /// Fenced by the promise (`Node::fence`): no writes, no data plane, until a ChangeRole to
    /// the promised epoch or above completes.
    promise_fenced: bool,
    /// The voters V, `(name, data-dir id)` (`Node::set_voters`): when set, a master counts
    /// only the acks of a registered replica of V (None: every replica, as before).
    voters: Option<Vec<(String, String)>>,
    /// Held (cloned) by every put from its admission to its outcome; replaced by
    /// [`Node::apply_rule`], so that the puts admitted under the rule before can be waited for.
    rule: Arc<()>,
}

/// The puts admitted under the rule that an [`Node::apply_rule`] replaced.
#[derive(Debug)]
pub struct AdmittedUnderOldRule(std::sync::Weak<()>);

impl AdmittedUnderOldRule {
    /// Waits until every one of them has its outcome (PUT_OK, a timeout, a failure), at most
    /// `timeout`; false when some are still running then.
    pub async fn completed(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.0.strong_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        true
    }
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    config: Config,
    store: Arc<CommitLog>,
    metadata: Arc<MetadataStore>,
    history: Arc<Mutex<epoch::EpochHistory>>,
    /// A slave's master's replication mode as its confirm-offset learner last saw it.
    master_mode: Arc<Mutex<Option<crate::config::ReplicationMode>>>,
    /// This data directory's random id (`store::data_dir_id`), registered with a master.
    data_dir_id: String,
    state: Mutex<RoleState>,
    role_change: tokio::sync::Mutex<()>,
    /// Held shared by each metadata write (with its fence check) until the write itself ended
    /// (the guard moves into the blocking write, so a cancelled call does not drop it early),
    /// exclusively by a role change once it raised the fence: then no metadata write is in
    /// flight.
    metadata_gate: Arc<tokio::sync::RwLock<()>>,
    accepting: AtomicBool,
    fs: Arc<dyn FileSystem>,
    remote: remote::Remote,
    /// The HA listener the node holds: given at the start, or bound by its first master data
    /// plane; kept across roles until the node stops ([`ha_port`]).
    ha_listener: Mutex<Option<Arc<tokio::net::TcpListener>>>,
    /// What closes connections on the held port while no master plane serves it.
    ha_refuser: Mutex<Option<ha_port::Refuser>>,
    /// Where a master data plane binds when it has no listener to take: the address the given
    /// listener had (so an OS-assigned port stays the node's across role changes), else
    /// `ha.listen` until a plane bound it (then the address it got, for the same reason: a
    /// re-promotion restarts the plane).
    ha_bind: Mutex<SocketAddr>,
    /// This node's HA and gRPC listener addresses: a master there is this node.
    own_listeners: Vec<SocketAddr>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    metrics: Arc<crate::metrics::Metrics>,
    /// The coordinator's decision (None: static mode).
    coordination: Option<Arc<dyn coordination::Coordination>>,
    /// The epoch promised to a fence (0: none), as in `<data-dir>/promise`; changed under the
    /// role-change lock, read by the slave's epoch check.
    promised: Arc<AtomicU64>,
}

/// What a node starts with besides its configuration (the app gives them).
#[derive(Debug)]
pub(crate) struct NodeParts {
    /// Every file the node writes goes through this seam.
    pub(crate) fs: Arc<dyn FileSystem>,
    /// The master's API, as the control plane implements it.
    pub(crate) remote: remote::Remote,
    /// A bound HA listener, kept across roles (None: the first master data plane binds
    /// `ha.listen`).
    pub(crate) ha_listener: Option<tokio::net::TcpListener>,
    /// Truncate at corruption below the checkpoint instead of refusing to start.
    pub(crate) repair: bool,
    /// The gRPC listener's address (a demotion to it is refused: it is this node).
    pub(crate) grpc_addr: Option<SocketAddr>,
    /// The coordinator's decision, for coordinator mode (None: static mode).
    pub(crate) coordination: Option<Arc<dyn coordination::Coordination>>,
}

impl Node {
    /// Opens the store (recovering it) and the metadata, then starts the data plane of the
    /// node's role: the last ChangeRole (persisted) wins over the configuration, with a warning
    /// when they differ.
    pub(crate) async fn start(config: Config, parts: NodeParts) -> Result<Self, Error> {
        let NodeParts { fs, remote, ha_listener, repair, grpc_addr, coordination } = parts;
        let metrics = Arc::new(crate::metrics::Metrics::new());
        // Before the store is opened: a start refused here leaves the data dir as it was.
        let (role_file, history) = load_role_and_history(&config, fs.as_ref())?;
        let promised =
            fence::Promise::load(fs.as_ref(), &config.node.data_dir)?.map_or(0, |p| p.epoch);
        let store = open_store(&config, repair, &fs, &metrics).await?;
        let (metadata, data_dir_id) = match open_metadata(&config, &fs).await {
            Ok(opened) => opened,
            Err(e) => {
                close_refused(&store).await;
                return Err(e);
            }
        };
        let interrupted = role_file.as_ref().filter(|f| f.pending).map(interrupted_change);
        let persisted = role_file.map(|f| f.request);
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(persist_offsets(
            Arc::clone(&metadata),
            Arc::clone(&store),
            config.metadata.consumer_offset_persist_interval,
            cancel.child_token(),
        ));
        let replication = ReplicationSettings {
            mode: config.replication.mode,
            sync_ack_replicas: config.replication.sync_ack_replicas as usize,
        };
        let (role, master_ha, master_grpc, epoch) = starting_role(&config, &persisted, &history);
        let promise_fenced = promised > epoch.max(history.last().epoch);
        if promise_fenced {
            tracing::warn!(promised, epoch, %role, "the promised epoch is above the persisted \
                role's: fenced, without a data plane, until a ChangeRole at the promise or above");
        }
        // The member agent (coordinator mode, `[coordinator]` endpoints) confirms a master; a
        // node given a decision reader alone (tests) has no agent to.
        let coordinated_master =
            coordination.is_some() && config.coordinator.enabled() && role == Role::Master;
        if coordinated_master {
            tracing::info!(
                "coordinator mode: a master starts fenced until the group's state \
                record names it master at its epoch"
            );
        }
        if interrupted.is_some()
            || promise_fenced
            || coordinated_master
            || fenced_at_start(&config, role, &store)
        {
            store.set_writes(Writes::Fenced);
        } else {
            store.set_writes(writes_of(role));
        }
        let ha_bind =
            ha_listener.as_ref().and_then(|l| l.local_addr().ok()).unwrap_or(config.ha.listen);
        let node = Self {
            store,
            metadata,
            history: Arc::new(Mutex::new(history.clone())),
            master_mode: Arc::new(Mutex::new(None)),
            data_dir_id,
            state: Mutex::new(RoleState {
                role,
                epoch: epoch.max(history.last().epoch),
                master: None,
                slave: None,
                puller: None,
                ha_addr: None,
                master_ha,
                master_grpc,
                waiters: Arc::new(SyncWaiters::new(replication.sync_ack_replicas)),
                rule: Arc::new(()),
                replication,
                plane: cancel.child_token(),
                plane_tasks: TaskTracker::new(),
                last_request: if interrupted.is_some() { None } else { persisted },
                role_change: interrupted.clone(),
                promise_fenced,
                // Coordinator mode: no ack counts until the voters are known.
                voters: coordination.as_ref().map(|_| Vec::new()),
            }),
            role_change: tokio::sync::Mutex::new(()),
            metadata_gate: Arc::new(tokio::sync::RwLock::new(())),
            accepting: AtomicBool::new(true),
            fs,
            remote,
            ha_listener: Mutex::new(ha_listener.map(Arc::new)),
            ha_refuser: Mutex::new(None),
            ha_bind: Mutex::new(ha_bind),
            own_listeners: [Some(ha_bind), grpc_addr].into_iter().flatten().collect(),
            cancel,
            tasks,
            metrics,
            config,
            coordination,
            promised: Arc::new(AtomicU64::new(promised)),
        };
        let no_plane = interrupted.is_some() || promise_fenced;
        if let Err(e) = node.start_first_plane(role, no_plane).await {
            // A refused start stops cleanly: the next one is not taken for an unclean stop.
            if let Err(stop) = node.shutdown().await {
                tracing::warn!(error = %stop, "stopping after a refused start failed");
            }
            return Err(e);
        }
        Ok(node)
    }

    /// Starts the data plane of the role the node starts in; none after a change that was
    /// interrupted (until it is resumed or superseded) or while fenced by a promise above the
    /// role's epoch (until a ChangeRole at the promise or above).
    async fn start_first_plane(&self, role: Role, no_plane: bool) -> Result<(), Error> {
        match role {
            _ if no_plane => {}
            Role::Master => self.start_master_plane().await?,
            Role::Slave => self.start_slave_plane(),
        }
        self.refuse_on_ha_port();
        Ok(())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RoleState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The epoch of this master when no role change is running or failed (one read of the
    /// role state: a role change sets the new epoch before it changes the role).
    pub(crate) fn settled_master_epoch(&self) -> Option<u64> {
        let st = self.state();
        (st.role == Role::Master && st.role_change.is_none()).then_some(st.epoch)
    }

    /// The node's metrics (served by `hasync serve` on metrics.listen).
    pub(crate) fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// The configuration the node runs with.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }
    /// The commitlog.
    pub fn store(&self) -> &Arc<CommitLog> {
        &self.store
    }
    /// The current role.
    pub fn role(&self) -> Role {
        self.state().role
    }
    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.state().epoch
    }
    /// Whether writes (puts, metadata writes) are fenced: a role change is running or failed,
    /// or a master that stopped uncleanly waits for a ChangeRole to confirm its role.
    pub fn fenced(&self) -> bool {
        self.store.writes() == Writes::Fenced
    }

    /// Lowers the write fence for `role`: a master takes appends, a slave replicated bytes.
    pub(crate) fn open_writes(&self, role: Role) {
        self.store.set_writes(writes_of(role));
    }

    /// Coordinator mode: the agent saw the state record name this master at its epoch: puts
    /// open unless a promise, a role change or a shutdown says otherwise. Whether it opened.
    pub(crate) fn confirm_coordinated_master(&self, epoch: u64) -> bool {
        let st = self.state();
        let ok = st.role == Role::Master
            && st.epoch == epoch
            && st.role_change.is_none()
            && self.promised_epoch() <= epoch
            && self.accepting.load(std::sync::atomic::Ordering::SeqCst);
        if ok && self.fenced() {
            tracing::info!(
                epoch,
                "coordinator mode: the state record names this node master; puts open"
            );
            self.store.set_writes(writes_of(Role::Master));
        }
        ok
    }

    /// A role change running or failed, if any.
    pub fn role_change(&self) -> Option<role::RoleChange> {
        self.state().role_change.clone()
    }

    /// Why writes are fenced, and how to end it (for refusals).
    pub(crate) fn fence_reason(&self) -> String {
        use role::RoleChangeState as S;
        let (change, promise_fenced) = {
            let st = self.state();
            (st.role_change.clone(), st.promise_fenced)
        };
        let promised = self.promised_epoch();
        match change {
            Some(c) if promise_fenced && c.epoch < promised => format!(
                "fenced: this node promised epoch {promised} to a fence; a ChangeRole at epoch \
                 {promised} or above ends it"
            ),
            Some(c) if c.state == S::Failed => format!(
                "fenced: the role change to {} at epoch {} failed at step \"{}\" ({}); repeat \
                 the exact ChangeRole to resume it, or use a higher epoch",
                c.request.role, c.epoch, c.failed_step, c.error
            ),
            Some(c) => format!("fenced: changing role to {} at epoch {}", c.request.role, c.epoch),
            None if promise_fenced => format!(
                "fenced: this node promised epoch {promised} to a fence; a ChangeRole at epoch \
                 {promised} or above ends it"
            ),
            None => "fenced: this master stopped uncleanly or is changing role; a ChangeRole \
                     must confirm it before it takes puts"
                .into(),
        }
    }
    /// The bound HA address (a master's), with the OS-assigned port resolved.
    pub fn ha_addr(&self) -> Option<SocketAddr> {
        self.state().ha_addr
    }

    /// The HA port the node holds, whatever its role: once bound it is kept until the node
    /// stops, and serves slaves only while the node is master (see [`crate::ha::held_port`]).
    pub fn ha_port_held(&self) -> Option<SocketAddr> {
        let held = self.ha_listener.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().and_then(|l| l.local_addr().ok())
    }
    /// The epoch history.
    pub fn epoch_history(&self) -> epoch::EpochHistory {
        self.history.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The replication mode and `k` in force.
    pub fn replication(&self) -> ReplicationSettings {
        self.state().replication
    }

    /// Switches SYNC/ASYNC (and optionally `k`) for the next put; waiters already waiting run to
    /// their own outcome. Only a master has a replication mode.
    pub fn set_replication_mode(
        &self,
        mode: ReplicationMode,
        sync_ack_replicas: Option<usize>,
    ) -> Result<ReplicationSettings, Error> {
        if self.coordination.is_some() {
            return Err(Error::Coordinated(
                "coordinator mode: the replication mode and k are the group's state record's, \
                 changed by its master in rule B's order: use `hasync cluster change --group G \
                 --k N|--mode M` (docs/failover.md, \"Changing V, k or the mode\"); a direct \
                 change is refused"
                    .into(),
            ));
        }
        let mut st = self.state();
        if st.role != Role::Master {
            return Err(not_master(&st, "changing the replication mode"));
        }
        if sync_ack_replicas == Some(0) {
            return Err(Error::InvalidArgument {
                field: "sync_ack_replicas",
                reason: "must be at least 1 (it counts slaves, never the master)".into(),
            });
        }
        // The configuration's rule (`config check`): more acks than slave connections can never
        // be reached, and no SYNC put could succeed.
        let max = self.config.ha.max_connections as usize;
        if let Some(k) = sync_ack_replicas.filter(|k| *k > max) {
            return Err(Error::InvalidArgument {
                field: "sync_ack_replicas",
                reason: format!("{k} can never be reached with ha.max-connections = {max}"),
            });
        }
        let before = st.replication;
        st.replication.mode = mode;
        if let Some(k) = sync_ack_replicas {
            st.replication.sync_ack_replicas = k;
            st.waiters.set_sync_ack_replicas(k);
        }
        tracing::info!(?before, after = ?st.replication, "replication mode changed");
        Ok(st.replication)
    }

    /// Sets the voters V, `(member name, data-dir id)` (issue 17, invariant A): while set, a
    /// master counts for SYNC puts and the confirm offset only the acks of a replica whose
    /// connection registered the data-dir id of a voter other than this node (an unregistered
    /// or IP-identified connection, a stock Java slave and the master itself never count), so
    /// a SYNC put answers PUT_OK only once `k` members of V other than the master hold it.
    /// `None` counts every replica (the rule without a coordinator). Applies to the running
    /// master plane at once (waiters it satisfies complete) and to every later one.
    pub fn set_voters(&self, voters: Option<Vec<(String, String)>>) {
        let mut st = self.state();
        if st.voters == voters {
            return;
        }
        tracing::info!(?voters, "voters set");
        st.voters = voters;
        if let Some(m) = &st.master {
            m.set_voters(self.voter_data_dirs(&st.voters));
        }
    }

    /// Coordinator mode: applies the rule a master's SYNC puts follow from now on, in one step:
    /// the voters `(name, data-dir id)` whose acks count (see [`Node::set_voters`]), `k` and the
    /// mode (SYNC with k = 0 is a degraded group: its puts need no ack, as in ASYNC). Returns
    /// the puts admitted under the rule before, to wait for. The group's published rule is the
    /// caller's to keep in step (rule B: a stricter rule is applied before it is published, a
    /// weaker one after). Refused on a slave and for k above `ha.max-connections`.
    pub fn apply_rule(
        &self,
        voters: Vec<(String, String)>,
        k: usize,
        mode: ReplicationMode,
    ) -> Result<AdmittedUnderOldRule, Error> {
        let mut st = self.state();
        if st.role != Role::Master {
            return Err(not_master(&st, "applying a replication rule"));
        }
        let max = self.config.ha.max_connections as usize;
        if k > max {
            return Err(Error::InvalidArgument {
                field: "k",
                reason: format!("{k} can never be reached with ha.max-connections = {max}"),
            });
        }
        let before = (st.replication, st.voters.clone());
        if mode == ReplicationMode::Sync && k == 0 {
            // Degraded: no ack needed. The node's own k stays (a confirm offset needs k >= 1).
            st.replication.mode = ReplicationMode::Async;
        } else {
            st.replication.mode = mode;
            st.replication.sync_ack_replicas = k;
            st.waiters.set_sync_ack_replicas(k);
        }
        if st.voters.as_ref() != Some(&voters) {
            st.voters = Some(voters);
            if let Some(m) = &st.master {
                m.set_voters(self.voter_data_dirs(&st.voters));
            }
        }
        let old = std::mem::replace(&mut st.rule, Arc::new(()));
        tracing::info!(?before, after = ?(st.replication, &st.voters), "replication rule applied");
        Ok(AdmittedUnderOldRule(Arc::downgrade(&old)))
    }

    /// Whether at least `k` of the replicas counted now (the voters of the rule last applied)
    /// each hold every byte of `range` without a gap: the ack table's runs, so a slave that
    /// started empty at the last file holds nothing below its start however high it acked.
    /// `k = 0` asks for no replica, and an empty range for no byte. False on a slave.
    ///
    /// A replica counts once it acked a byte its connection was sent in this master term (the
    /// table's rule, see `ha::progress`): after a master restart an idle group's caught-up
    /// slaves hold nothing here until the next put.
    pub fn voters_hold(&self, k: usize, range: std::ops::Range<u64>) -> bool {
        if k == 0 || range.is_empty() {
            return self.role() == Role::Master;
        }
        let waiters = {
            let st = self.state();
            if st.role != Role::Master {
                return false;
            }
            Arc::clone(&st.waiters)
        };
        waiters.read_table(|t| t.holds(k, &range))
    }

    /// The voters' data-dir ids a master plane counts: this node's own left out.
    fn voter_data_dirs(
        &self,
        voters: &Option<Vec<(String, String)>>,
    ) -> Option<std::collections::HashSet<String>> {
        let ids = voters.as_ref()?.iter().map(|(_, id)| id);
        Some(ids.filter(|id| **id != self.data_dir_id).cloned().collect())
    }

    /// Refuses what needs the master role, naming the master this node follows now.
    pub(crate) fn check_master(&self, what: &'static str) -> Result<(), Error> {
        let st = self.state();
        if st.role != Role::Master {
            return Err(not_master(&st, what));
        }
        Ok(())
    }

    /// The broker metadata.
    pub fn metadata(&self) -> &Arc<MetadataStore> {
        &self.metadata
    }

    /// Admits a metadata write: refused on a slave (naming its master) and while writes are
    /// fenced. The write runs while the returned guard is held (the caller moves it into the
    /// blocking write, so it lives until the write ended even if the call is cancelled); a role
    /// change waits for it after raising the fence, so no metadata write lands behind the fence.
    pub(crate) async fn check_metadata_write(
        &self,
    ) -> Result<tokio::sync::OwnedRwLockReadGuard<()>, Error> {
        let gate = Arc::clone(&self.metadata_gate).read_owned().await;
        self.check_master("a metadata write")?;
        if self.fenced() {
            return Err(Error::Fenced { what: "a metadata write", why: self.fence_reason() });
        }
        Ok(gate)
    }

    /// Stops the data plane, then closes the store cleanly (final flush, checkpoint, abort
    /// marker removed). New puts are refused first, and every waiting put completes with
    /// SERVICE_NOT_AVAILABLE (outcome unknown).
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.accepting.store(false, std::sync::atomic::Ordering::SeqCst);
        let _role = self.role_change.lock().await;
        self.stop_plane().await;
        // The plane's tasks are gone: this closes the HA port (a restart may bind it again).
        self.release_ha_port().await;
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.close()).await??;
        let metadata = Arc::clone(&self.metadata);
        tokio::task::spawn_blocking(move || metadata.persist_offsets_if_dirty()).await??;
        Ok(())
    }
}

/// How long a crash waits for a role change, a fence or a metadata write in flight to end.
const CRASH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Node {
    /// Stops every task at once, as a killed process would: no flush, no checkpoint, the
    /// abort marker stays. For crash tests; the node is unusable afterwards.
    pub(crate) async fn crash(&self) {
        self.accepting.store(false, std::sync::atomic::Ordering::SeqCst);
        let (plane, tasks) = {
            let st = self.state();
            (st.plane.clone(), st.plane_tasks.clone())
        };
        plane.cancel();
        self.cancel.cancel();
        tasks.close();
        self.tasks.close();
        tasks.wait().await;
        self.tasks.wait().await;
        self.release_ha_port().await;
        // What the node would still write into its data dir ends too, as with a killed
        // process: a role change or fence in flight ends (later ones are refused, the node no
        // longer accepting), writes are fenced and metadata writes drained, then the store's
        // own thread stops (a flush may take a while to end: off the runtime). A node started
        // again on the data dir in this process then writes there alone.
        let _one_at_a_time = tokio::time::timeout(CRASH_WAIT, self.role_change.lock()).await;
        self.store.set_writes(Writes::Fenced);
        let _ = tokio::time::timeout(CRASH_WAIT, self.metadata_gate.write()).await;
        let store = Arc::clone(&self.store);
        let _ = tokio::task::spawn_blocking(move || store.halt()).await;
    }
}

/// The refusal of `what` on a non-master, naming the master it follows now (and that
/// master's gRPC address when known, for clients to follow).
fn not_master(st: &RoleState, what: &'static str) -> Error {
    let master =
        if st.master_ha.is_empty() { "not known".to_owned() } else { st.master_ha.clone() };
    Error::NotMaster { what, master, master_grpc: st.master_grpc.clone() }
}

/// The store's options: the `[store]` section, and whether a slave's acks wait for the
/// store's flushes (`slave.ack-mode = "flushed"`: SYNC puts wait for its store thread, which
/// then keeps the process's priority).
fn store_options(config: &Config, repair: bool) -> Result<StoreOptions, Error> {
    let mut opts = StoreOptions::from_config(&config.store)?;
    opts.repair = repair;
    opts.acks_wait_for_flushes = config.slave.ack_mode == crate::config::AckMode::Flushed;
    Ok(opts)
}

/// Opens (recovering) the commitlog off the async workers, and records the recovery time.
async fn open_store(
    config: &Config,
    repair: bool,
    fs: &Arc<dyn FileSystem>,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Result<Arc<CommitLog>, Error> {
    let opts = store_options(config, repair)?;
    let dir = config.node.data_dir.clone();
    let fs = Arc::clone(fs);
    let opening = std::time::Instant::now();
    let store = tokio::task::spawn_blocking(move || CommitLog::open(fs, &dir, opts)).await??;
    metrics.set_recovery_duration(opening.elapsed());
    let store = Arc::new(store);
    let m = Arc::clone(metrics);
    store.set_flush_observer(move |took| m.observe_flush(took));
    log_recovery(config, &store);
    Ok(store)
}

/// The role file and the epoch history, loaded before the store is opened (which writes the
/// abort marker and starts the store thread): a start refused for a missing epoch file leaves
/// the last stop clean.
fn load_role_and_history(
    config: &Config,
    fs: &dyn FileSystem,
) -> Result<(Option<role::RoleFile>, epoch::EpochHistory), Error> {
    let dir = &config.node.data_dir;
    fs.create_dir_all(dir).map_err(|e| crate::store::Error::io("create directory", dir, e))?;
    let role_file = role::RoleFile::load(fs, dir)?;
    let evidence = if dir.join(epoch::EPOCH_FILE).exists() {
        None
    } else {
        history_evidence(fs, dir, role_file.is_some())?
    };
    let history = epoch::EpochHistory::load_for_start(
        fs,
        dir,
        evidence,
        config.node.allow_missing_epoch_history,
    )?;
    Ok((role_file, history))
}

/// What says a node had an epoch history (so a missing epoch file is a fault): a role file
/// (every completed role change writes the epoch file, in every build), or data in its log
/// (a node writes its epoch file at its first start; builds before that rule did not).
fn history_evidence(
    fs: &dyn FileSystem,
    dir: &std::path::Path,
    role_file: bool,
) -> Result<Option<epoch::Evidence>, Error> {
    if role_file {
        let what = format!("the role file {} records a role change", role::ROLE_FILE);
        return Ok(Some(epoch::Evidence { what, older_builds_leave_it: false }));
    }
    let data = crate::store::prior_data::evidence(fs, dir)?;
    Ok(data.map(|what| epoch::Evidence { what, older_builds_leave_it: true }))
}

/// Opens the metadata and loads (or creates) the data dir's id.
async fn open_metadata(
    config: &Config,
    fs: &Arc<dyn FileSystem>,
) -> Result<(Arc<MetadataStore>, String), Error> {
    let dir = config.node.data_dir.clone();
    let mfs = Arc::clone(fs);
    let metadata =
        Arc::new(tokio::task::spawn_blocking(move || MetadataStore::open(mfs, &dir)).await??);
    let data_dir_id =
        crate::store::data_dir_id::load_or_create(fs.as_ref(), &config.node.data_dir)?;
    Ok((metadata, data_dir_id))
}

/// Closes the store of a start refused after it was opened, so that the next start does not
/// take the refusal for an unclean stop.
async fn close_refused(store: &Arc<CommitLog>) {
    let s = Arc::clone(store);
    match tokio::task::spawn_blocking(move || s.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "closing the store of a refused start failed"),
        Err(e) => tracing::warn!(error = %e, "closing the store of a refused start failed"),
    }
}

/// Whether a node starting as `role` refuses puts until a ChangeRole confirms it: a master
/// after an unclean stop, with `node.fence-on-unclean-start`.
fn fenced_at_start(config: &Config, role: Role, store: &CommitLog) -> bool {
    let fenced = role == Role::Master
        && config.node.fence_on_unclean_start
        && !store.recovery_report().clean;
    if fenced {
        tracing::warn!(
            "master after an unclean stop: puts refused until a ChangeRole confirms the role"
        );
    }
    fenced
}

/// The writes a role takes (the write fence lowered for it).
fn writes_of(role: Role) -> Writes {
    match role {
        Role::Master => Writes::Appends,
        Role::Slave => Writes::Replicated,
    }
}

/// The failed state of a change found pending in the role file at start.
fn interrupted_change(f: &role::RoleFile) -> role::RoleChange {
    let r = &f.request;
    tracing::error!(request = ?r, "the node stopped during a role change: fenced until its \
        exact repeat (which resumes it) or a change with a higher epoch");
    role::RoleChange {
        state: role::RoleChangeState::Failed,
        failed_step: role::Step::Restart.name(),
        error: format!(
            "the node stopped before the role change to {} at epoch {} completed",
            r.role, r.epoch
        ),
        epoch: r.epoch,
        request: r.clone(),
    }
}

/// The role to start in: the last ChangeRole (persisted) wins over the configuration.
fn starting_role(
    config: &Config,
    persisted: &Option<role::RoleRequest>,
    history: &epoch::EpochHistory,
) -> (Role, String, String, u64) {
    match persisted {
        Some(r) => {
            if r.role != config.node.role
                || (r.role == Role::Slave && r.master_ha != config.slave.master_ha)
            {
                tracing::warn!(
                    persisted = ?r, configured_role = %config.node.role,
                    "the last ChangeRole differs from the configuration; the ChangeRole wins"
                );
            }
            (r.role, r.master_ha.clone(), r.master_grpc.clone(), r.epoch)
        }
        None => (
            config.node.role,
            config.slave.master_ha.clone(),
            config.slave.master_grpc.clone(),
            history.last().epoch,
        ),
    }
}

/// The kind of write the consumer-offset persist is in the disk's write health.
const PERSIST_OFFSETS: &str = "consumer-offset persist";

/// Writes the consumer offsets at most every `every` while they change. A failed write is
/// retried at the next interval (the offsets stay dirty) and reported in the disk's write
/// health (status, metrics, rate-limited log lines).
async fn persist_offsets(
    metadata: Arc<MetadataStore>,
    store: Arc<CommitLog>,
    every: std::time::Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let m = Arc::clone(&metadata);
        match tokio::task::spawn_blocking(move || m.persist_offsets_if_dirty()).await {
            Ok(Ok(_)) => store.disk().succeeded(PERSIST_OFFSETS),
            Ok(Err(e)) => {
                let full = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .is_some_and(crate::store::error::is_disk_full);
                store.disk().failed(PERSIST_OFFSETS, &e, full);
            }
            Err(e) => tracing::error!(error = %e, "consumer-offset persist task failed"),
        }
    }
}

fn log_recovery(config: &Config, log: &CommitLog) {
    let r = log.recovery_report();
    tracing::info!(
        data_dir = %config.node.data_dir.display(),
        clean = r.clean,
        scan_from = r.scan_from,
        scanned_bytes = r.scanned_bytes,
        scanned_records = r.scanned_records,
        min_offset = log.min_offset(),
        max_offset = log.max_offset(),
        "store opened"
    );
    if let Some(from) = r.truncated_from {
        tracing::warn!(
            truncated_from = from,
            removed_files = ?r.removed_files,
            reason = r.stopped_because.as_deref().unwrap_or(""),
            repaired = r.repaired,
            "recovery truncated the commitlog"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_thread_keeps_the_process_priority_when_acks_wait_for_its_flushes() {
        let mut c = Config::default();
        let o = store_options(&c, true).unwrap();
        assert_eq!((o.background_nice, o.repair), (c.store.background_nice, true));
        assert_ne!(o.background_nice, 0, "the default lowers the background threads' priority");
        assert!(!o.acks_wait_for_flushes);
        c.slave.ack_mode = crate::config::AckMode::Flushed;
        let o = store_options(&c, false).unwrap();
        assert!(o.acks_wait_for_flushes);
        assert_eq!(o.background_nice, c.store.background_nice, "the scrub stays below");
    }
}
