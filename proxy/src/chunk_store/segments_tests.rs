use super::*;
use crate::chunk_store::ChunkKey;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn key(i: u64) -> ChunkKey {
    ChunkKey {
        origin: "s3".into(),
        bucket: "b".into(),
        key: format!("images/{i:06}.jpg"),
        etag: format!("\"etag-{i}\""),
        chunk_size: 4 << 20,
        index: 0,
    }
}

fn data(i: u64) -> Vec<u8> {
    let len = 3000 + (i * 7919) % 2000;
    (0..len).map(|b| (b * 31 + i * 17) as u8).collect()
}

fn open(dir: &Path) -> Segments {
    let s = Segments::open(dir, 0, 1, |_| true).unwrap().expect("the lock is free");
    s.set_share(32 << 20); // 1 MiB segments: a few hundred records each
    s.adopt(|_| true).unwrap(); // the slot's rebuild: a fleet of 1 settled, compactions may run
    s
}

fn put(s: &Segments, i: u64) {
    let (k, d) = (key(i), data(i));
    s.put(k.id().0, &k.identity_bytes(), &d, memarts_protocol::crc32c(&d), 0, false).unwrap();
}

fn read(s: &Segments, i: u64) -> Option<Vec<u8>> {
    let k = key(i);
    match s.read(k.id().0, &k.identity_bytes()).unwrap() {
        None => None,
        Some(Ok(p)) => Some(p.data),
        Some(Err(e)) => panic!("record {i} failed a check: {e}"),
    }
}

fn seg_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("0"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn records_read_back_after_a_restart_from_indexes_and_from_the_unsealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for i in 0..1000 {
        put(&s, i);
    }
    assert!(seg_files(dir.path()).len() > 3, "several segments sealed");
    drop(s);
    let s = open(dir.path());
    for i in 0..1000 {
        assert_eq!(read(&s, i), Some(data(i)), "record {i}");
    }
    assert_eq!(read(&s, 5000), None);
}

#[test]
fn a_torn_append_is_cut_and_the_records_before_it_are_kept() {
    for back in [1, 5, 200, 3000] {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        for i in 0..100 {
            put(&s, i);
        }
        drop(s);
        // The unsealed segment's last record written in part (a crash mid-append).
        let last = seg_files(dir.path()).pop().unwrap();
        assert!(!last.with_extension("idx").exists(), "the last segment is not sealed");
        let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
        f.set_len(f.metadata().unwrap().len() - back).unwrap();
        drop(f);
        let s = open(dir.path());
        let whole = (0..99).all(|i| read(&s, i) == Some(data(i)));
        assert!(whole, "cut {back} bytes from the end: the records before the torn one are kept");
        assert_eq!(read(&s, 99), None, "a torn record is a miss");
        put(&s, 99);
        assert_eq!(read(&s, 99), Some(data(99)), "appends go on after the cut");
        drop(s);
        let s = open(dir.path());
        assert!((0..100).all(|i| read(&s, i) == Some(data(i))), "and survive a restart");
    }
}

#[test]
fn a_damaged_record_is_a_miss_and_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for i in 0..10 {
        put(&s, i);
    }
    let seg = seg_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let k = key(5);
    let bad: Vec<u64> = (0..10)
        .filter(|&i| {
            let k = key(i);
            matches!(s.read(k.id().0, &k.identity_bytes()).unwrap(), Some(Err(_)))
        })
        .collect();
    assert_eq!(bad.len(), 1, "exactly the damaged record fails: {bad:?}");
    assert!(!s.contains(key(bad[0]).id().0), "and is dropped");
    assert!((0..10).filter(|i| *i != bad[0]).all(|i| read(&s, i) == Some(data(i))));
    let _ = k;
}

