//! The one integration-test binary: topic modules share one link of the crate and of tonic.
mod cli;
mod cli_client;
mod commitlog;
mod config;
mod docs;
mod failover;
mod grpc;
mod ha_codec;
mod ha_progress;
mod ha_replication;
mod mapped_file;
mod metadata;
mod record;
mod recovery;
mod support;
mod sync_replication;
