//! `memarts warmup PREFIX`: read every object under a prefix (or named in a manifest) through the
//! fleet, so that the next epoch is served from the cache, and report what it cost.
//!
//! The objects come from one recursive LIST of the prefix (paginated, no per-directory walk), or
//! from `--manifest` with no LIST at all. `--threads` readers (64 by default: over a link of 20 ms
//! per request, about 30 requests in flight fill 200 MB/s with 160 KiB files) take the objects in
//! turn:
//! - every object starts with a first read: a cold one costs one GET for its metadata and chunk 0
//!   together, and its metadata stays in the fleet, so the epoch after the warmup asks the origin
//!   nothing, not even a HEAD;
//! - the rest of a larger one follows in windows of up to [`WINDOW`] bytes, whose chunks are
//!   fetched in parallel; at most a quarter of the readers read objects larger than a window at
//!   once, so a dataset of large shards stays near `threads / 4 × WINDOW` of buffers.
//!
//! Progress (bytes or objects, rate, ETA) is drawn on stderr when it is a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use memarts_settings::size::format_size;
use memarts_shim::{fleet_running, Client};

use crate::access::AboutUrl;
use crate::cli::{Common, WarmupArgs};
use crate::settings::resolve;

/// Objects up to this size are read whole; larger ones in windows of this size.
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

/// At most `free` holders at once (the readers of large objects, each with a window's buffer).
struct Permits {
    free: Mutex<usize>,
    returned: Condvar,
}

impl Permits {
    fn new(n: usize) -> Permits {
        Permits { free: Mutex::new(n.max(1)), returned: Condvar::new() }
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        drop(free);
        let out = f();
        *self.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.returned.notify_one();
        out
    }
}

/// One object to read: its URL, and its size when a LIST said it (for the progress bar).
struct Job {
    url: String,
    size: Option<u64>,
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

/// The objects to read: the manifest's lines (one URL or key relative to the prefix per line,
/// its first field; `#` comments), or one recursive LIST of the prefix.
fn jobs(client: &Client, args: &WarmupArgs) -> Result<Vec<Job>> {
    let Some(manifest) = &args.manifest else {
        let listed = client.list(&args.url_prefix, true).about(&args.url_prefix)?;
        return Ok(listed
            .into_iter()
            .filter(|e| !e.is_dir)
            .map(|e| Job { size: Some(e.size), url: e.url })
            .collect());
    };
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("reading the manifest {}", manifest.display()))?;
    let base = args.url_prefix.trim_end_matches('/');
    Ok(text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|key| !key.starts_with('#'))
        .map(|key| Job {
            url: if key.contains("://") || key.starts_with('/') {
                key.to_string()
            } else {
                format!("{base}/{}", key.trim_start_matches('/'))
            },
            size: None,
        })
        .collect())
}

fn progress(jobs: &[Job]) -> (ProgressBar, bool) {
    let known: Option<u64> = jobs.iter().map(|j| j.size).sum();
    if !std::io::stderr().is_terminal() {
        return (ProgressBar::hidden(), known.is_some());
    }
    let (bar, template) = match known {
        Some(total) => (
            ProgressBar::new(total),
            "{spinner} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} [{wide_bar}] {msg}",
        ),
        None => (
            ProgressBar::new(jobs.len() as u64),
            "{spinner} {pos}/{len} objects {per_sec} ETA {eta} [{wide_bar}] {msg}",
        ),
    };
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar.enable_steady_tick(Duration::from_millis(200));
    (bar, known.is_some())
}

/// What one reader needs besides its job.
struct Readers<'a> {
    client: &'a Client,
    limit: Option<RateLimit>,
    large: Permits,
    bar: ProgressBar,
    by_bytes: bool,
}

impl Readers<'_> {
    fn took(&self, bytes: u64) {
        if let Some(limit) = &self.limit {
            limit.take(bytes);
        }
        if self.by_bytes {
            self.bar.inc(bytes);
        }
    }

    /// Reads one object into the reader's reused buffer; returns its bytes. A first read brings
    /// its metadata and chunk 0 (one GET when cold, and both stay in the fleet); the rest follows
    /// in windows whose chunks are fetched in parallel, under a permit for an object larger than a
    /// window.
    fn read(&self, job: &Job, buf: &mut Vec<u8>) -> Result<u64, String> {
        let cs = self.client.config().chunk_size as usize;
        if buf.len() < cs {
            buf.resize(cs, 0);
        }
        let meta = self.client.read_head(&job.url, buf).map_err(|e| e.to_string())?;
        let head = meta.size.min(cs as u64);
        self.took(head);
        let large = meta.size - head > WINDOW as u64;
        let mut offset = head;
        let mut rest = || {
            while offset < meta.size {
                let want = ((meta.size - offset) as usize).min(WINDOW);
                if buf.len() < want {
                    buf.resize(want, 0);
                }
                match self.client.read_at(&job.url, &meta, offset, &mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => {
                        offset += n as u64;
                        self.took(n as u64);
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(offset)
        };
        let out = if large { self.large.with(&mut rest) } else { rest() };
        if buf.len() > WINDOW.max(cs) {
            buf.truncate(WINDOW.max(cs));
        }
        out
    }
}

pub fn warmup(common: &Common, args: &WarmupArgs) -> Result<ExitCode> {
    let cfg = resolve(common)?;
    if !fleet_running(&cfg.run_dir) {
        bail!(
            "no fleet is running in {}: warmup fills a fleet's cache; start one with `memarts start_proxy N`",
            cfg.run_dir.display()
        );
    }
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
    let threads = args.threads.clamp(1, 1024);
    let client = Client::new(crate::settings::shim_config(&memarts_settings::Settings::from_env()?, &cfg))?;
    let listed = Instant::now();
    let jobs = jobs(&client, args)?;
    let source = match &args.manifest {
        Some(m) => format!("listed in {}", m.display()),
        None => format!("under {} (listed in {:.2}s)", args.url_prefix, listed.elapsed().as_secs_f64()),
    };
    match jobs.iter().map(|j| j.size).sum::<Option<u64>>() {
        Some(total) => eprintln!("   {} objects, {} {source}", jobs.len(), format_size(total)),
        None => eprintln!("   {} objects {source}", jobs.len()),
    }
    let (bar, by_bytes) = progress(&jobs);
    let readers = Readers { client: &client, limit, large: Permits::new(threads / 4), bar, by_bytes };
    let before = counters(&client);
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len().max(1)) {
            s.spawn(|| {
                let mut buf = Vec::new();
                while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    match readers.read(job, &mut buf) {
                        Ok(n) => {
                            bytes.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{}: {e}", job.url)),
                    }
                    if !readers.by_bytes {
                        readers.bar.inc(1);
                    }
                }
            });
        }
    });
    readers.bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let after = counters(&client);
    let read = bytes.load(Ordering::Relaxed);
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    println!(
        "   read {} objects, {} in {secs:.2}s: {:.1} MiB/s, {:.0} files/s",
        jobs.len() - failures.len(),
        format_size(read),
        read as f64 / secs / (1 << 20) as f64,
        jobs.len() as f64 / secs,
    );
    println!(
        "   chunks: {} from cache, {} from origin; bytes: {} from cache, {} from origin",
        after.0 - before.0,
        after.1 - before.1,
        format_size(after.2 - before.2),
        format_size(after.3 - before.3),
    );
    if !failures.is_empty() {
        for f in failures.iter().take(10) {
            eprintln!("memarts: warmup: {f}");
        }
        bail!("{} of {} objects could not be read", failures.len(), jobs.len());
    }
    Ok(ExitCode::SUCCESS)
}
