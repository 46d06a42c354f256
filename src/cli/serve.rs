//! `hasync serve`: run a node until SIGINT or SIGTERM.
//!
//! A node opens its commitlog (recovering it), runs the data plane of its role (a master
//! listens for slaves, a slave follows its master), and stops cleanly on a signal: data plane
//! first, then final flush, checkpoint, abort marker removed.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{Config, LogFormat};
use crate::control::ControlPlane;
use crate::node::Node;

/// Options of `serve` that are not configuration keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeOptions {
    /// Truncate at corruption below the checkpoint instead of refusing to start.
    pub repair: bool,
}

/// Installs the global tracing subscriber: `RUST_LOG` if set, else the configured filter.
pub fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Runs a node with an already validated configuration until it is shut down.
pub fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    config.validate()?;
    init_tracing(config.log.format, &config.log.filter);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let name = config.node.name.clone();
        let role = config.node.role;
        let grpc_addr = config.grpc.listen;
        let node = Arc::new(Node::start(config, opts.repair).await.context("starting the node")?);
        let listener = tokio::net::TcpListener::bind(grpc_addr)
            .await
            .with_context(|| format!("cannot listen on {grpc_addr} (grpc.listen)"))?;
        let control = ControlPlane::start(Arc::clone(&node), listener).await?;
        tracing::info!(node = %name, %role, grpc = %control.local_addr(), "node running; SIGINT or SIGTERM stops it");
        shutdown_signal().await;
        tracing::info!("stopping: health NOT_SERVING, puts refused, data plane, final flush");
        control.set_not_serving().await;
        let max = node.store().max_offset();
        node.shutdown().await?;
        control.stop().await;
        tracing::info!(max_offset = max, "stopped cleanly");
        anyhow::Ok(())
    })
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
