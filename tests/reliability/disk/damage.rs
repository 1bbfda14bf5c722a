//! Damaged and foreign files in the cache dir. A warm fleet is stopped; chunk files get a flipped
//! data byte, a flipped header byte, a truncation or a zero length, or are replaced by a symlink to
//! another chunk, a directory or a named pipe; packed records (the chunks of at most 32 KiB, in
//! segment files) get a flipped data byte; one slot's metadata snapshot is overwritten with
//! garbage; foreign files appear in the chunk tree, the cache root and `v1/`. The fleet starts again
//! and every object is read at two chunk sizes (one checked by the proxy, one by the shim). Then
//! chunk files of the live fleet are damaged while 8 readers run.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use super::{files_under, flip_data_byte, log_lines, read_all, LARGE, SMALL};
use crate::common::Fleet;
use crate::report::Row;
use crate::workload::{self, readers, stop_readers, Dataset, Tally};
use crate::Scale;

const SLOTS: u32 = 2;

/// A foreign entry we planted, and what the fleet is expected to do with it.
struct Foreign {
    path: PathBuf,
    fate: Fate,
    /// Its content, for the entries that must stay as they were.
    content: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// In the chunk tree: the index rebuild skips it (and logs it at debug level), nothing serves it.
    Skipped,
    /// In `v1/tmp/`: a temp file no live process writes, removed when a slot opens the store.
    Removed,
    /// Anywhere else: nothing reads it, it stays as it was.
    Untouched,
}

/// What was done to the stopped fleet's cache dir.
#[derive(Default)]
struct Damage {
    /// Files whose damage a read must catch (chunk files, the metadata snapshot).
    damaged: u64,
    /// Chunk paths now holding a symlink, a directory or a named pipe.
    replaced: Vec<PathBuf>,
    foreign: Vec<Foreign>,
}

fn garbage(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random()).collect()
}

/// Chunks of at most this many bytes are packed (the default `MEMARTS_PACK_MAX`).
const PACKED_MAX: u64 = 32 << 10;

/// Chunks the dataset makes at both chunk sizes: (as files, packed).
fn chunks_expected(data: &Dataset) -> (usize, usize) {
    let lens = |cs: u64| {
        data.objects.iter().flat_map(move |(_, d)| {
            let len = d.len() as u64;
            (0..len.div_ceil(cs)).map(move |i| (len - i * cs).min(cs))
        })
    };
    let all: Vec<u64> = lens(SMALL).chain(lens(LARGE)).collect();
    let packed = all.iter().filter(|&&l| l <= PACKED_MAX).count();
    (all.len() - packed, packed)
}

/// Every packed record in the segment files under `segments`: (file, offset of its data, data
/// length, chunk id).
fn packed_records(segments: &Path) -> Vec<(PathBuf, u64, u64, u128)> {
    use memarts_disk::segment::{decode_head, record_len, SEGMENT_HEADER};
    let mut out = Vec::new();
    for f in files_under(segments).into_iter().filter(|f| f.extension().is_some_and(|e| e == "seg")) {
        let bytes = std::fs::read(&f).unwrap();
        let mut at = SEGMENT_HEADER as usize;
        while let Ok(head) = decode_head(&bytes[at.min(bytes.len())..]) {
            let data = (at + head.data_offset()) as u64;
            let id =
                memarts_disk::chunk_file::ChunkKey::decode_identity(head.identity).map_or(0, |k| k.id().0);
            out.push((f.clone(), data, u64::from(head.data_len), id));
            at += record_len(head.identity.len(), head.data_len as usize) as usize;
        }
    }
    out
}

