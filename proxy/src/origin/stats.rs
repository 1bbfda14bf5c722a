//! What the origin's requests did, for `memarts status` and the Prometheus endpoint: counts, and
//! per kind of request its outcomes and a latency histogram. Every attempt is one request (a
//! retried GET is two).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use memarts_protocol::{MetricPoint, MetricValue};

use super::OriginError;
use crate::metrics::LatencyHistogram;

/// A kind of origin request, as the metrics label it (`op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Head,
    Get,
    List,
    Delete,
    /// The start of an upload (its parts are sent in the background).
    Put,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Head, Op::Get, Op::List, Op::Delete, Op::Put];

    pub fn label(self) -> &'static str {
        match self {
            Op::Head => "head",
            Op::Get => "get",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Put => "put",
        }
    }
}

/// How a request ended, as the metrics label it (`outcome`).
const OUTCOMES: [&str; 7] = ["ok", "not_found", "changed", "denied", "throttled", "malformed", "failed"];

fn outcome(result: Result<(), &OriginError>) -> usize {
    match result {
        Ok(()) => 0,
        Err(OriginError::NotFound(_) | OriginError::NoSuchBucket(_)) => 1,
        Err(OriginError::Stale(_)) => 2,
        Err(OriginError::PermissionDenied(_) | OriginError::Credentials(_)) => 3,
        Err(e) if e.is_throttle() => 4,
        Err(OriginError::Malformed(_)) => 5,
        Err(_) => 6,
    }
}

#[derive(Debug, Default)]
struct OpStats {
    outcomes: [AtomicU64; OUTCOMES.len()],
    latency: LatencyHistogram,
}

/// Counters the origin keeps.
#[derive(Debug, Default)]
pub struct OriginStats {
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub bytes: AtomicU64,
    /// Attempts the origin answered with 503 SlowDown or 429 (see [`OriginError::is_throttle`]).
    pub throttled: AtomicU64,
    by_op: [OpStats; Op::ALL.len()],
}

impl OriginStats {
    /// Records one request of kind `op` that started at `started` and ended with `result`.
    pub fn record(&self, op: Op, started: Instant, result: Result<(), &OriginError>) {
        let s = &self.by_op[op as usize];
        s.outcomes[outcome(result)].fetch_add(1, Ordering::Relaxed);
        s.latency.observe(started.elapsed());
    }

    /// Requests by kind and outcome (only the outcomes that happened), labelled `op` and `outcome`.
    pub fn outcome_points(&self) -> Vec<MetricPoint> {
        let mut points = Vec::new();
        for op in Op::ALL {
            for (i, name) in OUTCOMES.iter().enumerate() {
                let n = self.by_op[op as usize].outcomes[i].load(Ordering::Relaxed);
                if n > 0 {
                    points.push(MetricPoint {
                        labels: vec![("op".into(), op.label().into()), ("outcome".into(), (*name).into())],
                        value: MetricValue::Number(n as f64),
                    });
                }
            }
        }
        points
    }

    /// The latency of each kind of request, labelled `op`.
    pub fn latency_points(&self) -> Vec<MetricPoint> {
        Op::ALL
            .iter()
            .map(|&op| MetricPoint {
                labels: vec![("op".into(), op.label().into())],
                value: self.by_op[op as usize].latency.value(),
            })
            .collect()
    }
}
