//! The cache on a full filesystem. The fleet runs in a private mount namespace where its cache dir is
//! a size-limited tmpfs (the run dir with the sockets stays outside). First the fleet's capacity is
//! larger than the tmpfs, so the filesystem fills before the capacity is reached: readers go through
//! a dataset several times its size while a writer does `write_memarts` until it is refused. Then the
//! capacity is smaller than the tmpfs, and the bytes on disk are sampled while readers go through
//! more than the capacity (R1).

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_shim::Error;

use super::{bytes_on_disk, log_lines, read_all, LARGE, SMALL};
use crate::common::{pattern, text, Fleet};
use crate::report::Row;
use crate::workload::{self, readers, stop_readers, wrong_bytes, Dataset, Tally};
use crate::Scale;

const SLOTS: u32 = 2;
/// The tmpfs larger than the capacity, and the capacity (the smallest the config accepts).
const LARGE_FS: u64 = 128 << 20;
const CAPACITY: u64 = 64 << 20;
/// More chunk sizes, so the readers of the second part cache four times the dataset.
const MORE: [u64; 2] = [128 << 10, 512 << 10];

pub fn run(scale: Scale) -> Row {
    let mut row = Row::new("disk", "cache on a full filesystem");
    let started = Instant::now();
    let data = Arc::new(Dataset::put("full", scale.pick(24, 64), 2 << 20, 21));
    let full = filesystem_fills(scale, &data, &mut row);
    let bounded = within_capacity(&data, &mut row);
    row.note = format!("{full}; {bounded}");
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// Starts `n` slots of `fleet` in a new mount namespace whose cache dir is a tmpfs of `size` bytes:
/// `unshare -m` runs a shell that mounts it and execs `memarts start_proxy`, whose proxies inherit
/// the namespace. Checks that every slot sees the tmpfs.
fn start_on_tmpfs(fleet: &Fleet, n: u32, size: u64) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&fleet.cache_dir)
        .map_err(|e| format!("create {}: {e}", fleet.cache_dir.display()))?;
    let start = fleet.command(&["start_proxy", &n.to_string()]);
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o "size=$1,mode=0700" memarts-full "$0" || exit 97; shift; exec "$@""#)
        .arg(&fleet.cache_dir)
        .arg(size.to_string())
        .arg(start.get_program())
        .args(start.get_args())
        .envs(start.get_envs().filter_map(|(k, v)| Some((k, v?))));
    let out = cmd.output().map_err(|e| format!("run unshare: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`unshare -m` + `mount -t tmpfs` + start_proxy failed ({}): {}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    for slot in 0..n {
        let pid = fleet.pid(slot);
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).map_err(|e| e.to_string())?;
        let on_tmpfs = mounts.lines().any(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            fields.get(4) == Some(&&*fleet.cache_dir.to_string_lossy())
                && l.split(" - ").nth(1).is_some_and(|t| t.starts_with("tmpfs "))
        });
        if !on_tmpfs {
            return Err(format!(
                "slot {slot} (pid {pid}) does not see a tmpfs at {}",
                fleet.cache_dir.display()
            ));
        }
    }
    Ok(())
}

/// The cache dir as the proxies see it, from outside their namespace.
fn cache_in_namespace(fleet: &Fleet) -> PathBuf {
    let inner = fleet.cache_dir.strip_prefix("/").expect("absolute cache dir");
    PathBuf::from(format!("/proc/{}/root", fleet.pid(0))).join(inner)
}

/// Bytes in use on the filesystem holding `path` (what `df` shows).
fn fs_used(path: &std::path::Path) -> u64 {
    nix::sys::statvfs::statvfs(path).map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size()).unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// What the writer saw: acknowledged (url, seed, len), refusals' reasons, other errors.
#[derive(Default)]
struct Writes {
    acked: Vec<(String, u64, usize)>,
    no_space: Vec<String>,
    other: Vec<String>,
}

