//! A broker group in coordinator mode on a real etcd: nodes started in-process (the app, as the
//! binary starts it), each with its own data dir, member agent and controller, on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasync::config::{Config, ReplicationMode, Role};
use hasync::coordinator::Coordinator;
use hasync::coordinator::keys::Keys;
use hasync::coordinator::records::{self, GroupState, LeaderRecord, Phase};
use hasync::node::PutStatus;
use hasync::store::fs::StdFs;

use super::etcd::{EtcdCluster, EtcdProxy, connect_when_ready};
use super::ha::node_config;
use super::msg;
use super::node::TestNode;

pub const CLUSTER: &str = "c1";
pub const GROUP: &str = "g1";

/// One member: its data dir and, while it runs, the node.
pub struct Member {
    pub name: String,
    /// The node's way to etcd (cut it to cut the node off from etcd).
    pub proxy: EtcdProxy,
    /// Dropped before its data dir, which it stops (fields drop in order).
    pub node: Option<TestNode>,
    /// Kept for the node's life (its data dir).
    pub _dir: tempfile::TempDir,
    pub config: Config,
}

/// A group of `n` nodes on one etcd.
pub struct Group {
    /// The etcd the group runs on (killed on drop).
    pub etcd: Arc<EtcdCluster>,
    /// The group's name.
    pub group: String,
    pub engine: Arc<dyn Coordinator>,
    pub keys: Keys,
    pub members: Vec<Member>,
}

/// The coordinator settings of the tests: short TTL (etcd's floor with the test timers is 3 s)
/// and renewals, little hold-down.
pub fn coordinated(mut c: Config, name: &str, endpoints: &[String]) -> Config {
    c.node.name = name.to_owned();
    c.coordinator.endpoints = endpoints.to_vec();
    c.coordinator.cluster = CLUSTER.into();
    c.coordinator.group = GROUP.into();
    c.coordinator.ttl = Duration::from_secs(3);
    c.coordinator.renew_interval = Duration::from_millis(500);
    c.coordinator.timeout = Duration::from_secs(1);
    c.coordinator.hold_down = Duration::from_secs(1);
    c.coordinator.max_failovers_per_minute = 10;
    c.replication.mode = ReplicationMode::Sync;
    c.replication.sync_ack_replicas = 1;
    c.replication.slave_timeout = Duration::from_secs(2);
    c
}

