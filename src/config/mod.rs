//! The configuration tree: one serde struct per TOML section, kebab-case keys, human sizes
//! ("1GiB") and durations ("5s"), unknown keys refused.
//!
//! Where a setting comes from, lowest precedence first: the built-in defaults
//! ([`Config::default`], written out in `defaults.toml`), the config file ([`Config::load`]),
//! `HASYNC_*` environment variables, command-line flags (both through [`Overrides`]).
//! [`Config::validate`] runs last and reports every bad value or combination, each naming its
//! dotted key (`store.segment-size`). The one `[store]` rule the store owns (the largest record
//! fits in a segment) is handed in by the caller through [`Config::validate_with`], so that this
//! module, a leaf, imports nothing of the store.
//!
//! This module owns the settings, their defaults and their rules; it does not open sockets or
//! files other than the config file itself.

mod overrides;
pub mod units;
mod validate;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::overrides::Overrides;
pub use self::units::ByteSize;
pub use self::validate::{MAX_CPU_DMA_LATENCY_US, parse_log_filter};
pub(crate) use self::validate::{api_server_host_port, is_dns_label, is_dns_subdomain};

/// The documented default configuration file, printed by `hasync config defaults`.
///
/// Every key appears with a comment explaining it; the values equal [`Config::default`].
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// A configuration that could not be read, parsed or accepted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file could not be read. The I/O error is the
    /// [`source`](std::error::Error::source) (anyhow's `{:#}` shows it), not repeated here.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not valid TOML or does not fit the tree (unknown key, wrong type, bad size).
    #[error("{}{message}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    Parse {
        /// The file, when the text came from one.
        path: Option<PathBuf>,
        /// The dotted key at the error, when it could be located (`store.segment-size`).
        key: Option<String>,
        /// One line: position, key and toml's own message.
        message: String,
    },
    /// A value, or a combination of values, that the node would not run with.
    #[error("invalid `{key}` = {value}: {reason}")]
    Invalid {
        /// The dotted key (`store.segment-size`).
        key: String,
        /// The value as written in TOML (`"1000B"`, `0`).
        value: String,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// More than one [`Error::Invalid`]; [`Config::validate`] reports them all at once.
    #[error("{} invalid settings: {}", .0.len(), join(.0))]
    Many(Vec<Error>),
    /// The configuration could not be written as TOML (a bug, not bad input).
    #[error("cannot write the configuration as TOML: {0}")]
    Serialize(String),
}

fn join(errors: &[Error]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl Error {
    /// The dotted keys this error is about, for [`Error::Invalid`], [`Error::Many`] and a
    /// [`Error::Parse`] whose key was located.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Error::Invalid { key, .. } => vec![key.as_str()],
            Error::Parse { key: Some(key), .. } => vec![key.as_str()],
            Error::Many(errors) => errors.iter().flat_map(Error::keys).collect(),
            _ => Vec::new(),
        }
    }
}

/// The whole configuration of one node. Each field is one `[section]` of the TOML file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// `[node]`: identity, role and data directory.
    /// Default: [`NodeConfig::default`].
    pub node: NodeConfig,
    /// `[store]`: the commitlog files and flushing.
    /// Default: [`StoreConfig::default`].
    pub store: StoreConfig,
    /// `[replication]`: sync or async replication and its limits.
    /// Default: [`ReplicationConfig::default`].
    pub replication: ReplicationConfig,
    /// `[ha]`: the master's HA listener (RocketMQ's HA protocol).
    /// Default: [`HaConfig::default`].
    pub ha: HaConfig,
    /// `[slave]`: how a slave follows its master.
    /// Default: [`SlaveConfig::default`].
    pub slave: SlaveConfig,
    /// `[grpc]`: the control plane.
    /// Default: [`GrpcConfig::default`].
    pub grpc: GrpcConfig,
    /// `[metrics]`: the Prometheus endpoint and the cluster console.
    /// Default: [`MetricsConfig::default`].
    pub metrics: MetricsConfig,
    /// `[metadata]`: topics and consumer offsets.
    /// Default: [`MetadataConfig::default`].
    pub metadata: MetadataConfig,
    /// `[log]`: logging.
    /// Default: [`LogConfig::default`].
    pub log: LogConfig,
    /// `[coordinator]`: automatic failover through etcd (off without endpoints).
    /// Default: [`CoordinatorConfig::default`].
    pub coordinator: CoordinatorConfig,
    /// `[kubernetes]`: the pod's role label (coordinator mode in a Kubernetes pod).
    /// Default: [`KubernetesConfig::default`].
    pub kubernetes: KubernetesConfig,
}

