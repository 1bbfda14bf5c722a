//! Every metric of the slot, as data (`Request::Metrics`): what the node's Prometheus endpoint
//! (`crate::metrics`) serves, labelled with this slot's number there. Names are without the
//! `memarts_` prefix and, for counters, without `_total`: the exposition adds both.

use std::sync::atomic::{AtomicU64, Ordering};

use memarts_protocol::MetricKind::{Counter, Gauge, Histogram};
use memarts_protocol::{MetricValue, MetricsSnapshot};

use super::Engine;
use crate::metrics::{point, Families};

impl Engine {
    pub fn metrics(&self) -> MetricsSnapshot {
        let status = self.status();
        let prefetch = self.prefetch_status();
        let cluster = self.cluster_status();
        let (s, o, md) = (&self.stats, &self.origin.stats, &self.metadata.counters);
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let num = |v: u64| MetricValue::Number(v as f64);
        let mut m = Families::default();
        m.one("requests", "Requests from clients", Counter, status.requests as f64);
        m.one("hits", "Chunk reads served from the cache", Counter, status.hits as f64);
        m.one(
            "local_hits",
            "Hits that clients read straight from the chunk files, with no request to a proxy (part of hits)",
            Counter,
            n(&s.local_hits),
        );
        m.one(
            "misses",
            "Chunk reads the cache did not have: fetched from a peer or the origin",
            Counter,
            status.misses as f64,
        );
        m.add(
            "read_bytes",
            "Bytes of chunk reads, by where they came from",
            Counter,
            vec![
                point(&[("source", "cache")], num(status.bytes_from_cache)),
                point(&[("source", "origin")], num(status.bytes_from_origin)),
                point(&[("source", "peer")], num(cluster.bytes_from_peers)),
            ],
        );
        m.add(
            "read_seconds",
            "Time to answer a client's chunk read, reply sent, by whether it was a hit or a miss",
            Histogram,
            vec![
                point(&[("result", "hit")], s.read_hit.value()),
                point(&[("result", "miss")], s.read_miss.value()),
            ],
        );
        m.add(
            "origin_requests",
            "Requests to the origin (each attempt), by kind and outcome",
            Counter,
            o.outcome_points(),
        );
        m.add(
            "origin_request_seconds",
            "Time of a request to the origin (each attempt), by kind",
            Histogram,
            o.latency_points(),
        );
        m.one(
            "origin_retries",
            "Origin requests made again after a retryable failure",
            Counter,
            n(&o.retries),
        );
        m.one(
            "cache_used_bytes",
            "Bytes of chunks this slot keeps on disk",
            Gauge,
            status.cache_bytes_used as f64,
        );
        m.one(
            "cache_capacity_bytes",
            "This slot's share of the cache capacity (0: not known yet)",
            Gauge,
            status.cache_capacity as f64,
        );
        m.one("cached_chunks", "Chunks this slot keeps on disk", Gauge, status.cached_chunks as f64);
        m.one("evicted_chunks", "Chunks removed to make room", Counter, status.evicted_chunks as f64);
        m.one(
            "rejected_chunks",
            "Fetched chunks served but not kept: colder than what they would have pushed out",
            Counter,
            n(&s.rejected_chunks),
        );
        m.one(
            "corrupt_chunks",
            "Chunk files found damaged, dropped and fetched again",
            Counter,
            status.corrupt_chunks as f64,
        );
        m.one("store_errors", "Chunk files that could not be written or read", Counter, n(&s.store_errors));
        m.one(
            "stale_metadata_served",
            "Reads that went on with an expired version because the origin could not be reached",
            Counter,
            n(&md.stale_meta_served),
        );
        m.one(
            "listed_pages",
            "Pages of directory listings asked for to revalidate expired metadata, one per 1,000 keys",
            Counter,
            n(&md.listed_pages),
        );
        m.one(
            "refreshed_listings",
            "Directories listed again before the versions they gave expired, for the slots reading them",
            Counter,
            n(&md.refreshed_listings),
        );
        m.one(
            "listed_revalidations",
            "Expired metadata revalidated by its directory's listing instead of a HEAD",
            Counter,
            n(&md.listed_revalidations),
        );
        m.one("connections", "Client connections open", Gauge, status.connections as f64);
        m.one(
            "memory_budget_bytes",
            "Bytes of fills, uploads and replies to peers the slot may hold in memory at once",
            Gauge,
            self.info.memory_budget as f64,
        );
        m.one(
            "memory_budget_used_bytes",
            "Bytes of fills, uploads and replies to peers held in memory now",
            Gauge,
            self.memory_held() as f64,
        );
        m.one(
            "index_ready",
            "1 once the slot's chunk index is rebuilt from the disk",
            Gauge,
            f64::from(u8::from(status.index_ready)),
        );
        m.one("prefetch_hints", "Objects clients said they would read soon", Counter, prefetch.hinted as f64);
        m.one(
            "prefetch_objects",
            "Objects a prefetch fetched ahead of their reads",
            Counter,
            prefetch.objects as f64,
        );
        m.one(
            "prefetch_dropped",
            "Hints dropped from a full prefetch queue",
            Counter,
            prefetch.dropped as f64,
        );
        m.one(
            "prefetch_failed",
            "Prefetches that failed (their reads fetch again)",
            Counter,
            prefetch.failed as f64,
        );
        m.one(
            "peer_reads",
            "Chunk reads served by another node of the cluster",
            Counter,
            cluster.peer_reads as f64,
        );
        m.one(
            "peer_errors",
            "Peer reads that failed (then served from the origin)",
            Counter,
            cluster.peer_errors as f64,
        );
        m.one("uptime_seconds", "Seconds since the slot started", Gauge, status.uptime_ms as f64 / 1e3);
        m.finish()
    }
}
