//! Resident chunks (issue 17): chunks read directly are locked in memory by their slot and checked
//! there once, and their direct readers skip the CRC32C only while that holds: a resident entry held all
//! through the read, of the very file read, unchanged. Anything else (a file written to in place, a
//! slot that died, resident chunks turned off) is read and checked as any chunk, and never served wrong.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_disk::chunk_file::{chunk_path, chunks_dir, ChunkId};
use memarts_disk::layout::resident_table_path;
use memarts_shim::Client;

use crate::common::{moto, pattern, Fleet};
use crate::local_reads::{chunk_file, flip_a_data_byte};

const MIB: usize = 1 << 20;

/// (hits, resident hits, corrupt) of the client's local reads.
fn local_counts(client: &Client) -> (u64, u64, u64) {
    let d = client.local_counters().expect("local reads are on for the fleet's own uid");
    (d.hits.load(Ordering::Relaxed), d.resident.load(Ordering::Relaxed), d.corrupt.load(Ordering::Relaxed))
}

/// `n` objects of `len` bytes in a new bucket, read once (cold) through a fleet of 2 slots started
/// with `env`, and cached.
fn warm(
    bucket: &str,
    n: usize,
    len: usize,
    env: &[(&str, &str)],
) -> (String, Vec<(String, Vec<u8>)>, Fleet, Client) {
    let bucket = moto().bucket(bucket);
    let objects: Vec<(String, Vec<u8>)> =
        (0..n).map(|i| (format!("s3://{bucket}/o{i}"), pattern(9100 + i as u64, len))).collect();
    for (url, data) in &objects {
        moto().put(&bucket, url.rsplit('/').next().unwrap(), data);
    }
    let fleet = Fleet::start(2, env);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} cold");
    }
    fleet.wait_cached((n * len.div_ceil(MIB)) as u64);
    (bucket, objects, fleet, client)
}

/// Reads every object (checking its bytes), reporting the reads to the slots, until a whole round
/// is served from resident chunks; panics after 20 s.
fn read_until_resident(client: &Client, objects: &[(String, Vec<u8>)]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let before = local_counts(client).1;
        for (url, data) in objects {
            assert!(client.read(url).unwrap() == *data, "{url} warm");
        }
        let chunks: usize = objects.iter().map(|(_, d)| d.len().div_ceil(MIB)).sum();
        if local_counts(client).1 - before == chunks as u64 {
            return;
        }
        assert!(Instant::now() < deadline, "never resident: {:?}", local_counts(client));
        client.send_read_reports();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chunks_read_locally_are_made_resident_and_their_reads_skip_the_crc_only_while_that_holds() {
    let (bucket, objects, fleet, client) = warm("resident", 6, 300 << 10, &[]);
    read_until_resident(&client, &objects);
    let gets = moto().gets_settled(&bucket);
    let (hits, resident, _) = local_counts(&client);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data);
    }
    assert_eq!(local_counts(&client).0 - hits, 6, "local hits");
    assert_eq!(local_counts(&client).1 - resident, 6, "all of them from resident");

    // A resident chunk's file written to in place: its stamp changed, so its reader checks it, finds
    // it damaged, and the slot refetches it; the resident entry of the old bytes is no excuse.
    let (url, data) = &objects[2];
    let file = chunk_file(&fleet, &client, url, 0);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 7;
    bytes[at] ^= 0x10;
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::File::options().write(true).open(&file).unwrap(),
        &bytes[at..=at],
        at as u64,
    )
    .unwrap();
    let (_, resident, corrupt) = local_counts(&client);
    assert!(client.read(url).unwrap() == *data, "the damaged byte was served");
    assert_eq!(local_counts(&client).2 - corrupt, 1, "refused, counted");
    assert_eq!(local_counts(&client).1, resident, "not as a resident hit");
    assert_eq!(moto().gets_settled(&bucket), gets + 1, "fetched again, once");
    assert_eq!(fleet.total("corrupt_chunks"), 1);

    // The slots die (SIGKILL: nothing of theirs runs): the kernel unlocks their memory and marks
    // their resident chunks dead at once; reads stay direct (the metadata is still within its TTL) and are
    // checked again, every one.
    let (hits, resident, _) = local_counts(&client);
    for slot in 0..2 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(fleet.pid(slot)),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    for slot in 0..2 {
        let table =
            memarts_disk::resident_table::ResidentFile::open(&resident_table_path(&fleet.run_dir, slot))
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while table.table().owner_alive() {
            assert!(Instant::now() < deadline, "slot {slot}'s resident outlived it");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data);
    }
    let (now_hits, now_resident, _) = local_counts(&client);
    assert_eq!(now_hits - hits, 6, "still read directly");
    assert_eq!(now_resident, resident, "none skipped its check");
    fleet.recover(2);
}