#[test]
fn compaction_racing_readers_never_serves_a_wrong_byte_nor_loses_a_live_record() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(open(dir.path()));
    let n = 4000u64;
    for i in 0..n {
        put(&s, i);
    }
    let before = seg_files(dir.path());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while reads < 500 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Odd records are never removed: each read must find them, whole.
                    let i = ((reads * 2 + 1 + r) % n) | 1;
                    assert_eq!(read(&s, i), Some(data(i)), "live record {i}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for i in (0..n).step_by(2) {
        assert!(s.remove(key(i).id().0));
        if i % 100 == 0 {
            s.reclaim(); // as a slot does after each eviction
        }
    }
    s.reclaim();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let after = seg_files(dir.path());
    assert!(
        before.iter().any(|b| !after.contains(b)),
        "no half-dead segment was compacted: {before:?} -> {after:?}"
    );
    assert!(
        s.dead() <= s.reserved(),
        "dead records take {} bytes, over their room {}",
        s.dead(),
        s.reserved()
    );
    for i in 0..n {
        assert_eq!(read(&s, i), (i % 2 == 1).then(|| data(i)), "record {i} after compaction");
    }
    drop(s);
    // After a restart, every live record is back; a removed one that a segment still holds (its
    // segment was not due for compaction) may be back too, whole: never another's bytes.
    let s = open(dir.path());
    for i in 0..n {
        match read(&s, i) {
            Some(d) => assert_eq!(d, data(i), "record {i} after a restart"),
            None => assert!(i % 2 == 0, "live record {i} lost by a restart"),
        }
    }
}

#[test]
fn one_writer_per_slot_and_records_of_other_slots_are_dead() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for i in 0..50 {
        put(&s, i);
    }
    assert!(Segments::open(dir.path(), 0, 1, |_| true).unwrap().is_none(), "a second writer is refused");
    drop(s);
    let even = Segments::open(dir.path(), 0, 1, |id| key_index(id).is_multiple_of(2)).unwrap().unwrap();
    for i in 0..50 {
        let k = key(i);
        let found = even.read(k.id().0, &k.identity_bytes()).unwrap().is_some();
        assert_eq!(found, i % 2 == 0, "record {i}");
    }
    assert!(even.dead() > 0, "the others' records are dead");
}

fn key_index(id: u128) -> u64 {
    (0..50).find(|&i| key(i).id().0 == id).unwrap()
}

/// A fleet of 3 restarted as one of 2: each slot takes the chunks it now owns from the others'
/// segments, nothing compacts until both have, then slot 0 removes slot 2's directory.
#[test]
fn a_fleet_of_another_size_takes_its_chunks_from_the_old_slots_segments() {
    let dir = tempfile::tempdir().unwrap();
    let owner = |i: u64, slots: u32| memarts_protocol::owner_slot(key(i).id().0, slots);
    for slot in 0..3 {
        let s = Segments::open(dir.path(), slot, 3, |id| memarts_protocol::owner_slot(id, 3) == slot)
            .unwrap()
            .unwrap();
        s.set_share(32 << 20);
        (0..300).filter(|&i| owner(i, 3) == slot).for_each(|i| put(&s, i));
        s.adopt(|id| memarts_protocol::owner_slot(id, 3) == slot).unwrap();
    }
    let open2 = |slot: u32| {
        let s = Segments::open(dir.path(), slot, 2, |id| memarts_protocol::owner_slot(id, 2) == slot)
            .unwrap()
            .unwrap();
        s.set_share(32 << 20);
        s
    };
    let (zero, one) = (open2(0), open2(1));
    zero.adopt(|id| memarts_protocol::owner_slot(id, 2) == 0).unwrap();
    zero.reclaim();
    assert!(dir.path().join("2").exists(), "slot 1 has not taken its chunks yet: nothing goes");
    one.adopt(|id| memarts_protocol::owner_slot(id, 2) == 1).unwrap();
    for i in 0..300 {
        let s = if owner(i, 2) == 0 { &zero } else { &one };
        assert_eq!(read(s, i), Some(data(i)), "record {i} after the fleet shrank");
    }
    zero.reclaim();
    assert!(!dir.path().join("2").exists(), "slot 2's segments go once the fleet settled");
    assert_eq!(
        zero.adopt(|id| memarts_protocol::owner_slot(id, 2) == 0).unwrap(),
        0,
        "a settled fleet takes nothing"
    );
}

