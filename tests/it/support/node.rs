//! Nodes started the one way the binary starts them ([`hasync::app::App`]), on loopback
//! listeners with OS-assigned ports: data plane, gRPC control plane and metrics.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use hasync::app::{App, Listeners, StartOptions};
use hasync::config::Config;
use hasync::node::Node;
use hasync::store::fs::{FileSystem, StdFs};

/// A running node; derefs to its [`Node`] for the node's operations.
pub struct TestNode {
    app: App,
}

impl TestNode {
    /// Starts a node on the real file system.
    pub async fn start(config: Config) -> Self {
        Self::try_start(config, Arc::new(StdFs)).await.expect("start node")
    }

    /// Starts a node on the given file system (power-loss and failpoint tests).
    pub async fn start_with_fs(config: Config, fs: Arc<dyn FileSystem>) -> Self {
        Self::try_start(config, fs).await.expect("start node")
    }

    /// Starts a node in coordinator mode, reading its group's decision from `coordination`.
    pub async fn start_coordinated(
        config: Config,
        coordination: Arc<dyn hasync::node::coordination::Coordination>,
    ) -> Self {
        let opts = StartOptions { coordination: Some(coordination), ..StartOptions::default() };
        Self::try_start_with(config, Arc::new(StdFs), opts).await.expect("start node")
    }

    /// Starts a node, or says why it cannot.
    pub async fn try_start(
        config: Config,
        fs: Arc<dyn FileSystem>,
    ) -> Result<Self, hasync::app::Error> {
        Self::try_start_with(config, fs, StartOptions::default()).await
    }

    /// Starts a node with start options, or says why it cannot.
    pub async fn try_start_with(
        config: Config,
        fs: Arc<dyn FileSystem>,
        opts: StartOptions,
    ) -> Result<Self, hasync::app::Error> {
        // The HA listener at ha.listen (port 0 in most tests: OS-assigned), gRPC on an
        // OS-assigned loopback port unless grpc.listen names one, metrics on an OS-assigned one.
        let bind =
            |key, addr: std::net::SocketAddr| async move {
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| hasync::app::Error::Listen { key, addr, source })
            };
        let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        let listeners = Listeners {
            ha: Some(bind("ha.listen", config.ha.listen).await?),
            // A fixed grpc.listen port is kept (a restart on the same address).
            grpc: bind(
                "grpc.listen",
                if config.grpc.listen.port() == 0 { loopback } else { config.grpc.listen },
            )
            .await?,
            metrics: Some(bind("metrics.listen", loopback).await?),
        };
        let app = App::start(config, listeners, fs, opts).await?;
        Ok(Self { app })
    }

    /// The node, shared.
    pub fn node(&self) -> &Arc<Node> {
        self.app.node()
    }

    /// The gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.app.grpc_addr()
    }

    /// The gRPC URL (`http://...`).
    pub fn url(&self) -> String {
        format!("http://{}", self.app.grpc_addr())
    }

    /// The metrics address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.app.metrics_addr().expect("metrics served")
    }

    /// The app.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Graceful stop: health NOT_SERVING, node shutdown, control plane, metrics.
    pub async fn shutdown(&self) -> Result<(), hasync::app::Error> {
        self.app.shutdown().await
    }

    /// Stops every task at once, as a killed process would.
    pub async fn crash(&self) {
        self.app.crash().await;
    }

    /// [`TestNode::crash`] from synchronous code (its `Drop`), bounded: so that the node stops
    /// writing before a data dir dropped after it is removed. A node left
    /// running wrote into its dir during the removal, which then left the dir behind in the
    /// temp dir. Only on a multi-thread runtime (`block_in_place`); elsewhere it does nothing.
    fn crash_blocking(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        tokio::task::block_in_place(|| {
            rt.block_on(async {
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(20), self.crash()).await;
            })
        });
    }
}

impl Drop for TestNode {
    /// Stops the node before a data dir dropped after it is removed ([`TestNode::crash_blocking`]).
    fn drop(&mut self) {
        self.crash_blocking();
    }
}

impl Deref for TestNode {
    type Target = Node;

    fn deref(&self) -> &Node {
        self.app.node()
    }
}
