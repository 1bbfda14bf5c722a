//! `memarts warmup PREFIX`: read every object under a prefix through the fleet, so that the next epoch
//! is served from the cache, and report what it cost.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memarts_settings::size::format_size;
use memarts_shim::{fleet_running, Client};

use crate::cli::{Common, WarmupArgs};
use crate::settings::resolve;

/// Per-thread read buffer; objects larger than this are read in windows.
const WINDOW: usize = 8 << 20;

/// A shared budget of bytes per second: each reader takes what it read, and sleeps when the total
/// runs ahead of `per_sec` since the start.
struct RateLimit {
    per_sec: u64,
    start: Instant,
    taken: Mutex<u64>,
}

impl RateLimit {
    fn new(per_sec: u64) -> RateLimit {
        RateLimit { per_sec, start: Instant::now(), taken: Mutex::new(0) }
    }

    fn take(&self, bytes: u64) {
        let due = {
            let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
            *taken += bytes;
            Duration::from_secs_f64(*taken as f64 / self.per_sec as f64)
        };
        let elapsed = self.start.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

fn counters(client: &Client) -> (u64, u64, u64, u64) {
    client
        .status(Duration::from_secs(3))
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .fold((0, 0, 0, 0), |a, s| {
            (a.0 + s.hits, a.1 + s.misses, a.2 + s.bytes_from_cache, a.3 + s.bytes_from_origin)
        })
}

pub fn warmup(common: &Common, args: &WarmupArgs) -> Result<ExitCode> {
    let cfg = resolve(common)?;
    if !fleet_running(&cfg.run_dir) {
        bail!(
            "no fleet is running in {}: warmup fills a fleet's cache; start one with `memarts start_proxy N`",
            cfg.run_dir.display()
        );
    }
    let client = Client::new(crate::settings::shim_config(&memarts_settings::Settings::from_env()?, &cfg))?;
    let listed = Instant::now();
    let objects: Vec<_> = client.list(&args.url_prefix, true)?.into_iter().filter(|e| !e.is_dir).collect();
    let total: u64 = objects.iter().map(|e| e.size).sum();
    eprintln!(
        "   {} objects, {} under {} (listed in {:.2}s)",
        objects.len(),
        format_size(total),
        args.url_prefix,
        listed.elapsed().as_secs_f64()
    );
    let limit = match &args.max_rate {
        Some(rate) => {
            let per_sec = memarts_settings::size::parse_size(rate).context("--max-rate")?;
            if per_sec == 0 {
                bail!("--max-rate must be more than 0 bytes per second");
            }
            Some(RateLimit::new(per_sec))
        }
        None => None,
    };
    let before = counters(&client);
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..args.threads.clamp(1, 256) {
            s.spawn(|| {
                let mut buf = vec![0u8; WINDOW];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(obj) = objects.get(i) else { return };
                    let meta = memarts_protocol::ObjectMeta {
                        size: obj.size,
                        etag: obj.etag.clone(),
                        version: None,
                        last_modified_ms: obj.last_modified_ms,
                    };
                    let mut offset = 0;
                    while offset < obj.size {
                        match client.read_at(&obj.url, &meta, offset, &mut buf[..]) {
                            Ok(0) => break,
                            Ok(n) => {
                                offset += n as u64;
                                if let Some(limit) = &limit {
                                    limit.take(n as u64);
                                }
                            }
                            Err(e) => {
                                failures
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push(format!("{}: {e}", obj.url));
                                break;
                            }
                        }
                    }
                    bytes.fetch_add(offset, Ordering::Relaxed);
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let after = counters(&client);
    let read = bytes.load(Ordering::Relaxed);
    println!(
        "   read {} objects, {} in {secs:.2}s: {:.1} MiB/s, {:.0} files/s",
        objects.len(),
        format_size(read),
        read as f64 / secs / (1 << 20) as f64,
        objects.len() as f64 / secs,
    );
    println!(
        "   chunks: {} from cache, {} from origin; bytes: {} from cache, {} from origin",
        after.0 - before.0,
        after.1 - before.1,
        format_size(after.2 - before.2),
        format_size(after.3 - before.3),
    );
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    if !failures.is_empty() {
        for f in failures.iter().take(10) {
            eprintln!("memarts: warmup: {f}");
        }
        bail!("{} of {} objects could not be read", failures.len(), objects.len());
    }
    Ok(ExitCode::SUCCESS)
}