/// `[node]`: identity, role and data directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeConfig {
    /// Name of this node in logs, metrics and the control plane; non-empty, no whitespace.
    /// Default: "hasync".
    pub name: String,
    /// Role at start-up: "master" accepts writes and serves slaves; "slave" follows
    /// `slave.master-ha`. Changed at run time through the control plane. Default: "master".
    pub role: Role,
    /// Directory holding the commitlog segments, checkpoint and metadata. Default: "./data".
    pub data_dir: PathBuf,
    /// How long a graceful stop (SIGTERM/SIGINT: refuse puts, answer waiters, stop the data
    /// plane, final flush and checkpoint) may take before the process exits anyway, leaving
    /// the next start to recover; a second signal exits at once. Keep a supervisor's stop
    /// timeout (systemd `TimeoutStopSec`, Kubernetes `terminationGracePeriodSeconds`) longer.
    /// Default: "30s".
    #[serde(with = "units::duration")]
    pub shutdown_timeout: Duration,
    /// Worker threads of the process's async runtime (gRPC, HA, metrics); 0: tokio's
    /// default, `TOKIO_WORKER_THREADS` when set, else one per CPU the process may use. On a
    /// machine where a master, its slave and their clients share few CPUs, 1 avoids a put's
    /// hops between workers. Read at start (`serve`). Default: 0.
    pub worker_threads: u16,
    /// Hold a CPU wake-up latency request of this many microseconds through Linux PM QoS
    /// (`/dev/cpu_dma_latency`) while the process runs: idle CPUs stay in idle states that wake
    /// within it (0: they poll). On virtual machines whose idle vCPUs halt, each wake-up of a
    /// thread on another vCPU otherwise costs tens of µs, several per SYNC put. Machine-wide
    /// and it costs CPU on idle CPUs; needs root (a refusal is a warning and the node runs
    /// without it). -1: leave the machine's setting. Read at start (`serve`). Default: -1.
    pub cpu_dma_latency_us: i32,
    /// A node that was master and stopped uncleanly comes back refusing puts (and its
    /// replication health NOT_SERVING) until a ChangeRole confirms it: an orchestrator may have
    /// promoted another node meanwhile. Default: false.
    pub fence_on_unclean_start: bool,
    /// Start although the epoch file is missing while the node had a history (its commitlog
    /// holds data, or a role file says it changed role), with a fresh history and a warning.
    /// Without it such a start is refused. Also `serve --allow-missing-epoch-history`.
    /// Default: false.
    pub allow_missing_epoch_history: bool,
    /// host:port other nodes reach this node's HA listener at (published in coordinator mode);
    /// empty = `ha.listen` when it is not a wildcard address. Default: "".
    pub advertise_ha: String,
    /// host:port other nodes and the controller reach this node's gRPC port at; empty =
    /// `grpc.listen` when it is not a wildcard address. Default: "".
    pub advertise_grpc: String,
    /// Never promote this node to master (coordinator mode; it still votes and acks).
    /// Default: false.
    pub never_promote: bool,
    /// Breaks ties among equally complete candidates of a failover: higher first.
    /// Default: 0.
    pub priority: i32,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            name: "hasync".to_owned(),
            role: Role::Master,
            data_dir: PathBuf::from("./data"),
            shutdown_timeout: Duration::from_secs(30),
            worker_threads: 0,
            cpu_dma_latency_us: -1,
            fence_on_unclean_start: false,
            allow_missing_epoch_history: false,
            advertise_ha: String::new(),
            advertise_grpc: String::new(),
            never_promote: false,
            priority: 0,
        }
    }
}

