//! Coordinator mode of one node: the engine connection from `[coordinator]`, the node's
//! decision reader, and the member agent (started once the node is open: the name claim needs
//! its data-dir id).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::coordinator::agent::{AgentOptions, MemberAgent, StateReader, claim_name};
use crate::coordinator::etcd::{EtcdCoordinator, EtcdOptions, EtcdTls};
use crate::coordinator::keys::Keys;
use crate::coordinator::{Coordinator, Error};
use crate::node::Node;

/// In coordinator mode the HA heartbeat is at most this: the pre-vote reads the age of the
/// last frame each slave got from its master, and must tell a live master within a few
/// seconds.
pub const COORDINATOR_HEARTBEAT_MAX: Duration = Duration::from_secs(1);

/// The engine connection and the cluster's keys of a node in coordinator mode.
#[derive(Debug, Clone)]
pub struct Coordinated {
    /// The engine.
    pub coord: Arc<dyn Coordinator>,
    /// The cluster's keys.
    pub keys: Keys,
    /// The node's group.
    pub group: String,
    /// The member agent's view after each round (readiness and the pod's role label read it;
    /// it exists before the agent starts, so that the control plane can subscribe first).
    pub view: tokio::sync::watch::Sender<crate::coordinator::view::GroupView>,
}

/// The etcd client options of `[coordinator]`.
pub fn etcd_options(config: &Config) -> EtcdOptions {
    let c = &config.coordinator;
    let tls = (!c.ca_file.as_os_str().is_empty()).then(|| EtcdTls {
        ca_file: c.ca_file.clone(),
        cert_file: (!c.cert_file.as_os_str().is_empty()).then(|| c.cert_file.clone()),
        key_file: (!c.key_file.as_os_str().is_empty()).then(|| c.key_file.clone()),
    });
    EtcdOptions {
        endpoints: c.endpoints.clone(),
        timeout: c.timeout,
        tls,
        user: (!c.user.is_empty()).then(|| (c.user.clone(), c.password.clone())),
    }
}

/// What coordinator mode changes in the node's own configuration: the heartbeat is at most
/// [`COORDINATOR_HEARTBEAT_MAX`].
pub fn adjust(config: &mut Config) {
    if config.coordinator.enabled() && config.ha.heartbeat_interval > COORDINATOR_HEARTBEAT_MAX {
        config.ha.heartbeat_interval = COORDINATOR_HEARTBEAT_MAX;
    }
}

/// The address others reach a listener at: the advertised one, else the bound one when it is
/// not a wildcard.
pub fn advertised(configured: &str, bound: Option<SocketAddr>) -> String {
    if !configured.is_empty() {
        return configured.to_owned();
    }
    bound.filter(|a| !a.ip().is_unspecified()).map(|a| a.to_string()).unwrap_or_default()
}

impl Coordinated {
    /// Connects to the engine of `[coordinator]`.
    pub async fn connect(config: &Config) -> Result<Self, Error> {
        let coord = EtcdCoordinator::connect(etcd_options(config)).await?;
        Ok(Self::over(Arc::new(coord), config))
    }

    /// Coordinator mode over a given engine (tests use the in-memory one).
    pub fn over(coord: Arc<dyn Coordinator>, config: &Config) -> Self {
        let c = &config.coordinator;
        Self {
            coord,
            keys: Keys::new(&c.prefix, &c.cluster),
            group: c.group.clone(),
            view: tokio::sync::watch::Sender::new(Default::default()),
        }
    }

    /// The node's decision reader.
    pub fn reader(&self) -> StateReader {
        StateReader {
            coord: Arc::clone(&self.coord),
            keys: self.keys.clone(),
            group: self.group.clone(),
        }
    }

    /// Claims the node's name, then runs its member agent until `cancel`.
    pub async fn start_agent(
        &self,
        node: Arc<Node>,
        ha: Option<SocketAddr>,
        grpc: Option<SocketAddr>,
        cancel: CancellationToken,
    ) -> Result<(Arc<MemberAgent>, tokio::task::JoinHandle<()>), Error> {
        let config = node.config().clone();
        let name = config.node.name.clone();
        let data_dir_id = node.status().data_dir_id;
        claim_name(self.coord.as_ref(), &self.keys, &self.group, &name, &data_dir_id).await?;
        let opts = AgentOptions {
            group: self.group.clone(),
            name,
            ttl: config.coordinator.ttl,
            renew: config.coordinator.renew_interval,
            advertise_ha: advertised(&config.node.advertise_ha, ha),
            advertise_grpc: advertised(&config.node.advertise_grpc, grpc),
            never_promote: config.node.never_promote,
            priority: config.node.priority,
            floor: config.coordinator.min_sync_replicas,
            allow_degrade: config.coordinator.allow_degrade,
            configured_k: config.replication.sync_ack_replicas,
            max_connections: config.ha.max_connections,
            slave_timeout: config.replication.slave_timeout,
        };
        let agent = MemberAgent::new(Arc::clone(&self.coord), self.keys.clone(), opts, node)
            .with_view(self.view.clone());
        let agent = Arc::new(agent);
        // The first round before the node is announced as started: its record is in place.
        if let Err(e) = agent.tick().await {
            tracing::warn!(error = %e, "the member agent's first round failed; it retries");
        }
        let task = tokio::spawn(Arc::clone(&agent).run(cancel));
        Ok((agent, task))
    }
}
