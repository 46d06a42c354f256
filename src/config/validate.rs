//! [`Config::validate`]: every rule a value or a combination of values must follow, each
//! reported with the dotted key it is about.
//!
//! All rules run and all failures are reported together (one [`Error::Invalid`], or
//! [`Error::Many`] for several), so an operator fixes a file in one pass.

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

use super::units::{ByteSize, format_duration};
use super::{Config, Error, NodeConfig, ReplicaIdentity, ReplicationMode, Role, StoreConfig};

/// Bytes of the master->slave frame header: `[i64 offset][i32 size]`.
const FRAME_HEADER_BYTES: u64 = 12;
/// A Java slave's read buffer (upstream `READ_MAX_BUFFER_SIZE`).
const JAVA_SLAVE_READ_BUFFER_BYTES: u64 = 4 << 20;
/// The smallest segment size accepted.
const SEGMENT_SIZE_MIN_BYTES: u64 = 4 << 10;
/// Segment sizes must stay below this: RocketMQ file positions are Java ints.
const SEGMENT_SIZE_LIMIT_BYTES: u64 = 2 << 30;
/// The smallest slave read buffer accepted.
const READ_BUFFER_MIN_BYTES: u64 = 64 << 10;
/// The largest CPU latency request `node.cpu-dma-latency-us` may ask for, in µs: the kernel's
/// own "no constraint" value (PM QoS), the most it accepts.
pub const MAX_CPU_DMA_LATENCY_US: i32 = 2_000_000_000;

/// The most worker threads `node.worker-threads` may ask for.
const MAX_WORKER_THREADS: u16 = 1024;
/// The most `store.background-nice` may lower a thread's priority (nice values span 0-19).
const MAX_NICE: u8 = 19;

/// The OS page size that segment sizes must be a multiple of.
pub(crate) fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// A `[store]` rule that a module below the configuration owns (the store's "the largest
/// record and the end-of-file blank fit in a segment", `StoreOptions::check_config`), so that
/// `config` need not import it. It runs only when `store.segment-size` and
/// `store.max-message-size` pass their own rules, and its error takes their place in the order.
pub(crate) type StoreRule<'a> = &'a dyn Fn(&StoreConfig) -> Result<(), Error>;

impl Config {
    /// Checks every rule of the configuration itself; `Ok` when it breaks none. The store's
    /// cross-field rule is not among them: `hasync::app::validate` adds it.
    ///
    /// Reports all failures at once: one [`Error::Invalid`], or [`Error::Many`] holding several.
    /// Each names its dotted key, e.g.
    /// ``invalid `store.segment-size` = "1000B": must be a multiple of the page size (4096)``.
    pub fn validate(&self) -> Result<(), Error> {
        self.validate_with(&|_| Ok(()))
    }

    /// [`Config::validate`] plus `store_rule`, reported together with the other failures.
    pub(crate) fn validate_with(&self, store_rule: StoreRule<'_>) -> Result<(), Error> {
        let mut errors = self.validation_errors_with(store_rule);
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }

    /// Every rule this configuration breaks (with `store_rule`), each as an [`Error::Invalid`],
    /// in key order.
    pub(crate) fn validation_errors_with(&self, store_rule: StoreRule<'_>) -> Vec<Error> {
        let mut c = Checker::default();
        self.check_node(&mut c);
        self.check_store(&mut c, store_rule);
        self.check_replication(&mut c);
        self.check_ha(&mut c);
        self.check_slave(&mut c);
        self.check_grpc(&mut c);
        self.check_listeners(&mut c);
        self.check_coordinator(&mut c);
        self.check_kubernetes(&mut c);
        if self.log.filter.trim().is_empty() {
            c.fail("log.filter", quoted(&self.log.filter), "must not be empty (e.g. \"info\")");
        } else if let Err(reason) = parse_log_filter(&self.log.filter) {
            c.fail("log.filter", quoted(&self.log.filter), reason);
        }
        c.errors
    }

