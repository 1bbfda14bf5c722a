//! A4: a failing or full cache disk degrades the slot to origin pass-through, never to an error or a
//! crash. The cache runs over an engine whose writes fail with ENOSPC or EIO, or whose reads fail with
//! EIO, in front of an in-memory origin that counts nothing but answers everything.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::{ChunkRequest, FirstRequest};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::{ChunkOutcome, Engine, MetaCache, SlotInfo};
use crate::chunk_store::{BoxFuture, ChunkStore, IoEngine, PreadEngine};
use crate::config::OriginConfig;
use crate::origin::Origin;

/// Inline chunks: the slot itself reads them from disk, so a read failure shows here.
const CHUNK: u64 = 16 << 10;
const CHUNKS: u64 = 6;

/// The pread engine with switches: writes fail with `write_errno`, reads with EIO.
struct FailingDisk {
    write_errno: AtomicU64,
    fail_reads: AtomicBool,
    failed: AtomicU64,
}

impl FailingDisk {
    fn new() -> Arc<FailingDisk> {
        Arc::new(FailingDisk {
            write_errno: AtomicU64::new(0),
            fail_reads: AtomicBool::new(false),
            failed: AtomicU64::new(0),
        })
    }

    fn fail<T: Send + 'static>(&self, errno: i32) -> BoxFuture<io::Result<T>> {
        self.failed.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Err(io::Error::from_raw_os_error(errno)) })
    }
}

impl IoEngine for FailingDisk {
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return self.fail(libc::EIO);
        }
        PreadEngine.read_at(file, offset, len)
    }

    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>> {
        match self.write_errno.load(Ordering::SeqCst) {
            0 => PreadEngine.write_at(file, offset, data),
            errno => self.fail(errno as i32),
        }
    }

    fn write_parts_blocking(&self, file: &File, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        match self.write_errno.load(Ordering::SeqCst) {
            0 => PreadEngine.write_parts_blocking(file, offset, parts),
            errno => {
                self.failed.fetch_add(1, Ordering::SeqCst);
                Err(io::Error::from_raw_os_error(errno as i32))
            }
        }
    }

    fn fsync(&self, file: Arc<File>, data_only: bool) -> BoxFuture<io::Result<()>> {
        PreadEngine.fsync(file, data_only)
    }

    fn name(&self) -> &'static str {
        "failing-disk"
    }
}

fn object() -> Bytes {
    (0..CHUNK * CHUNKS - 100).map(|i| (i * 7 % 251) as u8).collect()
}

/// A slot over `disk` whose origin holds [`object`] at `s3://b/o`.
async fn slot_over(disk: &Arc<FailingDisk>, dir: &std::path::Path) -> Arc<Engine> {
    let origin_store = Arc::new(InMemory::new());
    origin_store.put(&Path::from("o"), object().into()).await.unwrap();
    let origin = Origin::new(OriginConfig { max_attempts: 1, ..OriginConfig::default() }, None)
        .with_bucket_store("b", origin_store);
    let store = ChunkStore::open(dir, Arc::clone(disk) as Arc<dyn IoEngine>).unwrap();
    let info = SlotInfo {
        slot: 0,
        slots: 1,
        cache_dir: dir.to_path_buf(),
        capacity: Some(1 << 30),
        io_engine: "failing-disk",
        passthrough: false,
        memory_budget: crate::budget::DEFAULT_BYTES,
        eviction: Default::default(),
    };
    let cache = Engine::new(info, origin, store, MetaCache::new(Duration::from_secs(60), 1000), None);
    cache.start_rebuild();
    cache
}

/// Reads the whole object through `cache` as a shim does: the first chunk with the metadata, then the
/// others. Returns the bytes and how many chunks were hits.
async fn read_all(cache: &Arc<Engine>) -> (Vec<u8>, u64) {
    let first = FirstRequest { url: "s3://b/o".into(), chunk_size: CHUNK, refresh: false };
    let (meta, outcome) = cache.read_first(&first).await.expect("the first chunk");
    let mut out = Vec::new();
    let mut hits = 0;
    let mut take = |outcome: ChunkOutcome| match outcome {
        ChunkOutcome::Bytes { data, crc32c, from_cache } => {
            assert_eq!(memarts_protocol::crc32c(&data), crc32c);
            hits += u64::from(from_cache);
            out.extend_from_slice(&data);
        }
        ChunkOutcome::Fd(_) => panic!("chunks of {CHUNK} bytes are sent inline"),
    };
    take(outcome.expect("a non-empty object"));
    for index in 1..CHUNKS {
        let req = ChunkRequest {
            url: first.url.clone(),
            etag: meta.etag.clone().unwrap(),
            object_size: meta.size,
            chunk_size: CHUNK,
            index,
            recheck: false,
        };
        take(cache.read_chunk(&req).await.unwrap_or_else(|e| panic!("chunk {index}: {e}")));
    }
    (out, hits)
}

fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| if e.file_type().unwrap().is_dir() { files_under(&e.path()) } else { 1 })
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_failing_disk_on_writes_serves_from_the_origin_and_caches_nothing() {
    for errno in [libc::ENOSPC, libc::EIO] {
        let dir = tempfile::tempdir().unwrap();
        let disk = FailingDisk::new();
        let cache = slot_over(&disk, dir.path()).await;
        disk.write_errno.store(errno as u64, Ordering::SeqCst);
        for pass in 0..2 {
            let (got, hits) = read_all(&cache).await;
            assert!(got == object(), "errno {errno}, pass {pass}: wrong bytes");
            assert_eq!(hits, 0, "errno {errno}, pass {pass}: a hit from a disk that stores nothing");
            cache.wait_idle(Duration::from_secs(10)).await;
        }
        assert!(disk.failed.load(Ordering::SeqCst) >= CHUNKS, "errno {errno}: the disk was not asked");
        assert!(cache.stats.store_errors.load(Ordering::Relaxed) >= CHUNKS, "errno {errno}: not counted");
        assert_eq!(files_under(&dir.path().join("v1")), 0, "errno {errno}: a failed write left a file");
        assert_eq!(cache.status().cached_chunks, 0);

        // The disk recovers: the next read caches, the one after is all hits.
        disk.write_errno.store(0, Ordering::SeqCst);
        assert!(read_all(&cache).await.0 == object());
        cache.wait_idle(Duration::from_secs(10)).await;
        assert_eq!(read_all(&cache).await, (object().to_vec(), CHUNKS), "errno {errno}: not cached after");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_failing_on_reads_serves_from_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let disk = FailingDisk::new();
    let cache = slot_over(&disk, dir.path()).await;
    assert!(read_all(&cache).await.0 == object());
    cache.wait_idle(Duration::from_secs(10)).await;
    assert_eq!(read_all(&cache).await.1, CHUNKS, "warm");

    disk.fail_reads.store(true, Ordering::SeqCst);
    for pass in 0..2 {
        let (got, hits) = read_all(&cache).await;
        assert!(got == object(), "pass {pass}: wrong bytes from a disk failing on reads");
        assert_eq!(hits, 0, "pass {pass}: a hit from a disk that cannot be read");
        cache.wait_idle(Duration::from_secs(10)).await;
    }
    assert!(disk.failed.load(Ordering::SeqCst) >= CHUNKS);
    disk.fail_reads.store(false, Ordering::SeqCst);
    assert!(read_all(&cache).await.0 == object(), "after the disk recovered");
}