/// `[coordinator]`: automatic failover and switchover coordinated through etcd. A node with
/// no `endpoints` runs without a coordinator (static roles, manual ChangeRole), as before.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CoordinatorConfig {
    /// etcd endpoints: `host:port` or `http(s)://host:port`; empty = no coordinator.
    /// Default: [].
    pub endpoints: Vec<String>,
    /// Key prefix every record lives under. Default: "/hasync/v1/".
    pub prefix: String,
    /// The cluster's name (one controller campaign per cluster). Default: "".
    pub cluster: String,
    /// The broker group this node belongs to. Default: "".
    pub group: String,
    /// TTL of the member's lease (and the master's leader key): a master whose lease
    /// expires is failed over. Default: "10s".
    #[serde(with = "units::duration")]
    pub ttl: Duration,
    /// How often the lease is renewed and the member record refreshed; below ttl / 2.
    /// Default: "2s".
    #[serde(with = "units::duration")]
    pub renew_interval: Duration,
    /// Wait before retrying a failed call to etcd. Default: "500ms".
    #[serde(with = "units::duration")]
    pub retry: Duration,
    /// Longest one call to etcd may take. Default: "2s".
    #[serde(with = "units::duration")]
    pub timeout: Duration,
    /// PEM CA certificate to verify etcd's TLS certificate; empty = plaintext unless an
    /// endpoint is https://. Default: "".
    pub ca_file: PathBuf,
    /// PEM client certificate for etcd (with key-file); empty = none. Default: "".
    pub cert_file: PathBuf,
    /// PEM private key of cert-file. Default: "".
    pub key_file: PathBuf,
    /// etcd user name; empty = no authentication. Default: "".
    pub user: String,
    /// etcd password of `user`; HASYNC_COORDINATOR_PASSWORD overrides it. Default: "".
    pub password: String,
    /// Run the controller in this node (one is active per cluster, the others stand by).
    /// Default: true.
    pub controller: bool,
    /// Floor of k the controller and the master never go below (a shrink is refused).
    /// Default: 1.
    pub min_sync_replicas: u32,
    /// Let the group degrade to k = 0 when too few voters remain (then no automatic failover
    /// until k is raised again). Default: false.
    pub allow_degrade: bool,
    /// Fail over automatically in ASYNC mode (within max-lag-on-failover). Default: false.
    pub async_failover: bool,
    /// ASYNC: most bytes the best candidate may lag for an automatic failover.
    /// Default: "16MiB".
    pub max_lag_on_failover: ByteSize,
    /// ASYNC: oldest the best candidate's last report may be for an automatic failover.
    /// Default: "10s".
    #[serde(with = "units::duration")]
    pub max_lag_time_on_failover: Duration,
    /// Least time between two automatic failovers of one group. Default: "30s".
    #[serde(with = "units::duration")]
    pub hold_down: Duration,
    /// Most automatic failovers of one group per minute. Default: 2.
    pub max_failovers_per_minute: u32,
    /// Most automatic failovers of the cluster running at once (groups in a decision);
    /// further groups wait their turn (`concurrency_limited`). Default: 4.
    pub max_concurrent_failovers: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            prefix: "/hasync/v1/".to_owned(),
            cluster: String::new(),
            group: String::new(),
            ttl: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
            retry: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            ca_file: PathBuf::new(),
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            user: String::new(),
            password: String::new(),
            controller: true,
            min_sync_replicas: 1,
            allow_degrade: false,
            async_failover: false,
            max_lag_on_failover: ByteSize::mib(16),
            max_lag_time_on_failover: Duration::from_secs(10),
            hold_down: Duration::from_secs(30),
            max_failovers_per_minute: 2,
            max_concurrent_failovers: 4,
        }
    }
}

/// The service account directory a pod's token, CA and namespace are mounted in.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `[kubernetes]`: in coordinator mode inside a Kubernetes pod, the node labels its own pod
/// `hasync.io/role: master` or `slave` as the group's state record names it, so that a
/// Service selecting the label reaches the current master.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct KubernetesConfig {
    /// Keep the pod's `hasync.io/role` label equal to the node's role in the state record
    /// (PATCH of the pod through the API server; needs coordinator mode and RBAC `patch` on
    /// `pods`). Default: false.
    pub role_label: bool,
    /// The pod to label; empty = the environment variable POD_NAME, else the host name.
    /// Default: "".
    pub pod_name: String,
    /// The pod's namespace; empty = the service account's `namespace` file. Default: "".
    pub namespace: String,
    /// The API server, `https://host:port`; empty =
    /// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`. Default: "".
    pub api_server: String,
    /// Directory holding the service account's `token` (read at every request: it rotates),
    /// `ca.crt` (verifies the API server) and `namespace`.
    /// Default: "/var/run/secrets/kubernetes.io/serviceaccount".
    pub service_account_dir: PathBuf,
    /// Longest one PATCH may take; a failed one is retried with a growing wait (up to 30s).
    /// Default: "5s".
    #[serde(with = "units::duration")]
    pub timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            role_label: false,
            pod_name: String::new(),
            namespace: String::new(),
            api_server: String::new(),
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            timeout: Duration::from_secs(5),
        }
    }
}

