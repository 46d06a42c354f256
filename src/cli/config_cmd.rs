//! `hasync config check FILE` and `hasync config defaults`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use crate::cli::logging::print_out;
use crate::config::{Config, DEFAULTS_TOML};

/// `hasync config ...`.
#[derive(Clone, Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate a config file; prints `ok: FILE` or the problems (exit 1).
    Check {
        /// The config file (TOML).
        file: PathBuf,
    },
    /// Print the documented default config file; every key with its default value.
    Defaults,
}

/// Runs a `config` subcommand.
pub(crate) fn run(command: ConfigCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Check { file } => {
            let config = Config::load(&file)?;
            crate::app::validate(&config).with_context(|| format!("{}", file.display()))?;
            // RUST_LOG, when set, wins over log.filter at serve: a bad one fails there too.
            crate::cli::logging::check_rust_log()?;
            print_out(&format!("ok: {}\n", file.display()));
        }
        ConfigCommand::Defaults => print_out(DEFAULTS_TOML),
    }
    Ok(ExitCode::SUCCESS)
}
