//! R1: the bytes on disk (headers included) stay within the configured capacity, by LRU eviction.

use crate::common::{pattern, Fleet};

const CS: u64 = 1 << 20;

fn bytes_on_disk(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

#[test]
fn the_cache_stays_within_its_capacity_and_evicts_least_recently_used() {
    let cap: u64 = 64 << 20;
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    let client = fleet.client(CS);
    let objects: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            let path = fleet.dir.path().join(format!("obj-{i}"));
            let data = pattern(200 + i, 10 << 20);
            std::fs::write(&path, &data).unwrap();
            (path.display().to_string(), data)
        })
        .collect();
    // Wait for the (empty) index rebuild, after which capacity is enforced.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        assert!(std::time::Instant::now() < deadline, "index rebuild did not finish");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} differs");
    }
    let on_disk = bytes_on_disk(&fleet.cache_dir.join("v1"));
    assert!(on_disk <= cap, "{on_disk} bytes on disk for a capacity of {cap}");
    assert!(fleet.total("evicted_chunks") > 0, "nothing was evicted");
    assert!(fleet.total("cache_bytes_used") <= cap);
    assert_eq!(fleet.total("cache_capacity"), cap);
    // Everything still reads correctly, evicted or not.
    for (url, data) in objects.iter().rev() {
        assert!(client.read(url).unwrap() == *data, "{url} differs after eviction");
    }
    assert!(bytes_on_disk(&fleet.cache_dir.join("v1")) <= cap);
}
