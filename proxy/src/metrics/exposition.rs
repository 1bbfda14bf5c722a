//! The fleet's metrics as one OpenMetrics text exposition, encoded by prometheus-client: the
//! families of every slot that answered merged by name, each point labelled with its `slot`, and
//! `memarts_slot_up` for every slot.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use memarts_protocol::{MetricKind, MetricPoint, MetricValue, MetricsSnapshot};

/// Each slot of the fleet and what it answered (`None`: it did not).
#[derive(Debug)]
struct Fleet(Vec<(u32, Option<MetricsSnapshot>)>);

/// One family of the exposition: its description and every slot's points.
struct Merged<'a> {
    name: &'a str,
    help: &'a str,
    kind: MetricKind,
    points: Vec<(u32, &'a MetricPoint)>,
}

impl Fleet {
    /// The families in the order the slots list them, each once.
    fn merged(&self) -> Vec<Merged<'_>> {
        let mut merged: Vec<Merged<'_>> = Vec::new();
        for (slot, snapshot) in &self.0 {
            for f in snapshot.iter().flat_map(|s| &s.families) {
                let at = match merged.iter().position(|m| m.name == f.name) {
                    Some(at) => at,
                    None => {
                        merged.push(Merged {
                            name: &f.name,
                            help: &f.help,
                            kind: f.kind,
                            points: Vec::new(),
                        });
                        merged.len() - 1
                    }
                };
                // A family some slot describes as another kind (a build of another version) is
                // left out for that slot rather than encoded as what it is not.
                if merged[at].kind == f.kind {
                    merged[at].points.extend(f.points.iter().map(|p| (*slot, p)));
                }
            }
        }
        merged
    }
}

impl Collector for Fleet {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut up = encoder.encode_descriptor(
            "slot_up",
            "1 if the slot answered this scrape, 0 if it did not (down, or a build without metrics)",
            None,
            MetricType::Gauge,
        )?;
        for (slot, snapshot) in &self.0 {
            let labels = [("slot", slot.to_string())];
            ConstGauge::new(i64::from(snapshot.is_some())).encode(up.encode_family(&labels)?)?;
        }
        for family in self.merged() {
            let kind = match family.kind {
                MetricKind::Counter => MetricType::Counter,
                MetricKind::Gauge => MetricType::Gauge,
                MetricKind::Histogram => MetricType::Histogram,
            };
            let mut e = encoder.encode_descriptor(family.name, family.help, None, kind)?;
            for (slot, point) in family.points {
                let mut labels = vec![("slot".to_string(), slot.to_string())];
                labels.extend(point.labels.iter().cloned());
                let mut e = e.encode_family(&labels)?;
                match (&point.value, family.kind) {
                    (MetricValue::Number(v), MetricKind::Counter) => {
                        e.encode_counter::<NoLabelSet, _, f64>(v, None)?;
                    }
                    (MetricValue::Number(v), _) => e.encode_gauge(v)?,
                    (MetricValue::Histogram { sum, count, buckets }, MetricKind::Histogram) => {
                        // prometheus-client writes `+Inf` for a bound of f64::MAX.
                        let buckets: Vec<(f64, u64)> = buckets
                            .iter()
                            .map(|&(le, n)| (if le.is_infinite() { f64::MAX } else { le }, n))
                            .collect();
                        e.encode_histogram::<NoLabelSet>(*sum, *count, &buckets, None)?;
                    }
                    (MetricValue::Histogram { .. }, _) => {}
                }
            }
        }
        Ok(())
    }
}

/// The exposition of `slots` (each slot's number and its metrics, if it answered), ending with
/// `# EOF`. Served as `application/openmetrics-text; version=1.0.0; charset=utf-8`.
pub fn encode(slots: Vec<(u32, Option<MetricsSnapshot>)>) -> String {
    let mut registry = Registry::with_prefix("memarts");
    registry.register_collector(Box::new(Fleet(slots)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use memarts_protocol::MetricKind::{Counter, Histogram};

    use super::*;
    use crate::metrics::{point, Families};

    fn slot(hits: f64, hist: MetricValue) -> MetricsSnapshot {
        let mut m = Families::default();
        m.one("hits", "Chunk reads served from the cache", Counter, hits);
        m.add("read_seconds", "Time to answer", Histogram, vec![point(&[("result", "hit")], hist)]);
        m.finish()
    }

    #[test]
    fn slots_are_merged_by_family_and_labelled() {
        let hist =
            MetricValue::Histogram { sum: 0.25, count: 3, buckets: vec![(0.1, 2), (f64::INFINITY, 1)] };
        let text = encode(vec![(0, Some(slot(5.0, hist.clone()))), (1, None), (2, Some(slot(7.0, hist)))]);
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "# TYPE memarts_slot_up gauge",
            "memarts_slot_up{slot=\"1\"} 0",
            "memarts_slot_up{slot=\"2\"} 1",
            "# TYPE memarts_hits counter",
            "memarts_hits_total{slot=\"0\"} 5.0",
            "memarts_hits_total{slot=\"2\"} 7.0",
            "memarts_read_seconds_bucket{le=\"0.1\",slot=\"2\",result=\"hit\"} 2",
            "memarts_read_seconds_bucket{le=\"+Inf\",slot=\"2\",result=\"hit\"} 3",
            "# EOF",
        ] {
            assert!(lines.contains(&want), "{want:?} missing from\n{text}");
        }
        assert_eq!(lines.iter().filter(|l| l.starts_with("# TYPE memarts_hits ")).count(), 1, "{text}");
    }
}