/// What a shim finds of record `i` through the packed table at `table` (`memarts_disk::packed_table`):
/// `None` when it is not published or moved while read (a miss), else the verdict of the checks on
/// the bytes at the place it names, read while the entry held.
fn read_published(dir: &Path, table: &Path, i: u64) -> Option<Result<Vec<u8>, segment::Invalid>> {
    let file = memarts_disk::packed_table::PackedFile::open(table).unwrap();
    let table = file.table();
    let k = key(i);
    let entry = table.lookup(k.id().0)?;
    // The shims' name for it (`memarts_disk::segment::segment_path`), which must be the slot's.
    let path = segment::segment_path(dir, 0, entry.record.segment);
    let mut bytes = vec![0u8; entry.record.len as usize];
    let read = std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut bytes, entry.record.offset));
    if !table.unchanged(&entry) {
        return None;
    }
    read.expect("an entry that held names a segment file that is there, whole");
    Some(segment::check_record(&bytes, Some(&k.identity_bytes())).map(|(_, d)| d.to_vec()))
}

#[test]
fn the_packed_table_names_each_record_after_a_put_a_compaction_and_a_restart_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let table = run.path().join("packed-0.table");
    let s = open(dir.path());
    for i in 0..50 {
        put(&s, i);
    }
    s.publish_at(table.clone()).unwrap();
    let first = memarts_disk::packed_table::PackedFile::open(&table).unwrap();
    // Records written before the table was made, and after, are published; enough to grow it.
    let n = 5000u64;
    for i in 50..n {
        put(&s, i);
    }
    assert!(first.table().superseded(), "the table grew: its first file says so");
    for i in 0..n {
        assert!(read_published(dir.path(), &table, i) == Some(Ok(data(i))), "record {i} after its put");
    }
    // Removed: withdrawn at once. Then compacted: the live records are found at their new places.
    let before = seg_files(dir.path());
    for i in (0..n).step_by(2) {
        assert!(s.remove(key(i).id().0));
        assert_eq!(read_published(dir.path(), &table, i), None, "record {i} removed");
    }
    s.reclaim();
    assert!(before.iter().any(|b| !seg_files(dir.path()).contains(b)), "nothing was compacted");
    for i in (1..n).step_by(2) {
        assert!(read_published(dir.path(), &table, i) == Some(Ok(data(i))), "record {i} after compaction");
    }
    let file = memarts_disk::packed_table::PackedFile::open(&table).unwrap();
    let entries = file.table().entries();
    assert_eq!(entries.len() as u64, n / 2, "one entry per live record, none for the removed");
    assert!(entries
        .iter()
        .all(|(_, r)| seg_files(dir.path()).iter().any(|p| p.ends_with(format!("{:016x}.seg", r.segment)))));
    // A record found damaged is withdrawn.
    let (i, at) = (1, file.table().lookup(key(1).id().0).unwrap().record);
    let seg = dir.path().join("0").join(format!("{:016x}.seg", at.segment));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&seg).unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at.offset + at.len - 9).unwrap();
    f.write_all_at(&[byte[0] ^ 0x40], at.offset + at.len - 9).unwrap();
    assert!(matches!(read_published(dir.path(), &table, i), Some(Err(_))), "the damage is seen");
    let k = key(i);
    assert!(matches!(s.read(k.id().0, &k.identity_bytes()).unwrap(), Some(Err(_))));
    assert_eq!(read_published(dir.path(), &table, i), None, "and the damaged record withdrawn");
    // The slot starts again: its new table holds what it loaded, the old one is superseded.
    drop(s);
    let s = open(dir.path());
    s.publish_at(table.clone()).unwrap();
    assert!(file.table().superseded(), "the last run's table says a newer one is in place");
    for i in (3..n).step_by(2) {
        assert_eq!(read_published(dir.path(), &table, i), Some(Ok(data(i))), "record {i} after a restart");
    }
}

