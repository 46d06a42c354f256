//! `hasync quickstart`: a master and a slave on loopback with embedded defaults, in temporary
//! data directories, replicating over real sockets; sample messages flow and the status shows
//! the slave keeping up, until Ctrl-C or `--duration`.

use std::time::{Duration, Instant};

use clap::Args;

use crate::cli::bench::sample_message;
use crate::config::units::ByteSize;
use crate::config::{Config, Role};
use crate::node::Node;

/// Arguments of `hasync quickstart`.
#[derive(Debug, Clone, Args)]
pub struct QuickstartArgs {
    /// Stop after this long instead of waiting for Ctrl-C (e.g. "10s").
    #[arg(long, value_parser = crate::config::units::parse_duration)]
    pub duration: Option<Duration>,
}

fn node_config(dir: &std::path::Path, name: &str) -> Config {
    let mut c = Config::default();
    c.node.name = name.to_owned();
    c.node.data_dir = dir.join(name);
    c.store.segment_size = ByteSize::mib(64);
    c.store.max_message_size = ByteSize::kib(512);
    c.ha.listen = "127.0.0.1:0".parse().expect("literal address");
    c.grpc.listen = "127.0.0.1:0".parse().expect("literal address");
    c.metrics.listen = "127.0.0.1:0".parse().expect("literal address");
    c.slave.reconnect_backoff = Duration::from_millis(500);
    c
}

/// Runs the quickstart.
pub fn run(args: &QuickstartArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("hasync-quickstart-").tempdir()?;
    crate::cli::serve::init_tracing(crate::config::LogFormat::Text, "warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let master_cfg = node_config(dir.path(), "master");
        master_cfg.validate()?;
        let master = Node::start(master_cfg, false).await?;
        let ha = master.ha_addr().expect("a master listens");
        let mut slave_cfg = node_config(dir.path(), "slave");
        slave_cfg.node.role = Role::Slave;
        slave_cfg.slave.master_ha = ha.to_string();
        slave_cfg.validate()?;
        let slave = Node::start(slave_cfg, false).await?;
        println!(
            "hasync quickstart: master (HA {ha}) and slave on loopback, data in {}",
            dir.path().display()
        );
        println!("putting 10 sample messages every 100 ms; Ctrl-C stops");
        println!(
            "{:>8} {:>12} {:>12} {:>10} {:>9} {:>6}",
            "time", "master max", "slave max", "lag bytes", "lag ms", "link"
        );
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut shown = Instant::now();
        let stop = crate::cli::serve::shutdown_signal();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => {}
            }
            if args.duration.is_some_and(|d| started.elapsed() >= d) {
                break;
            }
            let batch: Vec<_> =
                (0..10).map(|i| sample_message("QuickstartTopic", i % 4, 256)).collect();
            master.store().append(&batch)?;
            if shown.elapsed() >= Duration::from_secs(1) {
                shown = Instant::now();
                print_status(started, &master, &slave);
            }
        }
        // Let the slave take the last batch, then show the final state.
        let until = Instant::now() + Duration::from_secs(5);
        while slave.store().max_offset() < master.store().max_offset() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        print_status(started, &master, &slave);
        let same = identical(&master, &slave);
        println!(
            "slave holds {} of the master's {} bytes, byte-identical: {same}",
            slave.store().max_offset() - slave.store().min_offset(),
            master.store().max_offset() - master.store().min_offset()
        );
        slave.shutdown().await?;
        master.shutdown().await?;
        println!("stopped cleanly");
        anyhow::ensure!(same, "the slave's bytes differ from the master's");
        anyhow::Ok(())
    })
}

fn print_status(started: Instant, master: &Node, slave: &Node) {
    let m = master.master().expect("master role");
    let r = m.replicas();
    let (lag_bytes, lag_ms) = r.first().map_or((0, 0), |r| (r.lag_bytes, r.lag_millis));
    let link = slave.slave().map(|s| s.status()).unwrap_or_default();
    println!(
        "{:>7.1}s {:>12} {:>12} {:>10} {:>9} {:>6}",
        started.elapsed().as_secs_f64(),
        master.store().max_offset(),
        slave.store().max_offset(),
        lag_bytes,
        lag_ms,
        if link.connected { "up" } else { "down" }
    );
}

fn identical(master: &Node, slave: &Node) -> bool {
    let (m, s) = (master.store(), slave.store());
    if m.max_offset() != s.max_offset() {
        return false;
    }
    let mut at = s.min_offset();
    while let Ok(Some(b)) = s.read(at, usize::MAX) {
        match m.read(at, b.len()) {
            Ok(Some(mb)) if mb[..] == b[..] => at += b.len() as u64,
            _ => return false,
        }
    }
    at == s.max_offset()
}