pub fn run(scale: Scale) -> Row {
    let mut row = Row::new("disk", "damaged chunk files");
    let started = Instant::now();
    let data = Arc::new(Dataset::put("damage", scale.pick(16, 48), scale.pick(1 << 20, 2 << 20), 11));
    let fleet = Fleet::start(SLOTS, &[]);
    let clients = [SMALL, LARGE].map(|cs| workload::client(&fleet, cs, Duration::from_secs(30)));
    let warm = Tally::default();
    for c in &clients {
        read_all(c, &data, &warm);
    }
    // A stop drains the fills still being written: every chunk is on disk after it.
    fleet.stop_proxy();
    let chunks_dir = fleet.cache_dir.join("v1/chunks");
    let files = files_under(&chunks_dir);
    let records = packed_records(&fleet.cache_dir.join("v1/segments"));
    let (as_files, packed) = chunks_expected(&data);
    if (files.len(), records.len()) != (as_files, packed) {
        row.violate(format!(
            "{} chunk files and {} packed records after the warm-up, {as_files} and {packed} expected",
            files.len(),
            records.len()
        ));
    }
    let k = scale.pick(1, 4);
    let mut rng = StdRng::seed_from_u64(12);
    let mut damage = damage_stopped(&fleet, files, k, &mut rng);
    // A flipped data byte in some packed records: each is caught by its data CRC.
    let mut records = records;
    records.shuffle(&mut rng);
    let mut damaged_records = Vec::new();
    for (f, data, len, id) in records.iter().filter(|r| r.2 > 0).take(3 * k) {
        damaged_records.push(*id);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(f).unwrap();
        let at = data + rng.random_range(0..*len);
        let mut byte = [0u8];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).unwrap();
        byte[0] ^= 1 << rng.random_range(0..8);
        std::os::unix::fs::FileExt::write_all_at(&file, &byte, at).unwrap();
        damage.damaged += 1;
    }
    row.injected = damage.damaged + damage.foreign.len() as u64;

    // Read everything again: every damaged chunk must be caught, counted and fetched again. An entry
    // in place of a chunk file (symlink, directory, pipe) is counted when a read meets it before the
    // index rebuild is done; after, the rebuild has skipped it, the read goes to the origin and the
    // fill replaces it uncounted. Either way it holds its chunk again at the end (checked below).
    fleet.start_proxy(SLOTS);
    let again = Tally::default();
    for c in &clients {
        read_all(c, &data, &again);
    }
    let corrupt = fleet.total("corrupt_chunks");
    let dropped = log_lines(&fleet.run_dir, SLOTS, "dropping corrupt chunk");
    let missed: Vec<String> = (damaged_records.iter())
        .map(|id| format!("{id:032x}"))
        .filter(|id| !dropped.iter().any(|l| l.contains(id.as_str())))
        .collect();
    if !missed.is_empty() {
        row.violate(format!("damaged packed records never caught: {}", missed.join(", ")));
    }
    let snapshots = log_lines(&fleet.run_dir, SLOTS, "metadata snapshot ignored").len() as u64;
    let uncounted = damage.damaged - (corrupt + snapshots).min(damage.damaged);
    if corrupt + snapshots > damage.damaged || uncounted > damage.replaced.len() as u64 {
        row.violate(format!(
            "{} damaged files read; {corrupt} chunks counted corrupt and {snapshots} snapshots ignored",
            damage.damaged
        ));
    }
    let skipped = log_lines(&fleet.run_dir, SLOTS, "skipped a foreign entry");
    let handled = damage
        .foreign
        .iter()
        .filter(|f| match f.fate {
            Fate::Skipped => skipped.iter().any(|l| l.contains(&*f.path.to_string_lossy())),
            Fate::Removed => !f.path.exists(),
            Fate::Untouched => std::fs::read(&f.path).is_ok_and(|b| b == f.content),
        })
        .count() as u64;

    // Damage chunk files of the live fleet under 8 readers; then read everything once more.
    let stop = Arc::new(AtomicBool::new(false));
    let (small, h1) = readers(&fleet, &data, 4, SMALL, &stop);
    let (large, h2) = readers(&fleet, &data, 4, LARGE, &stop);
    let (live, live_truncated) = damage_live(&chunks_dir, Duration::from_secs(scale.pick(4, 20)), &mut rng);
    stop_readers(&stop, h1);
    stop_readers(&stop, h2);
    let after = Tally::default();
    for c in &clients {
        read_all(c, &data, &after);
    }
    for t in [&warm, &again, &small, &large, &after] {
        t.add_to(&mut row);
    }
    let live_detected = fleet.total("corrupt_chunks") - corrupt;
    // The entries in place of chunk files hold their chunk again once the fills are written.
    fleet.stop_proxy();
    let not_files: Vec<String> = (damage.replaced.iter())
        .filter(|p| !std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .map(|p| p.display().to_string())
        .collect();
    if !not_files.is_empty() {
        row.violate(format!("not a chunk file again after the reads: {}", not_files.join(", ")));
    }
    row.injected += live;
    row.detected = corrupt + snapshots + handled + live_detected;
    let reads = Tally::get(&small.calls) + Tally::get(&large.calls);
    row.note = format!(
        "stopped fleet: {} damaged files ({} flipped data bytes, {} flipped header bytes, {} truncated, {} \
         emptied, {k} each replaced by a symlink to another chunk, a directory, a named pipe; 1 garbage \
         metadata snapshot) and {} foreign entries; detected = chunks counted in `corrupt_chunks` \
         ({corrupt}; the entries in place of chunk files are removed and hold their chunk again after the \
         reads) + snapshots logged as ignored ({snapshots}) + foreign entries handled as designed \
         ({handled}): in chunks/ the index rebuild skips them (logged, left in place, never served), in \
         v1/tmp/ they are removed at start, in the cache root, v1/ and v1/memarts/ nothing reads them and \
         they stay as they were. Live fleet: {live} chunk files damaged in place ({live_truncated} \
         truncated, the rest a flipped data byte) under 8 readers ({reads} reads), {live_detected} caught \
         by a check (a file damaged again before it was read, or after a refill replaced it, counts once \
         or not at all); a final read of everything was byte-exact",
        damage.damaged,
        4 * k,
        2 * k,
        3 * k,
        3 * k,
        damage.foreign.len()
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// Damages a sample of the stopped fleet's chunk files (each kind its own files, `k` scaling the
/// counts), its slot 0 metadata snapshot, and plants foreign entries.
fn damage_stopped(fleet: &Fleet, mut files: Vec<PathBuf>, k: usize, rng: &mut StdRng) -> Damage {
    files.shuffle(rng);
    let other_chunk = files.pop().expect("chunk files");
    let mut victims = files.iter();
    let mut d = Damage::default();
    for f in victims.by_ref().take(4 * k) {
        d.damaged += u64::from(flip_data_byte(f, |from, to| rng.random_range(from..to)).expect("flip"));
    }
    for f in victims.by_ref().take(2 * k) {
        let mut bytes = std::fs::read(f).unwrap();
        let at = rng.random_range(0..40);
        bytes[at] ^= 1 << rng.random_range(0..8);
        std::fs::write(f, &bytes).unwrap();
        d.damaged += 1;
    }
    for f in victims.by_ref().take(3 * k) {
        let len = std::fs::metadata(f).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(rng.random_range(1..len)).unwrap();
        d.damaged += 1;
    }
    for f in victims.by_ref().take(3 * k) {
        std::fs::write(f, b"").unwrap();
        d.damaged += 1;
    }
    // In place of chunk files: a symlink to another chunk's file (whose header names that chunk), a
    // directory with a file in it, a named pipe (an open for reading would wait for a writer).
    for (i, f) in victims.by_ref().take(3 * k).enumerate() {
        std::fs::remove_file(f).unwrap();
        match i % 3 {
            0 => std::os::unix::fs::symlink(&other_chunk, f).unwrap(),
            1 => {
                std::fs::create_dir(f).unwrap();
                std::fs::write(f.join("inside"), b"foreign").unwrap();
            }
            _ => nix::unistd::mkfifo(f, nix::sys::stat::Mode::S_IRWXU).unwrap(),
        }
        d.replaced.push(f.clone());
        d.damaged += 1;
    }
    let snapshot = fleet.cache_dir.join(format!("v1/meta/slot-0-of-{SLOTS}.snap"));
    assert!(snapshot.exists(), "no metadata snapshot at {}", snapshot.display());
    std::fs::write(&snapshot, garbage(rng, 300)).unwrap();
    d.damaged += 1;
    d.foreign = plant_foreign(&fleet.cache_dir, k, rng);
    d
}

/// `k` foreign files of each kind across the cache dir, and a foreign directory in the chunk tree.
fn plant_foreign(cache: &Path, k: usize, rng: &mut StdRng) -> Vec<Foreign> {
    let chunks = cache.join("v1/chunks");
    let mut out = Vec::new();
    let mut put = |path: PathBuf, fate: Fate, rng: &mut StdRng| {
        let len = rng.random_range(0..10_000);
        let content = garbage(rng, len);
        std::fs::write(&path, &content).unwrap();
        out.push(Foreign { path, fate, content });
    };
    // An existing fan-out directory `depth` levels down.
    let fanout = |rng: &mut StdRng, depth: usize| -> PathBuf {
        let mut dir = chunks.clone();
        for _ in 0..depth {
            let mut subdirs: Vec<PathBuf> =
                std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
            subdirs.sort();
            dir = subdirs.choose(rng).unwrap().clone();
        }
        dir
    };
    for i in 0..k {
        for depth in 0..2 {
            let name = format!("{}-{i}", ["notes.txt", "core", ".nfs0001", "x"][rng.random_range(0..4)]);
            put(fanout(rng, depth).join(name), Fate::Skipped, rng);
        }
        // A well-formed chunk name in the wrong fan-out directory.
        let dir = fanout(rng, 1);
        let prefix = u8::from_str_radix(dir.file_name().unwrap().to_str().unwrap(), 16).unwrap();
        let misplaced = format!("{:02x}{:030x}", prefix ^ 1, rng.random::<u128>() >> 8);
        put(dir.join(misplaced), Fate::Skipped, rng);
        put(cache.join(format!("garbage-{i}")), Fate::Untouched, rng);
        put(cache.join(format!("v1/garbage-{i}")), Fate::Untouched, rng);
        put(cache.join(format!("v1/memarts/garbage-{i}")), Fate::Untouched, rng);
        put(cache.join(format!("v1/tmp/garbage-{i}")), Fate::Removed, rng);
        // A dead writer's temp file (pid 0 never names a live process).
        put(cache.join(format!("v1/tmp/{:032x}.0.{i}.tmp", rng.random::<u128>())), Fate::Removed, rng);
    }
    let dir = chunks.join("zz");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("inside"), b"foreign").unwrap();
    out.push(Foreign { path: dir, fate: Fate::Skipped, content: Vec::new() });
    out
}

/// For `how_long`, every 20–120 ms: a random chunk file of the live fleet gets a flipped data byte
/// (3 in 4) or is truncated, in place. Returns (files damaged, of which truncated).
fn damage_live(chunks_dir: &Path, how_long: Duration, rng: &mut StdRng) -> (u64, u64) {
    let until = Instant::now() + how_long;
    let (mut damaged, mut truncated) = (0u64, 0u64);
    let (mut list, mut listed) = (files_under(chunks_dir), Instant::now());
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.random_range(20..120)));
        if listed.elapsed() > Duration::from_secs(1) {
            (list, listed) = (files_under(chunks_dir), Instant::now());
        }
        let Some(f) = list.choose(rng) else { continue };
        if rng.random_bool(0.25) {
            let Ok(file) = std::fs::OpenOptions::new().write(true).open(f) else { continue };
            let len = file.metadata().map_or(0, |m| m.len());
            if len > 1 && file.set_len(rng.random_range(1..len)).is_ok() {
                damaged += 1;
                truncated += 1;
            }
        } else if let Ok(true) = flip_data_byte(f, |from, to| rng.random_range(from..to)) {
            damaged += 1;
        }
    }
    (damaged, truncated)
}
