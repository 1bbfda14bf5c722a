use super::*;
use crate::chunk_store::ChunkKey;
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