/// `write_memarts` of 512 KiB objects every 50 ms until the first refusal, then smaller ones (256 KiB
/// down to 1 byte) until 5 refusals.
fn write_until_refused(client: memarts_shim::Client, stop: Arc<AtomicBool>) -> Writes {
    let mut w = Writes::default();
    let bucket = format!("full-only-{}", std::process::id());
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && w.no_space.len() + w.other.len() < 5 {
        let len = [512 << 10, 256 << 10, 64 << 10, 4096, 1][w.no_space.len().min(4)];
        let url = format!("s3://{bucket}/o{i:05}");
        match client.put_memarts_bytes(&url, &pattern(7_000_000 + i, len)) {
            Ok(_) => w.acked.push((url, 7_000_000 + i, len)),
            Err(Error::NoSpace(why)) => w.no_space.push(why),
            Err(e) => w.other.push(format!("{url}: {e}")),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    w
}

/// Capacity above the tmpfs: the filesystem fills. Returns the note's part.
fn filesystem_fills(scale: Scale, data: &Arc<Dataset>, row: &mut Row) -> String {
    let fleet = Fleet::new(&[("MEMARTS_CACHE_CAPACITY", "1GiB")]);
    let fs_size = scale.pick(8 << 20, 16 << 20);
    if let Err(e) = start_on_tmpfs(&fleet, SLOTS, fs_size) {
        row.violate(format!("could not run the fleet on a tmpfs: {e}"));
        return "the fleet could not run on a tmpfs".into();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, stop) = (workload::client(&fleet, LARGE, Duration::from_secs(30)), stop.clone());
        std::thread::spawn(move || write_until_refused(client, stop))
    };
    let (small, h1) = readers(&fleet, data, 2, SMALL, &stop);
    let (large, h2) = readers(&fleet, data, 2, LARGE, &stop);
    // One sweep through the whole dataset, several times the tmpfs.
    let sweep = Tally::default();
    read_all(&workload::client(&fleet, LARGE, Duration::from_secs(30)), data, &sweep);
    // Reads go on over the full filesystem a while, and until the writer has been refused.
    let (until, give_up) =
        (Instant::now() + Duration::from_secs(scale.pick(1, 5)), Instant::now() + Duration::from_secs(30));
    while (Instant::now() < until || !writer.is_finished()) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_readers(&stop, h1);
    stop_readers(&stop, h2);
    let writes = writer.join().expect("the writer panicked");
    for t in [&small, &large, &sweep] {
        t.add_to(row);
    }

    let status = fleet.status();
    let slots = status["slots"].as_array().cloned().unwrap_or_default();
    let alive = slots.iter().filter(|s| s["alive"] == true).count();
    if alive != SLOTS as usize {
        row.violate(format!("{alive} of {SLOTS} slots alive after the filesystem filled: {status}"));
    }
    if writes.no_space.is_empty() {
        row.violate(format!("write_memarts was never refused on a full {} tmpfs", mib(fs_size)));
    }
    if let Some(e) = writes.other.first() {
        row.violate(format!("{} write_memarts failed otherwise than NoSpace, e.g. {e}", writes.other.len()));
    }
    if writes.no_space.iter().any(|why| why.trim().is_empty()) {
        row.violate("a NoSpace error without a reason");
    }
    row.expected_errors += writes.no_space.len() as u64;
    // Acknowledged memarts-only objects read back, byte for byte, on the full filesystem.
    let client = workload::client(&fleet, LARGE, Duration::from_secs(30));
    for (url, seed, len) in &writes.acked {
        let mut sink = memarts_shim::VecSink::default();
        match client.read_memarts_to(url, &mut sink) {
            Ok(_) => {
                // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
                let got = unsafe { sink.finish() };
                row.bytes_verified += *len as u64;
                row.wrong_bytes += wrong_bytes(&got, &pattern(*seed, *len));
            }
            Err(e) => {
                row.acked_lost += 1;
                row.violate(format!("acknowledged {url} unreadable: {e}"));
            }
        }
    }

    let dir = cache_in_namespace(&fleet);
    let (du, df) = (bytes_on_disk(&dir), fs_used(&dir));
    let not_cached = log_lines(&fleet.run_dir, SLOTS, "could not cache chunk");
    let for_space = not_cached.iter().filter(|l| l.contains("no space left")).count() as u64;
    let failed_writes = (writes.no_space.len() + writes.other.len()) as u64;
    row.injected += not_cached.len() as u64 + failed_writes;
    row.detected += for_space + writes.no_space.len() as u64;
    format!(
        "capacity 1 GiB on a {} tmpfs: {} read by {} verified reads, {} bytes of files on the tmpfs at the \
         end ({} used per statfs); injected = chunk fills the full filesystem refused ({}) + write_memarts \
         calls that failed ({failed_writes}), detected = fills refused as `no space` that the reader still \
         got from the origin ({for_space}) + typed NoSpace errors ({}, e.g. \"{}\"); {} memarts-only \
         objects acknowledged before the filesystem filled all read back byte-exact; every slot alive",
        mib(fs_size),
        mib(Tally::get(&small.bytes_verified)
            + Tally::get(&large.bytes_verified)
            + Tally::get(&sweep.bytes_verified)),
        Tally::get(&small.calls) + Tally::get(&large.calls) + Tally::get(&sweep.calls),
        mib(du),
        mib(df),
        not_cached.len(),
        writes.no_space.len(),
        writes.no_space.first().map_or("", |s| s.as_str()),
        writes.acked.len()
    )
}

/// Capacity below the tmpfs: bytes on disk, sampled every 10 ms, stay within it. Returns the note's part.
fn within_capacity(data: &Arc<Dataset>, row: &mut Row) -> String {
    // Plain LRU: every fill past the capacity evicts (the default policy keeps a chunk read once
    // only while there is room, so these one-pass readers would evict nothing). The same reserve-
    // then-write path serves both policies; this is its busiest case.
    let fleet = Fleet::new(&[("MEMARTS_CACHE_CAPACITY", &CAPACITY.to_string()), ("MEMARTS_EVICTION", "lru")]);
    if let Err(e) = start_on_tmpfs(&fleet, SLOTS, LARGE_FS) {
        row.violate(format!("could not run the fleet on a tmpfs: {e}"));
        return "the fleet could not run on a tmpfs".into();
    }
    // The same objects as local files (an origin as fast as the disk: this part is about the cache).
    let objects = fleet.dir.path().join("objects");
    std::fs::create_dir(&objects).expect("objects dir");
    let urls: Arc<Vec<String>> = Arc::new(
        (data.objects.iter().enumerate())
            .map(|(i, (_, bytes))| {
                let path = objects.join(format!("{i:05}.bin"));
                std::fs::write(&path, bytes).expect("write object");
                path.display().to_string()
            })
            .collect(),
    );
    let dir = cache_in_namespace(&fleet);
    let stop = Arc::new(AtomicBool::new(false));
    let (max_du, max_df, samples) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (dir, stop, max_du, max_df, samples) =
            (dir.clone(), stop.clone(), max_du.clone(), max_df.clone(), samples.clone());
        std::thread::spawn(move || {
            let base = fs_used(&dir);
            while !stop.load(Ordering::Relaxed) {
                max_du.fetch_max(bytes_on_disk(&dir), Ordering::Relaxed);
                max_df.fetch_max(fs_used(&dir).saturating_sub(base), Ordering::Relaxed);
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // Four readers, each through every object at its own chunk size: four times the dataset in chunks.
    let tally = Arc::new(Tally::default());
    let handles: Vec<_> = [SMALL, MORE[0], LARGE, MORE[1]]
        .into_iter()
        .enumerate()
        .map(|(t, cs)| {
            let (data, urls, tally) = (data.clone(), urls.clone(), tally.clone());
            let client = workload::client(&fleet, cs, Duration::from_secs(30));
            std::thread::spawn(move || {
                let n = data.objects.len();
                for i in (0..n).map(|i| (i + t * n / 4) % n) {
                    match client.read(&urls[i]) {
                        Ok(got) => tally.check(&got, &data.objects[i].1),
                        Err(e) => tally.fail(format!("read {}: {e}", urls[i])),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a reader panicked");
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("the sampler panicked");
    tally.add_to(row);
    let (max_du, max_df) = (max_du.load(Ordering::Relaxed), max_df.load(Ordering::Relaxed));
    if max_du > CAPACITY {
        row.violate(format!("R1: {max_du} bytes of files on disk for a capacity of {CAPACITY}"));
    }
    let evicted = fleet.total("evicted_chunks");
    if evicted == 0 {
        row.violate("nothing was evicted: the readers never reached the capacity");
    }
    format!(
        "capacity {CAPACITY} bytes on a {} tmpfs, objects read from local files at 4 chunk sizes: {} read, \
         at most {max_du} bytes of files on the tmpfs over {} samples taken every 10 ms through \
         /proc/<proxy pid>/root (temp files and headers included; {max_df} bytes per statfs, which also \
         counts evicted files still open), {evicted} chunks evicted",
        mib(LARGE_FS),
        mib(Tally::get(&tally.bytes_verified)),
        samples.load(Ordering::Relaxed),
    )
}
