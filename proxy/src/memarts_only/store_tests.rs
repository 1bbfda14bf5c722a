//! Tests of `memarts_only`.

use super::*;

#[test]
fn round_trip_replace_remove_and_detect_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), None).unwrap();
    let url = ObjectUrl::parse("obs://b/k").unwrap();
    assert!(store.get(&url).unwrap().is_none());
    for data in [b"first version".to_vec(), vec![7u8; 100_000]] {
        let mut w = store.begin(&url).unwrap();
        w.write(&data[..10]).unwrap();
        w.write(&data[10..]).unwrap();
        assert_eq!(store.commit(w).unwrap(), data.len() as u64);
        let s = store.get(&url).unwrap().unwrap();
        let mut back = vec![0u8; s.len as usize];
        s.file.read_exact_at(&mut back, s.data_offset).unwrap();
        assert_eq!(back, data);
        assert_eq!(s.crc32c, crc32c(&data));
    }
    // An unacknowledged writer leaves nothing behind.
    let mut w = store.begin(&url).unwrap();
    w.write(b"never committed").unwrap();
    drop(w);
    assert_eq!(fs::read_dir(dir.path().join("v1/tmp")).unwrap().count(), 0);
    assert_eq!(store.get(&url).unwrap().unwrap().len, 100_000);
    // A flipped header byte is detected.
    let path = store.path_of(&url.to_string());
    let mut bytes = fs::read(&path).unwrap();
    bytes[20] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(store.get(&url), Err(OnlyError::Corrupt { .. })));
    assert!(store.remove(&url).unwrap());
    assert!(store.get(&url).unwrap().is_none());
}

/// Found by the e2e test of D1: an empty object was written as its header alone, shorter than the
/// data offset the header names, so once acknowledged it read back as corrupt.
#[test]
fn an_empty_object_reads_back_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), None).unwrap();
    let url = ObjectUrl::parse("obs://b/empty").unwrap();
    assert_eq!(store.commit(store.begin(&url).unwrap()).unwrap(), 0);
    let s = store.get(&url).unwrap().expect("the empty object is there");
    assert_eq!((s.len, s.crc32c), (0, crc32c(b"")));
}

/// A named pipe at an object's path used to hang `get` in its open, waiting for a writer; it and
/// a directory are now a typed `Corrupt`, at once.
#[test]
fn a_pipe_or_a_directory_at_an_objects_path_is_corrupt_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), None).unwrap();
    let (pipe, folder) =
        (ObjectUrl::parse("obs://b/pipe").unwrap(), ObjectUrl::parse("obs://b/dir").unwrap());
    let pipe_path = store.path_of(&pipe.to_string());
    fs::create_dir_all(pipe_path.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&pipe_path, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let folder_path = store.path_of(&folder.to_string());
    fs::create_dir_all(&folder_path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcomes = [&pipe, &folder].map(|u| matches!(store.get(u), Err(OnlyError::Corrupt { .. })));
        let _ = tx.send(outcomes);
    });
    let outcomes = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("get hung on a named pipe");
    assert_eq!(outcomes, [true, true]);
}

/// S9: a well-formed object file of another owner (no slot wrote it) is never read.
#[test]
fn an_object_file_of_another_owner_is_corrupt() {
    assert!(nix::unistd::geteuid().is_root(), "this test chowns a file: run it as root (CI does)");
    let dir = tempfile::tempdir().unwrap();
    let (store, url) = (OnlyStore::open(dir.path(), None).unwrap(), ObjectUrl::parse("obs://b/o").unwrap());
    store.commit(store.begin(&url).unwrap()).unwrap();
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&store.path_of(&url.to_string()), nobody, None).unwrap();
    let err = store.get(&url).unwrap_err().to_string();
    assert!(err.contains("uid 65534"), "{err}");
}

