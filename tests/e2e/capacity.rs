//! R1: the bytes on disk (headers included) stay within the configured capacity; and what a full
//! cache keeps (issue 15): repeated epochs over a dataset twice the cache keep a stable half of it
//! resident, sequential or shuffled, where plain LRU keeps nothing useful.

use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::common::{moto, pattern, Fleet};

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

fn wait_index_ready(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        assert!(Instant::now() < deadline, "index rebuild did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_cache_stays_within_its_capacity_and_evicts_to_make_room() {
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
    wait_index_ready(&fleet);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} differs");
    }
    // Read once, the chunks past the capacity were served and not kept (no more often read than
    // those cached); read twice more, the last objects push the first ones out.
    assert!(fleet.total("rejected_chunks") > 0, "the fill did not reach the capacity");
    for _ in 0..2 {
        for (url, data) in &objects[8..] {
            assert!(client.read(url).unwrap() == *data, "{url} differs");
        }
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

/// 128 objects of 1 MiB in chunks of 256 KiB: 128 MiB, twice a cache of 64 MiB.
const EPOCH_OBJECTS: u64 = 128;
const EPOCH_CHUNK: u64 = 256 << 10;

/// Hits of each of `epochs` reads of every object (shuffled anew each epoch with `shuffle`), as
/// ratios of the chunks read, from the fleet's `status --json` counters. Every byte is checked.
fn epoch_hit_ratios(fleet: &Fleet, objects: &[(String, Vec<u8>)], epochs: usize, shuffle: bool) -> Vec<f64> {
    let client = fleet.client(EPOCH_CHUNK);
    let chunks = objects.iter().map(|(_, d)| (d.len() as u64).div_ceil(EPOCH_CHUNK)).sum::<u64>() as f64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut order: Vec<usize> = (0..objects.len()).collect();
    (0..epochs)
        .map(|_| {
            if shuffle {
                order.shuffle(&mut rng);
            }
            let before = fleet.total("hits");
            for &i in &order {
                let (url, data) = &objects[i];
                assert!(client.read(url).unwrap() == *data, "{url} differs");
            }
            client.send_read_reports();
            (fleet.total("hits") - before) as f64 / chunks
        })
        .collect()
}

/// Epoch 2 of a dataset twice the cache hits at least 0.9 × capacity / dataset (issue 15).
fn second_epoch_keeps_a_stable_part(shuffle: bool) {
    let cap: u64 = 64 << 20;
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    let bucket = moto().bucket(if shuffle { "epochs-shuffled" } else { "epochs-sequential" });
    let objects: Vec<(String, Vec<u8>)> = (0..EPOCH_OBJECTS)
        .map(|i| {
            let data = pattern(1500 + i, 1 << 20);
            moto().put(&bucket, &format!("d/{i:03}"), &data);
            (format!("s3://{bucket}/d/{i:03}"), data)
        })
        .collect();
    let dataset = (EPOCH_OBJECTS << 20) as f64;
    wait_index_ready(&fleet);
    let ratios = epoch_hit_ratios(&fleet, &objects, 2, shuffle);
    let best = cap as f64 / dataset;
    println!(
        "epoch hit ratios ({}): {ratios:?}, best possible {best}",
        if shuffle { "shuffled" } else { "sequential" }
    );
    assert!(ratios[1] >= 0.9 * best, "epoch 2 hit ratio {} < 0.9 x {best}: {ratios:?}", ratios[1]);
    assert!(fleet.total("rejected_chunks") > 0, "nothing was refused: the dataset fit");
    let on_disk = bytes_on_disk(&fleet.cache_dir.join("v1"));
    assert!(on_disk <= cap, "{on_disk} bytes on disk for a capacity of {cap}");
}

#[test]
fn sequential_epochs_over_twice_the_cache_keep_a_stable_part_resident() {
    second_epoch_keeps_a_stable_part(false);
}

#[test]
fn shuffled_epochs_over_twice_the_cache_keep_a_stable_part_resident() {
    second_epoch_keeps_a_stable_part(true);
}

/// A job that moves to another dataset (issue 15): after 3 epochs over a dataset A that fits,
/// B, twice the cache and read in a new order each pass, hits at least 0.9 × capacity / B by its
/// 3rd pass: A's higher counts hold it back for one pass, not for as many as A had. Then A's
/// chunks are gone from the cache.
#[test]
fn a_new_dataset_twice_the_cache_takes_over_by_its_third_pass() {
    let cap: u64 = 64 << 20;
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    let bucket = moto().bucket("epochs-changeover");
    let put = |prefix: &str, n: u64, seed: u64| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| {
                let data = pattern(seed + i, 1 << 20);
                moto().put(&bucket, &format!("{prefix}/{i:03}"), &data);
                (format!("s3://{bucket}/{prefix}/{i:03}"), data)
            })
            .collect()
    };
    let a = put("a", 48, 3000);
    let b = put("b", EPOCH_OBJECTS, 4000);
    wait_index_ready(&fleet);
    let on_a = epoch_hit_ratios(&fleet, &a, 3, true);
    let on_b = epoch_hit_ratios(&fleet, &b, 3, true);
    let best = cap as f64 / (EPOCH_OBJECTS << 20) as f64;
    println!("A's hit ratios {on_a:?}, then B's {on_b:?}, best for B {best}");
    assert!(on_a[2] >= 0.9, "A fits: {on_a:?}");
    assert!(on_b[2] >= 0.9 * best, "B's 3rd pass {} < 0.9 x {best}: {on_b:?}", on_b[2]);
    assert!(bytes_on_disk(&fleet.cache_dir.join("v1")) <= cap);
}
