//! `hasync verify`: checks a stopped node's data directory ([`crate::store::verify`]) and prints
//! each segment checked, its records, and every damage with file, offset and what failed. Exits
//! non-zero when it finds damage. Holds the data-dir lock while it runs (a running node's
//! directory is refused); reads only, changes nothing else.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::Config;
use crate::store::verify::{SegmentReport, verify_data_dir_with};

/// Arguments of `hasync verify`.
#[derive(Clone, Debug, clap::Args)]
pub struct VerifyArgs {
    /// The data directory to check (default: the config file's `node.data-dir`).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Config file whose `node.data-dir` to check when `--data-dir` is not given; its
    /// `store.max-message-size` bounds the largest record (the default's when not given).
    #[arg(long, env = "HASYNC_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Runs the check; `Ok(FAILURE)` after printing the damage found.
pub(crate) fn run(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let config = match &args.config {
        Some(file) => Config::load(file)?,
        None => Config::default(),
    };
    let dir = args.data_dir.clone().unwrap_or_else(|| config.node.data_dir.clone());
    let max_message_size = config.store.max_message_size.bytes() as usize;
    if !dir.join("commitlog").is_dir() {
        anyhow::bail!("{} is not a data directory: it has no commitlog directory", dir.display());
    }
    // Before anything in the directory is read: a running node's directory is refused (the
    // lock `serve` holds), and no node starts on it while the check runs.
    let _lock = crate::store::DataDirLock::acquire(&dir)?;
    let report = verify_data_dir_with(&dir, max_message_size, print_segment)?;
    let stop = if report.clean { "clean" } else { "unclean (a start recovers the tail)" };
    let flushed =
        report.checkpoint_flushed.map_or_else(|| "no checkpoint".to_owned(), |f| f.to_string());
    println!(
        "{}: {} segment(s), {} record(s); last stop {stop}; checkpoint flushed offset {flushed}",
        dir.display(),
        report.segments.len(),
        report.records()
    );
    if let Some(cut) = report.unfinished_cut {
        let what =
            if cut.wipe { "a wipe".to_owned() } else { format!("a cut to offset {}", cut.offset) };
        println!(
            "unfinished: {what}, interrupted before its checkpoint; the next start finishes it"
        );
    }
    if report.damage.is_empty() {
        println!("no damage found");
        return Ok(ExitCode::SUCCESS);
    }
    for d in &report.damage {
        println!("damage: {} at offset {}: {}", d.file.display(), d.offset, d.reason);
    }
    eprintln!("error: {} damaged place(s) in {}", report.damage.len(), dir.display());
    Ok(ExitCode::FAILURE)
}

fn print_segment(s: &SegmentReport) {
    let state = match (&s.damage, s.sealed) {
        (Some(d), _) => format!("DAMAGED at offset {}: {}", d.offset, d.reason),
        (None, true) => "sealed, intact".to_owned(),
        (None, false) => format!("intact, records end at offset {}", s.ends_at),
    };
    println!("segment {}: {} record(s), {state}", s.file.display(), s.records);
}
