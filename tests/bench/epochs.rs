//! What a full cache keeps (issue 15): 3 epochs over a dataset twice the cache, in order and
//! shuffled, through a fleet with the default policy (TinyLFU admission) and one with plain LRU
//! (`MEMARTS_EVICTION=lru`), side by side in the same run; and a changeover: 3 shuffled epochs
//! over a dataset A that fits, then 3 over a new dataset B twice the cache. Figures are hit ratios
//! per epoch (hits / chunks read, from `memarts status --json`), next to the best any policy could
//! do (capacity / dataset); no timing.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::common::{pattern, Fleet};

const MIB: u64 = 1 << 20;
/// The fleet's capacity (the smallest a fleet accepts), and a dataset twice as large.
const CAPACITY: u64 = 64 * MIB;
const OBJECTS: u64 = 128;
const CHUNK: u64 = 256 << 10;
const EPOCHS: usize = 3;

/// Objects of dataset A in the changeover: 48 MiB, which fits.
const CHANGEOVER_A: u64 = 48;

/// A fresh 2-slot fleet with `policy`, once its (empty) index is ready.
fn fleet(policy: &str) -> Fleet {
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", policy)]);
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    fleet
}

/// `n` local files of 1 MiB named `{prefix}NNN.bin` in the fleet's dir, of patterns `seed..`.
fn dataset(fleet: &Fleet, prefix: &str, n: u64, seed: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let path = fleet.dir.path().join(format!("{prefix}{i:03}.bin"));
            std::fs::write(&path, pattern(seed + i, MIB as usize)).unwrap();
            path.display().to_string()
        })
        .collect()
}

/// Hit ratio of each of `EPOCHS` epochs over `urls` (shuffled anew each epoch with `shuffle`).
fn epochs(fleet: &Fleet, urls: &[String], shuffle: bool) -> Vec<f64> {
    let client = fleet.client(CHUNK);
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut order: Vec<usize> = (0..urls.len()).collect();
    let chunks = (urls.len() as u64 * MIB / CHUNK) as f64;
    (0..EPOCHS)
        .map(|_| {
            if shuffle {
                order.shuffle(&mut rng);
            }
            let before = fleet.total("hits");
            for &i in &order {
                assert_eq!(client.read(&urls[i]).unwrap().len() as u64, MIB, "{}", urls[i]);
            }
            // Local hits (chunks read straight from their files) count once reported.
            client.send_read_reports();
            (fleet.total("hits") - before) as f64 / chunks
        })
        .collect()
}

/// Hit ratio of each epoch over a dataset twice the cache, through a fresh fleet with `policy`.
fn hit_ratios(policy: &str, shuffle: bool) -> Vec<f64> {
    let fleet = fleet(policy);
    let urls = dataset(&fleet, "", OBJECTS, 0);
    epochs(&fleet, &urls, shuffle)
}

/// Rows (one per order and policy) and ratios (epoch 2's hit ratio over the best possible).
pub fn run(rows: &mut Vec<serde_json::Value>, ratios: &mut serde_json::Map<String, serde_json::Value>) {
    let best = CAPACITY as f64 / (OBJECTS * MIB) as f64;
    for (order, shuffle) in [("sequential", false), ("shuffled", true)] {
        for (label, policy) in [("memarts", "tinylfu"), ("lru", "lru")] {
            let per_epoch = hit_ratios(policy, shuffle);
            let shown: Vec<String> = per_epoch.iter().map(|r| format!("{r:.3}")).collect();
            println!(
                "{EPOCHS} epochs {order} over {} MiB, cache {} MiB, {policy}: hit ratio per epoch {} (best {best:.3})",
                OBJECTS,
                CAPACITY >> 20,
                shown.join(" / ")
            );
            rows.push(serde_json::json!({
                "scenario": "epochs", "order": order, "policy": policy,
                "dataset_mib": OBJECTS, "capacity_mib": CAPACITY >> 20, "chunk_kib": CHUNK >> 10,
                "hit_ratio_per_epoch": per_epoch, "best_hit_ratio": best,
            }));
            let key = if label == "memarts" {
                format!("epoch2_hits_vs_best_{order}")
            } else {
                format!("lru_epoch2_hits_vs_best_{order}")
            };
            ratios.insert(key, (per_epoch[1] / best).into());
        }
    }
    for policy in ["tinylfu", "lru"] {
        let fleet = fleet(policy);
        let (a, b) = (dataset(&fleet, "a", CHANGEOVER_A, 1000), dataset(&fleet, "b", OBJECTS, 2000));
        let (on_a, on_b) = (epochs(&fleet, &a, true), epochs(&fleet, &b, true));
        let shown = |r: &[f64]| r.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" / ");
        println!(
            "changeover, {policy}: {EPOCHS} shuffled epochs over A ({CHANGEOVER_A} MiB): {}, then over B ({OBJECTS} MiB): {} (best {best:.3})",
            shown(&on_a),
            shown(&on_b)
        );
        rows.push(serde_json::json!({
            "scenario": "changeover", "order": "shuffled", "policy": policy,
            "first_dataset_mib": CHANGEOVER_A, "dataset_mib": OBJECTS, "capacity_mib": CAPACITY >> 20,
            "chunk_kib": CHUNK >> 10, "first_hit_ratio_per_epoch": on_a, "hit_ratio_per_epoch": on_b,
            "best_hit_ratio": best,
        }));
        let key = if policy == "tinylfu" {
            "changeover_pass3_hits_vs_best"
        } else {
            "lru_changeover_pass3_hits_vs_best"
        };
        ratios.insert(key.into(), (on_b[2] / best).into());
    }
}