/// A cluster, group or member name in coordinator mode (it becomes part of etcd keys and
/// Prometheus labels): 1 to 64 of `a-z A-Z 0-9 . _ -`.
pub fn is_record_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl CoordinatorConfig {
    /// Whether a coordinator is configured.
    pub fn enabled(&self) -> bool {
        !self.endpoints.is_empty()
    }
}

/// The role a node starts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Accepts writes and serves slaves.
    Master,
    /// Follows a master; never accepts writes.
    Slave,
}

/// `[store]`: the commitlog files and flushing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct StoreConfig {
    /// Size of each commitlog segment file. Must equal the master's (offsets map to files by
    /// it), be a multiple of the OS page size, at least 4KiB and below 2GiB (RocketMQ
    /// positions are Java ints). Default: "1GiB".
    pub segment_size: ByteSize,
    /// Largest message body accepted. The largest record (body plus header, topic and
    /// properties) and the 8-byte end-of-file blank must fit in one segment. Default: "4MiB".
    pub max_message_size: ByteSize,
    /// "async": flush in the background every `flush-interval`; "sync": a put returns after
    /// its record is flushed (or FLUSH_DISK_TIMEOUT after `sync-flush-timeout`).
    /// Default: "async".
    pub flush: FlushMode,
    /// How often the background flush runs under `flush = "async"`. Default: "500ms".
    #[serde(with = "units::duration")]
    pub flush_interval: Duration,
    /// How long a put waits for its flush under `flush = "sync"`. Default: "5s".
    #[serde(with = "units::duration")]
    pub sync_flush_timeout: Duration,
    /// Segments older than this are deleted (whole files, never the last one).
    /// Default: "72h".
    #[serde(with = "units::duration")]
    pub file_reserved_time: Duration,
    /// When the data disk is fuller than this ratio, old segments are deleted early; in
    /// (0, 1]. Default: 0.75.
    pub disk_max_used_ratio: f64,
    /// Fault every page of the next segment in once it is allocated ahead of time (off the
    /// write path; a roll during the warm takes it and the warm goes on beside the writer), so
    /// appends and a slave's writes do not wait for the file system to map a page (RocketMQ's
    /// warmMapedFileEnable); and the rest of a last segment never warmed (the store's first
    /// one). `MADV_POPULATE_WRITE` (Linux 5.14+). Costs writing the segment's size once more.
    /// Default: true.
    pub warm_segments: bool,
    /// Among which stores the warms take turns, one page-fault call (1 MiB) at a time, so
    /// that two warms' first-touch faults, which a `PREEMPT_NONE` kernel does not interrupt,
    /// seldom hold two CPUs at once (only when a wait gives up): "process" (the stores of this process: an in-process
    /// cluster, a bench), "none", or the absolute path of a lock file (created when missing)
    /// that the hasync processes sharing a machine name alike, for turns among them too
    /// (`flock`). A turn is given up after 1 s, so a stuck holder never stops a warm; while it
    /// waits, the store thread still flushes, checkpoints and prepares segments.
    /// Default: "process".
    pub warm_lock: String,
    /// Bytes per second the background scrub re-reads sealed segments to check every record
    /// (CRC and structure); "0" turns it off. Default: "4MiB".
    pub scrub_rate: ByteSize,
    /// How far below the process's CPU priority the store's background threads run: their
    /// nice value is the process's plus this (at most 19). They are the store thread (async
    /// flushes, checkpoints, retention, preparing and warming the next segment) and the scrub.
    /// Higher yields the CPUs to the appending and replicating tasks when they are busy; 0
    /// leaves them at the process's priority; 0 to 19. The store thread stays at the process's
    /// priority when a put or an ack waits for its flushes (`store.flush = "sync"`,
    /// `slave.ack-mode = "flushed"`). Default: 10.
    pub background_nice: u8,
    /// Tail files under `<data-dir>/truncated/` (the bytes a truncate removed, kept aside)
    /// older than this are removed. Default: "168h".
    #[serde(with = "units::duration")]
    pub truncated_retention: Duration,
    /// While the tail files hold more than this, the oldest are removed (never the newest
    /// one, which only truncated-retention removes). Default: "4GiB".
    pub truncated_max_bytes: ByteSize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            segment_size: ByteSize::gib(1),
            max_message_size: ByteSize::mib(4),
            flush: FlushMode::Async,
            flush_interval: Duration::from_millis(500),
            sync_flush_timeout: Duration::from_secs(5),
            file_reserved_time: Duration::from_secs(72 * 3600),
            disk_max_used_ratio: 0.75,
            warm_segments: true,
            warm_lock: "process".to_owned(),
            scrub_rate: ByteSize::mib(4),
            background_nice: 10,
            truncated_retention: Duration::from_secs(168 * 3600),
            truncated_max_bytes: ByteSize::gib(4),
        }
    }
}