#[test]
fn a_reader_of_the_packed_table_racing_compactions_finds_every_entry_that_held_whole() {
    let dir = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let table = run.path().join("packed-0.table");
    let s = Arc::new(open(dir.path()));
    s.publish_at(table.clone()).unwrap();
    let n = 4000u64;
    for i in 0..n {
        put(&s, i);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (stop, dir, table) = (Arc::clone(&stop), dir.path().to_path_buf(), table.clone());
            std::thread::spawn(move || {
                let (mut reads, mut found) = (0u64, 0u64);
                while reads < 2000 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let i = (reads * 7 + r) % n;
                    match read_published(&dir, &table, i) {
                        None => {}
                        Some(got) => {
                            assert!(got == Ok(data(i)), "record {i}: an entry that held named other bytes");
                            found += 1;
                        }
                    }
                    reads += 1;
                }
                found
            })
        })
        .collect();
    for i in (0..n).filter(|i| i % 3 != 0) {
        assert!(s.remove(key(i).id().0));
        if i % 50 == 0 {
            s.reclaim();
        }
    }
    s.reclaim();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0, "the readers found nothing to check");
    }
    for i in 0..n {
        let want = (i % 3 == 0).then(|| Ok(data(i)));
        assert!(read_published(dir.path(), &table, i) == want, "record {i} at the end");
    }
}

#[test]
fn the_room_kept_follows_what_is_packed_and_disk_stays_within_live_records_and_room() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let gauge = s.reserve_gauge();
    assert_eq!(s.reserved(), 0, "a slot with no segment keeps nothing back");
    put(&s, 0);
    let one = taken(segment::record_len(key(0).identity_bytes().len(), data(0).len()) as u32);
    let small = s.reserved();
    assert!(small >= one && small <= one + one / 16 + 4 * BLOCK, "one record: {small} kept for {one}");
    let n = 2000; // ~8 MiB of records in 1 MiB segments
    for i in 1..n {
        put(&s, i);
    }
    let live: u64 = s.chunks().iter().map(|c| c.1).sum();
    let full = s.reserved();
    assert_eq!(gauge.load(Ordering::Relaxed), full, "the gauge says what is kept now");
    let segment = 1 << 20;
    assert!(full <= 3 * segment + 2 * BLOCK * 16, "at most three segments and their last blocks: {full}");
    assert!(full >= segment + live / 16, "a compaction's segment and a 16th of {live} live: {full}");
    // Three in four removed and compacted as evictions come: on disk, never more than the live
    // records and the room kept for them.
    for i in (0..n).filter(|i| i % 4 != 0) {
        assert!(s.remove(key(i).id().0));
        s.reclaim();
        let live: u64 = s.chunks().iter().map(|c| c.1).sum();
        let disk: u64 = std::fs::read_dir(dir.path().join("0"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "seg" || x == "idx"))
            .map(|e| std::os::unix::fs::MetadataExt::blocks(&e.metadata().unwrap()) * 512)
            .sum();
        assert!(disk <= live + s.reserved(), "after {i}: {disk} on disk for {live} live + {}", s.reserved());
    }
    assert!(s.reserved() < full, "the room shrank with the records: {} then {full}", s.reserved());
}

