//! A1: `start_proxy` is ready in seconds whatever the cache holds, the index being rebuilt in the
//! background. A2: `stop_proxy` lets the requests in flight finish (and the chunks they fetched reach
//! the disk) before the slots exit, and removes what killed slots left, without touching live ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern, text, Fleet};

const CS: u64 = 1 << 20;

#[test]
fn start_proxy_is_ready_at_once_over_a_large_cache_and_rebuilds_its_index_in_the_background() {
    const CHUNKS: u64 = 20_000;
    let fleet = Fleet::new(&[]);
    // Chunk files as a previous fleet left them (their content is only read when served).
    let chunks = fleet.cache_dir.join("v1/chunks");
    let mut x: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
    for _ in 0..CHUNKS {
        x = x.wrapping_mul(0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645).wrapping_add(1);
        let hex = format!("{:032x}", x & !(0xff << 112)); // 256 fan-out directories
        let dir = chunks.join(&hex[0..2]).join(&hex[2..4]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::File::create(dir.join(&hex)).unwrap();
    }
    let started = Instant::now();
    fleet.start_proxy(2);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "start_proxy over {CHUNKS} chunks took {took:?}");
    // Each slot said it was ready before its index was rebuilt: the rebuild runs behind the serving.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        assert!(Instant::now() < deadline, "the index rebuild did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    for slot in 0..2 {
        let log = std::fs::read_to_string(fleet.run_dir.join(format!("proxy-{slot}.log"))).unwrap();
        let ready =
            log.find(&format!("slot {slot}/2 ready")).unwrap_or_else(|| panic!("no ready line:\n{log}"));
        let rebuilt = log.find("index rebuilt").unwrap_or_else(|| panic!("no rebuild line:\n{log}"));
        assert!(ready < rebuilt, "slot {slot} rebuilt its index before it was ready:\n{log}");
    }
    assert_eq!(fleet.total("cached_chunks"), CHUNKS, "the rebuilt indexes hold every chunk on disk");
}

/// Keys in `bucket` whose chunk 0 slot `0`, `1`, ... of a fleet of `slots` owns, one per slot.
fn key_per_slot(bucket: &str, slots: u32) -> Vec<String> {
    (0..slots)
        .map(|slot| {
            (0..)
                .map(|i| format!("drain-{i}"))
                .find(|k| {
                    let url = memarts_protocol::ObjectUrl::parse(&format!("s3://{bucket}/{k}")).unwrap();
                    memarts_protocol::chunk_owner(&url, CS, 0, slots) == slot
                })
                .unwrap()
        })
        .collect()
}

#[test]
fn stop_proxy_drains_reads_in_flight_and_cleans_up_after_killed_slots_only() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("drain");
    let keys = key_per_slot(&bucket, 3);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(4300 + i, CS as usize)).collect();
    for (k, d) in keys.iter().zip(&data) {
        moto().put(&bucket, k, d);
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("origin.toml");
    std::fs::write(
        &cfg,
        "[origin]\nfirst_byte_timeout_secs = 5.0\nbackoff_base_ms = 1\nbackoff_max_ms = 5\n",
    )
    .unwrap();
    let mut env = relay.env();
    env.push(("MEMARTS_CONFIG".into(), cfg.display().to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let fleet = Fleet::start(3, &env);

    // Slot 2 dies: its pid file and socket stay behind.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(fleet.pid(2)), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));

    // A 1 MiB cold read on each live slot, held at the origin for 2 s.
    for k in &keys[..2] {
        relay.inject(Match::ranged_get(k), Fault::Stall(Duration::from_secs(2)), 1);
    }
    let client = Arc::new(
        memarts_shim::Client::new(memarts_shim::ShimConfig {
            deadline: Duration::from_secs(8),
            ..fleet.client(CS).config().clone()
        })
        .unwrap(),
    );
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (client, url) = (client.clone(), format!("s3://{bucket}/{}", keys[i]));
            std::thread::spawn(move || client.read(&url))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while relay.injected() < 2 {
        assert!(Instant::now() < deadline, "the reads never reached the origin");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Stopped while the reads wait for the origin: the slots answer them, then exit. (Nothing would
    // answer them later: the fleet is not started again before they return.)
    let out = fleet.stop_proxy();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    for (i, r) in readers.into_iter().enumerate() {
        let got = r.join().unwrap().unwrap_or_else(|e| panic!("the read in flight on slot {i} failed: {e}"));
        assert!(got == data[i], "the read in flight on slot {i} returned wrong bytes");
    }
    // The dead slot's socket, pid file and metadata table.
    assert!(stdout.contains("stopped 2 proxies, cleaned 3 stale files"), "{stdout}{stderr}");
    assert!(!stderr.contains("did not drain"), "{stderr}");
    let left: Vec<String> = std::fs::read_dir(&fleet.run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock") || n.ends_with(".pid") || n.ends_with(".table"))
        .collect();
    assert!(left.is_empty(), "stop_proxy left {left:?}");

    // The chunks those reads fetched were written before the slots exited.
    let gets = moto().gets_settled(&bucket);
    fleet.start_proxy(3);
    for (k, d) in keys[..2].iter().zip(&data) {
        assert!(client.read(&format!("s3://{bucket}/{k}")).unwrap() == *d);
    }
    assert_eq!(moto().gets_settled(&bucket), gets, "a chunk fetched while draining was not cached");
}
