//! R2 at the slot: however many different chunks clients miss at once, the fills in flight stay
//! within the slot's memory budget; the others wait their turn and are then served whole, in any
//! order the clients take their replies (a share is given back once its chunk is on disk).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::ChunkRequest;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::ChunkOutcome;
use crate::config::FleetConfig;
use crate::origin::faulty::{Fault, FaultyStore};
use crate::origin::Origin;

const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_of_many_chunks_at_once_hold_no_more_than_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let data: Bytes = (0..CHUNK * CHUNKS).map(|i| (i % 251) as u8).collect();
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let etag = store.inner().put(&Path::from("o"), data.clone().into()).await.unwrap().e_tag.unwrap();
    let cfg = FleetConfig {
        run_dir: dir.path().join("run"),
        cache_dir: dir.path().join("cache"),
        io_engine: "pread".into(),
        origin_log: false,
        // Room for four chunks.
        memory_budget: Some(4 * CHUNK),
        ..FleetConfig::default()
    };
    let origin = Origin::new(cfg.origin.clone(), None).with_bucket_store("b", store.clone());
    let cache = crate::build_engine_with(&cfg, 0, origin).unwrap().0;
    cache.start_rebuild();
    // Every GET is held long enough for all the readers to line up behind the budget.
    store.script((0..CHUNKS).map(|_| Fault::Stall(Duration::from_millis(400))));
    let readers: Vec<_> = (0..CHUNKS)
        .map(|index| {
            let cache = cache.clone();
            let req = ChunkRequest {
                url: "s3://b/o".into(),
                etag: etag.clone(),
                object_size: CHUNK * CHUNKS,
                chunk_size: CHUNK,
                index,
                recheck: false,
            };
            tokio::spawn(async move { cache.read_chunk(&req).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(store.gets(), 4, "fills past the budget went to the origin at once");
    assert_eq!(cache.budget().free(), 0);
    for (index, reader) in readers.into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs(10), reader).await;
        let out = out.unwrap_or_else(|_| panic!("chunk {index} was never served"));
        let ChunkOutcome::Bytes { data: got, .. } = out.unwrap().unwrap() else {
            panic!("a missed chunk is sent inline")
        };
        let at = index * CHUNK as usize;
        assert!(got == data[at..at + CHUNK as usize], "chunk {index}");
    }
    cache.wait_idle(Duration::from_secs(10)).await;
    assert_eq!(store.gets(), CHUNKS);
    assert_eq!(cache.budget().free(), 4 * CHUNK, "every fill gave its share back");
}
