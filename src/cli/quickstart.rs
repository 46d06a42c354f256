//! `hasync quickstart`: a demonstration on embedded defaults in a temporary data directory.
//!
//! Today it shows the store: it appends sample messages, prints where they landed, stops and
//! reopens the store (a clean restart keeps every record and the queue offsets), and then keeps
//! appending until Ctrl-C or `--duration`. The data-plane issue turns it into a replicating
//! master/slave pair.

use std::time::{Duration, Instant};

use clap::Args;

use crate::cli::bench::sample_message;
use crate::config::Config;

/// Arguments of `hasync quickstart`.
#[derive(Debug, Clone, Args)]
pub struct QuickstartArgs {
    /// Stop after this long instead of waiting for Ctrl-C (e.g. "10s").
    #[arg(long, value_parser = crate::config::units::parse_duration)]
    pub duration: Option<Duration>,
}

/// Runs the quickstart.
pub fn run(args: &QuickstartArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("hasync-quickstart-").tempdir()?;
    let mut config = Config::default();
    config.node.data_dir = dir.path().to_path_buf();
    config.store.segment_size = crate::config::units::ByteSize::mib(64);
    config.store.max_message_size = crate::config::units::ByteSize::kib(512);
    config.validate()?;
    crate::cli::serve::init_tracing(config.log.format, "warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        println!("hasync quickstart: data dir {}", dir.path().display());
        let log = crate::cli::serve::open_store(&config, false)?;
        let batch: Vec<_> = (0..10).map(|i| sample_message("QuickstartTopic", i % 4, 256)).collect();
        let r = log.append(&batch)?;
        println!("appended {} records:", r.records.len());
        for (i, rec) in r.records.iter().enumerate() {
            println!(
                "  #{i:<2} queue {} offset {:>6} size {} queue-offset {}",
                i % 4,
                rec.offset,
                rec.size,
                rec.queue_offset
            );
        }
        let end = r.end_offset;
        tokio::task::spawn_blocking(move || log.close()).await??;
        let log = crate::cli::serve::open_store(&config, false)?;
        println!(
            "reopened after a clean stop: max offset {} (was {end}), next queue offset of queue 0: {}",
            log.max_offset(),
            log.next_queue_offset("QuickstartTopic", 0)
        );
        println!("appending 1 record every 100 ms; Ctrl-C stops");
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = crate::cli::serve::shutdown_signal() => break,
                _ = tick.tick() => {
                    if args.duration.is_some_and(|d| started.elapsed() >= d) {
                        break;
                    }
                    log.append(&[sample_message("QuickstartTopic", 0, 256)])?;
                }
            }
        }
        println!(
            "stopping: min {} max {} flushed {}",
            log.min_offset(),
            log.max_offset(),
            log.flushed_offset()
        );
        tokio::task::spawn_blocking(move || log.close()).await??;
        println!("stopped cleanly");
        anyhow::Ok(())
    })
}
