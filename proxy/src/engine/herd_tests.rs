//! R3 at the slot: however many readers miss a chunk at once, and whichever way each of them takes
//! to it, one origin GET fetches it. The origin is a [`FaultyStore`] that counts GETs and holds
//! requests back to line the readers up.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::FirstRequest;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::{ChunkOutcome, Engine};
use crate::config::{FleetConfig, OriginConfig};
use crate::origin::faulty::{Fault, FaultyStore};
use crate::origin::Origin;

const CHUNK: u64 = 64 << 10;

fn object() -> Bytes {
    (0..CHUNK).map(|i| (i % 253) as u8).collect()
}

/// A slot (its index not rebuilt yet) over a counting origin holding [`object`] at `s3://b/o`.
async fn slot(dir: &std::path::Path) -> (Arc<FaultyStore>, Arc<Engine>) {
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    store.inner().put(&Path::from("o"), object().into()).await.unwrap();
    let cfg = FleetConfig {
        run_dir: dir.join("run"),
        cache_dir: dir.join("cache"),
        io_engine: "pread".into(),
        origin_log: false,
        origin: OriginConfig {
            max_attempts: 2,
            backoff_base_ms: 1,
            backoff_max_ms: 5,
            ..OriginConfig::default()
        },
        ..FleetConfig::default()
    };
    let origin = Origin::new(cfg.origin.clone(), None).with_bucket_store("b", store.clone());
    (store, crate::build_engine_with(&cfg, 0, origin).unwrap().0)
}

/// Starts the slot's index rebuild and waits for its end.
async fn rebuilt(cache: &Arc<Engine>) {
    cache.start_rebuild();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !cache.status().index_ready {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the index rebuild finished");
}

async fn first(cache: &Arc<Engine>) -> Bytes {
    let req = FirstRequest { url: "s3://b/o".into(), chunk_size: CHUNK, refresh: false };
    match cache.read_first(&req).await.unwrap().1.unwrap() {
        ChunkOutcome::Bytes { data, .. } => data,
        ChunkOutcome::Fd(_) => panic!("a {CHUNK}-byte chunk is sent inline"),
    }
}

/// A reader that finds no metadata before the index is rebuilt asks for it (its directory's listing,
/// `revalidate.rs`; a HEAD before that), then reads chunk 0;
/// one that comes once the index is rebuilt fetches chunk 0 and the metadata in one GET. When both
/// are in flight at once, chunk 0 must still be fetched once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_both_sides_of_the_index_rebuild_fetch_chunk_0_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, cache) = slot(dir.path()).await;
    // The first request to arrive (the early reader's listing) waits 300 ms, the second (the late
    // reader's GET) 600 ms: the early reader asks for chunk 0 while the late reader's GET is out.
    store.script([Fault::Stall(Duration::from_millis(300)), Fault::Stall(Duration::from_millis(600))]);
    let early = tokio::spawn({
        let cache = cache.clone();
        async move { first(&cache).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.heads() + store.lists(), 1, "the early reader asks for the metadata");
    rebuilt(&cache).await;
    let late = tokio::spawn({
        let cache = cache.clone();
        async move { first(&cache).await }
    });
    assert!(late.await.unwrap() == object());
    assert!(early.await.unwrap() == object());
    cache.wait_idle(Duration::from_secs(10)).await;
    assert_eq!(store.gets(), 1, "chunk 0 was fetched {} times", store.gets());
}

/// A reader that found the object cold may reach the first-read flight only after another cold
/// first read has ended (fetched, kept and answered): it must not fetch chunk 0 a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_first_read_that_comes_after_another_ended_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, cache) = slot(dir.path()).await;
    rebuilt(&cache).await;
    assert!(first(&cache).await == object());
    assert_eq!(store.gets(), 1);
    // Its flight has ended (it may outlive the answer by a moment), as the late reader finds it.
    cache.wait_idle(Duration::from_secs(10)).await;
    // What the late reader does once past its look at the cache: it joins (here: starts) the flight.
    let url = memarts_protocol::ObjectUrl::parse("s3://b/o").unwrap();
    let late = cache.read_first_cold(url, CHUNK, super::ReadBy::Client).await;
    assert!(late.is_none(), "the late reader is sent the usual way, to the cached chunk");
    assert!(first(&cache).await == object());
    assert_eq!((store.gets(), store.heads()), (1, 0), "chunk 0 was fetched again");
}

/// A reader that knows the object's version without this slot knowing it (a peer told by a
/// listing) fills chunk 0 as a chunk; a cold first read that comes meanwhile must wait for it,
/// not fetch chunk 0 a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_first_read_during_a_chunk_0_fill_of_a_known_version_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, cache) = slot(dir.path()).await;
    rebuilt(&cache).await;
    let etag = store.inner().head(&Path::from("o")).await.unwrap().e_tag.unwrap();
    store.script([Fault::Stall(Duration::from_millis(400))]);
    let chunk = tokio::spawn({
        let cache = cache.clone();
        async move {
            let req = memarts_protocol::ChunkRequest {
                url: "s3://b/o".into(),
                etag,
                object_size: CHUNK,
                chunk_size: CHUNK,
                index: 0,
                recheck: false,
            };
            match cache.read_chunk(&req).await.unwrap() {
                ChunkOutcome::Bytes { data, .. } => data,
                ChunkOutcome::Fd(_) => panic!("a {CHUNK}-byte chunk is sent inline"),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.gets(), 1, "the chunk's fill is out");
    assert!(first(&cache).await == object());
    assert!(chunk.await.unwrap() == object());
    cache.wait_idle(Duration::from_secs(10)).await;
    assert_eq!(store.gets(), 1, "chunk 0 was fetched {} times", store.gets());
}
