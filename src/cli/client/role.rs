//! `hasync role master|slave ...` (ChangeRole) and `hasync epochs` (GetEpochHistory).

use clap::{Args, Subcommand};

use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::control::pb;

/// `hasync role ...`
#[derive(Debug, Clone, Subcommand)]
pub enum RoleCommand {
    /// Promote the node to master with an epoch above every epoch in its history.
    Master {
        /// The epoch of the change.
        #[arg(long)]
        epoch: u64,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Make the node a slave of a master (its log converges with the master's epoch history).
    Slave {
        /// The epoch of the change (the new master's).
        #[arg(long)]
        epoch: u64,
        /// The new master's HA address (host:port).
        #[arg(long, value_name = "ADDR")]
        master_ha: String,
        /// The new master's gRPC address (host:port); without it the node follows in classic
        /// mode (no epoch check), as it would a stock Java broker.
        #[arg(long, value_name = "ADDR", default_value = "")]
        master_grpc: String,
        /// Wipe the local log when it cannot converge with the master.
        #[arg(long)]
        force_resync: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
}

/// Runs `hasync role`.
pub(crate) fn run(cmd: RoleCommand) -> Result<(), Failure> {
    block_on(async move {
        let (conn, req) = match cmd {
            RoleCommand::Master { epoch, conn } => (
                conn,
                pb::ChangeRoleRequest {
                    role: pb::Role::Master as i32,
                    epoch,
                    ..Default::default()
                },
            ),
            RoleCommand::Slave { epoch, master_ha, master_grpc, force_resync, conn } => (
                conn,
                pb::ChangeRoleRequest {
                    role: pb::Role::Slave as i32,
                    epoch,
                    master_ha_address: master_ha,
                    master_grpc_address: master_grpc,
                    force_resync,
                    ..Default::default()
                },
            ),
        };
        let client = Client::connect(&conn).await?;
        let mut r = client.replication();
        let now = client.call("ChangeRole", r.change_role(req)).await?;
        let role = now.role().as_str_name().trim_start_matches("ROLE_").to_lowercase();
        println!("{} is now {role} at epoch {}", client.url(), now.epoch);
        Ok(())
    })
}

/// Arguments of `hasync epochs`.
#[derive(Debug, Clone, Args)]
pub struct EpochsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync epochs`.
pub(crate) fn epochs(args: EpochsArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let mut r = client.replication();
        let h = client
            .call("GetEpochHistory", r.get_epoch_history(pb::GetEpochHistoryRequest {}))
            .await?;
        if args.json {
            let entries: Vec<_> = h
                .entries
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "epoch": e.epoch,
                        "start_offset": e.start_offset,
                        "master_name": e.master_name,
                    })
                })
                .collect();
            let v = serde_json::json!({
                "entries": entries,
                "max_offset": h.max_offset,
                "role": h.role().as_str_name(),
                "epoch": h.epoch,
            });
            println!("{v}");
            return Ok(());
        }
        let role = h.role().as_str_name().trim_start_matches("ROLE_").to_lowercase();
        println!("{role} at epoch {}, max offset {}", h.epoch, h.max_offset);
        println!("{:>8}  {:>20}  opened by", "epoch", "start offset");
        for e in &h.entries {
            println!("{:>8}  {:>20}  {}", e.epoch, e.start_offset, e.master_name);
        }
        Ok(())
    })
}
