//! `hasync serve`: run a node. (Minimal for now: it reports the configuration it would run.)

use crate::config::Config;

/// Runs a node with an already validated configuration until it is shut down.
pub fn run(config: Config) -> anyhow::Result<()> {
    config.validate()?;
    println!(
        "hasync: node {} as {}, data {}, segment {}, ha {}, grpc {}, metrics {}, replication {}",
        config.node.name,
        config.node.role,
        config.node.data_dir.display(),
        config.store.segment_size,
        config.ha.listen,
        config.grpc.listen,
        config.metrics.listen,
        config.replication.mode,
    );
    Ok(())
}