/// The path of `memarts cat` (a stream's `copy_to`, which hands whole warm chunks to its output
/// from their files' mappings): chunks their slot held resident are written out without their CRC32C
/// being computed again, and only those: a resident chunk file written to in place is checked,
/// refused and refetched, never written out as resident.
#[test]
fn streams_write_resident_chunks_from_their_mappings_without_checking_them_again() {
    let (bucket, objects, fleet, client) = warm("pinnedcat", 2, 3 * MIB + 40_000, &[]);
    read_until_resident(&client, &objects);
    let client = Arc::new(client);
    let copy = |url: &str| {
        let mut out = Vec::new();
        let mut stream = client.open_stream(url).unwrap();
        stream
            .copy_to(|piece| {
                out.extend_from_slice(piece);
                Ok(())
            })
            .unwrap();
        out
    };
    let (hits, resident, _) = local_counts(&client);
    for (url, data) in &objects {
        assert!(copy(url) == *data, "{url} copied");
    }
    assert_eq!(local_counts(&client).0 - hits, 8, "every chunk written out directly");
    assert_eq!(local_counts(&client).1 - resident, 8, "every chunk written out as resident");

    // Chunk 1 of the first object damaged in place: its stamp changed, so the copy checks it,
    // refuses it and has its slot fetch it again; the other three are still resident.
    let (url, data) = &objects[0];
    flip_a_data_byte(&chunk_file(&fleet, &client, url, 1));
    let gets = moto().gets_settled(&bucket);
    let (hits, resident, corrupt) = local_counts(&client);
    assert!(copy(url) == *data, "the damaged byte was written out");
    assert_eq!(local_counts(&client).2 - corrupt, 1, "refused, counted");
    assert_eq!(local_counts(&client).1 - resident, 3, "the other chunks only as resident");
    assert_eq!(local_counts(&client).0 - hits, 3, "the damaged one not as a hit");
    assert_eq!(moto().gets_settled(&bucket), gets + 1, "fetched again, once");
}

/// A stream's reads of any size (`File(url, 'rb').read(n)`, `std::io::Read`) of chunks their slot
/// holds resident are read from the chunk files straight into the caller's buffer, a part at a time,
/// with no window; a resident chunk file damaged in place is never served so: the stream reads it
/// whole and checks it, refuses it, and its slot fetches it again.
#[test]
fn stream_reads_of_resident_chunks_go_straight_into_the_callers_buffer_and_never_serve_a_damaged_one() {
    let (bucket, objects, fleet, client) = warm("pinnedread", 1, 3 * MIB + 40_000, &[]);
    read_until_resident(&client, &objects);
    let client = Arc::new(client);
    let (url, data) = &objects[0];
    // Pieces of 100 KiB and 1 byte taking turns, across every chunk boundary.
    let read_in_pieces = || {
        let mut stream = client.open_stream(url).unwrap();
        let (mut out, mut buf, mut turn) = (Vec::new(), vec![0u8; 100 << 10], 0usize);
        loop {
            let want = if turn % 2 == 0 { buf.len() } else { 1 };
            let n = stream.read(&mut buf[..want]).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            turn += 1;
        }
        (out, stream.window_chunks())
    };
    let (hits, resident, _) = local_counts(&client);
    let (got, window) = read_in_pieces();
    assert!(got == *data, "read in pieces");
    assert_eq!(local_counts(&client).1 - resident, 4, "each chunk read from its entry");
    assert_eq!(local_counts(&client).0 - hits, 4, "and counted once, however many reads it took");
    assert_eq!(window, 0, "no chunk was read ahead into a buffer");

    // Chunk 2 damaged in place: the reads of chunks 0, 1 and 3 still come from their resident chunks; chunk 2
    // is read whole, checked, refused and fetched again.
    flip_a_data_byte(&chunk_file(&fleet, &client, url, 2));
    let gets = moto().gets_settled(&bucket);
    let (_, resident, corrupt) = local_counts(&client);
    let (got, _) = read_in_pieces();
    assert!(got == *data, "the damaged byte was served");
    assert_eq!(local_counts(&client).2 - corrupt, 1, "refused, counted");
    assert_eq!(local_counts(&client).1 - resident, 3, "the other chunks from their resident");
    assert_eq!(moto().gets_settled(&bucket), gets + 1, "fetched again, once");
}

