//! A slot's metrics as data: the answer to `Request::Metrics`. The slot that serves the node's
//! Prometheus endpoint asks every slot of the fleet for these over its socket and encodes them all
//! as one exposition, each point labelled with its slot.
//!
//! Families carry their own name, help and kind, so that a metric a slot gains is served without
//! a change to this struct (the rule of `AdmissionStatus`: postcard has no optional fields).

use serde::{Deserialize, Serialize};

/// What a family's points are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetricKind {
    /// Only grows (the exposition adds `_total` to the name).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// One value of a family, with its labels (besides the slot's, which the endpoint adds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    pub labels: Vec<(String, String)>,
    pub value: MetricValue,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetricValue {
    /// A counter's or a gauge's value.
    Number(f64),
    /// A histogram: the sum and count of its observations, and per bucket its upper bound and the
    /// observations in it (not cumulative), the last bound `+Inf`.
    Histogram { sum: f64, count: u64, buckets: Vec<(f64, u64)> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricFamily {
    /// Without the `memarts_` prefix and, for a counter, without `_total`.
    pub name: String,
    pub help: String,
    pub kind: MetricKind,
    pub points: Vec<MetricPoint>,
}

/// Every metric of one slot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    pub families: Vec<MetricFamily>,
}
