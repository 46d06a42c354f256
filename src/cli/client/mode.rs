//! `hasync mode sync|async [--sync-ack-replicas K]`: SetReplicationMode on a master.

use clap::Args;

use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::config::ReplicationMode;
use crate::control::pb;

/// Arguments of `hasync mode`.
#[derive(Debug, Clone, Args)]
pub struct ModeArgs {
    /// The replication mode for the next put.
    #[arg(value_enum)]
    pub(crate) mode: ReplicationMode,
    /// Also set k, the slave acks a SYNC put waits for (at least 1).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) sync_ack_replicas: Option<u32>,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync mode`.
pub(crate) fn run(args: ModeArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let mode = match args.mode {
            ReplicationMode::Sync => pb::ReplicationMode::Sync,
            ReplicationMode::Async => pb::ReplicationMode::Async,
        };
        let req = pb::SetReplicationModeRequest {
            mode: mode as i32,
            sync_ack_replicas: args.sync_ack_replicas,
        };
        let mut r = client.replication();
        let now = client.call("SetReplicationMode", r.set_replication_mode(req)).await?;
        let k = now.sync_ack_replicas;
        match now.mode() {
            pb::ReplicationMode::Sync => {
                println!("replication mode SYNC: a put waits for {k} slave ack(s)");
            }
            other => println!(
                "replication mode {}: a put returns once stored (k = {k} applies in SYNC)",
                other.as_str_name().trim_start_matches("REPLICATION_MODE_")
            ),
        }
        Ok(())
    })
}