    fn check_node(&self, c: &mut Checker) {
        let name = &self.node.name;
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            c.fail("node.name", quoted(name), "must be non-empty and contain no whitespace");
        }
        if self.node.data_dir.as_os_str().is_empty() {
            c.fail("node.data-dir", "\"\"", "must not be empty");
        }
        c.positive("node.shutdown-timeout", self.node.shutdown_timeout);
        if self.node.worker_threads > MAX_WORKER_THREADS {
            c.fail(
                "node.worker-threads",
                self.node.worker_threads,
                format!(
                    "must be 0 (TOKIO_WORKER_THREADS, else one per CPU) to {MAX_WORKER_THREADS}"
                ),
            );
        }
        let latency = self.node.cpu_dma_latency_us;
        if !(-1..=MAX_CPU_DMA_LATENCY_US).contains(&latency) {
            c.fail(
                "node.cpu-dma-latency-us",
                latency,
                format!(
                    "must be -1 (leave the machine's setting) or 0 to {MAX_CPU_DMA_LATENCY_US} µs"
                ),
            );
        }
        if self.node.role == Role::Slave && self.slave.master_ha.trim().is_empty() {
            c.fail(
                "slave.master-ha",
                "\"\"",
                "is required when `node.role` = \"slave\" (host:port of the master's HA listener)",
            );
        }
    }

    fn check_store(&self, c: &mut Checker, store_rule: StoreRule<'_>) {
        let s = &self.store;
        let segment = s.segment_size.bytes();
        let page = page_size();
        let segment_ok = segment.is_multiple_of(page)
            && (SEGMENT_SIZE_MIN_BYTES..SEGMENT_SIZE_LIMIT_BYTES).contains(&segment);
        if !segment.is_multiple_of(page) {
            c.fail_size(
                "store.segment-size",
                s.segment_size,
                format!("must be a multiple of the page size ({page})"),
            );
        } else if segment < SEGMENT_SIZE_MIN_BYTES {
            c.fail_size("store.segment-size", s.segment_size, "must be at least 4KiB");
        } else if segment >= SEGMENT_SIZE_LIMIT_BYTES {
            c.fail_size(
                "store.segment-size",
                s.segment_size,
                "must be below 2GiB (RocketMQ file positions are Java ints)",
            );
        }
        let body = s.max_message_size.bytes();
        if body == 0 {
            c.fail_size("store.max-message-size", s.max_message_size, "must be greater than 0");
        } else if segment_ok && let Err(e) = store_rule(s) {
            c.errors.push(e);
        }
        let ratio = s.disk_max_used_ratio;
        if !(ratio > 0.0 && ratio <= 1.0) {
            c.fail(
                "store.disk-max-used-ratio",
                format!("{ratio:?}"),
                "must be in (0, 1], e.g. 0.75",
            );
        }
        if s.background_nice > MAX_NICE {
            c.fail(
                "store.background-nice",
                s.background_nice,
                format!("must be 0 to {MAX_NICE} (0: the process's priority)"),
            );
        }
        if let Err(reason) = super::WarmLock::parse(&s.warm_lock) {
            c.fail("store.warm-lock", quoted(&s.warm_lock), reason);
        }
        c.positive("store.flush-interval", s.flush_interval);
        c.positive("store.sync-flush-timeout", s.sync_flush_timeout);
        c.positive("store.file-reserved-time", s.file_reserved_time);
        c.positive("store.truncated-retention", s.truncated_retention);
    }

    fn check_replication(&self, c: &mut Checker) {
        let r = &self.replication;
        if r.sync_ack_replicas == 0 {
            c.fail(
                "replication.sync-ack-replicas",
                0,
                "must be at least 1 (it counts slaves only, never the master)",
            );
        } else if self.ha.max_connections > 0 && r.sync_ack_replicas > self.ha.max_connections {
            c.fail(
                "replication.sync-ack-replicas",
                r.sync_ack_replicas,
                format!(
                    "can never be reached with `ha.max-connections` = {}",
                    self.ha.max_connections
                ),
            );
        }
        c.positive("replication.slave-timeout", r.slave_timeout);
        if r.max_gap_not_in_sync.bytes() == 0 {
            c.fail_size(
                "replication.max-gap-not-in-sync",
                r.max_gap_not_in_sync,
                "must be greater than 0",
            );
        }
    }

    fn check_ha(&self, c: &mut Checker) {
        let ha = &self.ha;
        let batch = ha.transfer_batch_size.bytes();
        let java_max = JAVA_SLAVE_READ_BUFFER_BYTES - FRAME_HEADER_BYTES;
        let ours_max = self.slave.read_buffer_size.bytes().saturating_sub(FRAME_HEADER_BYTES);
        if batch == 0 || batch > java_max {
            c.fail_size(
                "ha.transfer-batch-size",
                ha.transfer_batch_size,
                format!(
                    "must be in [1, {java_max}] bytes (a Java slave's 4MiB read buffer less the \
                 12-byte frame header)"
                ),
            );
        } else if batch > ours_max {
            c.fail_size(
                "ha.transfer-batch-size",
                ha.transfer_batch_size,
                format!(
                    "must be at most `slave.read-buffer-size` ({}) less the 12-byte frame header",
                    self.slave.read_buffer_size
                ),
            );
        }
        c.positive("ha.heartbeat-interval", ha.heartbeat_interval);
        if ha.heartbeat_interval >= ha.housekeeping_interval {
            c.fail_duration(
                "ha.housekeeping-interval",
                ha.housekeeping_interval,
                format!(
                    "must be greater than `ha.heartbeat-interval` ({}), or a healthy idle link \
                 would be closed",
                    format_duration(ha.heartbeat_interval)
                ),
            );
        }
        if ha.max_connections == 0 {
            c.fail("ha.max-connections", 0, "must be at least 1");
        }
    }

    fn check_slave(&self, c: &mut Checker) {
        let s = &self.slave;
        if s.read_buffer_size.bytes() < READ_BUFFER_MIN_BYTES {
            c.fail_size("slave.read-buffer-size", s.read_buffer_size, "must be at least 64KiB");
        }
        c.positive("slave.connect-timeout", s.connect_timeout);
        c.positive("slave.reconnect-backoff", s.reconnect_backoff);
        if s.reconnect_backoff > s.reconnect_backoff_max {
            c.fail_duration(
                "slave.reconnect-backoff-max",
                s.reconnect_backoff_max,
                format!(
                    "must be at least `slave.reconnect-backoff` ({})",
                    format_duration(s.reconnect_backoff)
                ),
            );
        }
        for (key, value) in
            [("slave.master-ha", &s.master_ha), ("slave.master-grpc", &s.master_grpc)]
        {
            if !value.is_empty()
                && let Err(reason) = check_host_port(value)
            {
                c.fail(key, quoted(value), reason);
            }
        }
        c.positive("metadata.sync-interval", self.metadata.sync_interval);
        c.positive(
            "metadata.consumer-offset-persist-interval",
            self.metadata.consumer_offset_persist_interval,
        );
    }

    /// Two listeners on the same port and overlapping addresses cannot both bind.
    fn check_grpc(&self, c: &mut Checker) {
        let g = &self.grpc;
        if g.max_request_size.bytes() < self.store.max_message_size.bytes() + 64 * 1024 {
            c.fail_size(
                "grpc.max-request-size",
                g.max_request_size,
                "must hold at least one message of store.max-message-size plus 64KiB",
            );
        }
        if g.max_messages_per_put == 0 {
            c.fail("grpc.max-messages-per-put", 0, "must be at least 1");
        }
        if g.put_stream_max_in_flight == 0 {
            c.fail("grpc.put-stream-max-in-flight", 0, "must be at least 1");
        }
        if g.put_stream_max_in_flight_bytes.bytes() == 0 {
            c.fail_size(
                "grpc.put-stream-max-in-flight-bytes",
                g.put_stream_max_in_flight_bytes,
                "must be at least 1",
            );
        }
        if g.max_concurrent_streams == 0 {
            c.fail("grpc.max-concurrent-streams", 0, "must be at least 1");
        }
        if g.max_connections == 0 {
            c.fail("grpc.max-connections", 0, "must be at least 1");
        }
        c.positive("grpc.handshake-timeout", g.handshake_timeout);
        c.positive("grpc.idle-timeout", g.idle_timeout);
        c.positive("grpc.keepalive-interval", g.keepalive_interval);
        c.positive("grpc.keepalive-timeout", g.keepalive_timeout);
        let (cert, key) =
            (g.tls_cert_file.as_os_str().is_empty(), g.tls_key_file.as_os_str().is_empty());
        if cert != key {
            let (k, v) = if cert {
                ("grpc.tls-cert-file", &g.tls_cert_file)
            } else {
                ("grpc.tls-key-file", &g.tls_key_file)
            };
            c.fail(
                k,
                quoted(v.display()),
                "TLS needs both grpc.tls-cert-file and grpc.tls-key-file",
            );
        }
        if g.token.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
            c.fail("grpc.token", "(hidden)", "must not contain whitespace or control characters");
        }
    }

    /// `[coordinator]` and what coordinator mode asks of the other sections.
    fn check_coordinator(&self, c: &mut Checker) {
        for (key, value) in [
            ("node.advertise-ha", &self.node.advertise_ha),
            ("node.advertise-grpc", &self.node.advertise_grpc),
        ] {
            if !value.is_empty()
                && let Err(reason) = check_host_port(value)
            {
                c.fail(key, quoted(value), reason);
            }
        }
        let k = &self.coordinator;
        for (i, e) in k.endpoints.iter().enumerate() {
            let bare =
                e.strip_prefix("http://").or_else(|| e.strip_prefix("https://")).unwrap_or(e);
            if let Err(reason) = check_host_port(bare) {
                c.fail(&format!("coordinator.endpoints[{i}]"), quoted(e), reason);
            }
        }
        if !k.prefix.starts_with('/') || k.prefix.contains(char::is_whitespace) {
            c.fail(
                "coordinator.prefix",
                quoted(&k.prefix),
                "must start with / and hold no whitespace",
            );
        }
        let (cert, key) = (k.cert_file.as_os_str().is_empty(), k.key_file.as_os_str().is_empty());
        if cert != key {
            let (name, v) = if cert {
                ("coordinator.cert-file", &k.cert_file)
            } else {
                ("coordinator.key-file", &k.key_file)
            };
            c.fail(
                name,
                quoted(v.display()),
                "a client certificate needs both coordinator.cert-file and coordinator.key-file",
            );
        }
        if !cert && k.ca_file.as_os_str().is_empty() {
            c.fail(
                "coordinator.cert-file",
                quoted(k.cert_file.display()),
                "a client certificate needs coordinator.ca-file too (TLS to etcd)",
            );
        }
        if k.user.is_empty() != k.password.is_empty() {
            c.fail(
                "coordinator.user",
                quoted(&k.user),
                "user and password go together (HASYNC_COORDINATOR_PASSWORD sets the password)",
            );
        }
        c.positive("coordinator.retry", k.retry);
        c.positive("coordinator.timeout", k.timeout);
        if k.ttl < Duration::from_secs(2) {
            c.fail_duration(
                "coordinator.ttl",
                k.ttl,
                "must be at least 2s (etcd rounds leases to seconds)",
            );
        }
        if k.renew_interval.is_zero() || k.renew_interval * 2 >= k.ttl {
            c.fail_duration(
                "coordinator.renew-interval",
                k.renew_interval,
                format!(
                    "must be above 0 and below coordinator.ttl / 2 ({})",
                    format_duration(k.ttl / 2)
                ),
            );
        }
        if k.max_failovers_per_minute == 0 {
            c.fail("coordinator.max-failovers-per-minute", 0, "must be at least 1");
        }
        if k.max_concurrent_failovers == 0 {
            c.fail("coordinator.max-concurrent-failovers", 0, "must be at least 1");
        }
        if !k.enabled() {
            return;
        }
        for (key, value) in [("coordinator.cluster", &k.cluster), ("coordinator.group", &k.group)] {
            if !crate::config::is_record_name(value) {
                c.fail(
                    key,
                    quoted(value),
                    "is required with coordinator.endpoints: 1-64 of a-z A-Z 0-9 . _ -",
                );
            }
        }
        if self.node.name == NodeConfig::default().name
            || !crate::config::is_record_name(&self.node.name)
        {
            c.fail(
                "node.name",
                quoted(&self.node.name),
                "must be set explicitly in coordinator mode (unique in its group; 1-64 of a-z A-Z 0-9 . _ -)",
            );
        }
        if self.ha.replica_identity == ReplicaIdentity::Connection {
            c.fail(
                "ha.replica-identity",
                "\"connection\"",
                "is refused in coordinator mode: acks count only from registered members",
            );
        }
        if self.node.advertise_ha.is_empty() && self.ha.listen.ip().is_unspecified() {
            c.fail(
                "node.advertise-ha",
                "\"\"",
                "is required in coordinator mode while ha.listen is a wildcard address",
            );
        }
        if self.node.advertise_grpc.is_empty() && self.grpc.listen.ip().is_unspecified() {
            c.fail(
                "node.advertise-grpc",
                "\"\"",
                "is required in coordinator mode while grpc.listen is a wildcard address",
            );
        }
        if self.replication.mode == ReplicationMode::Sync
            && self.replication.sync_ack_replicas < k.min_sync_replicas
        {
            c.fail(
                "replication.sync-ack-replicas",
                self.replication.sync_ack_replicas,
                format!("is below coordinator.min-sync-replicas ({})", k.min_sync_replicas),
            );
        }
    }

    /// `[kubernetes]`: the role label follows the coordinator, so it needs coordinator mode;
    /// names and the API server address must be usable in the PATCH's URL.
    fn check_kubernetes(&self, c: &mut Checker) {
        let k = &self.kubernetes;
        if k.role_label && !self.coordinator.enabled() {
            c.fail(
                "kubernetes.role-label",
                true,
                "needs coordinator mode (coordinator.endpoints): the label follows the \
                 coordinator's state record",
            );
        }
        if !k.pod_name.is_empty() && !is_dns_subdomain(&k.pod_name) {
            c.fail(
                "kubernetes.pod-name",
                quoted(&k.pod_name),
                "must be a pod name: 1-253 of a-z 0-9 - . (starting and ending alphanumeric)",
            );
        }
        if !k.namespace.is_empty() && !is_dns_label(&k.namespace) {
            c.fail(
                "kubernetes.namespace",
                quoted(&k.namespace),
                "must be a namespace name: 1-63 of a-z 0-9 - (starting and ending alphanumeric)",
            );
        }
        if !k.api_server.is_empty()
            && let Err(reason) = api_server_host_port(&k.api_server)
        {
            c.fail("kubernetes.api-server", quoted(&k.api_server), reason);
        }
        if k.role_label && k.service_account_dir.as_os_str().is_empty() {
            c.fail(
                "kubernetes.service-account-dir",
                "\"\"",
                "must not be empty with kubernetes.role-label (the token and CA are read there)",
            );
        }
        c.positive("kubernetes.timeout", k.timeout);
    }

    fn check_listeners(&self, c: &mut Checker) {
        let listeners = [
            ("ha.listen", self.ha.listen),
            ("grpc.listen", self.grpc.listen),
            ("metrics.listen", self.metrics.listen),
        ];
        for (i, &(key, addr)) in listeners.iter().enumerate() {
            let clash = listeners[..i].iter().find(|(_, other)| conflicts(addr, *other));
            if let Some((other_key, _)) = clash {
                c.fail(key, quoted(addr), format!("uses the same port as `{other_key}`"));
            }
        }
    }
}

