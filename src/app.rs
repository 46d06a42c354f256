//! The one way in: [`App::start`] takes a configuration, bound listeners and the file-system
//! seam, wires the node, its gRPC control plane (with the master's API client the node needs)
//! and its metrics server, and returns a running handle. `serve`, `quickstart`, `bench` and the
//! tests all start nodes here; nothing else wires the parts.
//!
//! Stopping is one sequence, in this order: health NOT_SERVING (load balancers and probes see
//! it first), the node (puts refused, waiting puts answered, data plane stopped, final flush
//! and checkpoint), the control plane, the metrics server.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::control::ControlPlane;
use crate::control::remote::GrpcMaster;
use crate::coordinator::mode::Coordinated;
use crate::metrics::feed::Feed;
use crate::node::{Node, NodeParts};
use crate::store::fs::FileSystem;

mod console;

/// Why an app could not start or stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid (every problem, each naming its key).
    #[error(transparent)]
    Config(#[from] crate::config::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({key})")]
    Listen {
        /// The configuration key of the address.
        key: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node failed to start or stop.
    #[error(transparent)]
    Node(#[from] crate::node::Error),
    /// The control plane failed to start.
    #[error("the gRPC control plane did not start")]
    Control(#[source] std::io::Error),
    /// A TLS file the node needs is unreadable or not PEM (naming the file and its key).
    #[error(transparent)]
    Tls(#[from] crate::control::PemError),
    /// Coordinator mode could not start (etcd unreachable, the node's name claimed by another
    /// data dir ...).
    #[error("coordinator: {0}")]
    Coordinator(#[from] crate::coordinator::Error),
    /// The pod's role label cannot be set up (`[kubernetes] role-label`: no API server, no
    /// service account files, no pod name ...).
    #[error(transparent)]
    Kubernetes(#[from] crate::coordinator::kube::KubeError),
}

/// The listeners a node serves on, bound by the caller (tests bind port 0 on 127.0.0.1).
#[derive(Debug)]
pub struct Listeners {
    /// The HA data plane's; None: a master binds `ha.listen` when it starts.
    pub ha: Option<TcpListener>,
    /// The gRPC control plane's.
    pub grpc: TcpListener,
    /// The Prometheus endpoint's; None: no metrics server.
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds `grpc.listen` and `metrics.listen`; the HA port is bound by the master data plane.
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        let grpc = bind(config.grpc.listen, "grpc.listen").await?;
        let metrics = bind(config.metrics.listen, "metrics.listen").await?;
        // In coordinator mode any member may be promoted: its HA port is bound up front, so
        // the address its member record publishes is the one a promotion serves on (also with
        // port 0).
        let ha = match config.coordinator.enabled() {
            true => Some(bind(config.ha.listen, "ha.listen").await?),
            false => None,
        };
        Ok(Self { ha, grpc, metrics: Some(metrics) })
    }

    /// Every listener on 127.0.0.1 with an OS-assigned port (tests, quickstart, bench).
    pub async fn loopback() -> Result<Self, Error> {
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        Ok(Self {
            ha: Some(bind(any, "ha.listen").await?),
            grpc: bind(any, "grpc.listen").await?,
            metrics: Some(bind(any, "metrics.listen").await?),
        })
    }
}

async fn bind(addr: SocketAddr, key: &'static str) -> Result<TcpListener, Error> {
    TcpListener::bind(addr).await.map_err(|source| Error::Listen { key, addr, source })
}

/// Every rule a configuration must follow before a node runs with it: the configuration's own
/// ([`Config::validate`]) and the store's (the largest record fits in a segment,
/// [`crate::store::StoreOptions::check_config`]), all reported together, each naming its key.
pub fn validate(config: &Config) -> Result<(), crate::config::Error> {
    config.validate_with(&crate::store::StoreOptions::check_config)
}

/// Options of a start that are not configuration keys.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Truncate at corruption below the checkpoint instead of refusing to start.
    pub repair: bool,
    /// A test seam: the group's decision as a fake coordinator reads it (None: the one the
    /// `[coordinator]` section gives, or static mode without it).
    pub coordination: Option<Arc<dyn crate::node::coordination::Coordination>>,
    /// The engine of coordinator mode (None: connect to `coordinator.endpoints`; tests pass
    /// an in-memory one).
    pub coordinator: Option<Arc<dyn crate::coordinator::Coordinator>>,
    /// A test seam: the cluster console's document, published by the test (None: the node's
    /// own producer, `app::console`). Served only with `metrics.console`.
    pub console: Option<Feed>,
}

/// A running node: data plane, control plane and metrics.
#[derive(Debug)]
pub struct App {
    node: Arc<Node>,
    grpc_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    /// Taken by the first stop.
    parts: tokio::sync::Mutex<Served>,
    /// Cancelled when the control plane's server ends.
    control_ended: CancellationToken,
    /// Coordinator mode's tasks (member agent, controller), when on.
    coordinated: tokio::sync::Mutex<Option<CoordinatedTasks>>,
}

/// The tasks of coordinator mode.
#[derive(Debug)]
struct CoordinatedTasks {
    cancel: CancellationToken,
    agent: tokio::task::JoinHandle<()>,
    controller: Option<tokio::task::JoinHandle<()>>,
    /// The pod's role label (`kubernetes.role-label`).
    label: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug)]
struct Served {
    control: Option<ControlPlane>,
    metrics: Option<MetricsServer>,
}

#[derive(Debug)]
struct MetricsServer {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Where the console's document comes from.
enum ConsoleSource {
    /// This node's topology stream, followed by `app::console` while someone looks.
    Produce(console::Source),
    /// A test's feed ([`StartOptions::console`]).
    Given(Feed),
}

impl App {
    /// Validates the configuration, opens (recovering) the node on `fs`, starts the data
    /// plane of its role and serves the control plane and metrics on the given listeners.
    pub async fn start(
        config: Config,
        listeners: Listeners,
        fs: Arc<dyn FileSystem>,
        opts: StartOptions,
    ) -> Result<Self, Error> {
        validate(&config)?;
        crate::control::check_tls_files(&config)?;
        let (console_on, given_feed) = (config.metrics.console, opts.console.clone());
        let mut config = config;
        crate::coordinator::mode::adjust(&mut config);
        let coordinated = match (config.coordinator.enabled(), opts.coordinator.clone()) {
            (false, _) => None,
            (true, Some(engine)) => Some(Coordinated::over(engine, &config)),
            (true, None) => Some(Coordinated::connect(&config).await?),
        };
        // Before the node opens anything: a role label that cannot work refuses the start.
        let kube = match &coordinated {
            Some(_) if config.kubernetes.role_label => Some(kube_client(&config)?),
            _ => None,
        };
        let coordination = opts.coordination.clone().or_else(|| {
            coordinated
                .as_ref()
                .map(|c| Arc::new(c.reader()) as Arc<dyn crate::node::coordination::Coordination>)
        });
        let remote = GrpcMaster::remote(&config);
        let grpc_addr = listeners.grpc.local_addr().ok();
        let ha_addr = listeners.ha.as_ref().and_then(|l| l.local_addr().ok());
        let parts = NodeParts {
            fs,
            remote,
            ha_listener: listeners.ha,
            repair: opts.repair,
            grpc_addr,
            coordination,
        };
        let node = Arc::new(Node::start(config, parts).await?);
        let cluster = coordinated.as_ref().map(|c| {
            Arc::new(crate::controller::cluster_api::ClusterView::new(
                Arc::clone(&c.coord),
                c.keys.clone(),
            )) as Arc<dyn crate::control::cluster::ClusterApi>
        });
        let cluster_api = cluster.clone();
        // Readiness follows the member agent's view (control defines what it asks).
        let readiness = coordinated.as_ref().map(|c| {
            let view = c.view.subscribe();
            Arc::new(move || view.borrow().ready(tokio::time::Instant::now()))
                as crate::control::CoordinatorReadiness
        });
        let control = match ControlPlane::start(
            Arc::clone(&node),
            listeners.grpc,
            cluster,
            readiness,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                // Nothing may keep running when the start fails: stop the node cleanly.
                if let Err(stop) = node.shutdown().await {
                    tracing::error!(error = %stop, "stopping the node after a failed start");
                }
                return Err(Error::Control(e));
            }
        };
        let tasks = match &coordinated {
            None => None,
            Some(c) => {
                let grpc = control.local_addr();
                match start_coordinated(c, &node, ha_addr, grpc, kube).await {
                    Ok(t) => Some(t),
                    Err(e) => {
                        control.stop().await;
                        if let Err(stop) = node.shutdown().await {
                            tracing::error!(error = %stop, "stopping the node after a failed start");
                        }
                        return Err(e);
                    }
                }
            }
        };
        // The console's document: produced from this node's topology stream, unless a test
        // gives the feed; none with `metrics.console = false`.
        let console = console_on.then(|| match given_feed {
            Some(feed) => ConsoleSource::Given(feed),
            None => ConsoleSource::Produce(console::Source {
                cluster: cluster_api.clone(),
                node: Arc::clone(&node),
            }),
        });
        let metrics = listeners.metrics.map(|l| MetricsServer::start(l, &node, console));
        Ok(Self {
            coordinated: tokio::sync::Mutex::new(tasks),
            grpc_addr: control.local_addr(),
            metrics_addr: metrics.as_ref().map(|m| m.addr),
            control_ended: control.ended(),
            parts: tokio::sync::Mutex::new(Served { control: Some(control), metrics }),
            node,
        })
    }

    /// The node.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The gRPC address (OS-assigned port resolved).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The metrics address, when served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The HA address, while the node is a master.
    pub fn ha_addr(&self) -> Option<SocketAddr> {
        self.node.ha_addr()
    }

    /// Resolves when the control plane's server ended (after a stop, or by failing: then the
    /// node can no longer be managed and should be stopped).
    pub async fn wait(&self) {
        self.control_ended.cancelled().await;
    }

    /// Health NOT_SERVING at once (the first step of [`App::shutdown`]).
    pub async fn set_not_serving(&self) {
        if let Some(c) = &self.parts.lock().await.control {
            c.set_not_serving().await;
        }
    }

    /// The graceful stop (see the module docs). A second call finds nothing left to stop.
    /// In coordinator mode the member's lease is revoked after the node stopped, so a stopped
    /// master's group fails over without waiting for the TTL.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.set_not_serving().await;
        let stopped = self.node.shutdown().await;
        if let Some(t) = self.coordinated.lock().await.take() {
            t.cancel.cancel();
            let _ = t.agent.await;
            if let Some(c) = t.controller {
                let _ = c.await;
            }
            if let Some(l) = t.label {
                let _ = l.await;
            }
        }
        self.stop_servers().await;
        stopped.map_err(Error::from)
    }

    /// Stops every task at once, as a killed process would: no flush, no checkpoint, the
    /// abort marker stays, a coordinator lease is left to expire (crash tests; the next start
    /// recovers).
    pub async fn crash(&self) {
        if let Some(t) = self.coordinated.lock().await.take() {
            t.agent.abort();
            if let Some(c) = t.controller {
                c.abort();
            }
            if let Some(l) = t.label {
                l.abort();
            }
        }
        self.node.crash().await;
        self.stop_servers().await;
    }

    async fn stop_servers(&self) {
        let (control, metrics) = {
            let mut p = self.parts.lock().await;
            (p.control.take(), p.metrics.take())
        };
        if let Some(c) = control {
            c.stop().await;
        }
        if let Some(m) = metrics {
            m.stop().await;
        }
    }
}

/// The role label's client of `[kubernetes]`, resolved against the process environment.
fn kube_client(config: &Config) -> Result<crate::coordinator::kube::KubeClient, Error> {
    use crate::coordinator::kube::{KubeClient, KubeTarget};
    let env = |name: &str| std::env::var(name).ok();
    let target = KubeTarget::resolve(&config.kubernetes, &env)?;
    tracing::info!(api_server = %target.authority(), pod = %target.path(), "pod role label on");
    Ok(KubeClient::new(target)?)
}

/// Claims the node's name and starts its member agent, (with `coordinator.controller`) a
/// controller, and (with a `kube` client) the pod's role label, fed by the agent's view.
async fn start_coordinated(
    c: &Coordinated,
    node: &Arc<Node>,
    ha: Option<SocketAddr>,
    grpc: SocketAddr,
    kube: Option<crate::coordinator::kube::KubeClient>,
) -> Result<CoordinatedTasks, Error> {
    let cancel = CancellationToken::new();
    let (_, agent) = c.start_agent(Arc::clone(node), ha, Some(grpc), cancel.child_token()).await?;
    let label = kube.map(|client| {
        let view = c.view.subscribe();
        tokio::spawn(crate::coordinator::kube::run_role_label(client, view, cancel.child_token()))
    });
    let config = node.config();
    let controller = config.coordinator.controller.then(|| {
        let name = format!("{}/{}", config.coordinator.group, config.node.name);
        let opts = crate::controller::options_of(config, &name);
        let ctl = Arc::new(crate::controller::run::Controller::with_metrics(
            Arc::clone(&c.coord),
            c.keys.clone(),
            opts,
            node.metrics().coordinator(),
        ));
        tokio::spawn(ctl.run(cancel.child_token()))
    });
    Ok(CoordinatedTasks { cancel, agent, controller, label })
}

/// How long a stop waits for metrics scrapes in progress.
const METRICS_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl MetricsServer {
    /// Serves `/metrics`, and the cluster console from `console` (None: off); a produced
    /// feed's producer stops with the server.
    fn start(listener: TcpListener, node: &Arc<Node>, console: Option<ConsoleSource>) -> Self {
        let addr = listener.local_addr().unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
        let stop = CancellationToken::new();
        let on = console.is_some();
        let console = console.map(|c| match c {
            ConsoleSource::Given(feed) => feed,
            ConsoleSource::Produce(source) => {
                let feed = Feed::new(console::initial(node, source.cluster.is_some()));
                tokio::spawn(console::run(source, feed.clone(), stop.clone()));
                feed
            }
        });
        let task = tokio::spawn(crate::metrics::serve(
            listener,
            Arc::clone(node.metrics()),
            Arc::clone(node),
            console,
            stop.clone(),
        ));
        tracing::info!(metrics_listen = %addr, console = on, "metrics served at /metrics");
        Self { addr, stop, task }
    }

    /// Stops the server: scrapes in progress get [`METRICS_STOP_WAIT`] to finish, then it is
    /// aborted (half a request must not hold the graceful stop).
    async fn stop(mut self) {
        self.stop.cancel();
        match tokio::time::timeout(METRICS_STOP_WAIT, &mut self.task).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "metrics server stopped with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "metrics server task failed"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => {
                tracing::debug!("metrics connections still open at the stop; closed");
                self.task.abort();
            }
        }
    }
}
