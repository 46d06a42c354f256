//! `hasync serve`: run a node until SIGINT or SIGTERM.
//!
//! A node opens its commitlog (recovering it), runs the data plane of its role (a master
//! listens for slaves, a slave follows its master), and stops cleanly on a signal: data plane
//! first, then final flush, checkpoint, abort marker removed.

use std::sync::Arc;

use anyhow::Context as _;

use crate::app::{App, Listeners, StartOptions};
use crate::cli::logging;
use crate::config::Config;
use crate::store::DataDirLock;
use crate::store::fs::StdFs;

/// Options of `serve` that are not configuration keys.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServeOptions {
    /// Truncate at corruption below the checkpoint instead of refusing to start.
    pub(crate) repair: bool,
}

/// How long the last log lines may take to be written before the process exits.
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// Raises the soft open-files limit to the hard one (the gRPC port's connection budget is
/// computed from it); returns the limit in force.
fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the open-files limit to its hard limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// Runs a node with an already validated configuration until it is shut down.
///
/// The first SIGINT or SIGTERM starts a graceful stop bounded by `node.shutdown-timeout`; a
/// second signal, or the bound passing, exits at once (non-zero; the next start recovers).
pub(crate) fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    logging::init(config.log.format, &config.log.filter)?;
    let served = serve(config, opts);
    logging::flush(LOG_FLUSH);
    served
}

/// Exits at once (after a short wait for the last log lines).
fn exit_now(code: i32) -> ! {
    logging::flush(LOG_FLUSH);
    std::process::exit(code)
}

fn serve(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    // First of all: nothing in the data dir is read or written, no port bound, before this
    // process holds the directory (a second process on it stops here, naming the holder).
    let lock = DataDirLock::acquire(&config.node.data_dir)?;
    tracing::info!(data_dir = %lock.dir().display(), pid = std::process::id(), "data directory locked");
    let nofile = raise_nofile_limit();
    tracing::debug!(open_files_limit = ?nofile, "open-files limit");
    let _cpu_latency = crate::cli::cpu_latency::hold_if_asked(config.node.cpu_dma_latency_us);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.node.worker_threads > 0 {
        builder.worker_threads(usize::from(config.node.worker_threads));
    }
    let runtime = builder.enable_all().build()?;
    tracing::info!(
        workers = runtime.metrics().num_workers(),
        "async runtime started (node.worker-threads; 0: TOKIO_WORKER_THREADS, else one per CPU)"
    );
    let result = runtime.block_on(async move {
        let mut signals = Signals::install()?;
        let name = config.node.name.clone();
        let role = config.node.role;
        let shutdown_timeout = config.node.shutdown_timeout;
        let listeners = Listeners::bind(&config).await?;
        let start = StartOptions { repair: opts.repair, ..StartOptions::default() };
        let app =
            App::start(config, listeners, Arc::new(StdFs), start).await.context("starting the node")?;
        tracing::info!(node = %name, %role, grpc = %app.grpc_addr(), "node running; SIGINT or SIGTERM stops it");
        let signal = tokio::select! {
            signal = signals.recv() => signal,
            () = app.wait() => {
                tracing::error!("the gRPC control plane stopped by itself; stopping the node");
                "control plane failure"
            }
        };
        tracing::info!(
            signal,
            timeout = ?shutdown_timeout,
            "stopping: health NOT_SERVING, puts refused, waiters answered, data plane, final \
             flush; a second signal exits at once"
        );
        let max = app.node().store().max_offset();
        tokio::select! {
            stopped = tokio::time::timeout(shutdown_timeout, app.shutdown()) => match stopped {
                Ok(result) => result?,
                Err(_) => {
                    tracing::error!(
                        timeout = ?shutdown_timeout,
                        "graceful stop did not finish within node.shutdown-timeout; exiting \
                         now (the next start recovers)"
                    );
                    exit_now(EXIT_SHUTDOWN_TIMEOUT);
                }
            },
            second = signals.recv() => {
                tracing::warn!(signal = second, "second signal: exiting at once (the next start recovers)");
                exit_now(EXIT_SECOND_SIGNAL);
            }
        }
        tracing::info!(max_offset = max, "stopped cleanly");
        anyhow::Ok(())
    });
    // The runtime (and every task) ends before the lock is released.
    drop(runtime);
    drop(lock);
    result
}

/// Exit code when the graceful stop outlived `node.shutdown-timeout`.
pub(crate) const EXIT_SHUTDOWN_TIMEOUT: i32 = 124;
/// Exit code when a second signal cut the graceful stop short (128 + SIGINT, as shells do).
pub(crate) const EXIT_SECOND_SIGNAL: i32 = 130;

/// SIGTERM and SIGINT, installed once so that a second signal is never lost between two waits.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// The next SIGTERM or SIGINT, by name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
