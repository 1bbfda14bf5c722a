//! The campaign's workload: a dataset generated from a seed, and readers that verify every byte they
//! get against the generator, counting what they read, what was wrong and what failed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memarts_shim::{Client, ShimConfig};
use rand::{Rng, SeedableRng};

use crate::common::{moto, pattern, Fleet};
use crate::report::Row;

pub struct Dataset {
    pub bucket: String,
    /// (key, bytes)
    pub objects: Vec<(String, Vec<u8>)>,
}

impl Dataset {
    /// `n` objects of 1 KiB to `max` bytes in a fresh bucket, the same for the same seed.
    pub fn put(hint: &str, n: usize, max: usize, seed: u64) -> Dataset {
        let bucket = moto().bucket(hint);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let objects: Vec<(String, Vec<u8>)> = (0..n)
            .map(|i| {
                let len = rng.random_range(1024..=max);
                (format!("data/{i:05}.bin"), pattern(seed * 100_000 + i as u64, len))
            })
            .collect();
        for (key, data) in &objects {
            moto().put(&bucket, key, data);
        }
        Dataset { bucket, objects }
    }

    pub fn url(&self, i: usize) -> String {
        format!("s3://{}/{}", self.bucket, self.objects[i].0)
    }
}

/// Bytes of `got` that differ from `want`, a length difference counting as that many wrong bytes.
pub fn wrong_bytes(got: &[u8], want: &[u8]) -> u64 {
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    (differ + got.len().abs_diff(want.len())) as u64
}

#[derive(Default)]
pub struct Tally {
    pub calls: AtomicU64,
    pub bytes_verified: AtomicU64,
    pub wrong_bytes: AtomicU64,
    pub failed: AtomicU64,
    /// The first few failures, for the report.
    pub errors: Mutex<Vec<String>>,
}

impl Tally {
    pub fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 5 {
            errors.push(what);
        }
    }

    pub fn check(&self, got: &[u8], want: &[u8]) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes_verified.fetch_add(want.len() as u64, Ordering::Relaxed);
        self.wrong_bytes.fetch_add(wrong_bytes(got, want), Ordering::Relaxed);
    }

    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }

    pub fn first_errors(&self) -> String {
        self.errors.lock().unwrap().join("; ")
    }

    /// Adds these readers' totals to `row`; a failed read breaks the row's promise.
    pub fn add_to(&self, row: &mut Row) {
        row.bytes_verified += Self::get(&self.bytes_verified);
        row.wrong_bytes += Self::get(&self.wrong_bytes);
        let failed = Self::get(&self.failed);
        row.failed_calls += failed;
        if failed > 0 {
            row.violate(format!("{failed} reads failed: {}", self.first_errors()));
        }
    }
}

pub fn client(fleet: &Fleet, chunk_size: u64, deadline: Duration) -> Client {
    Client::new(ShimConfig {
        run_dir: fleet.run_dir.clone(),
        chunk_size,
        parallel: 4,
        deadline,
        ..ShimConfig::default()
    })
    .expect("client")
}

/// `threads` readers, each its own client (as worker processes would be), reading random whole
/// objects and random ranges of `data` until `stop`; every byte is checked.
pub fn readers(
    fleet: &Fleet,
    data: &Arc<Dataset>,
    threads: usize,
    chunk_size: u64,
    stop: &Arc<AtomicBool>,
) -> (Arc<Tally>, Vec<std::thread::JoinHandle<()>>) {
    let tally = Arc::new(Tally::default());
    let handles = (0..threads)
        .map(|t| {
            let (data, tally, stop) = (data.clone(), tally.clone(), stop.clone());
            let client = client(fleet, chunk_size, Duration::from_secs(30));
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                while !stop.load(Ordering::Relaxed) {
                    let i = rng.random_range(0..data.objects.len());
                    let (url, want) = (data.url(i), &data.objects[i].1);
                    if rng.random_bool(0.7) {
                        match client.read(&url) {
                            Ok(got) => tally.check(&got, want),
                            Err(e) => tally.fail(format!("read {url}: {e}")),
                        }
                    } else {
                        let off = rng.random_range(0..want.len());
                        let len = rng.random_range(1..=want.len() - off);
                        match client.read_range(&url, off as u64, len) {
                            Ok(got) => tally.check(&got, &want[off..off + len]),
                            Err(e) => tally.fail(format!("read {url} [{off}..+{len}]: {e}")),
                        }
                    }
                }
            })
        })
        .collect();
    (tally, handles)
}

/// Stops the readers and waits for them.
pub fn stop_readers(stop: &AtomicBool, handles: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a reader panicked");
    }
}
