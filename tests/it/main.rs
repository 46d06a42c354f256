//! The one integration-test binary: topic modules share one link of the crate and of tonic.
mod cli;
mod commitlog;
mod config;
mod grpc;
mod ha_codec;
mod ha_progress;
mod ha_replication;
mod mapped_file;
mod record;
mod recovery;
mod support;
mod sync_replication;
mod metadata;
mod failover;