/// Among which stores the warms of segments take turns (`store.warm-lock`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WarmLock {
    /// No turns: every store warms when it likes (`"none"`).
    None,
    /// Among the stores of this process (`"process"`).
    #[default]
    Process,
    /// Among the stores of this process and of every process that names the same lock file.
    Host(PathBuf),
}

impl WarmLock {
    /// Parses `store.warm-lock`: `"none"`, `"process"` or an absolute path.
    pub fn parse(s: &str) -> std::result::Result<Self, &'static str> {
        match s {
            "none" => Ok(Self::None),
            "process" => Ok(Self::Process),
            p if Path::new(p).is_absolute() => Ok(Self::Host(PathBuf::from(p))),
            _ => Err("must be \"none\", \"process\" or the absolute path of a lock file that the \
                      processes sharing this machine name alike"),
        }
    }
}

/// When a put's record is flushed to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FlushMode {
    /// In the background, every `store.flush-interval` (upstream ASYNC_FLUSH).
    Async,
    /// Before the put returns (upstream SYNC_FLUSH).
    Sync,
}

/// `[replication]`: sync or async replication and its limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReplicationConfig {
    /// "async": a put returns once stored on the master (upstream ASYNC_MASTER); "sync": it
    /// also waits for `sync-ack-replicas` slaves to ack it (upstream SYNC_MASTER).
    /// Default: "async".
    pub mode: ReplicationMode,
    /// In sync mode, how many slaves (never counting the master) must ack a put. At least 1
    /// and at most `ha.max-connections`. Default: 1.
    pub sync_ack_replicas: u32,
    /// How long a sync put waits for its acks before answering FLUSH_SLAVE_TIMEOUT (the record
    /// stays stored on the master). The seeds' value; upstream >= 4.9.3 uses 3s.
    /// Default: "5s".
    #[serde(with = "units::duration")]
    pub slave_timeout: Duration,
    /// A slave further behind than this does not count as in sync; with fewer than
    /// `sync-ack-replicas` in-sync slaves a sync put answers SLAVE_NOT_AVAILABLE at once.
    /// Default: "256MiB".
    pub max_gap_not_in_sync: ByteSize,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            mode: ReplicationMode::Async,
            sync_ack_replicas: 1,
            slave_timeout: Duration::from_secs(5),
            max_gap_not_in_sync: ByteSize::mib(256),
        }
    }
}

/// Whether a put waits for slaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicationMode {
    /// Return once stored on the master.
    Async,
    /// Also wait for `replication.sync-ack-replicas` slave acks.
    Sync,
}

