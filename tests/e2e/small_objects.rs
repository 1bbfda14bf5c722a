//! Many small objects through a fleet (issue 31) that packs them (`MEMARTS_PACK_MAX`): into segment
//! files, not a file each; a restarted fleet serves them all with no origin request, with the same
//! number of slots or another; a slot killed with `kill -9` in the middle of a fill loses no
//! acknowledged byte and serves no wrong one; a full cache evicts and compacts within its capacity.
//! Every object read is compared with its bytes.

use std::path::{Path, PathBuf};

use crate::common::{pattern, text, Fleet};

/// Small chunks packed.
const PACKED: &[(&str, &str)] = &[("MEMARTS_PACK_MAX", "32KiB")];

/// Objects of the main test (`MEMARTS_TEST_SMALL_OBJECTS` to change it).
fn objects() -> usize {
    std::env::var("MEMARTS_TEST_SMALL_OBJECTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

/// `n` objects of 1-8 KiB in directories of 1,000 under `root`; returns their paths.
fn dataset(root: &Path, n: usize, seed: u64) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let dir = root.join(format!("d{:04}", i / 1000));
            if i % 1000 == 0 {
                std::fs::create_dir_all(&dir).unwrap();
            }
            let path = dir.join(format!("{i:07}.bin"));
            std::fs::write(&path, pattern(seed + i as u64, 1024 + (i * 977) % 7168)).unwrap();
            path
        })
        .collect()
}

/// Every object read through the fleet (4 threads) and compared with its file.
fn read_all_exact(fleet: &Fleet, paths: &[PathBuf]) {
    std::thread::scope(|s| {
        for part in paths.chunks(paths.len().div_ceil(4)) {
            s.spawn(move || {
                let client = fleet.client(memarts_protocol::DEFAULT_CHUNK_SIZE);
                for p in part {
                    let got = client.read(&p.display().to_string()).unwrap();
                    assert!(got == std::fs::read(p).unwrap(), "{} differs", p.display());
                }
            });
        }
    });
}

/// GETs in every slot's request log (of every fleet size the run dir has seen).
fn origin_gets(fleet: &Fleet) -> usize {
    std::fs::read_dir(&fleet.run_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("origin-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .map(|log| log.lines().filter(|l| l.contains(" GET ")).count())
        .sum()
}

fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map_or(0, |d| d.flatten().map(|e| if e.path().is_dir() { files_under(&e.path()) } else { 1 }).sum())
}

/// Bytes the cache's chunks take on disk: chunk files and packed segments (what the capacity
/// bounds; the metadata snapshots of `v1/meta` are not chunks).
fn chunk_bytes(cache_dir: &Path) -> u64 {
    bytes_on_disk(&cache_dir.join("v1/chunks")) + bytes_on_disk(&cache_dir.join("v1/segments"))
}

fn bytes_on_disk(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .map(|e| {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    bytes_on_disk(&e.path())
                } else {
                    m.blocks() * 512
                }
            })
            .sum()
    })
}

#[test]
fn many_small_objects_are_packed_survive_a_restart_and_a_kill_9_and_read_back_exact() {
    let fleet = Fleet::start(2, PACKED);
    fleet.wait_index_ready();
    let n = objects();
    let data = fleet.dir.path().join("data");
    let paths = dataset(&data, n, 31);
    let object_bytes: u64 = paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();

    let out = fleet.memarts(&["warmup", &data.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(origin_gets(&fleet), n, "one GET per object");
    // Packed: a few segment files, no chunk file per object; and close to the objects' bytes.
    assert_eq!(files_under(&fleet.cache_dir.join("v1/chunks")), 0, "small chunks kept as files");
    let on_disk = bytes_on_disk(&fleet.cache_dir.join("v1"));
    assert!(on_disk < object_bytes * 13 / 10, "{on_disk} bytes on disk for {object_bytes} of objects");

    // A restart (clean stop): every object from the cache, no GET; then as a fleet of 3 (each
    // slot takes the chunks it now owns from the others' segments) and of 2 again.
    for slots in [2, 3, 2] {
        fleet.stop_proxy();
        fleet.start_proxy(slots);
        fleet.wait_index_ready();
        read_all_exact(&fleet, &paths);
        let logs = fleet.slot_logs();
        let told: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("segment") || l.contains("packed") || l.contains("rebuilt"))
            .collect();
        assert_eq!(origin_gets(&fleet), n, "a restarted fleet of {slots} asked the origin again: {told:#?}");
    }

    // kill -9 of a slot in the middle of a fill of new objects: what it had appended is served
    // whole or fetched again, never torn; the other slot and what was cached before lose nothing.
    let more = fleet.dir.path().join("more");
    let new_paths = dataset(&more, 20_000, 7_000_000);
    let mut warmup = fleet.command(&["warmup", &more.display().to_string()]).spawn().unwrap();
    let victim = fleet.pid(1);
    let started = std::time::Instant::now();
    while origin_gets(&fleet) < n + 5_000 {
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "the fill did not progress");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), nix::sys::signal::Signal::SIGKILL).unwrap();
    // The fill ends there (its reads of the dead slot's objects would wait for their deadline).
    let _ = warmup.kill();
    let _ = warmup.wait();
    fleet.recover(2);
    fleet.wait_index_ready();
    read_all_exact(&fleet, &new_paths);
    let gets = origin_gets(&fleet);
    read_all_exact(&fleet, &paths);
    assert_eq!(origin_gets(&fleet), gets, "objects cached before the kill were fetched again");
}

#[test]
fn a_full_cache_of_small_objects_evicts_and_compacts_within_its_capacity() {
    let cap: u64 = 64 << 20;
    let fleet = Fleet::start(2, &[PACKED[0], ("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    fleet.wait_index_ready();
    let data = fleet.dir.path().join("data");
    // About 180 MiB of objects: three times the capacity.
    let paths = dataset(&data, 40_000, 99);
    // Read once, the objects past the capacity are served and not kept; read 3 more times, the
    // last quarter pushes the first ones out (their records dead, their segments compacted).
    for pass in 0..4 {
        read_all_exact(&fleet, if pass == 0 { &paths } else { &paths[30_000..] });
        let on_disk = chunk_bytes(&fleet.cache_dir);
        assert!(on_disk <= cap, "{on_disk} bytes on disk for a capacity of {cap}: {}", disk_report(&fleet));
    }
    assert!(fleet.total("evicted_chunks") > 0, "nothing was evicted");
    let segments = files_under(&fleet.cache_dir.join("v1/segments"));
    assert!(segments > 0, "nothing was packed");
    // After a restart, what was kept is served, and still exact.
    fleet.stop_proxy();
    fleet.start_proxy(2);
    fleet.wait_index_ready();
    read_all_exact(&fleet, &paths);
    let on_disk = chunk_bytes(&fleet.cache_dir);
    assert!(
        on_disk <= cap,
        "{on_disk} bytes on disk for a capacity of {cap} after a restart: {}",
        disk_report(&fleet)
    );
}

/// What the cache holds, for a failure's message.
fn disk_report(fleet: &Fleet) -> String {
    let mut out = format!("used {} ", fleet.total("cache_bytes_used"));
    for slot in 0..2 {
        let dir = fleet.cache_dir.join(format!("v1/segments/{slot}"));
        let files: Vec<String> = std::fs::read_dir(&dir).map_or(Vec::new(), |d| {
            d.flatten()
                .map(|e| format!("{}:{}", e.file_name().to_string_lossy(), e.metadata().unwrap().len()))
                .collect()
        });
        out += &format!("slot {slot}: {files:?} ");
    }
    out
}