fn conflicts(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Checks `host:port` (`[v6]:port` for IPv6 literals) with a non-zero port.
fn check_host_port(value: &str) -> Result<(), String> {
    let usage = "must be host:port, e.g. \"10.0.0.1:10912\" or \"[::1]:10912\"";
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(format!("{usage} (no port)"));
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    if !port_ok {
        return Err(format!("{usage} (port {port:?} is not in 1..=65535)"));
    }
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && !host.contains([':', '[', ']', '/'])
                && !host.contains(char::is_whitespace)
        }
    };
    if !host_ok {
        return Err(format!("{usage} (bad host {host:?})"));
    }
    Ok(())
}

/// `value` as a TOML string literal.
/// A Kubernetes DNS label (namespaces): 1-63 of `a-z 0-9 -`, alphanumeric at both ends.
pub(crate) fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A Kubernetes DNS subdomain (pod names): 1-253 characters, dot-separated DNS labels.
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// The host (without brackets) and port of `kubernetes.api-server`: `https://host[:port]`
/// with no path (port 443 when left out).
pub(crate) fn api_server_host_port(url: &str) -> Result<(String, u16), String> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(
            "must be https://host:port (the bearer token is never sent in the clear)".into()
        );
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace)
    {
        return Err("must be https://host:port, without a path".into());
    }
    let bad_port = |p: &str| format!("port {p:?} is not a number in 1-65535");
    let parse_port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad_port(p));
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) =
            v6.split_once(']').ok_or("must be https://host:port (an IPv6 host in brackets)")?;
        match after {
            "" => (host, 443),
            p => (host, parse_port(p.strip_prefix(':').ok_or_else(|| bad_port(p))?)?),
        }
    } else {
        match rest.split_once(':') {
            None => (rest, 443),
            Some((host, p)) => (host, parse_port(p)?),
        }
    };
    if host.is_empty() {
        return Err("must be https://host:port: the host is missing".into());
    }
    Ok((host.to_owned(), port))
}

