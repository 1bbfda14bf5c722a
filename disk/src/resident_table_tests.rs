use super::*;

fn stamp(n: u64) -> Stamp {
    Stamp { ino: n, size: 4096 + n, mtime_ns: 1_700_000_000_000_000_000 + n as i64, ctime_ns: 7 + n as i64 }
}

#[test]
fn a_pin_is_found_until_it_is_withdrawn_and_holds_only_while_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resident-0.table");
    let file = ResidentFile::create(&path, 100).unwrap();
    let table = file.table();
    assert_eq!(table.capacity(), 100);
    let _owner = file.hold_owner_lock().unwrap();
    let reader = ResidentFile::open(&path).unwrap();
    let (a, b) = (0x1234_u128 << 64 | 5, 0x99_u128 << 64 | 6);
    assert_eq!(reader.table().lookup(a), None);
    assert!(table.insert(a, stamp(1)).is_some() && table.insert(b, stamp(2)).is_some());
    let entry = reader.table().lookup(a).unwrap();
    assert_eq!(entry.stamp, stamp(1));
    assert!(reader.table().held(&entry));
    // Resident again (the same chunk, its file checked again): an earlier find no longer holds.
    assert!(table.insert(a, stamp(3)).is_some());
    assert!(!reader.table().held(&entry));
    let entry = reader.table().lookup(a).unwrap();
    assert_eq!(entry.stamp, stamp(3));
    assert!(table.withdraw(a) && !table.withdraw(a));
    assert!(!reader.table().held(&entry), "withdrawn while a reader read");
    assert_eq!(reader.table().lookup(a), None);
    assert_eq!(reader.table().lookup(b).unwrap().stamp, stamp(2));
    assert!(table.insert(0, stamp(4)).is_none() && table.lookup(0).is_none(), "id 0 marks a free place");
}

#[test]
fn resident_entries_die_with_their_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resident-1.table");
    let file = ResidentFile::create(&path, 16).unwrap();
    let reader = ResidentFile::open(&path).unwrap();
    assert!(file.table().insert(9, stamp(9)).is_some());
    let entry = reader.table().lookup(9).unwrap();
    assert!(!reader.table().held(&entry), "a lock never taken has no living owner");
    let owner = file.hold_owner_lock().unwrap();
    assert!(reader.table().owner_alive() && reader.table().held(&entry));
    // The holder thread exits without unlocking, as every thread of a killed slot does: the
    // kernel marks the lock, with nothing done by the slot.
    drop(owner);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while reader.table().owner_alive() {
        assert!(std::time::Instant::now() < deadline, "the owner's death never showed");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!reader.table().held(&entry));
    // A slot that starts again over the same table takes the lock over.
    let again = ResidentFile::open(&path).unwrap();
    let _owner = again.hold_owner_lock().unwrap();
    assert!(reader.table().owner_alive());
}

#[test]
fn a_full_neighbourhood_refuses_a_pin() {
    let words: Vec<AtomicU64> = (0..table_len(8) / 8).map(|_| AtomicU64::new(0)).collect();
    let table = ResidentTable::init(&words).unwrap();
    for i in 1..=8u128 {
        assert!(table.insert(i << 64 | 1, stamp(i as u64)).is_some());
    }
    assert!(table.insert(9 << 64 | 1, stamp(9)).is_none());
    assert!(table.withdraw(3 << 64 | 1));
    assert!(table.insert(9 << 64 | 1, stamp(9)).is_some());
    assert_eq!(ResidentTable::open(&words[..4]).err(), Some(ResidentTableError::NotATable));
    words[2].store(0, Ordering::Relaxed);
    assert_eq!(ResidentTable::open(&words).err(), Some(ResidentTableError::BadCapacity(0)));
}

#[test]
fn reads_noted_by_readers_are_taken_by_the_slot_once_and_start_afresh_with_a_new_pin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resident-2.table");
    let file = ResidentFile::create(&path, 16).unwrap();
    let _owner = file.hold_owner_lock().unwrap();
    let (a, b) = (7_u128 << 64 | 3, 7_u128 << 64 | 4);
    let (at_a, at_b) = (file.table().insert(a, stamp(1)).unwrap(), file.table().insert(b, stamp(2)).unwrap());
    // Two readers in other mappings of the file (as in other processes).
    let readers = [ResidentFile::open(&path).unwrap(), ResidentFile::open(&path).unwrap()];
    for (i, r) in readers.iter().enumerate() {
        let entry = r.table().lookup(a).unwrap();
        for _ in 0..=i {
            r.table().note_read(&entry);
        }
        assert!(r.table().held(&entry), "noting a read does not disturb the entry");
    }
    assert_eq!(file.table().take_reads(at_a, a), 3);
    assert_eq!(file.table().take_reads(at_a, a), 0, "taken once");
    assert_eq!(file.table().take_reads(at_b, b), 0, "b was not read");
    assert_eq!(file.table().take_reads(at_b, a), 0, "another chunk's place");
    // Withdrawn and resident again: the count starts from nothing.
    let entry = readers[0].table().lookup(b).unwrap();
    readers[0].table().note_read(&entry);
    assert!(file.table().withdraw(b));
    assert_eq!(file.table().take_reads(at_b, b), 0, "a withdrawn entry has no reads to give");
    assert_eq!(file.table().insert(b, stamp(5)), Some(at_b));
    assert_eq!(file.table().take_reads(at_b, b), 0, "a new entry starts with none");
}