/// `[ha]`: the master's HA listener (RocketMQ's HA protocol, byte-compatible with Java).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HaConfig {
    /// Address the master listens on for slaves; port 0 lets the OS choose (tests).
    /// Default: "0.0.0.0:10912".
    pub listen: SocketAddr,
    /// Largest body of one master->slave frame (upstream's 32 KiB transfer batch); at most
    /// 4MiB - 12 (a Java slave's read buffer less the frame header) and at most
    /// `slave.read-buffer-size` - 12. Default: "32KiB".
    pub transfer_batch_size: ByteSize,
    /// How often the master sends an empty frame and the slave reports its offset when
    /// otherwise idle; below `housekeeping-interval`. Default: "5s".
    #[serde(with = "units::duration")]
    pub heartbeat_interval: Duration,
    /// A connection silent for this long is closed, on both sides. Default: "20s".
    #[serde(with = "units::duration")]
    pub housekeeping_interval: Duration,
    /// Where a slave with an empty log starts: "last-file" (the start of the master's last
    /// segment, as upstream) or "earliest" (the master's first offset). Default: "last-file".
    pub empty_slave_start: EmptySlaveStart,
    /// What counts as one replica for sync acks: "registered" (the data-dir id an hasync
    /// slave registers for its connection; an unregistered connection counts as the identity
    /// registered from its IP, else as its IP), "ip" (one replica per peer IP) or "connection"
    /// (each connection, as upstream). The newest connection of a replica replaces its older
    /// ones. Default: "registered".
    pub replica_identity: ReplicaIdentity,
    /// Most slaves served at once: a connection takes a slot at its first report; connections
    /// without a report hold none (they have their own bound). Default: 64.
    pub max_connections: u32,
    /// Networks slaves may connect from, in CIDR form ("10.0.0.0/8") or bare addresses
    /// (one host); empty allows all. Default: [].
    #[serde(with = "units::net_list")]
    pub allow_list: Vec<ipnet::IpNet>,
}

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 10912)),
            transfer_batch_size: ByteSize::kib(32),
            heartbeat_interval: Duration::from_secs(5),
            housekeeping_interval: Duration::from_secs(20),
            empty_slave_start: EmptySlaveStart::LastFile,
            replica_identity: ReplicaIdentity::Registered,
            max_connections: 64,
            allow_list: Vec::new(),
        }
    }
}

/// Where a slave with an empty log starts replicating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmptySlaveStart {
    /// The start of the master's last segment file (upstream behaviour).
    LastFile,
    /// The master's first available offset.
    Earliest,
}

/// What the master counts as one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaIdentity {
    /// The data-dir id a slave registered for its connection (`Replication.RegisterReplica`);
    /// an unregistered connection counts as the identity registered from its IP, else as its
    /// IP.
    Registered,
    /// One replica per peer IP address; its newest connection wins.
    Ip,
    /// Every connection (upstream behaviour).
    Connection,
}

/// `[slave]`: how a slave follows its master.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SlaveConfig {
    /// host:port of the master's HA listener; required when `node.role = "slave"`.
    /// Default: "".
    pub master_ha: String,
    /// host:port of the master's gRPC control plane, for pulling metadata; empty = no
    /// metadata pull (e.g. when following a Java master). Default: "".
    pub master_grpc: String,
    /// PEM certificate of the master's gRPC port (or of the CA that signed it), to verify a
    /// master whose gRPC port has TLS on; set, a `host:port` in `master-grpc` is reached over
    /// TLS (as `https://host:port` is); empty = plaintext. Default: "".
    pub master_grpc_ca_file: PathBuf,
    /// Receive buffer for master frames; at least 64KiB and at least
    /// `ha.transfer-batch-size` + 12. Default: "4MiB".
    pub read_buffer_size: ByteSize,
    /// How long a connection attempt to the master may take. Default: "5s".
    #[serde(with = "units::duration")]
    pub connect_timeout: Duration,
    /// First wait before reconnecting after the link drops, and the wait after a session
    /// that got as far as its first report; jittered, doubling per failed attempt up to
    /// `reconnect-backoff-max`. Default: "200ms".
    #[serde(with = "units::duration")]
    pub reconnect_backoff: Duration,
    /// Longest wait between reconnection attempts after a failure that may pass (the master
    /// down or unreachable). A refusal the operator must fix (the master behind this slave, no
    /// shared epoch, a segment-size mismatch) backs off further, up to 30s; no wait is longer
    /// than 30s, whatever this says. Default: "1500ms".
    #[serde(with = "units::duration")]
    pub reconnect_backoff_max: Duration,
    /// Local IP address to bind before connecting to the master; empty = let the OS choose.
    /// Default: "".
    #[serde(with = "units::optional_ip")]
    pub source_address: Option<IpAddr>,
    /// Which offset the slave acks: "received" (in its page cache, as upstream) or "flushed"
    /// (on its disk: two durable copies, slower). Default: "received".
    pub ack_mode: AckMode,
}

