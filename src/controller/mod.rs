//! The controller: one active per cluster (an engine campaign), the others standing by. It
//! watches every group's records ([`groups`]: one prefix watch) and acts only through
//! compare-and-swap on the state record:
//! failover when a master's lease expires, switchover and the manual override on request.
//! The pure rules are in [`decision`]; the rest runs them against the engine and the nodes.
//!
//! [`cluster_api`] is the Cluster service's view of the records (status, history, the
//! operator's requests and pause switches); any node with a coordinator serves it.

pub mod cluster_api;
pub mod decision;
pub mod groups;
pub mod run;
pub mod slots;

use std::time::Duration;

use crate::config::{Config, ReplicationMode};
use crate::control::client::ClientOptions;
use crate::coordinator::records::Mode;

/// The controller's options from a node's (or `hasync controller`'s) configuration.
pub fn options_of(config: &Config, name: &str) -> run::ControllerOptions {
    let c = &config.coordinator;
    let heartbeat =
        config.ha.heartbeat_interval.min(crate::coordinator::mode::COORDINATOR_HEARTBEAT_MAX);
    // A frame (data or heartbeat) arrives every heartbeat; a member record is at most one
    // renewal old: younger than two heartbeats plus a renewal and a second of slack is alive.
    let prevote = heartbeat * 2 + c.renew_interval + Duration::from_secs(1);
    let mut client = ClientOptions::to("");
    client.token = config.grpc.token.clone();
    client.connect_timeout = c.timeout;
    client.request_timeout = Some(config.replication.slave_timeout + c.timeout * 2);
    if !config.slave.master_grpc_ca_file.as_os_str().is_empty() {
        client.ca_file = Some(config.slave.master_grpc_ca_file.clone());
    }
    run::ControllerOptions {
        name: name.to_owned(),
        ttl: c.ttl,
        tick: Duration::from_millis(500),
        client,
        policy: decision::FailoverPolicy {
            prevote_frame_age_ms_max: prevote.as_millis() as u64,
            hold_down_ms: c.hold_down.as_millis() as u64,
            failovers_per_minute_max: c.max_failovers_per_minute,
            concurrent_failovers_max: c.max_concurrent_failovers,
            async_failover: c.async_failover,
            async_lag_bytes_max: c.max_lag_on_failover.bytes(),
            async_lag_ms_max: c.max_lag_time_on_failover.as_millis() as u64,
            lease_ttl_ms: c.ttl.as_millis() as u64,
        },
        defaults: decision::RuleDefaults {
            k: config.replication.sync_ack_replicas,
            mode: match config.replication.mode {
                ReplicationMode::Sync => Mode::Sync,
                ReplicationMode::Async => Mode::Async,
            },
        },
        retry: c.retry,
    }
}
