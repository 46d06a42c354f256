//! The `hasync` command line: argument parsing (clap derive) and dispatch to one module per
//! subcommand. Every failure ends as one `error: ...` line on stderr and a non-zero exit code;
//! the gRPC client subcommands (`status`, `mode`, `put`, `read`, `health`, `cluster`,
//! `switchover`, `failover` ..., in [`client`]) pick
//! the code by kind of failure ([`client::EXIT_CODES`]).
//!
//! `serve` builds its configuration here (defaults < file < `HASYNC_*` environment < flags,
//! then [`Config::validate`]) so that [`serve::run`] always receives a valid one.

pub(crate) mod bench;
pub(crate) mod bench_cluster;
pub(crate) mod bench_costs;
pub(crate) mod bench_echo;
pub(crate) mod bench_pair;
pub(crate) mod bench_platform;
pub(crate) mod bench_plot;
pub mod client;
pub(crate) mod config_cmd;
pub mod controller;
pub(crate) mod cpu_latency;
mod env_errors;
pub(crate) mod logging;
pub(crate) mod quickstart;
mod quickstart_cluster;
pub(crate) mod serve;
pub(crate) mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{Config, Overrides};

/// hasync: a RocketMQ-compatible commitlog store with master->slave HA replication.
#[derive(Debug, Parser)]
#[command(name = "hasync", version, about, propagate_version = true)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node (master or slave).
    Serve(Box<ServeArgs>),
    /// Check a config file or print the documented defaults.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// A demonstration on embedded defaults in a temporary data directory.
    Quickstart(quickstart::QuickstartArgs),
    /// Benchmarks, each next to a baseline measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Show a node's role, offsets and replication progress (GetStatus / WatchStatus).
    Status(client::status::StatusArgs),
    /// Switch a master between SYNC and ASYNC replication (SetReplicationMode).
    Mode(client::mode::ModeArgs),
    /// Put messages on a master and summarise statuses, throughput and latency.
    Put(client::put::PutArgs),
    /// Read decoded messages from an offset, on a master or a slave; or the truncated tails a
    /// node kept aside (--tail-file, --tail-dir).
    Read(client::read::ReadArgs),
    /// Check a node's gRPC health (the node, and its replication role).
    Health(client::health::HealthArgs),
    /// Change a node's role, fenced by an epoch (ChangeRole); see docs/failover.md.
    #[command(subcommand)]
    Role(client::role::RoleCommand),
    /// Show a node's epoch history (GetEpochHistory).
    Epochs(client::role::EpochsArgs),
    /// The cluster's groups, decision history and pause switches (coordinator mode).
    #[command(subcommand)]
    Cluster(client::cluster::ClusterCommand),
    /// A zero-loss change of a group's master, carried out by the active controller.
    Switchover(client::cluster::SwitchoverArgs),
    /// A manual failover that may lose data (needs --accept-data-loss), carried out by the
    /// active controller.
    Failover(client::cluster::FailoverArgs),
    /// Run a standalone controller of a cluster (coordinator mode) until SIGINT or SIGTERM.
    Controller(controller::ControllerArgs),
    /// Show a node's metadata tables and their versions (Metadata.Get).
    Metadata(client::metadata::MetadataArgs),
    /// Create, delete or list topics (Metadata service).
    #[command(subcommand)]
    Topic(client::metadata::TopicCommand),
    /// Check a stopped node's data directory: every record of every segment, and the
    /// checkpoint; lists each damage with file, offset and what failed (exit 1 on damage).
    Verify(verify::VerifyArgs),
}

/// Arguments of `hasync serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Config file (TOML); without one the built-in defaults apply.
    #[arg(long, env = "HASYNC_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (defaults < file < environment < flags) as TOML,
    /// after validating it, and exit without serving.
    #[arg(long)]
    pub print_config: bool,
    /// Truncate the commitlog at corruption found below the checkpoint instead of refusing to
    /// start (what is cut is logged). Without it, such corruption stops start-up.
    #[arg(long)]
    pub repair: bool,
    /// Start although the epoch file is missing while the commitlog holds data (or a role
    /// file exists): a fresh epoch history, with a warning. Sets
    /// node.allow-missing-epoch-history.
    #[arg(long)]
    pub allow_missing_epoch_history: bool,
    /// Flags that override config-file keys.
    #[command(flatten)]
    pub overrides: Overrides,
}

impl ServeArgs {
    /// The effective configuration: the defaults, the config file over them, then the
    /// environment and flags; validated, with errors about overridden keys naming the flag.
    pub fn effective_config(&self) -> Result<Config, crate::config::Error> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        config.apply_overrides(&self.overrides);
        if self.allow_missing_epoch_history {
            config.node.allow_missing_epoch_history = true;
        }
        crate::app::validate(&config).map_err(|e| self.overrides.annotate(e))?;
        Ok(config)
    }
}

/// Parses the command line, runs the subcommand and turns its outcome into an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version come here too, with a success exit code.
            let code = ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            // A bad value that came from a HASYNC_* variable, not the flag: name the variable.
            match env_errors::from_environment(&e, std::env::args_os()) {
                Some(line) => logging::print_err(&line),
                None => {
                    let _ = e.print();
                }
            }
            return code;
        }
    };
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            logging::print_err(&format!("error: {}", format!("{e:#}").replace('\n', " ")));
            // Client commands fail with a documented exit code per kind of failure.
            match e.downcast_ref::<client::Failure>() {
                Some(f) => ExitCode::from(f.exit_code()),
                None => ExitCode::FAILURE,
            }
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            let config = args.effective_config()?;
            if args.print_config {
                logging::print_out(&config.to_toml_string()?);
                return Ok(ExitCode::SUCCESS);
            }
            serve::run(config, serve::ServeOptions { repair: args.repair })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(command) => config_cmd::run(command),
        Command::Quickstart(args) => quickstart::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Bench(command) => bench::run(command).map(|()| ExitCode::SUCCESS),
        Command::Status(args) => client_done(client::status::run(args)),
        Command::Mode(args) => client_done(client::mode::run(args)),
        Command::Put(args) => client_done(client::put::run(args)),
        Command::Read(args) => client_done(client::read::run(args)),
        Command::Health(args) => client_done(client::health::run(args)),
        Command::Role(cmd) => client_done(client::role::run(cmd)),
        Command::Epochs(args) => client_done(client::role::epochs(args)),
        Command::Cluster(cmd) => client_done(client::cluster::run(cmd)),
        Command::Switchover(args) => client_done(client::cluster::switchover(args)),
        Command::Failover(args) => client_done(client::cluster::failover(args)),
        Command::Controller(args) => {
            let config = args.effective_config()?;
            if args.print_config {
                logging::print_out(&config.to_toml_string()?);
                return Ok(ExitCode::SUCCESS);
            }
            controller::run(config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Metadata(args) => client_done(client::metadata::run(args)),
        Command::Topic(cmd) => client_done(client::metadata::topic(cmd)),
        Command::Verify(args) => verify::run(&args),
    }
}

fn client_done(outcome: Result<(), client::Failure>) -> anyhow::Result<ExitCode> {
    outcome.map(|()| ExitCode::SUCCESS).map_err(anyhow::Error::from)
}
