//! The origin promises (docs/RELIABILITY.md: O1, O3, I3, I4, A5) under injected faults: first at the
//! [`Origin`], then one level up at the [`Engine`](crate::engine::Engine). Every test asserts how many
//! requests reached the store, so a fault that was not applied, or a check that was skipped, fails it.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::{ChunkRequest, ErrorCode, FirstRequest, ObjectUrl, WireError};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use super::faulty::{Fault, FaultyStore};
use super::{Origin, OriginError};
use crate::config::{FleetConfig, OriginConfig};
use crate::engine::{ChunkOutcome, Engine};

const URL: &str = "s3://b/data/object.bin";
const CHUNK: u64 = memarts_protocol::MIN_CHUNK_SIZE;

/// Bytes where a shift by one is visible everywhere.
fn version(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// Tiny backoff, default (generous) deadlines: only the stall test needs short ones.
fn fast_retries() -> OriginConfig {
    OriginConfig { max_attempts: 4, backoff_base_ms: 1, backoff_max_ms: 5, ..OriginConfig::default() }
}

/// A faulty bucket `b` holding `data` at [`URL`], and an origin that reads it.
async fn setup(cfg: OriginConfig, data: &Bytes) -> (Arc<FaultyStore>, Origin, ObjectUrl) {
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let url = ObjectUrl::parse(URL).unwrap();
    store.inner().put(&Path::from(url.key.as_str()), data.clone().into()).await.unwrap();
    let origin = Origin::new(cfg, None).with_bucket_store("b", store.clone());
    (store, origin, url)
}

/// The ETag the store itself reports, without faults or counting.
async fn etag_of(store: &FaultyStore, url: &ObjectUrl) -> String {
    store.inner().head(&Path::from(url.key.as_str())).await.unwrap().e_tag.unwrap()
}

fn retries(origin: &Origin) -> u64 {
    origin.stats.retries.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_burst_of_503s_is_retried_and_returns_the_exact_bytes() {
    let data = version(0, 10_000);
    let (store, origin, url) = setup(fast_retries(), &data).await;
    let etag = etag_of(&store, &url).await;
    store.script([Fault::Unavailable, Fault::Unavailable, Fault::Unavailable]);

    let got = origin.get_range(&url, 100..4196, &etag).await.unwrap();

    assert_eq!(got, data.slice(100..4196));
    assert_eq!(store.gets(), 4);
    assert_eq!(store.pending(), 0);
    assert_eq!(retries(&origin), 3);
    assert_eq!(origin.stats.requests.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn internal_errors_on_every_attempt_give_a_typed_failure_after_max_attempts() {
    let data = version(0, 10_000);
    let (store, origin, url) = setup(fast_retries(), &data).await;
    let etag = etag_of(&store, &url).await;
    // More faults than attempts: one attempt too many would pass through and succeed.
    store.script(std::iter::repeat_n(Fault::Internal, 10));

    // A hang detector, computed from the policy: every attempt at its deadline plus every backoff
    // at its ceiling. The promise itself is checked on the request count.
    let p = origin.policy();
    let backoffs: Duration = (1..p.max_attempts).map(|r| p.cap.min(p.base * (1 << r))).sum();
    let bound = p.attempt_deadline(4096) * p.max_attempts + backoffs;
    let out =
        tokio::time::timeout(bound, origin.get_range(&url, 0..4096, &etag)).await.expect("within bound");

    match out {
        Err(e @ OriginError::Failed(_)) => {
            assert!(e.is_retryable());
            assert!(e.to_string().contains("gave up after 4 attempts"), "{e}");
            assert_eq!(WireError::from(e).code, ErrorCode::OriginError);
        }
        other => panic!("expected a retryable Failed error, got {other:?}"),
    }
    assert_eq!(store.gets(), u64::from(p.max_attempts));
    assert_eq!(retries(&origin), u64::from(p.max_attempts - 1));
}

/// One `fault`, then a clean answer: the call returns exactly the asked bytes after one retry.
async fn one_fault_is_retried_and_never_returned(fault: Fault) {
    let data = version(0, 10_000);
    let (store, origin, url) = setup(fast_retries(), &data).await;
    let etag = etag_of(&store, &url).await;
    store.script([fault.clone()]);

    let got = origin.get_range(&url, 1000..5096, &etag).await;

    let got = got.unwrap_or_else(|e| panic!("{fault:?}: {e}"));
    assert!(got == data.slice(1000..5096), "{fault:?}: wrong bytes returned");
    assert_eq!(store.gets(), 2, "{fault:?}: the fault was not retried exactly once");
    assert_eq!(store.pending(), 0);
    assert_eq!(retries(&origin), 1);
}

#[tokio::test]
async fn a_connection_reset_is_retried() {
    one_fault_is_retried_and_never_returned(Fault::Reset).await;
}

#[tokio::test]
async fn a_truncated_body_is_retried_and_never_returned() {
    one_fault_is_retried_and_never_returned(Fault::Truncate(1000)).await;
}

#[tokio::test]
async fn a_body_error_mid_stream_is_retried() {
    one_fault_is_retried_and_never_returned(Fault::BodyError(1000)).await;
}

#[tokio::test]
async fn a_wrong_range_is_retried_and_never_returned() {
    one_fault_is_retried_and_never_returned(Fault::WrongRange).await;
}

#[tokio::test]
async fn a_stall_past_the_first_byte_deadline_is_abandoned_and_retried() {
    let cfg = OriginConfig {
        connect_timeout_secs: 0.05,
        first_byte_timeout_secs: 0.25,
        min_throughput: 1 << 30,
        ..fast_retries()
    };
    let data = version(0, 10_000);
    let (store, origin, url) = setup(cfg, &data).await;
    let etag = etag_of(&store, &url).await;
    store.script([Fault::Stall(Duration::from_secs(3600))]);

    // Without a per-attempt deadline the call would wait out the stall and this timeout would fire.
    let got = tokio::time::timeout(Duration::from_secs(20), origin.get_range(&url, 0..4096, &etag))
        .await
        .expect("the stalled attempt was not abandoned");

    assert_eq!(got.unwrap(), data.slice(0..4096));
    assert_eq!(store.gets(), 2);
    assert_eq!(retries(&origin), 1);
}

#[tokio::test]
async fn an_object_replaced_between_chunks_is_stale_and_not_retried() {
    let data = version(0, 10_000);
    let (store, origin, url) = setup(fast_retries(), &data).await;
    let etag = origin.head(&url).await.unwrap().etag.unwrap();
    assert_eq!(origin.get_range(&url, 0..4096, &etag).await.unwrap(), data.slice(0..4096));
    let gets = store.gets();

    store.script([Fault::Replace(version(0x5a, 10_000))]);
    let out = origin.get_range(&url, 4096..8192, &etag).await;

    assert!(matches!(out, Err(OriginError::Stale(_))), "{out:?}");
    assert_eq!(store.gets() - gets, 1, "a stale read must not be retried");
    assert_eq!(retries(&origin), 0);
    assert_ne!(etag_of(&store, &url).await, etag, "the object was not replaced");
    // Both GETs carried the old ETag as If-Match: the store itself refused the new version (412).
    assert_eq!(store.if_matches(), vec![Some(etag.clone()); 2]);
}

#[tokio::test]
async fn head_under_a_burst_of_503s_returns_the_right_size_and_etag() {
    let data = version(0, 10_000);
    let (store, origin, url) = setup(fast_retries(), &data).await;
    store.script([Fault::Unavailable, Fault::Unavailable]);

    let meta = origin.head(&url).await.unwrap();

    assert_eq!(meta.size, 10_000);
    assert_eq!(meta.etag.unwrap(), etag_of(&store, &url).await);
    assert_eq!(store.heads(), 3);
    assert_eq!(store.gets(), 0);
    assert_eq!(retries(&origin), 2);
}

// One level up: the cache over a faulty origin.

async fn cache_over(store: &Arc<FaultyStore>, dir: &std::path::Path) -> Arc<Engine> {
    let cfg = FleetConfig {
        run_dir: dir.join("run"),
        cache_dir: dir.join("cache"),
        io_engine: "pread".into(),
        origin_log: false,
        origin: fast_retries(),
        ..FleetConfig::default()
    };
    let origin = Origin::new(cfg.origin.clone(), None).with_bucket_store("b", store.clone());
    crate::build_engine_with(&cfg, 0, origin).unwrap().0
}

fn chunk(etag: &str, size: u64, index: u64) -> ChunkRequest {
    ChunkRequest {
        url: URL.into(),
        etag: etag.into(),
        object_size: size,
        chunk_size: CHUNK,
        index,
        recheck: false,
    }
}

/// The bytes of a chunk outcome (reading a passed descriptor as the client would), and whether
/// they came from the cache.
fn bytes_of(outcome: ChunkOutcome) -> (Bytes, bool) {
    match outcome {
        ChunkOutcome::Bytes { data, crc32c, from_cache } => {
            assert_eq!(memarts_protocol::crc32c(&data), crc32c);
            (data, from_cache)
        }
        ChunkOutcome::Fd(c) => {
            let mut buf = vec![0; c.len as usize];
            c.file.read_exact_at(&mut buf, c.data_offset).unwrap();
            (buf.into(), true)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_down_cached_chunks_are_served_and_misses_fail_typed() {
    let dir = tempfile::tempdir().unwrap();
    let data = version(0, 2 * CHUNK as usize + 1000);
    let (store, _, url) = setup(fast_retries(), &data).await;
    let cache = cache_over(&store, dir.path()).await;
    let first = FirstRequest { url: url.to_string(), chunk_size: CHUNK, refresh: false };
    let (meta, outcome) = cache.read_first(&first).await.unwrap();
    assert_eq!(bytes_of(outcome.unwrap()).0, data.slice(..CHUNK as usize));
    cache.wait_idle(Duration::from_secs(10)).await; // chunk 0 is on disk

    store.script(std::iter::repeat_n(Fault::Internal, 100)); // the origin is down
    let (heads, gets) = (store.heads(), store.gets());
    let (_, outcome) = cache.read_first(&first).await.unwrap();
    let (bytes, from_cache) = bytes_of(outcome.unwrap());
    assert_eq!(bytes, data.slice(..CHUNK as usize));
    assert!(from_cache);
    assert_eq!((store.heads(), store.gets()), (heads, gets), "a hit went to the origin");

    let Err(e) = cache.read_chunk(&chunk(meta.etag.as_deref().unwrap(), meta.size, 1)).await else {
        panic!("a miss was served while the origin is down");
    };
    assert_eq!(e.code, ErrorCode::OriginError, "{e:?}");
    assert_eq!(store.gets() - gets, u64::from(fast_retries().max_attempts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_mid_read_fails_stale_never_new_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let data = version(0, 2 * CHUNK as usize + 1000);
    let (store, _, url) = setup(fast_retries(), &data).await;
    let cache = cache_over(&store, dir.path()).await;
    let first = FirstRequest { url: url.to_string(), chunk_size: CHUNK, refresh: false };
    let (meta, outcome) = cache.read_first(&first).await.unwrap();
    assert_eq!(bytes_of(outcome.unwrap()).0, data.slice(..CHUNK as usize));
    let etag = meta.etag.unwrap();

    let new = version(0x5a, data.len());
    store.script([Fault::Replace(new.clone())]);
    let gets = store.gets();
    let Err(e) = cache.read_chunk(&chunk(&etag, meta.size, 1)).await else {
        panic!("chunk 1 of the old version was served after the object was replaced");
    };
    assert_eq!(e.code, ErrorCode::Stale, "{e:?}");
    assert_eq!(store.gets() - gets, 1, "a stale read must not be retried");

    // Nothing of the new version was cached under the old ETag: asking again is still stale.
    let Err(e) = cache.read_chunk(&chunk(&etag, meta.size, 1)).await else {
        panic!("chunk 1 was served under the old ETag");
    };
    assert_eq!(e.code, ErrorCode::Stale, "{e:?}");

    // A read that starts over sees the new version whole.
    let (meta, outcome) = cache.read_first(&FirstRequest { refresh: true, ..first }).await.unwrap();
    assert_ne!(meta.etag.as_deref(), Some(etag.as_str()));
    assert_eq!(bytes_of(outcome.unwrap()).0, new.slice(..CHUNK as usize));
}
