//! The HA data plane: RocketMQ's classic replication protocol (port 10912), master and slave.
//!
//! `ha` knows nothing of gRPC. The pure modules (`codec`, `progress`, `group_transfer`) are tested
//! without sockets, files or clocks. `progress` holds the one replica table; `error` says why a
//! connection ended; the master and the slave increment the `metrics` handles they are given.
//!
//! Only `status`'s `ReplicaStatus`, `MasterLinkStatus` and `DamagedRecord` are public (they are fields of
//! `node::NodeStatus`); the rest is the crate's, except the items of `codec`, `progress` and
//! `group_transfer` that the benches measure: those are `pub` so that the benches' re-export
//! module, the top layer of the crate's module map, can re-export them, and are reached from
//! outside only through it. The master and the slave themselves are tested in
//! `replication_tests`: over stores in temp dirs, with raw peers speaking the wire bytes
//! (`test_peers` starts them with options the configuration cannot express).

pub(crate) mod backoff;
pub(crate) mod close_log;
pub(crate) mod codec;
#[cfg(test)]
mod codec_tests;
pub(crate) mod error;
pub(crate) mod group_transfer;
pub(crate) mod held_port;
#[cfg(test)]
mod hostile_tests;
pub(crate) mod identity;
#[cfg(test)]
mod identity_tests;
pub(crate) mod master;
pub(crate) mod progress;
#[cfg(test)]
mod progress_tests;
#[cfg(test)]
mod replication_tests;
pub(crate) mod slave;
pub mod status;
#[cfg(test)]
mod test_peers;
#[cfg(test)]
mod voters_tests;