impl Default for SlaveConfig {
    fn default() -> Self {
        Self {
            master_ha: String::new(),
            master_grpc: String::new(),
            master_grpc_ca_file: PathBuf::new(),
            read_buffer_size: ByteSize::mib(4),
            connect_timeout: Duration::from_secs(5),
            reconnect_backoff: Duration::from_millis(200),
            reconnect_backoff_max: Duration::from_millis(1500),
            source_address: None,
            ack_mode: AckMode::Received,
        }
    }
}

/// Which offset a slave reports to its master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckMode {
    /// The end of what it received (in its page cache).
    Received,
    /// The end of what it flushed to disk.
    Flushed,
}

/// `[grpc]`: the control plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct GrpcConfig {
    /// Address of the gRPC control plane; port 0 lets the OS choose. Default: "0.0.0.0:10920".
    pub listen: SocketAddr,
    /// Bearer token required by every call except the read-only ones (health, reflection,
    /// GetStatus, WatchStatus, GetEpochHistory, Read, metadata Get and Pull), and by those too
    /// with `token-for-reads`; empty = no token. The environment variable HASYNC_GRPC_TOKEN
    /// overrides it. Default: "".
    pub token: String,
    /// Whether the read-only calls (status, read, metadata reads) need the token too.
    /// Default: false.
    pub token_for_reads: bool,
    /// Largest gRPC request accepted (a Put with its messages). Default: "16MiB".
    pub max_request_size: ByteSize,
    /// Most messages in one Put. Default: 1024.
    pub max_messages_per_put: u32,
    /// Most puts of one PutStream begun and not yet answered; the node reads no further put
    /// from that stream until an answer is sent. Default: 1024.
    pub put_stream_max_in_flight: u32,
    /// Most request bytes of one PutStream's puts begun and not yet answered (one put is
    /// always let in when none is in flight). Default: "64MiB".
    pub put_stream_max_in_flight_bytes: ByteSize,
    /// Most concurrent HTTP/2 streams per connection. Default: 256.
    pub max_concurrent_streams: u32,
    /// Most gRPC connections open at once; more are closed at accept. Lowered at start to the
    /// fd budget (the open-files limit less 64 and every socket the HA port may hold).
    /// Default: 1024.
    pub max_connections: u32,
    /// A connection that sends no byte within this is closed. Default: "10s".
    #[serde(with = "units::duration")]
    pub handshake_timeout: Duration,
    /// A connection with no open call for this long is closed. Default: "5m".
    #[serde(with = "units::duration")]
    pub idle_timeout: Duration,
    /// How often the server sends an HTTP/2 keepalive ping. Default: "60s".
    #[serde(with = "units::duration")]
    pub keepalive_interval: Duration,
    /// A client that does not answer a keepalive ping within this is disconnected.
    /// Default: "20s".
    #[serde(with = "units::duration")]
    pub keepalive_timeout: Duration,
    /// PEM certificate chain for TLS on the gRPC port (rustls, ring); empty = plaintext.
    /// Needs `tls-key-file` too. Default: "".
    pub tls_cert_file: PathBuf,
    /// PEM private key matching `tls-cert-file`; empty = plaintext. Default: "".
    pub tls_key_file: PathBuf,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 10920)),
            token: String::new(),
            token_for_reads: false,
            max_request_size: ByteSize::mib(16),
            max_messages_per_put: 1024,
            put_stream_max_in_flight: 1024,
            put_stream_max_in_flight_bytes: ByteSize::mib(64),
            max_concurrent_streams: 256,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            tls_cert_file: PathBuf::new(),
            tls_key_file: PathBuf::new(),
        }
    }
}

/// `[metrics]`: the Prometheus endpoint and the cluster console beside it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct MetricsConfig {
    /// Address serving Prometheus text at /metrics; port 0 lets the OS choose.
    /// Default: "0.0.0.0:10921".
    pub listen: SocketAddr,
    /// Serve the cluster console on the same listener: a read-only page at / and its data
    /// under /console/ (docs/console.md); false answers 404 there. Default: true.
    pub console: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { listen: SocketAddr::from(([0, 0, 0, 0], 10921)), console: true }
    }
}

