//! memarts-only objects (`write_memarts`) on a real fleet: D4, eviction of the chunk cache never
//! touches them and no room is a typed `NoSpace`, fleet-wide; I2, damage to one is a typed `Corrupt`
//! (there is no other copy to fall back on), whether the proxy or the shim checks the bytes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{pattern, Fleet};

const CS: u64 = 1 << 20;

fn read_only(client: &memarts_shim::Client, url: &str) -> memarts_shim::Result<Vec<u8>> {
    let mut sink = memarts_shim::VecSink::default();
    client.read_memarts_to(url, &mut sink)?;
    // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
    Ok(unsafe { sink.finish() })
}

/// The files of `<cache>/v1/memarts` (one per memarts-only object).
fn only_files(cache_dir: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(cache_dir.join("v1/memarts")).unwrap().flatten().map(|e| e.path()).collect()
}

fn wait_index_ready(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        assert!(Instant::now() < deadline, "the index rebuild did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn eviction_never_removes_memarts_only_objects_and_no_room_is_a_typed_no_space() {
    let quota: u64 = 4 << 20;
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_ONLY_CAPACITY", "4MiB")]);
    let client = fleet.client(CS);
    wait_index_ready(&fleet);

    // Memarts-only objects on both slots, well within the quota.
    let only: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("s3://only-bucket/keep/{i}"), pattern(3000 + i, 300_000 + i as usize)))
        .collect();
    for (url, data) in &only {
        client.put_memarts_bytes(url, data).unwrap_or_else(|e| panic!("{url}: {e}"));
    }

    // Fill the chunk cache half again past its capacity: eviction has to run.
    for i in 0..12u64 {
        let path = fleet.dir.path().join(format!("origin-{i}"));
        let data = pattern(3100 + i, 8 << 20);
        std::fs::write(&path, &data).unwrap();
        assert!(client.read(&path.display().to_string()).unwrap() == data, "origin object {i} differs");
    }
    // Read twice more, the last objects are read more often than the first: they push them out.
    for _ in 0..2 {
        for i in 8..12u64 {
            let path = fleet.dir.path().join(format!("origin-{i}"));
            assert!(client.read(&path.display().to_string()).is_ok(), "origin object {i}");
        }
    }
    assert!(fleet.total("evicted_chunks") > 0, "nothing was evicted: the test did not fill the cache");
    for (url, data) in &only {
        let got = read_only(&client, url).unwrap_or_else(|e| panic!("{url} after eviction: {e}"));
        assert!(got == *data, "{url} differs after eviction");
    }

    // Then more memarts-only objects than the quota holds, spread over both slots: each is either
    // acknowledged or refused with a typed NoSpace that says why, and what was acknowledged fits in
    // the quota fleet-wide, headers included.
    let mut acked = only.clone();
    let mut refused = Vec::new();
    for i in 0..24u64 {
        let (url, data) = (format!("s3://only-bucket/more/{i}"), pattern(3200 + i, 300_000));
        match client.put_memarts_bytes(&url, &data) {
            Ok(_) => acked.push((url, data)),
            Err(memarts_shim::Error::NoSpace(why)) => {
                assert!(why.contains("quota"), "a NoSpace that does not say why: {why}");
                refused.push(url);
            }
            Err(e) => panic!("{url}: expected success or NoSpace, got {e}"),
        }
    }
    assert!(!refused.is_empty(), "24 objects of 300 KB never filled a 4 MiB quota");
    let on_disk: u64 = only_files(&fleet.cache_dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert!(
        on_disk <= quota,
        "{} memarts-only objects take {on_disk} bytes, over the fleet-wide quota of {quota}",
        acked.len()
    );
    for url in &refused {
        assert!(
            matches!(read_only(&client, url), Err(memarts_shim::Error::NotFound(_))),
            "refused {url} exists"
        );
    }
    for (url, data) in &acked {
        assert!(read_only(&client, url).unwrap() == *data, "{url} differs");
    }
}

/// Damages the bytes of a file in place.
type Damage = fn(&mut Vec<u8>);

/// Writes one memarts-only object and returns the file that holds it.
fn write_one(fleet: &Fleet, client: &memarts_shim::Client, url: &str, data: &[u8]) -> PathBuf {
    let before = only_files(&fleet.cache_dir);
    client.put_memarts_bytes(url, data).unwrap();
    let mut new: Vec<PathBuf> = only_files(&fleet.cache_dir).difference(&before).cloned().collect();
    assert_eq!(new.len(), 1, "one file per memarts-only object");
    new.pop().unwrap()
}

#[test]
fn a_damaged_memarts_only_object_is_a_typed_corrupt_error_never_bad_bytes() {
    let fleet = Fleet::start(2, &[]);
    let client = fleet.client(CS);
    // Small objects go inline (checked by the proxy), large ones by descriptor (checked by the shim).
    for (size, name) in [(20_000usize, "small"), (3 << 20, "large")] {
        let damages: [(&str, Damage); 4] = [
            ("a flipped data byte", |b| *b.last_mut().unwrap() ^= 0x10),
            ("a flipped header byte", |b| b[17] ^= 1),
            ("a truncated file", |b| b.truncate(b.len() - 100)),
            ("an emptied file", |b| b.clear()),
        ];
        for (i, (what, damage)) in damages.into_iter().enumerate() {
            let url = format!("s3://damaged/{name}/{i}");
            let data = pattern(3300 + i as u64, size);
            let file = write_one(&fleet, &client, &url, &data);
            assert!(read_only(&client, &url).unwrap() == data);
            let corrupt_before = fleet.total("corrupt_chunks");
            let mut bytes = std::fs::read(&file).unwrap();
            damage(&mut bytes);
            std::fs::write(&file, &bytes).unwrap();
            match read_only(&client, &url) {
                Err(memarts_shim::Error::Corrupt(m)) => assert!(m.contains(&url), "{name}, {what}: {m}"),
                Ok(got) => panic!("{name}, {what}: served {} bytes (equal: {})", got.len(), got == data),
                Err(e) => panic!("{name}, {what}: expected a typed Corrupt, got {e}"),
            }
            if size <= 64 << 10 || i > 0 {
                assert!(fleet.total("corrupt_chunks") > corrupt_before, "{name}, {what}: not counted");
            }
        }
    }
    // Undamaged objects are still served.
    let data = pattern(3399, 5000);
    write_one(&fleet, &client, "s3://damaged/fine", &data);
    assert!(read_only(&client, "s3://damaged/fine").unwrap() == data);
}
