//! Coordinator mode's families: the member agent's lease and leader key, the controller's
//! activity, failovers by kind and result, their duration, blocked promotions by reason, and
//! the published voters. The agent and the controller hold a clone of [`CoordinatorMetrics`]
//! and set them as they go. A node registers every family; `hasync controller` only the
//! controller's ([`super::ControllerMetrics`]); a default one is registered nowhere (tests).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindResultLabels {
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BlockedLabels {
    reason: String,
}

fn duration_histogram() -> Histogram {
    // 100 ms .. ~7 min.
    Histogram::new(exponential_buckets(0.1, 2.0, 13))
}

/// The coordinator's metric handles; clones share them.
#[derive(Debug, Clone)]
pub(crate) struct CoordinatorMetrics {
    lease_remaining: Gauge<f64, std::sync::atomic::AtomicU64>,
    leader: Gauge,
    controller_active: Gauge,
    failovers: Family<KindResultLabels, Counter>,
    duration: Histogram,
    blocked: Family<BlockedLabels, Gauge>,
    voters: Gauge,
    required_acks: Gauge,
    degraded: Gauge,
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        Self {
            lease_remaining: Gauge::default(),
            leader: Gauge::default(),
            controller_active: Gauge::default(),
            failovers: Family::default(),
            duration: duration_histogram(),
            blocked: Family::default(),
            voters: Gauge::default(),
            required_acks: Gauge::default(),
            degraded: Gauge::default(),
        }
    }
}

impl CoordinatorMetrics {
    /// Every family: a node's registry (its member agent and, when it runs one, its
    /// controller).
    pub(super) fn register(&self, r: &mut Registry) {
        self.register_member(r);
        self.register_controller(r);
    }

    /// The member agent's families: the lease, the leader key, the published V.
    fn register_member(&self, r: &mut Registry) {
        r.register(
            "coordinator_lease_remaining_seconds",
            "TTL left now on the member's coordinator lease: from the send time of the last \
             acknowledged renewal, so it falls while the coordinator is unreachable (0: none)",
            self.lease_remaining.clone(),
        );
        r.register(
            "coordinator_leader",
            "1 while this node holds its group's leader key (it is the group's master)",
            self.leader.clone(),
        );
        r.register(
            "voters",
            "Members of the published voting membership V of this node's group (master included)",
            self.voters.clone(),
        );
        r.register(
            "coordinator_required_acks",
            "k as this node's group publishes it: member acks a SYNC put needs (0 in ASYNC and \
             while degraded)",
            self.required_acks.clone(),
        );
        r.register(
            "coordinator_sync_degraded",
            "1 while this node's group is SYNC with k = 0 (coordinator.allow-degrade): PUT_OK \
             needs no member's ack and automatic failover is impossible (sync_degraded)",
            self.degraded.clone(),
        );
    }

    /// The controller's families (all a standalone controller serves).
    pub(super) fn register_controller(&self, r: &mut Registry) {
        r.register(
            "controller_active",
            "1 while this process runs the cluster's active controller",
            self.controller_active.clone(),
        );
        r.register(
            "failovers",
            "Decisions of this controller that opened an epoch, by kind (failover, switchover, \
             manual_failover) and result (promoted)",
            self.failovers.clone(),
        );
        r.register(
            "failover_duration_seconds",
            "From a decision's epoch allocation to the new master's promotion",
            self.duration.clone(),
        );
        r.register(
            "promotion_blocked",
            "1 per group and reason while this controller finds a failover blocked (docs/failover.md \
             lists the reasons)",
            self.blocked.clone(),
        );
    }

    /// The lease's TTL left now.
    pub(crate) fn set_lease_remaining(&self, seconds: f64) {
        self.lease_remaining.set(seconds);
    }

    /// Whether this node holds its group's leader key.
    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Whether the active controller runs here.
    pub(crate) fn set_controller_active(&self, active: bool) {
        self.controller_active.set(i64::from(active));
    }

    /// |V| as the state record publishes it.
    pub(crate) fn set_voters(&self, n: usize) {
        self.voters.set(n as i64);
    }

    /// k and whether the group is degraded, as its state record publishes them.
    pub(crate) fn set_rule(&self, required_acks: u32, degraded: bool) {
        self.required_acks.set(i64::from(required_acks));
        self.degraded.set(i64::from(degraded));
    }

    /// One decision done: its kind, result and duration.
    pub(crate) fn failover(&self, kind: &str, result: &str, seconds: Option<f64>) {
        self.failovers
            .get_or_create(&KindResultLabels { kind: kind.into(), result: result.into() })
            .inc();
        if let Some(s) = seconds {
            self.duration.observe(s);
        }
    }

    /// Sets the blocked gauges: 1 for each reason of `all` that is in `on`, 0 for the others.
    pub(crate) fn set_blocked(&self, all: &[&str], on: &[&str]) {
        for r in all {
            self.blocked
                .get_or_create(&BlockedLabels { reason: (*r).into() })
                .set(i64::from(on.contains(r)));
        }
    }

    /// Counters at 0 for every kind of decision, so a dashboard sees the series before the
    /// first failover.
    pub(crate) fn declare(&self, kinds: &[&str], reasons: &[&str]) {
        for k in kinds {
            let _ = self
                .failovers
                .get_or_create(&KindResultLabels { kind: (*k).into(), result: "promoted".into() });
        }
        self.set_blocked(reasons, &[]);
    }
}
