//! The metrics of a process that runs no node: `hasync controller`. Its registry holds
//! `hasync_build_info` and the controller's families of [`CoordinatorMetrics`]
//! (`hasync_controller_active`, `hasync_failovers_total`, `hasync_failover_duration_seconds`,
//! `hasync_promotion_blocked`); no node family, so no alert on nodes matches a controller.

use std::sync::Mutex;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::coordinator::CoordinatorMetrics;
use super::{BuildLabels, Format};

/// A standalone controller's registry.
#[derive(Debug)]
pub(crate) struct ControllerMetrics {
    registry: Registry,
    coordinator: CoordinatorMetrics,
    /// One scrape at a time.
    scrape: Mutex<()>,
}

impl ControllerMetrics {
    /// The registry of the controller named `name` (its `node.name`).
    pub(crate) fn new(name: &str) -> Self {
        let mut registry = Registry::with_prefix("hasync");
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                node: name.to_owned(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; labels carry the hasync version and the node name (node.name)",
            build_info,
        );
        let coordinator = CoordinatorMetrics::default();
        coordinator.register_controller(&mut registry);
        Self { registry, coordinator, scrape: Mutex::default() }
    }

    /// The handles the controller sets.
    pub(crate) fn coordinator(&self) -> CoordinatorMetrics {
        self.coordinator.clone()
    }

    /// The registry as text: what a scrape answers.
    pub(crate) fn encode(&self, format: Format) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        super::encode_registry(&self.registry, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_serves_its_families_and_no_node_family() {
        let m = ControllerMetrics::new("ctl-1");
        m.coordinator().set_controller_active(true);
        m.coordinator().declare(&["failover"], &["paused"]);
        m.coordinator().failover("failover", "promoted", Some(1.5));
        let text = m.encode(Format::Prometheus);
        for needle in [
            "hasync_build_info{version=",
            "node=\"ctl-1\"",
            "hasync_controller_active 1",
            "hasync_failovers_total{kind=\"failover\",result=\"promoted\"} 1",
            "hasync_failover_duration_seconds_count 1",
            "hasync_promotion_blocked{reason=\"paused\"} 0",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        for absent in ["hasync_voters", "hasync_coordinator_lease", "hasync_role", "hasync_epoch"] {
            assert!(!text.contains(absent), "{absent} in:\n{text}");
        }
    }
}
