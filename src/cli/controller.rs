//! `hasync controller`: a standalone controller of one cluster, outside any node.
//!
//! It reads a config file whose `[coordinator]` section names the etcd endpoints, the cluster
//! and the prefix (with the TLS, user and timing keys nodes use), and `node.name`, which names
//! the controller (in the campaign key, the history records and the logs). It campaigns like
//! the controller a node runs with `coordinator.controller = true` (one active per cluster, the
//! others stand by) and drives every group of the cluster until SIGINT or SIGTERM; then it
//! revokes its campaign lease so that a standby takes over at once. `coordinator.group` is not
//! needed: a controller drives every group. etcd unreachable at the start is retried with a
//! backoff until it answers or a signal stops the process. It serves its metrics (the
//! controller's families) at `/metrics` on `metrics.listen`.
//!
//! The keys it uses besides `[coordinator]`: `grpc.token` (sent to the nodes it fences and
//! promotes), `slave.master-grpc-ca-file` (their TLS CA), `ha.heartbeat-interval` (the
//! pre-vote's frame-age bound: give it the nodes' value), `replication.mode` and
//! `replication.sync-ack-replicas` (a bootstrapped state's defaults when no master reports
//! them), `metrics.listen` and `log.*`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::cli::logging;
use crate::config::{Config, Error, NodeConfig};
use crate::controller::run::Controller;
use crate::coordinator::mode::Coordinated;
use crate::metrics::ControllerMetrics;

/// Arguments of `hasync controller`.
#[derive(Clone, Debug, clap::Args)]
pub struct ControllerArgs {
    /// Config file (TOML) with `[coordinator]` endpoints and cluster; `node.name` names the
    /// controller.
    #[arg(long, env = "HASYNC_CONFIG", value_name = "FILE")]
    pub config: PathBuf,
    /// Print the effective configuration as TOML, after validating it, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Bearer token sent to the nodes; prefer the environment variable [key: grpc.token].
    #[arg(long, env = "HASYNC_GRPC_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub grpc_token: Option<String>,
    /// etcd password of coordinator.user [key: coordinator.password].
    #[arg(
        long,
        env = "HASYNC_COORDINATOR_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub coordinator_password: Option<String>,
}

/// How long the last log lines may take to be written before the process exits.
const LOG_FLUSH: Duration = Duration::from_secs(2);
/// How long the stop waits for the controller's round in progress and its lease revocation.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// How long the stop waits for metrics scrapes in progress.
const METRICS_STOP_WAIT: Duration = Duration::from_secs(1);
/// The shortest and the longest wait between two attempts to reach etcd at the start.
const CONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl ControllerArgs {
    /// The file's configuration with the environment's secrets over it, validated for a
    /// controller.
    pub fn effective_config(&self) -> Result<Config, Error> {
        let mut config = Config::load(&self.config)?;
        if let Some(t) = &self.grpc_token {
            config.grpc.token.clone_from(t);
        }
        if let Some(p) = &self.coordinator_password {
            config.coordinator.password.clone_from(p);
        }
        validate(&config)?;
        Ok(config)
    }
}

fn invalid(key: &str, value: String, reason: &str) -> Error {
    Error::Invalid { key: key.to_owned(), value, reason: reason.to_owned() }
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// The rules a controller's configuration follows: every rule of [`Config::validate`] except
/// the node-only ones (`coordinator.group`, `node.advertise-ha`, `node.advertise-grpc`: a
/// controller serves nothing) and `coordinator.cluster` and `node.name` (checked here with a
/// controller's reasons), plus `coordinator.endpoints` required.
pub fn validate(config: &Config) -> Result<(), Error> {
    let own = [
        "coordinator.group",
        "coordinator.cluster",
        "node.name",
        "node.advertise-ha",
        "node.advertise-grpc",
    ];
    let mut errors: Vec<Error> = config
        .validation_errors_with(&|_| Ok(()))
        .into_iter()
        .filter(|e| !matches!(e, Error::Invalid { key, .. } if own.contains(&key.as_str())))
        .collect();
    let c = &config.coordinator;
    if c.endpoints.is_empty() {
        errors.push(invalid(
            "coordinator.endpoints",
            "[]".into(),
            "is required by `hasync controller`: the etcd endpoints of the cluster (\"host:port\" or \"http(s)://host:port\")",
        ));
    }
    if !crate::config::is_record_name(&c.cluster) {
        errors.push(invalid(
            "coordinator.cluster",
            quoted(&c.cluster),
            "is required by `hasync controller`: the cluster to control, 1-64 of a-z A-Z 0-9 . _ -",
        ));
    }
    let name = &config.node.name;
    if *name == NodeConfig::default().name || !crate::config::is_record_name(name) {
        errors.push(invalid(
            "node.name",
            quoted(name),
            "must name the controller explicitly (unique among the cluster's controllers; 1-64 of a-z A-Z 0-9 . _ -)",
        ));
    }
    errors.sort_by_key(|e| match e {
        Error::Invalid { key, .. } => key.clone(),
        _ => String::new(),
    });
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Many(errors)),
    }
}

