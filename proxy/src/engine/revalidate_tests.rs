//! Revalidation by listing at the slot, counted at the origin: a directory this slot holds whole is
//! listed once; one of 100,000 objects of which 10 are cached is not listed through to
//! revalidate 10 (`list_policy.rs`); a bucket whose listings are refused is not asked to list
//! again for each object.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::FirstRequest;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::{ChunkOutcome, Engine};
use crate::config::{FleetConfig, OriginConfig};
use crate::origin::faulty::FaultyStore;
use crate::origin::Origin;

const CHUNK: u64 = 64 << 10;
const TTL: Duration = Duration::from_millis(1500);

fn body(key: &str) -> Bytes {
    Bytes::from(format!("the bytes of {key}"))
}

/// A slot of a fleet of one over a counting origin holding `keys`, its index rebuilt.
async fn slot(dir: &std::path::Path, keys: impl Iterator<Item = String>) -> (Arc<FaultyStore>, Arc<Engine>) {
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    for key in keys {
        store.inner().put(&Path::from(key.as_str()), body(&key).into()).await.unwrap();
    }
    let cfg = FleetConfig {
        run_dir: dir.join("run"),
        cache_dir: dir.join("cache"),
        io_engine: "pread".into(),
        origin_log: false,
        meta_ttl_secs: TTL.as_secs_f64(),
        origin: OriginConfig {
            max_attempts: 2,
            backoff_base_ms: 1,
            backoff_max_ms: 5,
            ..OriginConfig::default()
        },
        ..FleetConfig::default()
    };
    let origin = Origin::new(cfg.origin.clone(), None).with_bucket_store("b", store.clone());
    let engine = crate::build_engine_with(&cfg, 0, origin).unwrap().0;
    engine.start_rebuild();
    while !engine.status().index_ready {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (store, engine)
}

/// Reads `key` as a client's first read does, checking its bytes.
async fn read(engine: &Arc<Engine>, key: &str) {
    let req = FirstRequest { url: format!("s3://b/{key}"), chunk_size: CHUNK, refresh: false };
    let (meta, chunk) = engine.read_first(&req).await.unwrap_or_else(|e| panic!("{key}: {e}"));
    let data = match chunk.expect("not empty") {
        ChunkOutcome::Bytes { data, .. } => data,
        ChunkOutcome::Fd(f) => {
            let mut buf = vec![0; f.len as usize];
            std::os::unix::fs::FileExt::read_exact_at(&*f.file, &mut buf, f.data_offset).unwrap();
            Bytes::from(buf)
        }
    };
    assert_eq!(data, body(key), "{key}");
    assert_eq!(meta.size, body(key).len() as u64);
}

/// (HEADs, listings, keys listed) so far.
fn asked(store: &FaultyStore) -> (u64, u64, u64) {
    (store.heads(), store.lists(), store.listed_keys())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_cached_objects_of_a_prefix_of_100_000_are_revalidated_without_listing_it() {
    let dir = tempfile::tempdir().unwrap();
    let big = |i: usize| format!("big/k{i:06}");
    let cached: Vec<String> = (0..10).map(|j| big(j * 10_000 + 7)).collect();
    let (store, engine) = slot(dir.path(), (0..100_000).map(big)).await;
    for key in &cached {
        read(&engine, key).await;
    }
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let before = asked(&store);
    for key in &cached {
        read(&engine, key).await;
    }
    let (heads, lists, keys) = asked(&store);
    let (heads, lists, keys) = (heads - before.0, lists - before.1, keys - before.2);
    assert!(keys < 5_000, "{keys} keys listed to revalidate 10 objects ({lists} listings, {heads} HEADs)");
    assert!(heads + lists <= 12, "{heads} HEADs and {lists} listings for 10 objects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_held_whole_is_listed_once_for_all_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..1_500).map(|i| format!("dense/k{i:04}")).collect();
    let (store, engine) = slot(dir.path(), keys.iter().cloned()).await;
    for key in &keys {
        read(&engine, key).await;
    }
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let before = asked(&store);
    for key in &keys {
        read(&engine, key).await;
    }
    let (heads, lists, _) = asked(&store);
    assert_eq!((heads - before.0, lists - before.1), (0, 1), "(HEADs, listings) of 1,500 objects");
}

/// The origin refuses listings (403): each object is asked with one HEAD, not a LIST then a HEAD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_refuses_listings_is_asked_with_heads_only() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..50).map(|i| format!("d/k{i:02}")).collect();
    let (store, engine) = slot(dir.path(), keys.iter().cloned()).await;
    for key in &keys {
        read(&engine, key).await;
    }
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    store.refuse_listings(true);
    let before = asked(&store);
    for key in &keys {
        read(&engine, key).await;
    }
    let (heads, lists, _) = asked(&store);
    assert_eq!((heads - before.0, lists - before.1), (50, 1), "(HEADs, listings) of 50 objects");
}
