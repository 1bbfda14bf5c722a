//! The cache survives restarts (same or different N, clean stop or kill -9), and the lifecycle
//! commands clean up after crashes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{moto, pattern, text, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn restart_with_same_and_different_n_keeps_the_cache_warm() {
    let bucket = moto().bucket("restart");
    let objects: Vec<Vec<u8>> = (0..6).map(|i| pattern(10 + i, 5 * CS as usize + i as usize)).collect();
    for (i, o) in objects.iter().enumerate() {
        moto().put(&bucket, &format!("o{i}"), o);
    }
    let fleet = Fleet::start(4, &[]);
    let read_all = |fleet: &Fleet| {
        let client = fleet.client(CS);
        for (i, o) in objects.iter().enumerate() {
            assert!(client.read(&format!("s3://{bucket}/o{i}")).unwrap() == *o, "object {i} differs");
        }
    };
    read_all(&fleet);
    let cold = moto().gets_settled(&bucket);
    let chunks: usize = objects.iter().map(|o| o.len().div_ceil(CS as usize)).sum();
    assert_eq!(cold, chunks, "one GET per chunk");
    for n in [4, 3, 1, 6, 3] {
        let heads = moto().requests(&format!("HEAD /{bucket}/"));
        fleet.stop_proxy();
        assert!(!fleet.run_dir.join("proxy-0.sock").exists(), "stop_proxy left a socket");
        fleet.start_proxy(n);
        // After a fleet of another size, each slot takes the metadata it now serves from the
        // previous fleet's snapshots before its index is ready.
        fleet.wait_index_ready();
        read_all(&fleet);
        assert_eq!(moto().gets_settled(&bucket), cold, "restart with N={n} re-fetched cached chunks");
        // Clean stops: the metadata saved is still within its TTL, whatever the new N.
        let after = moto().requests(&format!("HEAD /{bucket}/"));
        assert_eq!(after, heads, "a clean restart with N={n} asked the origin for metadata again");
    }
}

#[test]
fn kill_9_of_a_slot_during_reads_then_recovery_loses_no_read() {
    let bucket = moto().bucket("kill");
    let objects: Arc<Vec<Vec<u8>>> =
        Arc::new((0..8).map(|i| pattern(20 + i, 9 * CS as usize + 11)).collect());
    for (i, o) in objects.iter().enumerate() {
        moto().put(&bucket, &format!("o{i}"), o);
    }
    let fleet = Fleet::start(3, &[]);
    let client = Arc::new(fleet.client(CS));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..8)
        .map(|r| {
            let (client, objects, stop, reads, bucket) =
                (client.clone(), objects.clone(), stop.clone(), reads.clone(), bucket.clone());
            std::thread::spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % objects.len();
                    let got = client
                        .read(&format!("s3://{bucket}/o{k}"))
                        .unwrap_or_else(|e| panic!("read o{k}: {e}"));
                    assert!(got == objects[k], "object {k} differs");
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    kill(Pid::from_raw(fleet.pid(1)), Signal::SIGKILL).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    fleet.recover(3);
    let at_recovery = reads.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader failed");
    }
    assert!(reads.load(Ordering::Relaxed) > at_recovery, "reads made progress after recovery");
}

