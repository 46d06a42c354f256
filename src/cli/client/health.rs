//! `hasync health [--service NAME]`: standard gRPC health checks of the node as a whole
//! (service "") and of its replication role (`hasync.v1.Replication`); exit code 7 when one is
//! not SERVING, with the reason taken from the node's status when it can be read.

use clap::Args;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::cli::client::{Client, Connection, Failure, FailureKind, block_on};
use crate::control::pb;

/// Arguments of `hasync health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Check only this service ("" is the node as a whole); default: "" and
    /// hasync.v1.Replication.
    #[arg(long, value_name = "NAME")]
    pub(crate) service: Option<String>,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// Runs `hasync health`.
pub(crate) fn run(args: HealthArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let services = match args.service {
            Some(s) => vec![s],
            None => vec![String::new(), crate::control::REPLICATION_SERVICE.to_owned()],
        };
        let mut h = client.health();
        let mut failing = Vec::new();
        for service in services {
            let req = HealthCheckRequest { service: service.clone() };
            let answer = client.call("Health/Check", h.check(req)).await?;
            let status = ServingStatus::try_from(answer.status).unwrap_or(ServingStatus::Unknown);
            let shown = if service.is_empty() { "\"\" (the node)" } else { service.as_str() };
            println!("{shown:<24} {}", status.as_str_name());
            if status != ServingStatus::Serving {
                failing.push(format!("{shown} is {}", status.as_str_name()));
            }
        }
        if failing.is_empty() {
            return Ok(());
        }
        let why = reason(&client).await.map(|r| format!(" ({r})")).unwrap_or_default();
        Err(Failure::new(
            FailureKind::NotServing,
            format!("{}: {}{why}", client.url(), failing.join(", ")),
        ))
    })
}

/// The facts health is decided on, from GetStatus (best effort; health is re-evaluated on the
/// node every 200 ms, so it can lag a mode change).
async fn reason(client: &Client) -> Option<String> {
    let mut r = client.replication();
    let s = client.call("GetStatus", r.get_status(pb::GetStatusRequest {})).await.ok()?;
    match (s.role(), &s.master_link) {
        (pb::Role::Master, _) => Some(format!(
            "master, {}, {} in-sync slave(s), k = {}",
            s.mode().as_str_name().trim_start_matches("REPLICATION_MODE_"),
            s.in_sync_replicas,
            s.sync_ack_replicas
        )),
        (pb::Role::Slave, Some(l)) if !l.connected => {
            Some(format!("slave not connected to its master {}", l.address))
        }
        (pb::Role::Slave, Some(l)) => match l.master_max_offset {
            Some(m) => Some(format!("slave {} bytes behind its master", m - s.max_offset)),
            None => Some("slave has not heard from its master yet".into()),
        },
        _ => None,
    }
}
