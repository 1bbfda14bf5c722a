//! The node's metrics for Prometheus (`metrics_address`, `--metrics-address`,
//! `MEMARTS_METRICS_ADDRESS`).
//!
//! Every slot keeps its own counters, gauges and latency histograms (`histogram.rs`, and
//! `engine/metrics.rs`, which lists them). One slot of the fleet, whichever binds the address
//! first, serves `GET /metrics` for the whole node (`endpoint.rs`): it asks every other slot for
//! its metrics over its socket (`Request::Metrics`), and prometheus-client encodes them all as one
//! OpenMetrics exposition, each point labelled with its `slot` (`exposition.rs`), with
//! `memarts_slot_up` 0 for a slot that did not answer. The other slots try the address again every
//! few seconds, so that the endpoint moves to another slot when the one serving it goes.

mod endpoint;
mod exposition;
mod histogram;

pub use endpoint::serve;
pub use exposition::encode;
pub use histogram::LatencyHistogram;

use memarts_protocol::{MetricFamily, MetricKind, MetricPoint, MetricValue, MetricsSnapshot};

/// Builds a slot's [`MetricsSnapshot`], one family after another.
#[derive(Default)]
pub struct Families(Vec<MetricFamily>);

impl Families {
    /// A family of points with labels.
    pub fn add(&mut self, name: &str, help: &str, kind: MetricKind, points: Vec<MetricPoint>) {
        self.0.push(MetricFamily { name: name.into(), help: help.into(), kind, points });
    }

    /// A family of one point without labels.
    pub fn one(&mut self, name: &str, help: &str, kind: MetricKind, value: f64) {
        self.add(name, help, kind, vec![point(&[], MetricValue::Number(value))]);
    }

    pub fn finish(self) -> MetricsSnapshot {
        MetricsSnapshot { families: self.0 }
    }
}

/// A point with `labels`.
pub fn point(labels: &[(&str, &str)], value: MetricValue) -> MetricPoint {
    MetricPoint { labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(), value }
}
