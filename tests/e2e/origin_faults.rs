//! Origin faults through the fault relay: 503/500 bursts, resets, truncated bodies, a stall and a
//! wrong range are retried and never cached (every read byte-exact); an object replaced between two
//! chunk fetches gives a typed `Stale` or one whole version, never mixed bytes; with the origin down,
//! cached and memarts-only data are still served and a miss fails with a clear error in time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern};

const CS: u64 = 64 << 10;

#[test]
fn transient_origin_faults_are_retried_and_never_cached() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("faults");
    let (_cfg, fleet) = relay.fleet(2, "", &[]);
    let client = fleet.client(CS);
    let faults = [
        (Fault::Status(503), 3),
        (Fault::Status(500), 3),
        (Fault::Reset, 3),
        (Fault::Truncate, 2),
        (Fault::WrongRange, 2),
        (Fault::Stall(Duration::from_secs(3)), 1),
    ];
    for (i, (fault, times)) in faults.into_iter().enumerate() {
        let key = format!("obj-{i}");
        let data = pattern(700 + i as u64, 4 * CS as usize + 17);
        moto().put(&bucket, &key, &data);
        let (before_retries, before_injected) = (fleet.total("origin_retries"), relay.injected());
        relay.inject(Match::ranged_get(&key), fault.clone(), times);
        let url = format!("s3://{bucket}/{key}");
        let got = client.read(&url).unwrap_or_else(|e| panic!("{}: read failed: {e}", fault.name()));
        assert!(got == data, "{}: wrong bytes", fault.name());
        assert_eq!(
            relay.injected() - before_injected,
            times as u64,
            "{}: not every fault was hit",
            fault.name()
        );
        // The first GET of a cold read is a single attempt (it falls back to HEAD + GET), so a
        // fault there is not a retry; all the others are.
        assert!(
            fleet.total("origin_retries") - before_retries >= times as u64 - 1,
            "{}: retries were not counted",
            fault.name()
        );
        // What was cached is the right data: a second read comes from the cache, byte-exact.
        fleet.wait_cached(4 * (i as u64 + 1));
        assert!(client.read(&url).unwrap() == data, "{}: the cache kept bad bytes", fault.name());
    }
    assert_eq!(relay.pending(), 0);
}

#[test]
fn an_object_replaced_between_two_chunk_fetches_is_stale_or_whole_never_mixed() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("replaced");
    let (_cfg, fleet) = relay.fleet(2, "", &[]);
    let client = fleet.client(CS);
    let mut stale = 0;
    for i in 0..4u64 {
        let key = format!("r{i}");
        let (v1, v2) = (pattern(800 + i, 8 * CS as usize), pattern(900 + i, 8 * CS as usize));
        moto().put(&bucket, &key, &v1);
        let (b, k, v) = (bucket.clone(), key.clone(), v2.clone());
        relay.inject(Match::ranged_get(&key), Fault::Replace(Arc::new(move || moto().put(&b, &k, &v))), 1);
        let url = format!("s3://{bucket}/{key}");
        // Pinned to the first version's metadata, so the read cannot start over.
        let meta = client.stat(&url).unwrap();
        let mut buf = vec![0u8; v1.len()];
        match client.read_at(&url, &meta, 0, &mut buf[..]) {
            Ok(n) => assert!(buf[..n] == v1[..n], "a read returned bytes of two versions"),
            Err(memarts_shim::Error::Stale(m)) => {
                stale += 1;
                assert!(m.contains(&key), "the stale error names the object: {m}");
            }
            Err(e) => panic!("expected a typed Stale error, got {e}"),
        }
        // An unpinned whole read returns one version, whole.
        let whole = client.read(&url).unwrap();
        assert!(whole == v1 || whole == v2, "a whole read mixed versions");
    }
    assert!(stale > 0, "no read ever met the replaced object");
}

#[test]
fn with_the_origin_down_cached_data_is_served_and_misses_fail_in_time() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("down");
    let (_cfg, fleet) = relay.fleet(2, "meta_ttl_secs = 0.5", &[]);
    let client = fleet.client(CS);
    let (cached, missed) = (pattern(1000, 3 * CS as usize), pattern(1001, 3 * CS as usize));
    moto().put(&bucket, "cached", &cached);
    moto().put(&bucket, "missed", &missed);
    let (cached_url, missed_url) = (format!("s3://{bucket}/cached"), format!("s3://{bucket}/missed"));
    let only_url = format!("s3://{bucket}/only-in-cache");
    assert!(client.read(&cached_url).unwrap() == cached);
    client.put_memarts_bytes(&only_url, &missed).unwrap();
    fleet.wait_cached(3);

    relay.set_down(true);
    // Past the metadata TTL: the cached version cannot be revalidated, and is still served.
    std::thread::sleep(Duration::from_millis(700));
    assert!(client.read(&cached_url).unwrap() == cached, "cached data while the origin is down");
    let mut sink = memarts_shim::VecSink::default();
    client.read_memarts_to(&only_url, &mut sink).unwrap();
    // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
    assert!(unsafe { sink.finish() } == missed, "memarts-only data while the origin is down");
    let started = Instant::now();
    let err = client.read(&missed_url).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, memarts_shim::Error::Origin(_)), "a miss with the origin down: {err}");
    assert!(took < client.config().deadline, "the miss failed after {took:?}");

    relay.set_down(false);
    assert!(client.read(&missed_url).unwrap() == missed, "the miss succeeds once the origin is back");
}
