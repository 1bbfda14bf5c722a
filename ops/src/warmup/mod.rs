//! `memarts warmup PREFIX`: read every object under a prefix (or named in a manifest) through the
//! fleet, so that the next epoch is served from the cache, and report what it cost.
//!
//! The objects come from one recursive LIST of the prefix, read page by page while the readers
//! read (`jobs.rs`), or from `--manifest` with no LIST at all. `--threads` readers (64 by default: over a link of 20 ms
//! per request, about 30 requests in flight fill 200 MB/s with 160 KiB files) take the objects in
//! turn:
//! - every object starts with a first read: a cold one costs one GET for its metadata and chunk 0
//!   together, and its metadata stays in the fleet, so the epoch after the warmup asks the origin
//!   nothing, not even a HEAD. The slot fills it without sending the bytes back (`Fill`): a
//!   warmup has no use for them;
//! - the rest of a larger one follows in windows of up to [`WINDOW`] bytes, whose chunks are
//!   fetched in parallel; at most a quarter of the readers read objects larger than a window at
//!   once, so a dataset of large shards stays near `threads / 4 × WINDOW` of buffers.
//!
//! Progress (bytes or objects, rate, ETA) is drawn on stderr when it is a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use memarts_settings::size::format_size;
use memarts_shim::{fleet_running, Client, ObjectMeta};

use crate::cli::{Common, WarmupArgs};
use crate::settings::resolve;
use jobs::{Job, Jobs};

mod jobs;

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

fn counters(client: &Client) -> (u64, u64, u64, u64) {
    client
        .status(Duration::from_secs(3))
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .fold((0, 0, 0, 0), |a, s| {
            (a.0 + s.hits, a.1 + s.misses, a.2 + s.bytes_from_cache, a.3 + s.bytes_from_origin)
        })
}

/// A progress bar on a terminal (hidden otherwise): bytes when a LIST gives the sizes, objects for
/// a manifest. Its length grows as the listing goes on ([`Readers::refresh`]).
fn progress(by_bytes: bool) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let template = if by_bytes {
        "{spinner} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} [{wide_bar}] {msg}"
    } else {
        "{spinner} {pos}/{len} objects {per_sec} ETA {eta} [{wide_bar}] {msg}"
    };
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// What one reader needs besides its job.
struct Readers<'a> {
    client: &'a Client,
    limit: Option<RateLimit>,
    large: Permits,
    bar: ProgressBar,
    by_bytes: bool,
    /// A slot answered that it does not know `Fill` (an older build): first reads read.
    read_heads: AtomicBool,
}

impl Readers<'_> {
    /// The bar's length as far as the listing has gone.
    fn refresh(&self, jobs: &Jobs) {
        if self.bar.is_hidden() {
            return;
        }
        let (objects, bytes, done) = jobs.progress();
        self.bar.set_length(if self.by_bytes { bytes.unwrap_or(0) } else { objects });
        if done {
            self.bar.set_message("");
        } else {
            self.bar.set_message(format!("listing: {objects} objects so far"));
        }
    }

    fn took(&self, bytes: u64) {
        if let Some(limit) = &self.limit {
            limit.take(bytes);
        }
        if self.by_bytes {
            self.bar.inc(bytes);
        }
    }

    /// The first read of an object: its metadata and chunk 0 (one GET when cold; both stay in the
    /// fleet), filled by its slot without the bytes coming back (`Fill`: a warmup has no use for
    /// them; measured, this halved the warmup's own CPU per object); read into `buf` from a slot
    /// of an older build, which does not know `Fill`.
    fn head(&self, url: &str, buf: &mut Vec<u8>) -> memarts_shim::Result<ObjectMeta> {
        if !self.read_heads.load(Ordering::Relaxed) {
            match self.client.fill_head(url) {
                Err(e) if e.is_unknown_request() => self.read_heads.store(true, Ordering::Relaxed),
                filled => return filled,
            }
        }
        let cs = self.client.config().chunk_size as usize;
        if buf.len() < cs {
            buf.resize(cs, 0);
        }
        self.client.read_head(url, buf)
    }

    /// Reads one object; returns its bytes. Its first read ([`Readers::head`]) brings its
    /// metadata and chunk 0; the rest follows into the reader's reused buffer in windows whose
    /// chunks are fetched in parallel, under a permit for an object larger than a window.
    fn read(&self, job: &Job, buf: &mut Vec<u8>) -> memarts_shim::Result<u64> {
        let cs = self.client.config().chunk_size as usize;
        let meta = self.head(&job.url, buf)?;
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
                    Err(e) => return Err(e),
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
    let jobs = Jobs::new();
    // A manifest is read whole first (a missing file fails before anything is read); a LIST runs
    // beside the readers, which start with its first page.
    if let Some(manifest) = &args.manifest {
        jobs.read_manifest(manifest, &args.url_prefix)?;
    }
    let by_bytes = args.manifest.is_none();
    let readers = Readers {
        client: &client,
        limit,
        large: Permits::new(threads / 4),
        bar: progress(by_bytes),
        by_bytes,
        read_heads: AtomicBool::new(false),
    };
    readers.refresh(&jobs);
    let before = counters(&client);
    let started = Instant::now();
    let listed_in = Mutex::new(None);
    let bytes = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        if args.manifest.is_none() {
            s.spawn(|| {
                jobs.list(&client, &args.url_prefix);
                *listed_in.lock().unwrap_or_else(|p| p.into_inner()) = Some(started.elapsed());
                readers.refresh(&jobs);
            });
        }
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = Vec::new();
                while let Some(job) = jobs.next() {
                    match readers.read(&job, &mut buf) {
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
                    readers.refresh(&jobs);
                }
            });
        }
    });
    readers.bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    // `status` reports what was read straight from the chunk files first: it counts.
    let after = counters(&client);
    let read = bytes.load(Ordering::Relaxed);
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    let (objects, total, _) = jobs.progress();
    let listing_error = jobs.take_error();
    if let (Some(e), 0) = (&listing_error, objects) {
        // Nothing was listed: the listing's error is the whole story (no such bucket, no access).
        bail!("{e:#}");
    }
    let size = total.map(|t| format!(", {}", format_size(t))).unwrap_or_default();
    match (&args.manifest, listed_in.into_inner().unwrap_or_else(|p| p.into_inner())) {
        (Some(m), _) => eprintln!("   {objects} objects{size} listed in {}", m.display()),
        (None, Some(t)) => eprintln!(
            "   {objects} objects{size} under {} (listed in {:.2}s, read while listing)",
            args.url_prefix,
            t.as_secs_f64()
        ),
        (None, None) => {}
    }
    println!(
        "   read {} objects, {} in {secs:.2}s: {:.1} MiB/s, {:.0} files/s",
        objects - failures.len() as u64,
        format_size(read),
        read as f64 / secs / (1 << 20) as f64,
        objects as f64 / secs,
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
        bail!("{} of {} objects could not be read", failures.len(), objects);
    }
    if let Some(e) = listing_error {
        bail!("the listing of {} stopped after {objects} objects: {e:#}", args.url_prefix);
    }
    Ok(ExitCode::SUCCESS)
}
