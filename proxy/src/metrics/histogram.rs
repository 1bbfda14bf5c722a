//! A latency histogram that every request of a slot records into without a lock: one atomic
//! counter per bucket and one for the sum. (prometheus-client's `Histogram` takes a mutex per
//! observation and does not give its buckets out, and a slot's metrics travel to the slot that
//! serves the endpoint as data: `memarts_protocol::MetricValue`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use memarts_protocol::MetricValue;

/// Upper bounds of the buckets, in seconds: from a hit served by descriptor (tens of µs) to an
/// origin request that waited on retries (seconds). Observations above the last go to `+Inf`.
pub const BOUNDS: [f64; 17] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0,
];

#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative), the last one `+Inf`.
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = BOUNDS.partition_point(|&le| le < secs);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The histogram as the wire carries it.
    pub fn value(&self) -> MetricValue {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let bounds = BOUNDS.iter().copied().chain([f64::INFINITY]);
        MetricValue::Histogram {
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: counts.iter().sum(),
            buckets: bounds.zip(counts).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50)); // on a bound: in its bucket (le)
        h.observe(Duration::from_micros(51));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let MetricValue::Histogram { sum, count, buckets } = h.value() else { panic!("a histogram") };
        assert_eq!(count, 4);
        assert!((sum - 60.003101).abs() < 1e-9, "{sum}");
        let nonzero: Vec<(f64, u64)> = buckets.into_iter().filter(|b| b.1 > 0).collect();
        assert_eq!(nonzero, vec![(50e-6, 1), (100e-6, 1), (5e-3, 1), (f64::INFINITY, 1)]);
    }
}
