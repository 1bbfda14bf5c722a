//! What a full cache keeps (issue 15): 3 epochs over a dataset twice the cache, in order and
//! shuffled, through a fleet with the default policy (TinyLFU admission) and one with plain LRU
//! (`MEMARTS_EVICTION=lru`), side by side in the same run. Figures are hit ratios per epoch (hits /
//! chunks read, from `memarts status --json`), next to the best any policy could do (capacity /
//! dataset); no timing.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::common::{pattern, Fleet};

const MIB: u64 = 1 << 20;
/// The fleet's capacity (the smallest a fleet accepts), and a dataset twice as large.
const CAPACITY: u64 = 64 * MIB;
const OBJECTS: u64 = 128;
const CHUNK: u64 = 256 << 10;
const EPOCHS: usize = 3;

/// Hit ratio of each epoch through a fresh 2-slot fleet with `policy`.
fn hit_ratios(policy: &str, shuffle: bool) -> Vec<f64> {
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", policy)]);
    let urls: Vec<String> = (0..OBJECTS)
        .map(|i| {
            let path = fleet.dir.path().join(format!("{i:03}.bin"));
            std::fs::write(&path, pattern(i, MIB as usize)).unwrap();
            path.display().to_string()
        })
        .collect();
    while !fleet.status()["slots"].as_array().unwrap().iter().all(|s| s["index_ready"] == true) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let client = fleet.client(CHUNK);
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut order: Vec<usize> = (0..urls.len()).collect();
    let chunks = (OBJECTS * MIB / CHUNK) as f64;
    (0..EPOCHS)
        .map(|_| {
            if shuffle {
                order.shuffle(&mut rng);
            }
            let before = fleet.total("hits");
            for &i in &order {
                assert_eq!(client.read(&urls[i]).unwrap().len() as u64, MIB, "{}", urls[i]);
            }
            (fleet.total("hits") - before) as f64 / chunks
        })
        .collect()
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
}
