//! `hasync serve`: run a node until SIGINT or SIGTERM.
//!
//! Today a node opens its commitlog (recovering it), keeps it flushed and checkpointed, and
//! stops cleanly on a signal: final flush, checkpoint, abort marker removed. The data plane, the
//! control plane and metrics are wired in by their issues.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{Config, LogFormat};
use crate::store::fs::StdFs;
use crate::store::{CommitLog, StoreOptions};

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

/// Opens the store a configuration describes.
pub fn open_store(config: &Config, repair: bool) -> anyhow::Result<CommitLog> {
    let mut opts = StoreOptions::from_config(&config.store);
    opts.repair = repair;
    let log = CommitLog::open(Arc::new(StdFs), &config.node.data_dir, opts)
        .with_context(|| format!("opening the store in {}", config.node.data_dir.display()))?;
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
    Ok(log)
}

/// Runs a node with an already validated configuration until it is shut down.
pub fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    config.validate()?;
    init_tracing(config.log.format, &config.log.filter);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let log = open_store(&config, opts.repair)?;
        tracing::info!(
            node = %config.node.name,
            role = %config.node.role,
            segment_size = %config.store.segment_size,
            "node running; SIGINT or SIGTERM stops it"
        );
        shutdown_signal().await;
        tracing::info!("stopping: final flush and checkpoint");
        let max = log.max_offset();
        tokio::task::spawn_blocking(move || log.close()).await??;
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
