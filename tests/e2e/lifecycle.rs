//! A1: `start_proxy` is ready in seconds whatever the cache holds, the index being rebuilt in the
//! background. A2: `stop_proxy` lets the requests in flight finish (and the chunks they fetched reach
//! the disk) before the slots exit, and removes what killed slots left, without touching live ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_disk::chunk_file::{chunk_relative_path, ChunkId};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::files::files_below;
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
        let path = chunks.join(chunk_relative_path(ChunkId(x)));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::File::create(path).unwrap();
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

/// A cache written with the two-level fan-out of earlier versions (`<2 hex>/<2 hex>/<id>`) serves
/// on after an upgrade: its chunks are hits from the first read on (a lookup that misses moves a
/// chunk it finds there to its place), the index rebuild moves the others to `<2 hex>/<id>` and
/// removes the directories it empties, and nothing is fetched again.
#[test]
fn a_cache_of_the_two_level_layout_is_moved_to_one_level_and_served_without_refetching() {
    let bucket = moto().bucket("layout");
    let objects: Vec<(String, Vec<u8>)> =
        (0..12).map(|i| (format!("o{i}"), pattern(4400 + i, 2 * CS as usize + 1000))).collect();
    for (k, d) in &objects {
        moto().put(&bucket, k, d);
    }
    // Every chunk a file, as in a cache of the layout before (small ones are packed now).
    let fleet = Fleet::start(3, &[("MEMARTS_PACK_MAX", "0")]);
    let read_all = |client: &memarts_shim::Client| {
        for (k, d) in &objects {
            assert!(client.read(&format!("s3://{bucket}/{k}")).unwrap() == *d, "{k}: wrong bytes");
        }
    };
    read_all(&fleet.proxy_client(CS));
    let chunks = objects.len() as u64 * 3;
    fleet.wait_cached(chunks);
    fleet.stop_proxy();

    // Every chunk file where the two-level layout put it; a foreign file in one of its directories.
    let dir = fleet.cache_dir.join("v1/chunks");
    let moved_back = files_below(&dir);
    assert_eq!(moved_back.len() as u64, chunks);
    for f in &moved_back {
        let hex = f.file_name().unwrap().to_str().unwrap().to_string();
        let old = dir.join(&hex[0..2]).join(&hex[2..4]);
        std::fs::create_dir_all(&old).unwrap();
        std::fs::rename(f, old.join(&hex)).unwrap();
    }
    let first = &moved_back[0].file_name().unwrap().to_str().unwrap().to_string();
    let kept = dir.join(&first[0..2]).join(&first[2..4]).join("not-a-chunk");
    std::fs::write(&kept, b"foreign").unwrap();

    fleet.start_proxy(3);
    read_all(&fleet.proxy_client(CS));
    assert_eq!(fleet.total("misses"), 0, "a chunk was fetched again after the move");
    assert_eq!(fleet.total("hits"), chunks, "every chunk read through a slot was a hit");
    fleet.wait_index_ready();
    assert_eq!(fleet.total("cached_chunks"), chunks, "the rebuilt indexes hold every chunk");
    // Local reads (no slot asked) find the chunk files at their new paths.
    let direct = fleet.client(CS);
    read_all(&direct);
    let counters = direct.local_counters().expect("local reads are on");
    assert_eq!(counters.hits.load(std::sync::atomic::Ordering::Relaxed), chunks, "local hits");
    let mut now = files_below(&dir);
    now.retain(|f| *f != kept);
    let mut expected: Vec<_> = moved_back
        .iter()
        .map(|f| {
            let hex = f.file_name().unwrap().to_str().unwrap();
            dir.join(chunk_relative_path(ChunkId(u128::from_str_radix(hex, 16).unwrap())))
        })
        .collect();
    expected.sort();
    assert_eq!(now, expected, "every chunk file at its one-level path");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .flat_map(|fan| std::fs::read_dir(fan.path()).unwrap().flatten())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.path())
        .collect();
    assert_eq!(
        left,
        vec![kept.parent().unwrap().to_path_buf()],
        "only the directory with a foreign file is left"
    );
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
    // The dead slot's socket, pid file, metadata table, packed table and resident table.
    assert!(stdout.contains("stopped 2 proxies, cleaned 5 stale files"), "{stdout}{stderr}");
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