#[test]
fn evicted_chunks_let_go_of_their_pins_and_pins_can_be_turned_off() {
    // A cache of 64 MiB that keeps every fetched chunk (LRU) and 34 objects of 3 MiB: every pass
    // evicts what it resident before.
    let (_, objects, fleet, client) =
        warm("pinevict", 4, 3 * MIB, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", "lru")]);
    read_until_resident(&client, &objects);
    let bucket = moto().bucket("pinevict2");
    let others: Vec<(String, Vec<u8>)> =
        (0..30).map(|i| (format!("s3://{bucket}/p{i}"), pattern(9300 + i as u64, 3 * MIB))).collect();
    for (url, data) in &others {
        moto().put(&bucket, url.rsplit('/').next().unwrap(), data);
    }
    for _ in 0..2 {
        for (url, data) in others.iter().chain(&objects) {
            assert!(client.read(url).unwrap() == *data);
        }
    }
    assert!(fleet.total("evicted_chunks") > 40, "the passes evicted");
    // The objects read last are cached (and resident again); the resident chunks of all the others went.
    read_until_resident(&client, &objects);
    // Every resident entry left is of a chunk still cached, in the very file resident.
    let mut resident = 0;
    for slot in 0..2 {
        let table =
            memarts_disk::resident_table::ResidentFile::open(&resident_table_path(&fleet.run_dir, slot))
                .unwrap();
        for (id, stamp) in table.table().entries() {
            let file = chunk_path(&chunks_dir(&fleet.cache_dir), ChunkId(id));
            let meta = std::fs::metadata(&file)
                .unwrap_or_else(|e| panic!("a entry outlived its chunk {id:032x}: {e}"));
            assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), stamp.ino, "a entry of a replaced file");
            resident += 1;
        }
    }
    assert!(resident > 0, "the last pass resident nothing");
    drop(client);
    drop(fleet);

    let (_, objects, fleet, client) = warm("pinoff", 3, 100 << 10, &[("MEMARTS_RESIDENT_MEMORY", "0")]);
    for _ in 0..5 {
        for (url, data) in &objects {
            assert!(client.read(url).unwrap() == *data);
        }
        client.send_read_reports();
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(!resident_table_path(&fleet.run_dir, 0).exists(), "no resident table with resident off");
    let (hits, resident, _) = local_counts(&client);
    assert!(hits >= 15 && resident == 0, "{hits} hits, {resident} resident");
    drop(client);
    drop(fleet);

    // A budget of 2 MiB for the fleet: each of its 2 slots resident chunks at most 1 MiB of chunk files.
    let (_, objects, fleet, client) =
        warm("pinbudget", 12, 300 << 10, &[("MEMARTS_RESIDENT_MEMORY", "2MiB")]);
    for _ in 0..6 {
        for (url, data) in &objects {
            assert!(client.read(url).unwrap() == *data);
        }
        client.send_read_reports();
        std::thread::sleep(Duration::from_millis(150));
    }
    let mut resident = 0;
    for slot in 0..2 {
        let table =
            memarts_disk::resident_table::ResidentFile::open(&resident_table_path(&fleet.run_dir, slot))
                .unwrap();
        let bytes: u64 = table.table().entries().iter().map(|(_, s)| s.size.next_multiple_of(4096)).sum();
        assert!(bytes <= MIB as u64, "slot {slot} resident {bytes} bytes, over its 1 MiB");
        resident += table.table().entries().len();
    }
    assert!(resident >= 2, "the budget resident nothing ({resident})");
    assert!(local_counts(&client).1 > 0);
}

