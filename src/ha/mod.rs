//! The HA data plane: RocketMQ's classic replication protocol (port 10912), master and slave.
//!
//! `ha` knows nothing of gRPC. The pure modules (`codec`, `progress`, `group_transfer`) are tested
//! without sockets, files or clocks. `progress` holds the one replica table; `error` says why a
//! connection ended; the master and the slave increment the `metrics` handles they are given.

pub mod codec;
pub mod error;
pub mod group_transfer;
pub mod master;
pub mod progress;
pub mod slave;
pub mod status;