#[test]
fn quota_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), Some(10_000)).unwrap();
    let url = ObjectUrl::parse("obs://b/big").unwrap();
    let mut w = store.begin(&url).unwrap();
    w.write(&[1u8; 20_000]).unwrap();
    assert!(matches!(store.commit(w), Err(OnlyError::Quota { .. })));
    assert!(store.get(&url).unwrap().is_none());
}

/// Found by the e2e test of D4: each slot counted only what it had written itself, so a fleet
/// of two slots stored twice its quota.
#[test]
fn the_quota_is_shared_by_every_store_of_the_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let slots = [
        OnlyStore::open(dir.path(), Some(100_000)).unwrap(),
        OnlyStore::open(dir.path(), Some(100_000)).unwrap(),
    ];
    let mut acked = 0;
    for i in 0..10 {
        let store = &slots[i % 2];
        let mut w = store.begin(&ObjectUrl::parse(&format!("obs://b/{i}")).unwrap()).unwrap();
        w.write(&[i as u8; 20_000]).unwrap();
        match store.commit(w) {
            Ok(_) => acked += 1,
            Err(OnlyError::Quota { used, quota, .. }) => assert!(used <= quota),
            Err(e) => panic!("{e}"),
        }
    }
    // 24,096 bytes per object (a 4 KiB header): four fit in 100,000.
    assert_eq!(acked, 4);
    assert!(slots[0].used().unwrap() <= 100_000);
    // Replacing an object in place needs no more room than it frees.
    let url = ObjectUrl::parse("obs://b/0").unwrap();
    let mut w = slots[1].begin(&url).unwrap();
    w.write(&[9u8; 20_000]).unwrap();
    slots[1].commit(w).unwrap();
    assert!(slots[1].remove(&url).unwrap());
    assert_eq!(slots[0].used().unwrap(), 3 * 24_096);
}

/// Objects written by the release before the chunk-format codec read back byte for byte
/// through the store, and replacing one writes the new format.
#[test]
fn objects_of_the_earlier_format_read_back_and_are_replaced_in_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), None).unwrap();
    for (url, golden, len) in [
        ("s3://bucket/features/part-0.bin", &include_bytes!("testdata/v1-object.bin")[..], 10_000),
        ("s3://bucket/empty", &include_bytes!("testdata/v1-empty.bin")[..], 0),
    ] {
        fs::write(store.path_of(url), golden).unwrap();
        let url = ObjectUrl::parse(url).unwrap();
        let s = store.get(&url).unwrap().expect("the golden object is there");
        let mut back = vec![0u8; s.len as usize];
        s.file.read_exact_at(&mut back, s.data_offset).unwrap();
        assert_eq!(back, legacy::tests::golden_data(len));
        assert_eq!(s.crc32c, crc32c(&back));
    }
    let url = ObjectUrl::parse("s3://bucket/features/part-0.bin").unwrap();
    let mut w = store.begin(&url).unwrap();
    w.write(b"new").unwrap();
    store.commit(w).unwrap();
    assert_eq!(&fs::read(store.path_of(&url.to_string())).unwrap()[..8], b"MACHUNK1");
    assert_eq!(store.get(&url).unwrap().unwrap().len, 3);
}

/// The new format is fixed too: a file this code writes, checked in (`testdata/v2-object.bin`;
/// `MEMARTS_BLESS=1` rewrites it, for a deliberate format change only).
#[test]
fn the_new_format_is_what_the_golden_file_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = OnlyStore::open(dir.path(), None).unwrap();
    let url = ObjectUrl::parse("s3://bucket/features/part-0.bin").unwrap();
    let mut w = store.begin(&url).unwrap();
    w.write(&legacy::tests::golden_data(10_000)).unwrap();
    store.commit(w).unwrap();
    let written = fs::read(store.path_of(&url.to_string())).unwrap();
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/memarts_only/testdata/v2-object.bin");
    if std::env::var_os("MEMARTS_BLESS").is_some() {
        fs::write(&golden, &written).unwrap();
    }
    assert!(written == fs::read(&golden).unwrap(), "the memarts-only file format changed");
}
