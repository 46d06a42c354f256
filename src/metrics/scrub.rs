//! The background scrub's families (`hasync_scrub_*`): progress as counters, damage and the
//! configured rate as gauges, all copied from [`ScrubGauges`] at scrape time.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::gauge_u64;

/// The scrub's progress and findings, as the node hands them over (plain values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ScrubGauges {
    /// `store.scrub-rate`, bytes per second (0: off).
    pub(crate) rate_bytes_per_sec: u64,
    /// Passes completed.
    pub(crate) passes: u64,
    /// Segment checks completed.
    pub(crate) segments_checked: u64,
    /// Bytes checked.
    pub(crate) bytes_checked: u64,
    /// Segments whose last check found damage.
    pub(crate) damaged_segments: u64,
    /// When the last pass completed, Unix ms (0: none yet).
    pub(crate) last_pass_unix_ms: i64,
}

/// The registered families.
#[derive(Debug, Default)]
pub(super) struct ScrubMetrics {
    passes: Counter,
    segments: Counter,
    bytes: Counter,
    damaged: Gauge,
    rate: Gauge,
    last_pass: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl ScrubMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "scrub_passes",
            "Passes of the background scrub over every sealed segment completed",
            self.passes.clone(),
        );
        r.register(
            "scrub_checked_segments",
            "Sealed segments the background scrub checked (CRC and structure of every record)",
            self.segments.clone(),
        );
        r.register("scrub_checked_bytes", "Bytes the background scrub checked", self.bytes.clone());
        r.register(
            "scrub_damaged_segments",
            "Sealed segments whose last scrub found a damaged record (reads of it answer DATA_LOSS)",
            self.damaged.clone(),
        );
        r.register(
            "scrub_rate_bytes_per_second",
            "store.scrub-rate: the bytes per second the scrub reads at most (0: off)",
            self.rate.clone(),
        );
        r.register(
            "scrub_last_pass_timestamp_seconds",
            "When the last scrub pass completed, Unix seconds (0: none yet)",
            self.last_pass.clone(),
        );
    }

    pub(super) fn refresh(&self, s: &ScrubGauges) {
        for (counter, value) in [
            (&self.passes, s.passes),
            (&self.segments, s.segments_checked),
            (&self.bytes, s.bytes_checked),
        ] {
            counter.inc_by(value.saturating_sub(counter.get()));
        }
        self.damaged.set(gauge_u64(s.damaged_segments));
        self.rate.set(gauge_u64(s.rate_bytes_per_sec));
        self.last_pass.set(s.last_pass_unix_ms as f64 / 1000.0);
    }
}