/// `[metadata]`: topics, consumer offsets and the slave's pull of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct MetadataConfig {
    /// How often a slave pulls metadata from `slave.master-grpc`. Default: "10s".
    #[serde(with = "units::duration")]
    pub sync_interval: Duration,
    /// How often consumer offsets are written to disk. Default: "5s".
    #[serde(with = "units::duration")]
    pub consumer_offset_persist_interval: Duration,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        Self {
            sync_interval: Duration::from_secs(10),
            consumer_offset_persist_interval: Duration::from_secs(5),
        }
    }
}

/// `[log]`: logging.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogConfig {
    /// "text" for people, "json" for log collectors. Default: "text".
    pub format: LogFormat,
    /// tracing filter directives ("info", "hasync=debug,info"); non-empty. `RUST_LOG`, when
    /// set, takes precedence. Default: "info".
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, filter: "info".to_owned() }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Master => "master",
            Role::Slave => "slave",
        })
    }
}

impl fmt::Display for ReplicationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicationMode::Async => "async",
            ReplicationMode::Sync => "sync",
        })
    }
}

impl fmt::Display for FlushMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushMode::Async => "async",
            FlushMode::Sync => "sync",
        })
    }
}

impl Config {
    /// Parses TOML text. Keys not given keep their defaults; unknown keys are errors. Does not
    /// [`validate`](Config::validate).
    pub fn from_toml_str(text: &str) -> Result<Config, Error> {
        parse(text, None)
    }

    /// Reads and parses a config file; errors name the file. Does not
    /// [`validate`](Config::validate).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Read { path: path.to_owned(), source })?;
        parse(&text, Some(path))
    }

    /// The configuration as TOML, in the same shape as `defaults.toml` (without comments).
    pub fn to_toml_string(&self) -> Result<String, Error> {
        toml::to_string(self).map_err(|e| Error::Serialize(e.to_string()))
    }
}

fn parse(text: &str, path: Option<&Path>) -> Result<Config, Error> {
    toml::from_str(text).map_err(|e| {
        let located = e.span().map(|span| locate(text, span.start));
        let one_line = e.message().replace('\n', "; ");
        let message = match &located {
            Some(loc) => match &loc.key {
                Some(key) => {
                    format!("line {}, column {}: `{key}`: {one_line}", loc.line, loc.column)
                }
                None => format!("line {}, column {}: {one_line}", loc.line, loc.column),
            },
            None => one_line,
        };
        Error::Parse {
            path: path.map(Path::to_owned),
            key: located.and_then(|loc| loc.key),
            message,
        }
    })
}

/// Where in the text a parse error is: 1-based line and column, and the dotted key there.
struct Location {
    line: usize,
    column: usize,
    key: Option<String>,
}

/// Finds the dotted key of the line holding byte `offset`: the `[section]` above it plus the
/// key before `=` on that line (or, inside a multi-line array, on the line that opened it).
/// Best effort: an inline table names only its own key.
fn locate(text: &str, offset: usize) -> Location {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let lines = text[..line_end].lines().rev().map(str::trim).filter(|l| !l.starts_with('#'));
    let mut section = None;
    let mut key = None;
    let mut looking_for_key = true;
    for (i, candidate) in lines.enumerate() {
        if let Some(header) = candidate.strip_prefix('[') {
            let header = header.trim_start_matches('[');
            section = Some(header.split(']').next().unwrap_or(header));
            break;
        }
        if looking_for_key && let Some((lhs, rhs)) = candidate.split_once('=') {
            // The error's own line, or the line that opened the multi-line array it is in.
            if i == 0 || rhs.contains('[') {
                key = Some(lhs);
            }
            looking_for_key = false;
        }
    }
    let mut parts = section.map(dotted_parts).unwrap_or_default();
    parts.extend(key.map(dotted_parts).unwrap_or_default());
    let key = (!parts.is_empty()).then(|| parts.join("."));
    Location { line, column, key }
}

/// The parts of a dotted TOML key, unquoted: `a."b".c` -> `[a, b, c]`.
fn dotted_parts(key: &str) -> Vec<&str> {
    key.split('.').map(|p| p.trim().trim_matches('"')).filter(|p| !p.is_empty()).collect()
}
