//! Command-line flags and `HASYNC_*` environment variables that override config-file keys.
//!
//! clap reads each flag's environment variable when the flag is absent, which gives the
//! precedence defaults < file < environment < flag. Values parse with the same units code as
//! the file (`--segment-size 64KiB`, `--slave-timeout 3s`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::units::{ByteSize, parse_duration};
use super::{Config, Error, FlushMode, LogFormat, ReplicationMode, Role};

/// Flags of `hasync serve` that set config keys. Every field is optional: an absent flag (and
/// absent variable) leaves the key as the file or the defaults set it.
#[derive(Clone, Debug, Default, PartialEq, clap::Args)]
pub struct Overrides {
    /// Node name [key: node.name].
    #[arg(long, env = "HASYNC_NAME", value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// Data directory [key: node.data-dir].
    #[arg(long, env = "HASYNC_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Commitlog segment file size, e.g. 1GiB [key: store.segment-size].
    #[arg(long, env = "HASYNC_SEGMENT_SIZE", value_name = "SIZE")]
    pub(crate) segment_size: Option<ByteSize>,
    /// Role at start-up [key: node.role].
    #[arg(long, env = "HASYNC_ROLE", value_name = "ROLE")]
    pub(crate) role: Option<Role>,
    /// HA listen address for slaves [key: ha.listen].
    #[arg(long, env = "HASYNC_HA_LISTEN", value_name = "ADDR")]
    pub(crate) ha_listen: Option<SocketAddr>,
    /// gRPC control-plane listen address [key: grpc.listen].
    #[arg(long, env = "HASYNC_GRPC_LISTEN", value_name = "ADDR")]
    pub(crate) grpc_listen: Option<SocketAddr>,
    /// Prometheus metrics listen address [key: metrics.listen].
    #[arg(long, env = "HASYNC_METRICS_LISTEN", value_name = "ADDR")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// host:port of the master's HA listener [key: slave.master-ha].
    #[arg(long, env = "HASYNC_MASTER_HA", value_name = "ADDR")]
    pub(crate) master_ha: Option<String>,
    /// host:port of the master's gRPC control plane [key: slave.master-grpc].
    #[arg(long, env = "HASYNC_MASTER_GRPC", value_name = "ADDR")]
    pub(crate) master_grpc: Option<String>,
    /// host:port other nodes reach the HA listener at [key: node.advertise-ha].
    #[arg(long, env = "HASYNC_ADVERTISE_HA", value_name = "ADDR")]
    pub(crate) advertise_ha: Option<String>,
    /// host:port other nodes reach the gRPC port at [key: node.advertise-grpc].
    #[arg(long, env = "HASYNC_ADVERTISE_GRPC", value_name = "ADDR")]
    pub(crate) advertise_grpc: Option<String>,
    /// Replication mode [key: replication.mode].
    #[arg(long, env = "HASYNC_MODE", value_name = "MODE")]
    pub(crate) mode: Option<ReplicationMode>,
    /// Slave acks a sync put waits for [key: replication.sync-ack-replicas].
    #[arg(long, env = "HASYNC_SYNC_ACK_REPLICAS", value_name = "K")]
    pub(crate) sync_ack_replicas: Option<u32>,
    /// How long a sync put waits for slave acks, e.g. 5s [key: replication.slave-timeout].
    #[arg(
        long,
        env = "HASYNC_SLAVE_TIMEOUT",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub(crate) slave_timeout: Option<Duration>,
    /// Flush policy [key: store.flush].
    #[arg(long, env = "HASYNC_FLUSH", value_name = "FLUSH")]
    pub(crate) flush: Option<FlushMode>,
    /// How often a slave pulls metadata, e.g. 10s [key: metadata.sync-interval].
    #[arg(
        long,
        env = "HASYNC_METADATA_SYNC_INTERVAL",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub(crate) metadata_sync_interval: Option<Duration>,
    /// Log line format [key: log.format].
    #[arg(long, env = "HASYNC_LOG_FORMAT", value_name = "FORMAT")]
    pub(crate) log_format: Option<LogFormat>,
    /// Bearer token for mutating gRPC calls; prefer the environment variable to keep it out of
    /// the process list [key: grpc.token].
    #[arg(long, env = "HASYNC_GRPC_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub(crate) grpc_token: Option<String>,
    /// etcd password of coordinator.user; prefer the environment variable
    /// [key: coordinator.password].
    #[arg(
        long,
        env = "HASYNC_COORDINATOR_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub(crate) coordinator_password: Option<String>,
}

