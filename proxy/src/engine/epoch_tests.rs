//! The default eviction policy at the slot, through the read path that uses it (`persist`): epochs
//! over a dataset twice the slot's capacity keep half of it resident, the chunks not kept are
//! counted as `rejected_chunks`, bytes on disk stay within the capacity, and a memarts-only object
//! (outside the chunk index) is untouched.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::{ChunkRequest, ObjectUrl};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::Engine;
use crate::config::FleetConfig;
use crate::origin::Origin;

const CHUNK: u64 = 64 << 10;
/// The slot's capacity: 60 chunks of 64 KiB and their headers, about.
const CAPACITY: u64 = 4 << 20;
/// Objects of 4 chunks; 32 of them are 8 MiB, twice the capacity.
const OBJECT: u64 = 4 * CHUNK;
const OBJECTS: u64 = 32;

async fn slot(dir: &std::path::Path) -> Arc<Engine> {
    let store = Arc::new(InMemory::new());
    for i in 0..OBJECTS {
        let data: Vec<u8> = (0..OBJECT).map(|b| (b as u8).wrapping_mul(i as u8 | 1)).collect();
        store.put(&Path::from(format!("d/{i}")), data.into()).await.unwrap();
    }
    let cfg = FleetConfig {
        run_dir: dir.join("run"),
        cache_dir: dir.join("cache"),
        capacity: Some(CAPACITY),
        io_engine: "pread".into(),
        origin_log: false,
        ..FleetConfig::default()
    };
    let origin = Origin::new(cfg.origin.clone(), None).with_bucket_store("b", store);
    let engine = crate::build_engine_with(&cfg, 0, origin).unwrap().0;
    engine.start_rebuild();
    while !engine.status().index_ready {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine
}

/// Hits of one epoch over every chunk of every object, in `order`.
async fn epoch(engine: &Arc<Engine>, order: &[u64]) -> u64 {
    let before = engine.stats.hits.load(Ordering::Relaxed);
    for &i in order {
        let url = format!("s3://b/d/{i}");
        let meta = engine.metadata().stat(&url, false).await.unwrap();
        for index in 0..OBJECT / CHUNK {
            let req = ChunkRequest {
                url: url.clone(),
                etag: meta.etag.clone().unwrap(),
                object_size: meta.size,
                chunk_size: CHUNK,
                index,
                recheck: false,
            };
            engine.read_chunk(&req).await.unwrap();
        }
    }
    engine.stats.hits.load(Ordering::Relaxed) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_over_twice_the_capacity_keep_half_resident_and_leave_memarts_only_objects_alone() {
    let dir = tempfile::tempdir().unwrap();
    let engine = slot(dir.path()).await;
    // A memarts-only object, written before the cache fills.
    let only = engine.only_store().unwrap();
    let url = ObjectUrl::parse("s3://b/only/kept").unwrap();
    let mut w = only.begin(&url).unwrap();
    w.write(&[7u8; 100_000]).unwrap();
    only.commit(w).unwrap();

    let chunks = OBJECTS * OBJECT / CHUNK;
    let held = engine.status().cache_capacity / (CHUNK + 4096);
    let sequential: Vec<u64> = (0..OBJECTS).collect();
    let mut shuffled = sequential.clone();
    let mut hits = Vec::new();
    for e in 0..4u64 {
        // Two epochs in order, then two in a fixed shuffled order.
        if e >= 2 {
            shuffled.sort_by_key(|&i| (i * 7 + e * 13) % OBJECTS);
        }
        hits.push(epoch(&engine, if e < 2 { &sequential } else { &shuffled }).await);
    }
    let s = engine.status();
    println!("hits per epoch of {chunks} chunks: {hits:?} (the capacity holds {held}); {s:?}");
    for &h in &hits[1..] {
        assert!(h * 10 >= held * 9, "{h} hits of {chunks}, the capacity holds {held}: {hits:?}");
    }
    let a = engine.admission_status();
    assert!(a.rejected_chunks > 0 && s.cache_bytes_used <= s.cache_capacity, "{s:?} {a:?}");
    let kept = only.get(&url).unwrap().expect("the memarts-only object is still there");
    assert_eq!(kept.len, 100_000);
}