#[test]
fn a_record_damaged_in_the_unsealed_segment_is_caught_when_read_and_those_after_it_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for i in 0..10 {
        put(&s, i);
    }
    drop(s); // unsealed: no index beside it, a restart walks its records
    let seg = &seg_files(dir.path())[0];
    let bytes = std::fs::read(seg).unwrap();
    let mut at = SEGMENT_HEADER as usize;
    for _ in 0..3 {
        let head = segment::decode_head(&bytes[at..]).unwrap();
        at += segment::record_len(head.identity.len(), head.data_len as usize) as usize;
    }
    let head = segment::decode_head(&bytes[at..]).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    file.write_all_at(&[!bytes[at + head.data_offset() + 5]], (at + head.data_offset() + 5) as u64).unwrap();
    let s = open(dir.path());
    assert!(matches!(s.read(key(3).id().0, &key(3).identity_bytes()).unwrap(), Some(Err(_))), "caught");
    assert_eq!(read(&s, 3), None, "and dropped");
    for i in (0..10).filter(|&i| i != 3) {
        assert_eq!(read(&s, i), Some(data(i)), "record {i} kept");
    }
}

#[test]
fn a_record_a_compaction_finds_damaged_is_dropped_and_handed_back_and_the_others_are_moved() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let n = 4000u64;
    for i in 0..n {
        put(&s, i);
    }
    // A data byte of record 1 (kept below: odd records stay), in the first segment, sealed.
    let id = key(1).id().0;
    let loc = s.state().locs.get(id).unwrap();
    let seg = dir.path().join("0").join(format!("{:016x}.seg", loc.seq));
    let file = std::fs::OpenOptions::new().read(true).write(true).open(seg).unwrap();
    let mut record = vec![0u8; loc.len as usize];
    file.read_exact_at(&mut record, u64::from(loc.offset)).unwrap();
    let at = u64::from(loc.offset) + segment::decode_head(&record).unwrap().data_offset() as u64 + 10;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 4], at).unwrap();
    let mut corrupt = Vec::new();
    for i in (0..n).step_by(2) {
        assert!(s.remove(key(i).id().0));
        corrupt.extend(s.reclaim());
    }
    corrupt.extend(s.reclaim());
    assert!(!seg_files(dir.path()).iter().any(|f| f.ends_with(format!("{:016x}.seg", loc.seq))), "compacted");
    let found: Vec<u128> = corrupt.iter().map(|c| c.0).collect();
    assert_eq!(found, [id], "what the compaction found corrupt: {corrupt:?}");
    assert!(corrupt[0].1.contains("compaction"), "{}", corrupt[0].1);
    assert!(!s.contains(id), "the damaged record is dropped");
    for i in (3..n).step_by(2) {
        assert_eq!(read(&s, i), Some(data(i)), "record {i}, moved");
    }
}

/// A chunk written again (its last record in a later segment, or later in the same one) is read
/// from its last record after a restart, and only that record counts as live.
#[test]
fn a_chunk_written_again_is_at_its_last_record_after_a_restart_and_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let again = |i: u64| data(i + 7).into_iter().rev().collect::<Vec<u8>>();
    for i in 0..600 {
        put(&s, i);
    }
    for i in (0..600).step_by(3).chain([599]) {
        let (k, d) = (key(i), again(i));
        s.put(k.id().0, &k.identity_bytes(), &d, memarts_protocol::crc32c(&d), 0, false).unwrap();
    }
    assert!(seg_files(dir.path()).len() > 2, "the second records lie in later segments");
    let held = |s: &Segments| {
        let mut chunks: Vec<(u128, u64)> = s.chunks().into_iter().map(|(id, bytes, _)| (id, bytes)).collect();
        chunks.sort();
        chunks
    };
    let (before, reserved) = (held(&s), s.reserved());
    drop(s);
    let s = Segments::open(dir.path(), 0, 1, |_| true).unwrap().expect("the lock is free");
    assert_eq!(held(&s), before, "one place per chunk, its last record's");
    s.set_share(32 << 20);
    assert_eq!(s.reserved(), reserved, "live bytes counted once a chunk");
    for i in 0..600 {
        let want = if i % 3 == 0 || i == 599 { again(i) } else { data(i) };
        assert_eq!(read(&s, i), Some(want), "record {i}");
    }
}
