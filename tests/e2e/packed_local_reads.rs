//! Local hits of packed chunks: with `MEMARTS_PACK_MAX` set, a client of the fleet's own uid reads
//! warm small objects from their records in the slots' segment files (found in each slot's
//! `packed-<slot>.table`), with no request to a proxy, and every promise of the proxy path holds: a
//! record damaged on disk is never served (the slot refetches it, counted), and readers racing
//! evictions and compactions (records moved, segments removed) never get a wrong byte and never
//! take a moved record for a damaged one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use memarts_disk::layout::packed_table_path;
use memarts_disk::packed_table::PackedFile;
use memarts_disk::segment::{segment_path, segments_dir};
use memarts_protocol::{ObjectUrl, DEFAULT_CHUNK_SIZE};
use memarts_shim::Client;

use crate::common::{pattern, text, Fleet};

const PACKED: (&str, &str) = ("MEMARTS_PACK_MAX", "32KiB");

/// `n` objects of 1-8 KiB under `root`, in directories of 500; their paths.
fn dataset(root: &Path, n: usize, seed: u64) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let dir = root.join(format!("d{:03}", i / 500));
            if i % 500 == 0 {
                std::fs::create_dir_all(&dir).unwrap();
            }
            let path = dir.join(format!("{i:06}.bin"));
            std::fs::write(&path, pattern(seed + i as u64, 1024 + (i * 977) % 7168)).unwrap();
            path
        })
        .collect()
}

fn url(p: &Path) -> String {
    p.display().to_string()
}

/// Every object read by `client` and compared with its file.
fn read_exact(client: &Client, paths: &[PathBuf]) {
    for p in paths {
        let got = client.read(&url(p)).unwrap();
        assert!(got == std::fs::read(p).unwrap(), "{} differs", p.display());
    }
}

/// (hits, of them packed, fallbacks, corrupt) of the client's local reads.
fn local(client: &Client) -> (u64, u64, u64, u64) {
    let c = client.local_counters().expect("local reads are on for the fleet's own uid");
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    (n(&c.hits), n(&c.packed), n(&c.fallbacks), n(&c.corrupt))
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map_or(Vec::new(), |d| {
        d.flatten()
            .flat_map(|e| if e.path().is_dir() { files_under(&e.path()) } else { vec![e.path()] })
            .collect()
    })
}

/// The segment files of the fleet.
fn segment_files(fleet: &Fleet) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = files_under(&segments_dir(&fleet.cache_dir))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

fn warm(fleet: &Fleet, dir: &Path) {
    let out = fleet.memarts(&["warmup", &url(dir)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn warm_packed_objects_are_read_locally_exact_and_a_damaged_record_is_never_served() {
    let fleet = Fleet::start(2, &[PACKED]);
    fleet.wait_index_ready();
    let data = fleet.dir.path().join("data");
    let n = 3000;
    let paths = dataset(&data, n, 4100);
    warm(&fleet, &data);
    assert!(files_under(&fleet.cache_dir.join("v1/chunks")).is_empty(), "small chunks kept as files");
    assert!(!segment_files(&fleet).is_empty(), "nothing was packed");
    for slot in 0..2 {
        assert!(packed_table_path(&fleet.run_dir, slot).exists(), "slot {slot} published no packed table");
    }
    let client = fleet.client(DEFAULT_CHUNK_SIZE);
    // The metadata: once through the slots (a warmup fills the chunks; the versions are the
    // slots' to publish once a client asked for them).
    for p in &paths {
        client.stat(&url(p)).unwrap();
    }
    let (hits, misses, gets) = (fleet.total("hits"), fleet.total("misses"), fleet.total("origin_requests"));
    let before = local(&client);
    read_exact(&client, &paths);
    read_exact(&client, &paths);
    let after = local(&client);
    let (read_locally, packed) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(read_locally, 2 * n as u64, "every warm object read locally: {before:?} -> {after:?}");
    assert_eq!(packed, 2 * n as u64, "from its packed record");
    assert_eq!((after.2 - before.2, after.3), (0, 0), "no fallback, nothing corrupt");
    assert_eq!(fleet.total("misses"), misses, "no miss at the slots");
    assert_eq!(fleet.total("origin_requests"), gets, "nothing from the origin");
    // Reported to the slots (at the latest when the client goes): counted as the hits they were,
    // and none served by a slot itself.
    drop(client);
    assert_eq!(fleet.total("hits") - hits, 2 * n as u64, "the slots counted the local hits, and served none");

    // One byte of one record's data flipped on disk: never served, refetched by its slot, counted.
    let client = fleet.client(DEFAULT_CHUNK_SIZE);
    let victim = &paths[1234];
    let etag = client.stat(&url(victim)).unwrap().etag.unwrap();
    let object = ObjectUrl::parse(&url(victim)).unwrap();
    let id = memarts_protocol::chunk_id(&object, &etag, DEFAULT_CHUNK_SIZE, 0);
    let slot = memarts_protocol::owner_slot(id, 2);
    let table = PackedFile::open(&packed_table_path(&fleet.run_dir, slot)).unwrap();
    let record = table.table().lookup(id).expect("the object's record is published").record;
    let segment = segment_path(&segments_dir(&fleet.cache_dir), slot, record.segment);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&segment).unwrap();
        // Inside the data: it is at least 1 KiB long and ends at most 7 bytes before the record.
        let at = record.offset + record.len - 8 - 100;
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, at).unwrap();
        f.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
    }
    let gets = fleet.total("origin_requests");
    read_exact(&client, std::slice::from_ref(victim));
    let (_, _, _, corrupt) = local(&client);
    assert_eq!(corrupt, 1, "the damaged record was refused");
    assert_eq!(fleet.total("corrupt_chunks"), 1, "and counted by its slot");
    assert_eq!(fleet.total("origin_requests"), gets + 1, "and fetched again, once");
    // Its new record is published: the next read is local again, and exact.
    let before = local(&client);
    read_exact(&client, std::slice::from_ref(victim));
    let after = local(&client);
    assert_eq!((after.1 - before.1, after.3), (1, 1), "read locally from its new record");
}