impl Overrides {
    /// The `(key, flag, environment variable)` of every override that is set.
    pub fn set_keys(&self) -> Vec<(&'static str, &'static str, &'static str)> {
        let set = [
            (self.name.is_some(), "node.name", "--name", "HASYNC_NAME"),
            (self.data_dir.is_some(), "node.data-dir", "--data-dir", "HASYNC_DATA_DIR"),
            (
                self.segment_size.is_some(),
                "store.segment-size",
                "--segment-size",
                "HASYNC_SEGMENT_SIZE",
            ),
            (self.role.is_some(), "node.role", "--role", "HASYNC_ROLE"),
            (self.ha_listen.is_some(), "ha.listen", "--ha-listen", "HASYNC_HA_LISTEN"),
            (self.grpc_listen.is_some(), "grpc.listen", "--grpc-listen", "HASYNC_GRPC_LISTEN"),
            (
                self.metrics_listen.is_some(),
                "metrics.listen",
                "--metrics-listen",
                "HASYNC_METRICS_LISTEN",
            ),
            (self.master_ha.is_some(), "slave.master-ha", "--master-ha", "HASYNC_MASTER_HA"),
            (
                self.master_grpc.is_some(),
                "slave.master-grpc",
                "--master-grpc",
                "HASYNC_MASTER_GRPC",
            ),
            (
                self.advertise_ha.is_some(),
                "node.advertise-ha",
                "--advertise-ha",
                "HASYNC_ADVERTISE_HA",
            ),
            (
                self.advertise_grpc.is_some(),
                "node.advertise-grpc",
                "--advertise-grpc",
                "HASYNC_ADVERTISE_GRPC",
            ),
            (self.mode.is_some(), "replication.mode", "--mode", "HASYNC_MODE"),
            (
                self.sync_ack_replicas.is_some(),
                "replication.sync-ack-replicas",
                "--sync-ack-replicas",
                "HASYNC_SYNC_ACK_REPLICAS",
            ),
            (
                self.slave_timeout.is_some(),
                "replication.slave-timeout",
                "--slave-timeout",
                "HASYNC_SLAVE_TIMEOUT",
            ),
            (self.flush.is_some(), "store.flush", "--flush", "HASYNC_FLUSH"),
            (
                self.metadata_sync_interval.is_some(),
                "metadata.sync-interval",
                "--metadata-sync-interval",
                "HASYNC_METADATA_SYNC_INTERVAL",
            ),
            (self.log_format.is_some(), "log.format", "--log-format", "HASYNC_LOG_FORMAT"),
            (self.grpc_token.is_some(), "grpc.token", "--grpc-token", "HASYNC_GRPC_TOKEN"),
            (
                self.coordinator_password.is_some(),
                "coordinator.password",
                "--coordinator-password",
                "HASYNC_COORDINATOR_PASSWORD",
            ),
        ];
        set.into_iter().filter(|s| s.0).map(|(_, key, flag, env)| (key, flag, env)).collect()
    }

    /// Adds "(set by --flag or HASYNC_VAR)" to each [`Error::Invalid`] about a key that one of
    /// these overrides set, so the operator knows where to look.
    pub(crate) fn annotate(&self, error: Error) -> Error {
        let set = self.set_keys();
        let annotate_one = |error: Error| match error {
            Error::Invalid { key, value, reason } => {
                let origin = set.iter().find(|(k, _, _)| *k == key);
                let reason = match origin {
                    Some((_, flag, env)) => format!("{reason} (set by {flag} or {env})"),
                    None => reason,
                };
                Error::Invalid { key, value, reason }
            }
            other => other,
        };
        match error {
            Error::Many(errors) => Error::Many(errors.into_iter().map(annotate_one).collect()),
            other => annotate_one(other),
        }
    }
}

impl Config {
    /// Sets every key whose flag or environment variable was given. Run
    /// [`validate`](Config::validate) afterwards.
    pub fn apply_overrides(&mut self, o: &Overrides) {
        fn set<T: Clone>(slot: &mut T, value: &Option<T>) {
            if let Some(value) = value {
                *slot = value.clone();
            }
        }
        set(&mut self.node.name, &o.name);
        set(&mut self.node.data_dir, &o.data_dir);
        set(&mut self.node.role, &o.role);
        set(&mut self.store.segment_size, &o.segment_size);
        set(&mut self.store.flush, &o.flush);
        set(&mut self.ha.listen, &o.ha_listen);
        set(&mut self.grpc.listen, &o.grpc_listen);
        set(&mut self.metrics.listen, &o.metrics_listen);
        set(&mut self.slave.master_ha, &o.master_ha);
        set(&mut self.slave.master_grpc, &o.master_grpc);
        set(&mut self.node.advertise_ha, &o.advertise_ha);
        set(&mut self.node.advertise_grpc, &o.advertise_grpc);
        set(&mut self.replication.mode, &o.mode);
        set(&mut self.replication.sync_ack_replicas, &o.sync_ack_replicas);
        set(&mut self.replication.slave_timeout, &o.slave_timeout);
        set(&mut self.metadata.sync_interval, &o.metadata_sync_interval);
        set(&mut self.log.format, &o.log_format);
        set(&mut self.grpc.token, &o.grpc_token);
        set(&mut self.coordinator.password, &o.coordinator_password);
    }
}
