use super::*;

fn place(n: u64) -> RecordPlace {
    RecordPlace { segment: n, offset: 16 + 8 * n, len: 4096 + 8 * n }
}

fn words(capacity: usize) -> Vec<AtomicU64> {
    (0..table_len(capacity) / 8).map(|_| AtomicU64::new(0)).collect()
}

#[test]
fn an_entry_is_found_where_it_was_published_until_it_is_withdrawn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packed-0.table");
    let file = PackedFile::create(&path, 100).unwrap();
    let table = file.table();
    assert_eq!(table.capacity(), 100);
    let reader = PackedFile::open(&path).unwrap();
    let (a, b) = (0x1234_u128 << 64 | 5, 0x99_u128 << 64 | 6);
    assert_eq!(reader.table().lookup(a), None);
    assert_eq!(table.publish(a, place(1)), Publish::Added);
    assert_eq!(table.publish(b, place(2)), Publish::Added);
    let entry = reader.table().lookup(a).unwrap();
    assert_eq!(entry.record, place(1));
    assert!(reader.table().unchanged(&entry));
    // Moved (a compaction): a reader that found the old place sees the entry changed.
    assert_eq!(table.publish(a, place(3)), Publish::Updated);
    assert!(!reader.table().unchanged(&entry));
    let entry = reader.table().lookup(a).unwrap();
    assert_eq!(entry.record, place(3));
    assert!(table.withdraw(a) && !table.withdraw(a));
    assert!(!reader.table().unchanged(&entry), "withdrawn while a reader read");
    assert_eq!(reader.table().lookup(a), None);
    assert_eq!(reader.table().lookup(b).unwrap().record, place(2));
    assert_eq!(reader.table().entries(), vec![(b, place(2))]);
    assert_eq!(table.publish(0, place(4)), Publish::Full, "id 0 marks a free place");
    assert!(table.lookup(0).is_none());
}

#[test]
fn a_superseded_table_holds_no_entry_a_reader_may_trust() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packed-1.table");
    let file = PackedFile::create(&path, 16).unwrap();
    let reader = PackedFile::open(&path).unwrap();
    assert_eq!(file.table().publish(9, place(9)), Publish::Added);
    let entry = reader.table().lookup(9).unwrap();
    assert!(reader.table().unchanged(&entry) && reader.is_current(&path));
    // The slot starts again (or grows its table): a new file in its place, the old one marked.
    let older = PackedFile::open_writable(&path).unwrap();
    let again = PackedFile::create(&path, 32).unwrap();
    older.table().mark_superseded();
    assert!(reader.table().superseded() && !reader.is_current(&path));
    assert!(!reader.table().unchanged(&entry), "read from a superseded table");
    assert!(!again.table().superseded());
    assert_eq!(PackedFile::open(&path).unwrap().table().lookup(9), None);
}

#[test]
fn a_torn_or_odd_entry_is_never_returned() {
    let w = words(16);
    let table = PackedTable::init(&w).unwrap();
    let id = 3_u128 << 64 | 7;
    assert_eq!(table.publish(id, place(1)), Publish::Added);
    let at = (0..16)
        .map(|i| HEADER_WORDS + i * ENTRY_WORDS)
        .find(|&at| w[at + 1].load(Ordering::Relaxed) == 7 && w[at + 2].load(Ordering::Relaxed) == 3)
        .expect("the entry is in the table");
    let seq = w[at].load(Ordering::Relaxed);
    assert_eq!(seq % 2, 0);
    // A writer in the middle of a write (or one that died there): the sequence number is odd.
    w[at].store(seq + 1, Ordering::Relaxed);
    w[at + OFFSET].store(999, Ordering::Relaxed);
    assert_eq!(table.lookup(id), None, "an entry being written is never read");
    w[at].store(seq + 2, Ordering::Relaxed);
    assert_eq!(table.lookup(id).unwrap().record.offset, 999);
    // An entry of length 0 is no record: never returned.
    assert_eq!(table.publish(id, RecordPlace { len: 0, ..place(1) }), Publish::Updated);
    assert_eq!(table.lookup(id), None);
}

#[test]
fn a_full_neighbourhood_refuses_an_entry_and_a_bad_header_is_refused() {
    let w = words(8);
    let table = PackedTable::init(&w).unwrap();
    for i in 1..=8u128 {
        assert_eq!(table.publish(i << 64 | 1, place(i as u64)), Publish::Added);
    }
    assert_eq!(table.publish(9 << 64 | 1, place(9)), Publish::Full);
    assert!(table.withdraw(3 << 64 | 1));
    assert_eq!(table.publish(9 << 64 | 1, place(9)), Publish::Added);
    assert_eq!(PackedTable::open(&w[..4]).err(), Some(PackedTableError::NotATable));
    w[2].store(0, Ordering::Relaxed);
    assert_eq!(PackedTable::open(&w).err(), Some(PackedTableError::BadCapacity(0)));
    w[2].store(1 << 20, Ordering::Relaxed);
    assert_eq!(PackedTable::open(&w).err(), Some(PackedTableError::BadCapacity(1 << 20)), "past its file");
    w[1].store(VERSION + 1, Ordering::Relaxed);
    assert_eq!(PackedTable::open(&w).err(), Some(PackedTableError::NotATable), "another layout");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk"), [7u8; 4096]).unwrap();
    assert!(PackedFile::open(&dir.path().join("junk")).is_err());
    // A resident table is not a packed table.
    let resident = dir.path().join("pins-0.table");
    let _r = crate::resident_table::ResidentFile::create(&resident, 16).unwrap();
    assert!(PackedFile::open(&resident).is_err());
}