/// Reads of resident chunks are noted in the resident tables, not reported: the slot counts them with
/// no request at all (every second, and before it shows its counters), and they keep eviction
/// honest as reported reads do: with plain LRU, chunks read from resident chunks are the recent ones, and what
/// nobody read since goes.
#[test]
fn reads_of_resident_chunks_need_no_request_are_counted_by_their_slot_and_keep_what_is_read() {
    let bucket = moto().bucket("pinlru");
    let set = |name: &str, seed: u64| -> Vec<(String, Vec<u8>)> {
        (0..30).map(|i| (format!("s3://{bucket}/{name}{i}"), pattern(seed + i, MIB))).collect()
    };
    let (a, b, c) = (set("a", 9400), set("b", 9500), set("c", 9600));
    let keyed = |set: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        set.iter().map(|(u, d)| (u.rsplit('/').next().unwrap().to_string(), d.clone())).collect()
    };
    moto().put_many(&bucket, keyed(&a).into_iter().chain(keyed(&b)).chain(keyed(&c)));
    // 64 MiB: room for 63 chunk files of 1 MiB (and a 4 KiB header each): A and B fit, C pushes
    // out 27.
    let fleet = Fleet::start(1, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", "lru")]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    let read_all = |client: &Client, objects: &[(String, Vec<u8>)]| {
        for (url, data) in objects {
            assert!(client.read(url).unwrap() == *data, "{url}");
        }
    };
    read_all(&client, &a);
    read_all(&client, &b);
    fleet.wait_cached(60);
    read_until_resident(&client, &a);

    // A from its resident chunks, 3 times: no request to the slot (the two `memarts status` ask 3 each), and
    // every read in the slot's counters as soon as they are shown.
    let (hits, requests, resident) = (fleet.total("hits"), fleet.total("requests"), local_counts(&client).1);
    for _ in 0..3 {
        read_all(&client, &a);
    }
    client.send_read_reports();
    assert_eq!(local_counts(&client).1 - resident, 90, "A read from its resident");
    assert_eq!(fleet.total("requests") - requests, 3, "reads of resident chunks made requests");
    assert_eq!(fleet.total("hits") - hits, 90, "the slot counted the resident reads");
    assert_eq!(fleet.total("hits") - hits, 90, "counted once only");

    // B read through the slot (more recent than A now), then A from its resident chunks again, and nobody
    // asks for the counters: the slot counts A's reads by itself within a second, so C pushes out
    // the 27 least recently read chunks: B's, not A's.
    read_all(&fleet.proxy_client(MIB as u64), &b);
    read_all(&client, &a);
    assert_eq!(local_counts(&client).1 - resident, 120, "A read from its resident again");
    std::thread::sleep(Duration::from_millis(1500));
    read_all(&client, &c);
    let gets = moto().gets_settled(&bucket);
    read_all(&client, &a);
    assert_eq!(moto().gets_settled(&bucket), gets, "A was evicted although it was read last");
    read_all(&client, &b);
    assert!(moto().gets_settled(&bucket) >= gets + 27, "B stayed although nobody read it since");
}

/// After a restart, the first epoch reads the dataset from the disk and resident chunks nothing (issue 29: a
/// chunk read once gains nothing from a resident entry until its next read, and making resident it costs that epoch
/// 10-15% on 2 cores); the second epoch's reads, returning ones, resident entry; the third reads from resident chunks.
#[test]
fn after_a_restart_only_chunks_read_again_are_made_resident() {
    let (_bucket, objects, fleet, _) = warm("pinagain", 8, 300_000, &[]);
    // Files changed in the last 100 ms are not resident (`resident.rs`): these are long written.
    std::thread::sleep(Duration::from_millis(300));
    assert!(fleet.stop_proxy().status.success());
    fleet.start_proxy(2);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} first epoch after the restart");
    }
    let (hits, resident, _) = local_counts(&client);
    assert_eq!((hits, resident), (8, 0), "the first epoch: local reads, none resident");
    client.send_read_reports();
    std::thread::sleep(Duration::from_millis(500));
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} second epoch");
    }
    assert_eq!(local_counts(&client).1, 0, "chunks read once after the restart were resident");
    client.send_read_reports();
    read_until_resident(&client, &objects);
}