/// Runs the controller with a validated configuration until SIGINT or SIGTERM.
pub(crate) fn run(config: Config) -> anyhow::Result<()> {
    logging::init(config.log.format, &config.log.filter)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(control(config));
    drop(runtime);
    logging::flush(LOG_FLUSH);
    result
}

async fn control(config: Config) -> anyhow::Result<()> {
    let name = config.node.name.clone();
    let c = &config.coordinator;
    // The metrics port first: a port taken is a startup error, like a bad file.
    let addr = config.metrics.listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("metrics.listen {addr}: cannot bind"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let metrics = Arc::new(ControllerMetrics::new(&name));
    let stop_metrics = CancellationToken::new();
    let server = tokio::spawn(crate::metrics::serve_controller(
        listener,
        Arc::clone(&metrics),
        stop_metrics.clone(),
    ));
    tracing::info!(metrics_listen = %bound, "metrics served at /metrics");
    let signal = crate::cli::serve::shutdown_signal();
    tokio::pin!(signal);
    let connected = tokio::select! {
        c = connect_retrying(&config) => Some(c),
        () = &mut signal => None,
    };
    let result = match connected {
        None => {
            tracing::info!(controller = %name, "stopped before etcd answered");
            Ok(())
        }
        Some(Err(e)) => Err(e),
        Some(Ok(coordinated)) => {
            let opts = crate::controller::options_of(&config, &name);
            let ctl = Arc::new(Controller::with_metrics(
                Arc::clone(&coordinated.coord),
                coordinated.keys.clone(),
                opts,
                metrics.coordinator(),
            ));
            let cancel = CancellationToken::new();
            let task = tokio::spawn(Arc::clone(&ctl).run(cancel.clone()));
            tracing::info!(
                controller = %name,
                cluster = %c.cluster,
                prefix = %c.prefix,
                endpoints = %c.endpoints.join(","),
                ttl = ?c.ttl,
                "controller running; SIGINT or SIGTERM stops it"
            );
            (&mut signal).await;
            tracing::info!(controller = %name, "stopping: the round in progress ends, the campaign lease is revoked");
            cancel.cancel();
            match tokio::time::timeout(STOP_WAIT, task).await {
                Ok(Ok(())) => tracing::info!(controller = %name, "controller stopped"),
                Ok(Err(e)) => tracing::error!(error = %e, "the controller task failed"),
                Err(_) => {
                    tracing::warn!(wait = ?STOP_WAIT, "the controller did not stop in time; exiting")
                }
            }
            Ok(())
        }
    };
    stop_metrics.cancel();
    match tokio::time::timeout(METRICS_STOP_WAIT, server).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "metrics server stopped with an error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics server task failed"),
        Ok(Ok(Ok(()))) | Err(_) => {}
    }
    result
}

/// Connects to etcd, retrying every failure that a later attempt may mend (etcd down or
/// unreachable, refused credentials while auth is being set up) with a backoff from
/// `coordinator.retry` doubling up to [`CONNECT_BACKOFF_MAX`], one warning per attempt naming
/// the endpoints and the error. A configuration etcd cannot work with (a bad endpoint, a TLS
/// file) is an error at once. The caller stops it on a signal.
async fn connect_retrying(config: &Config) -> anyhow::Result<Coordinated> {
    let endpoints = config.coordinator.endpoints.join(",");
    let mut delay = config.coordinator.retry.max(CONNECT_BACKOFF_MIN).min(CONNECT_BACKOFF_MAX);
    for attempt in 1u64.. {
        match Coordinated::connect(config).await {
            Ok(c) => {
                if attempt > 1 {
                    tracing::info!(endpoints = %endpoints, attempt, "connected to the coordinator");
                }
                return Ok(c);
            }
            Err(e @ crate::coordinator::Error::Config(_)) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("connecting to the coordinator at {endpoints}"));
            }
            Err(e) => {
                tracing::warn!(endpoints = %endpoints, attempt, error = %e, retry_in = ?delay,
                    "cannot reach the coordinator; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(CONNECT_BACKOFF_MAX);
    }
    unreachable!("the attempts never run out")
}