#[test]
fn packed_reads_racing_evictions_and_compactions_never_see_a_wrong_byte() {
    // The smallest cache (segments of 1 MiB), compacted as the evictions of a flood of cold
    // objects (about 70 MiB of them) leave its segments half dead. LRU: each object of the flood
    // takes the place of the least recently read (TinyLFU would keep the first ones out).
    let fleet = Fleet::start(2, &[PACKED, ("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", "lru")]);
    fleet.wait_index_ready();
    let data = fleet.dir.path().join("data");
    // Hot and cold objects written interleaved: the segments the hot ones are in die by half when
    // the cold ones go, and are compacted, their hot records moved while they are read.
    let first = dataset(&data, 4000, 9100);
    let hot: Vec<PathBuf> = first.iter().step_by(2).cloned().collect();
    warm(&fleet, &data);
    let initial = segment_files(&fleet);
    let flood_dir = fleet.dir.path().join("flood");
    let flood = dataset(&flood_dir, 15_000, 77_000);
    let stop = AtomicBool::new(false);
    let fleet = &fleet;
    let (locally, packed) = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (hot, stop) = (&hot, &stop);
                s.spawn(move || {
                    let client = fleet.client(DEFAULT_CHUNK_SIZE);
                    let mut rounds = 0;
                    while rounds < 2 || !stop.load(Ordering::Relaxed) {
                        let part: Vec<PathBuf> = hot.iter().skip(r).step_by(2).cloned().collect();
                        read_exact(&client, &part);
                        rounds += 1;
                    }
                    let (hits, packed, _, corrupt) = local(&client);
                    assert_eq!(
                        corrupt, 0,
                        "a record moved or dropped while read was taken for a damaged one"
                    );
                    (hits, packed)
                })
            })
            .collect();
        // The flood, read through the slots twice: it pushes out the cold objects of the first
        // set, then its own first ones.
        let proxy = fleet.proxy_client(DEFAULT_CHUNK_SIZE);
        for _ in 0..2 {
            read_exact(&proxy, &flood);
        }
        stop.store(true, Ordering::Relaxed);
        readers.into_iter().map(|r| r.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let now = segment_files(fleet);
    let gone = initial.iter().filter(|p| !now.contains(p)).count();
    assert!(fleet.total("evicted_chunks") > 0, "nothing was evicted");
    assert!(gone > 0, "no segment was compacted away: {initial:?} -> {now:?}");
    assert!(packed > 0 && locally >= packed, "no packed record was read locally ({locally}, {packed})");
    assert_eq!(fleet.total("corrupt_chunks"), 0, "a slot was told a sound record was damaged");
    // Whatever stayed is read back exact, by a new client too.
    read_exact(&fleet.client(DEFAULT_CHUNK_SIZE), &hot);
}
