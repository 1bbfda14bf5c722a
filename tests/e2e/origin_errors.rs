//! O3: what the origin refuses — 403 (access), 404 (absence), 412 (the version a read is pinned to
//! is gone) — is asked once, never retried, and reaches the caller as three distinct typed errors.
//! Every origin request goes through the fault relay, which counts them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

/// A one-slot fleet reaching the origin through `relay`, retrying fast (so a retry would show at
/// once), with its index rebuilt (so cold reads take their usual one-GET path).
fn fleet_behind(relay: &FaultRelay) -> (tempfile::TempDir, Fleet) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("origin.toml");
    std::fs::write(&cfg, "[origin]\nmax_attempts = 4\nbackoff_base_ms = 1\nbackoff_max_ms = 10\n").unwrap();
    let mut env: Vec<(String, String)> = relay.env();
    env.push(("MEMARTS_CONFIG".into(), cfg.display().to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let fleet = Fleet::start(1, &env);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet.status()["slots"][0]["index_ready"] != true {
        assert!(Instant::now() < deadline, "the index was never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    (dir, fleet)
}

/// Runs `call` and returns its result and how many origin requests it made.
fn counted<T>(relay: &FaultRelay, call: impl FnOnce() -> T) -> (T, u64) {
    let before = relay.requests();
    let out = call();
    (out, relay.requests() - before)
}

#[test]
fn forbidden_absent_and_replaced_objects_are_asked_once_and_give_distinct_errors() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("refusals");
    let (_cfg, fleet) = fleet_behind(&relay);
    let client = fleet.client(CS);
    let url = |key: &str| format!("s3://{bucket}/{key}");
    let data = pattern(4200, 4 * CS as usize);
    // "cold" in a directory of its own: a listing of the others' (their revalidation) would make its
    // version known, and a read of a known version asks for its chunks at once, not for chunk 0.
    for key in ["elsewhere/cold", "warm", "pinned"] {
        moto().put(&bucket, key, &data);
    }
    assert!(client.read(&url("warm")).unwrap() == data);
    let meta = client.stat(&url("pinned")).unwrap();
    let retries = fleet.total("origin_retries");

    // 404: a read and a stat of an object that does not exist.
    let (got, asked) = counted(&relay, || client.read(&url("missing")));
    assert!(matches!(got, Err(memarts_shim::Error::NotFound(_))), "read of a missing object: {got:?}");
    assert_eq!(asked, 1, "a read of a missing object asked the origin {asked} times");
    let (got, asked) = counted(&relay, || client.stat(&url("also-missing")));
    assert!(matches!(got, Err(memarts_shim::Error::NotFound(_))), "stat of a missing object: {got:?}");
    assert_eq!(asked, 1, "a stat of a missing object asked the origin {asked} times");

    // 412: the object is replaced just before a read pinned to the old version fetches a chunk.
    let (b, k, v) = (bucket.clone(), "pinned".to_string(), pattern(4201, data.len()));
    relay.inject(Match::ranged_get("pinned"), Fault::Replace(Arc::new(move || moto().put(&b, &k, &v))), 1);
    let mut buf = vec![0u8; 1000];
    let (got, asked) = counted(&relay, || client.read_at(&url("pinned"), &meta, 2 * CS, &mut buf[..]));
    assert!(matches!(got, Err(memarts_shim::Error::Stale(_))), "a pinned read of a replaced object: {got:?}");
    assert_eq!(asked, 1, "a read that met a 412 asked the origin {asked} times");

    // 403: the origin refuses our key, for a cold object, a chunk of a warm one and a stat.
    relay.allow_keys(Some(vec!["not-our-key".into()]));
    let warm_meta = client.stat(&url("warm")).unwrap();
    let (got, asked) = counted(&relay, || client.read(&url("elsewhere/cold")));
    assert!(matches!(got, Err(memarts_shim::Error::PermissionDenied(_))), "a refused cold read: {got:?}");
    assert_eq!(asked, 1, "a refused cold read asked the origin {asked} times");
    let (got, asked) = counted(&relay, || client.stat_opts(&url("warm"), true));
    assert!(matches!(got, Err(memarts_shim::Error::PermissionDenied(_))), "a refused stat: {got:?}");
    assert_eq!(asked, 1, "a refused stat asked the origin {asked} times");
    let uncached =
        memarts_shim::Client::new(memarts_shim::ShimConfig { chunk_size: 2 * CS, ..client.config().clone() })
            .unwrap();
    let (got, asked) = counted(&relay, || uncached.read_at(&url("warm"), &warm_meta, 0, &mut buf[..]));
    assert!(matches!(got, Err(memarts_shim::Error::PermissionDenied(_))), "a refused chunk: {got:?}");
    assert_eq!(asked, 1, "a refused chunk asked the origin {asked} times");
    assert_eq!(relay.refused_keys(), 3);
    relay.allow_keys(None);

    assert_eq!(fleet.total("origin_retries"), retries, "a refusal was counted as retried");
    // What is cached is still served, and the refused object reads once the origin allows it.
    assert!(client.read(&url("warm")).unwrap() == data);
    assert!(client.read(&url("elsewhere/cold")).unwrap() == data);
}