impl Group {
    /// Starts etcd and `n` nodes: the first a master, the others its slaves.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, |_| {}).await
    }

    /// [`Group::start`] with a change to every node's configuration.
    pub async fn start_with(n: usize, tweak: impl Fn(&mut Config)) -> Self {
        let etcd = Arc::new(EtcdCluster::start(1));
        Self::start_on(etcd, GROUP, n, tweak).await
    }

    /// Another group of the same cluster on this group's etcd, with a change to every node's
    /// configuration.
    pub async fn another_with(&self, group: &str, n: usize, tweak: impl Fn(&mut Config)) -> Self {
        Self::start_on(Arc::clone(&self.etcd), group, n, tweak).await
    }

    async fn start_on(
        etcd: Arc<EtcdCluster>,
        group: &str,
        n: usize,
        tweak: impl Fn(&mut Config),
    ) -> Self {
        let engine: Arc<dyn Coordinator> =
            Arc::new(connect_when_ready(etcd.options(Duration::from_secs(2)), 20).await);
        let keys = Keys::new("/hasync/v1/", CLUSTER);
        let upstream = etcd.members[0].client;
        let mut members = Vec::new();
        let mut master = None;
        for i in 0..n {
            let dir = tempfile::tempdir().unwrap();
            let name =
                if group == GROUP { format!("n{}", i + 1) } else { format!("{group}-n{}", i + 1) };
            let proxy = EtcdProxy::start(upstream).await;
            let endpoints = [proxy.addr.to_string()];
            let mut c = coordinated(node_config(dir.path(), Role::Master), &name, &endpoints);
            c.coordinator.group = group.to_owned();
            if let Some((ha, grpc)) = &master {
                c.node.role = Role::Slave;
                c.slave.master_ha = format!("{ha}");
                c.slave.master_grpc = format!("{grpc}");
            }
            tweak(&mut c);
            let node = TestNode::start(c.clone()).await;
            if master.is_none() {
                master = Some((node.app().ha_addr().expect("master HA address"), node.grpc_addr()));
            }
            members.push(Member { name, proxy, _dir: dir, node: Some(node), config: c });
        }
        Self { etcd, group: group.to_owned(), engine, keys, members }
    }

    /// Starts one more member, `name`: a slave following the HA port at `master_ha` (a proxy
    /// in front of the master's, say) and the gRPC port at `master_grpc`.
    pub async fn add_slave(&mut self, name: &str, master_ha: SocketAddr, master_grpc: SocketAddr) {
        let dir = tempfile::tempdir().unwrap();
        let proxy = EtcdProxy::start(self.etcd.members[0].client).await;
        let endpoints = [proxy.addr.to_string()];
        let mut c = coordinated(node_config(dir.path(), Role::Slave), name, &endpoints);
        c.coordinator.group = self.group.clone();
        c.slave.master_ha = master_ha.to_string();
        c.slave.master_grpc = master_grpc.to_string();
        let node = TestNode::start(c.clone()).await;
        let name = name.to_owned();
        self.members.push(Member { name, proxy, _dir: dir, node: Some(node), config: c });
    }

    /// The group's state record.
    pub async fn state(&self) -> Option<GroupState> {
        let (kv, _) = self.engine.get(&self.keys.state(&self.group)).await.ok()?;
        kv.map(|kv| records::decode(&kv.key, &kv.value).unwrap())
    }

    /// Waits (bounded) for a stable state whose master is not `not`, and returns it. With
    /// `not = None` (a group starting) also until it is formed: every running member in V
    /// and k raised as far as V allows towards the k the group aims for (a master killed
    /// before that raise cannot be failed over automatically: `sync_degraded`).
    pub async fn wait_stable_master(&self, not: Option<&str>, within: Duration) -> GroupState {
        let deadline = Instant::now() + within;
        let running: Vec<&str> =
            self.members.iter().filter(|m| m.node.is_some()).map(|m| m.name.as_str()).collect();
        let formed = |s: &GroupState| {
            let others = u32::try_from(s.voters.len().saturating_sub(1)).unwrap_or(u32::MAX);
            let goal = s.wanted_k.unwrap_or(0).min(others);
            not.is_some() || (running.iter().all(|n| s.is_voter(n)) && s.k >= goal)
        };
        loop {
            if let Some(s) = self.state().await
                && s.phase == Phase::Stable
                && let Some(m) = s.master.as_deref()
                && Some(m) != not
                && formed(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no stable master (other than {not:?}) within {within:?}: state {:?}",
                self.state().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (bounded) until the leader key names `name` at `epoch`. The master writes it in
    /// its first round after the state names it (every `renew_interval`), so a stable state
    /// can be read before it exists: a group bootstrapped with all its members already
    /// registered is formed at once.
    pub async fn wait_leader_key(&self, name: &str, epoch: u64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let (kv, _) = self.engine.get(&self.keys.leader(&self.group)).await.unwrap();
            let leader = kv.map(|kv| records::decode::<LeaderRecord>(&kv.key, &kv.value).unwrap());
            if leader.as_ref().is_some_and(|l| l.name == name && l.epoch == epoch) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the leader key of {} does not name {name} at epoch {epoch} within {within:?}: \
                 {leader:?}",
                self.group
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The running node named `name`.
    pub fn node(&self, name: &str) -> &TestNode {
        self.member(name).node.as_ref().unwrap_or_else(|| panic!("{name} is not running"))
    }

    pub fn member(&self, name: &str) -> &Member {
        self.members.iter().find(|m| m.name == name).unwrap()
    }

    fn member_mut(&mut self, name: &str) -> &mut Member {
        self.members.iter_mut().find(|m| m.name == name).unwrap()
    }

    /// Kills a node as kill -9 would (its lease is left to expire).
    pub async fn crash(&mut self, name: &str) {
        let n = self.member_mut(name).node.take().expect("running");
        n.crash().await;
    }

    /// Keeps `name`'s HA and gRPC addresses across its restarts (the slaves' configurations
    /// name the first master's addresses).
    pub fn pin_addresses(&mut self, name: &str) {
        let m = self.member_mut(name);
        let node = m.node.as_ref().expect("running");
        m.config.ha.listen = node.app().ha_addr().expect("an HA address");
        m.config.grpc.listen = node.grpc_addr();
    }

    /// Starts a stopped node again on its data dir, with its configuration.
    pub async fn restart(&mut self, name: &str) {
        let m = self.member_mut(name);
        assert!(m.node.is_none(), "{name} runs");
        let node = TestNode::try_start(m.config.clone(), Arc::new(StdFs)).await.expect("restart");
        m.node = Some(node);
    }

    /// Puts on `name` until one answers PUT_OK (bounded): the group serves.
    pub async fn wait_put_ok(&self, name: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let out = self.node(name).node().put(vec![msg("t", 0, b"probe")]).await;
            if out.status == PutStatus::PutOk {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} gave no PUT_OK within {within:?}: last {:?} {:?}",
                out.status,
                out.detail
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