fn quoted(value: impl Display) -> String {
    format!("{:?}", value.to_string())
}

#[derive(Default)]
struct Checker {
    errors: Vec<Error>,
}

impl Checker {
    fn fail(&mut self, key: &str, value: impl Display, reason: impl Into<String>) {
        self.errors.push(Error::Invalid {
            key: key.to_owned(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    fn fail_size(&mut self, key: &str, value: ByteSize, reason: impl Into<String>) {
        self.fail(key, quoted(value), reason);
    }

    fn fail_duration(&mut self, key: &str, value: Duration, reason: impl Into<String>) {
        self.fail(key, quoted(format_duration(value)), reason);
    }

    fn positive(&mut self, key: &str, value: Duration) {
        if value.is_zero() {
            self.fail_duration(key, value, "must be greater than 0");
        }
    }
}

/// Parses tracing filter directives strictly (`log.filter`, `RUST_LOG`): every directive must
/// parse, else the parser's message.
pub fn parse_log_filter(directives: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    tracing_subscriber::EnvFilter::builder().parse(directives).map_err(|e| {
        format!("not tracing filter directives ({e}); e.g. \"info\" or \"hasync=debug,info\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_parse_strictly() {
        for good in ["info", "hasync=debug,info", "warn,hasync::ha=trace", "off"] {
            assert!(parse_log_filter(good).is_ok(), "{good}");
        }
        for bad in ["=[[", "info,=[[", "hasync=loud"] {
            assert!(parse_log_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_port_forms() {
        for good in ["10.0.0.1:10912", "master-0.hasync:10912", "[::1]:10912", "localhost:1"] {
            assert!(check_host_port(good).is_ok(), "{good}");
        }
        for bad in ["10.0.0.1", "10.0.0.1:", ":10912", "::1:10912", "h:0", "h:70000", "a b:1"] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn api_server_forms() {
        let hp = |u: &str| api_server_host_port(u);
        assert_eq!(hp("https://10.96.0.1:443"), Ok(("10.96.0.1".into(), 443)));
        assert_eq!(
            hp("https://kubernetes.default.svc"),
            Ok(("kubernetes.default.svc".into(), 443))
        );
        assert_eq!(hp("https://[fd00::1]:6443/"), Ok(("fd00::1".into(), 6443)));
        assert_eq!(hp("https://[fd00::1]"), Ok(("fd00::1".into(), 443)));
        for bad in [
            "http://10.0.0.1:443",
            "10.0.0.1:443",
            "https://",
            "https://:443",
            "https://h:0",
            "https://h:x",
            "https://fd00::1:443",
            "https://h:443/api",
            "https://[fd00::1]x",
        ] {
            assert!(hp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubernetes_names() {
        assert!(is_dns_label("hasync") && is_dns_label("a-1") && is_dns_label("0"));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("hasync-0") && is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("a..b") && !is_dns_subdomain("Hasync-0"));
    }

    #[test]
    fn listener_conflicts() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(conflicts(a("0.0.0.0:1"), a("127.0.0.1:1")));
        assert!(conflicts(a("127.0.0.1:1"), a("127.0.0.1:1")));
        assert!(!conflicts(a("127.0.0.1:1"), a("127.0.0.2:1")));
        assert!(!conflicts(a("0.0.0.0:0"), a("0.0.0.0:0")));
        assert!(!conflicts(a("0.0.0.0:1"), a("0.0.0.0:2")));
    }
}