#[test]
fn stop_proxy_after_kill_9_of_the_whole_fleet_cleans_up_and_start_works() {
    let bucket = moto().bucket("crash");
    let want = pattern(30, 3 * CS as usize);
    moto().put(&bucket, "x", &want);
    let fleet = Fleet::start(3, &[]);
    assert_eq!(fleet.client(CS).read(&format!("s3://{bucket}/x")).unwrap(), want);
    fleet.wait_cached(3);
    for slot in 0..3 {
        kill(Pid::from_raw(fleet.pid(slot)), Signal::SIGKILL).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    // A start over the wreck must work: stale files are not a live fleet.
    let out = fleet.stop_proxy();
    // Per slot: its socket, its pid file, its metadata table, its packed table and its resident table.
    assert!(text(&out.stdout).contains("stopped 0 proxies, cleaned 15 stale files"), "{}", text(&out.stdout));
    let leftovers: Vec<_> = std::fs::read_dir(&fleet.run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock") || n.ends_with(".pid") || n.ends_with(".table"))
        .collect();
    assert!(leftovers.is_empty(), "stop_proxy left {leftovers:?}");
    // stop is idempotent.
    fleet.stop_proxy();
    let gets = moto().gets_settled(&bucket);
    fleet.start_proxy(2);
    assert_eq!(fleet.client(CS).read(&format!("s3://{bucket}/x")).unwrap(), want);
    assert_eq!(moto().gets_settled(&bucket), gets, "the cache did not survive kill -9 of the fleet");
}

#[test]
fn start_proxy_refuses_a_live_fleet_and_status_reports_every_slot() {
    let fleet = Fleet::start(2, &[]);
    let out = fleet.memarts(&["start_proxy", "2"]);
    assert!(!out.status.success(), "a second start_proxy over a live fleet succeeded");
    assert!(text(&out.stderr).contains("already running"), "{}", text(&out.stderr));
    let status = fleet.status();
    let slots = status["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2);
    for (i, s) in slots.iter().enumerate() {
        assert_eq!(s["slot"], i as u64);
        assert_eq!(s["alive"], true);
        assert!(s["pid"].as_u64().unwrap() > 0);
        for field in [
            "uptime_s",
            "connections",
            "hits",
            "misses",
            "bytes_from_cache",
            "bytes_from_origin",
            "cache_bytes_used",
            "cache_capacity",
        ] {
            assert!(!s[field].is_null(), "status lacks {field}");
        }
    }
    kill(Pid::from_raw(fleet.pid(0)), Signal::SIGKILL).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let out = fleet.memarts(&["status", "--json"]);
    assert!(!out.status.success(), "status exits non-zero when a slot is down");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["slots"][0]["alive"], false);
    assert_eq!(v["slots"][1]["alive"], true);
}

#[test]
fn a_slot_that_is_down_is_retried_until_it_is_back() {
    let bucket = moto().bucket("down");
    let want = pattern(40, 4 * CS as usize);
    moto().put(&bucket, "y", &want);
    let fleet = Fleet::start(1, &[]);
    // Through the slot (a local read of the warm object would need no slot at all).
    let client = fleet.proxy_client(CS);
    let url = format!("s3://{bucket}/y");
    assert_eq!(client.read(&url).unwrap(), want);
    fleet.stop_proxy();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            fleet.start_proxy(1);
        });
        let started = std::time::Instant::now();
        assert_eq!(client.read(&url).unwrap(), want, "the read waits for the slot to come back");
        assert!(started.elapsed() >= Duration::from_millis(1000));
    });

    // With a short deadline and no fleet, the call fails in time with a typed error.
    let short = memarts_shim::Client::new(memarts_shim::ShimConfig {
        deadline: Duration::from_millis(800),
        ..fleet.client(CS).config().clone()
    })
    .unwrap();
    fleet.stop_proxy();
    let started = std::time::Instant::now();
    let err = short.read(&url).unwrap_err();
    assert!(matches!(err, memarts_shim::Error::Unavailable(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "the deadline was not kept: {:?}", started.elapsed());
}

#[test]
fn the_pread_engine_can_be_selected_and_serves_the_same_cache() {
    let bucket = moto().bucket("pread");
    let want = pattern(41, 6 * CS as usize);
    moto().put(&bucket, "z", &want);
    // `auto` even in the pass of the suite that forces pread through MEMARTS_IO_ENGINE.
    let fleet = Fleet::start(2, &[("MEMARTS_IO_ENGINE", "auto")]);
    let url = format!("s3://{bucket}/z");
    assert_eq!(fleet.client(CS).read(&url).unwrap(), want);
    fleet.wait_cached(6);
    let io_engine = |fleet: &Fleet| fleet.status()["slots"][0]["io_engine"].as_str().unwrap().to_string();
    assert_eq!(io_engine(&fleet), "io_uring", "auto picks io_uring where the kernel allows it");
    let gets = moto().gets_settled(&bucket);
    fleet.stop_proxy();
    let out = fleet.memarts(&["start_proxy", "2", "--io-engine", "pread"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(io_engine(&fleet), "pread");
    assert_eq!(fleet.client(CS).read(&url).unwrap(), want);
    assert_eq!(moto().gets_settled(&bucket), gets, "chunks written by io_uring are served by pread");
}

#[test]
fn start_proxy_says_which_slot_failed_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"a file where the cache dir should be").unwrap();
    let out = std::process::Command::new(crate::common::fleet::memarts_bin())
        .args(["start_proxy", "2", "--cache-dir"])
        .arg(&blocker)
        .env("MEMARTS_RUN_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "start_proxy succeeded over an unusable cache dir");
    let err = text(&out.stderr);
    assert!(err.contains("slot 0") && err.contains("slot 1"), "{err}");
    assert!(err.contains("cache dir") && err.contains("not-a-dir"), "the reason is missing: {err}");
    // Nothing is left running: a second attempt with a good cache dir starts cleanly.
    let out = std::process::Command::new(crate::common::fleet::memarts_bin())
        .args(["start_proxy", "1", "--cache-dir"])
        .arg(dir.path().join("cache"))
        .env("MEMARTS_RUN_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = std::process::Command::new(crate::common::fleet::memarts_bin())
        .args(["stop_proxy"])
        .env("MEMARTS_RUN_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// `n` objects `o0..` of about `chunks` chunks each in a new bucket: (bucket, contents).
fn put_objects(hint: &str, n: u64, chunks: usize, seed: u64) -> (String, Vec<Vec<u8>>) {
    let bucket = moto().bucket(hint);
    let objects = put_objects_in(&bucket, n, chunks, seed);
    (bucket, objects)
}

/// [`put_objects`] into `bucket`.
fn put_objects_in(bucket: &str, n: u64, chunks: usize, seed: u64) -> Vec<Vec<u8>> {
    let objects: Vec<Vec<u8>> =
        (0..n).map(|i| pattern(seed + i, chunks * CS as usize + i as usize)).collect();
    for (i, o) in objects.iter().enumerate() {
        moto().put(bucket, &format!("o{i}"), o);
    }
    objects
}

/// A client of `fleet` whose calls give up after `deadline`.
/// A client of the proxies only (these tests are about reaching slots that restart; a local read of
/// a warm object needs no slot at all).
fn client_with_deadline(fleet: &Fleet, deadline: Duration) -> memarts_shim::Client {
    let cfg = memarts_shim::ShimConfig { deadline, parallel: 8, ..fleet.proxy_client(CS).config().clone() };
    memarts_shim::Client::new(cfg).unwrap()
}

/// Reads object `i` of `objects` and checks it byte for byte.
fn read_checked(client: &memarts_shim::Client, bucket: &str, objects: &[Vec<u8>], i: usize) {
    let got = client.read(&format!("s3://{bucket}/o{i}"));
    assert!(got.as_ref().is_ok_and(|g| *g == objects[i]), "object {i}: {:?}", got.err());
}

#[test]
fn a_client_that_outlives_a_restart_reconnects_at_once() {
    let (bucket, objects) = put_objects("outlive", 4, 12, 40);
    let fleet = Fleet::start(2, &[]);
    // A short deadline: a dead pooled connection must not cost a backoff sleep each.
    let client = client_with_deadline(&fleet, Duration::from_millis(1000));
    let read_all = || (0..objects.len()).for_each(|i| read_checked(&client, &bucket, &objects, i));
    read_all();
    read_all(); // warm: every slot's pool now holds several connections
    fleet.stop_proxy();
    fleet.start_proxy(2);
    read_all();
}

#[test]
fn a_client_that_outlives_a_shrinking_restart_is_rerouted() {
    // At least 8 objects, and as many more as it takes for one's first chunk to be owned by slot 2
    // or 3 of 4 (the bucket's name is new each run, and so are the owners).
    let bucket = moto().bucket("shrink");
    let owner = |i: u64| {
        let url = memarts_protocol::ObjectUrl::parse(&format!("s3://{bucket}/o{i}")).unwrap();
        memarts_protocol::chunk_owner(&url, CS, 0, 4)
    };
    let gone = (0..).find(|&i| owner(i) >= 2).expect("some object's first chunk is owned by slot 2 or 3");
    let objects = put_objects_in(&bucket, gone.max(7) + 1, 3, 60);
    let fleet = Fleet::start(4, &[]);
    let client = client_with_deadline(&fleet, Duration::from_secs(3));
    let read_all = || (0..objects.len()).for_each(|i| read_checked(&client, &bucket, &objects, i));
    read_all();
    let cold = moto().gets_settled(&bucket);
    fleet.stop_proxy();
    fleet.start_proxy(2);
    // The first call after the restart is routed (by the old size) to slot 2 or 3, which no longer
    // exist: it goes to a slot that does, at once, instead of waiting for a slot that never returns.
    let gone = gone as usize;
    read_checked(&client, &bucket, &objects, gone);
    read_all();
    assert_eq!(client.slots(), 2);
    assert_eq!(moto().gets_settled(&bucket), cold, "the smaller fleet re-fetched cached chunks");
}
