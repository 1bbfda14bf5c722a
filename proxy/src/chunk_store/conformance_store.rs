//! Conformance cases for [`ChunkStore`], each taking the I/O engine under test; run against
//! both engines by the `conformance!` macro in `conformance.rs`.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::conformance::pattern;
use super::format::{self, FLAG_MEMARTS_ONLY};
use super::{ChunkKey, ChunkStore, IoEngine, StoreError};

fn key(name: &str, index: u64) -> ChunkKey {
    ChunkKey {
        origin: "s3|http://127.0.0.1:9000".into(),
        bucket: "train".into(),
        key: name.into(),
        etag: "\"0123abcd\"".into(),
        chunk_size: 1 << 20,
        index,
    }
}

fn open(root: &Path, io: &Arc<dyn IoEngine>) -> ChunkStore {
    ChunkStore::open(root, Arc::clone(io)).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    assert!(matches!(result, Err(StoreError::Corrupt { .. })), "expected Corrupt, got {result:?}");
}

/// Puts a 5000-byte chunk and returns the store, its key and its path.
async fn stored(root: &Path, io: &Arc<dyn IoEngine>) -> (ChunkStore, ChunkKey, std::path::PathBuf) {
    let store = open(root, io);
    let k = key("victim", 0);
    store.put(&k, Bytes::from(pattern(5000, 5)), 0, false).await.unwrap();
    let path = store.path_of(k.id());
    (store, k, path)
}

pub(super) async fn put_get_read_round_trip(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &io);
    assert!(store.get(&key("absent", 0)).await.unwrap().is_none());
    for (i, len) in [0usize, 1, 4095, 4096, 4097, 1 << 20].into_iter().enumerate() {
        let k = key("obj", i as u64);
        let data = pattern(len, i as u64);
        let on_disk = store.put(&k, Bytes::from(data.clone()), FLAG_MEMARTS_ONLY, i % 2 == 0).await.unwrap();
        let data_offset = format::data_offset_for(k.identity_len());
        assert_eq!(on_disk, format::round_up(data_offset + len as u64));
        let chunk = store.get(&k).await.unwrap().expect("chunk present");
        assert_eq!((chunk.id, chunk.len, chunk.data_offset, chunk.flags), (k.id(), len as u64, 4096, 1));
        assert_eq!(chunk.crc32c, memarts_protocol::crc32c(&data));
        assert!(store.read_verified(&chunk).await.unwrap() == data);
        let path = store.path_of(k.id());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }
    assert_eq!(mode(&root.path().join("v1/tmp")), 0o700);
    assert_eq!(fs::read_dir(root.path().join("v1/tmp")).unwrap().count(), 0);
}

pub(super) async fn data_flip_is_corrupt(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let (store, k, path) = stored(root.path(), &io).await;
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[!pattern(5000, 5)[1234]], 4096 + 1234).unwrap();
    let chunk = store.get(&k).await.unwrap().expect("header still fine");
    assert_corrupt(store.read_verified(&chunk).await);
    assert!(!path.exists(), "corrupt chunk removed");
    assert!(store.get(&k).await.unwrap().is_none());
}

pub(super) async fn header_flip_is_corrupt_and_removed(io: Arc<dyn IoEngine>) {
    for at in [0u64, 9, 17, 25, 30, 40, 80, 127] {
        let root = tempfile::tempdir().unwrap();
        let (store, k, path) = stored(root.path(), &io).await;
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
        assert_corrupt(store.get(&k).await);
        assert!(!path.exists(), "file with flipped header byte {at} removed");
    }
}

pub(super) async fn truncation_is_corrupt_and_removed(io: Arc<dyn IoEngine>) {
    for len in [4096 + 4999, 4096, 100, 31, 7] {
        let root = tempfile::tempdir().unwrap();
        let (store, k, path) = stored(root.path(), &io).await;
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len).unwrap();
        assert_corrupt(store.get(&k).await);
        assert!(!path.exists(), "file truncated to {len} removed");
    }
}

pub(super) async fn zero_length_file_is_corrupt(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let (store, k, path) = stored(root.path(), &io).await;
    fs::write(&path, b"").unwrap();
    assert_corrupt(store.get(&k).await);
    assert!(!path.exists());
}

pub(super) async fn other_keys_file_is_corrupt(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let (store, k, path) = stored(root.path(), &io).await;
    let other = key("other", 7);
    let other_path = store.path_of(other.id());
    fs::create_dir_all(other_path.parent().unwrap()).unwrap();
    fs::copy(&path, &other_path).unwrap();
    assert_corrupt(store.get(&other).await);
    assert!(!other_path.exists());
    assert!(store.get(&k).await.unwrap().is_some(), "the real chunk is untouched");
}

pub(super) async fn scan_skips_foreign_files(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let (store, k, path) = stored(root.path(), &io).await;
    let chunks = root.path().join("v1/chunks");
    let hex = k.id().to_hex();
    let leaf = path.parent().unwrap();
    let foreign = [
        chunks.join("README"),
        chunks.join("zz"),
        leaf.join("notes.txt"),
        leaf.join(hex.to_uppercase()),
        leaf.join(format!("{hex}.tmp")),
        leaf.join(format!("{}{}", if &hex[0..2] == "00" { "11" } else { "00" }, &hex[2..])),
        // In a fan-out directory of the two-level layout: a chunk of another prefix, a directory.
        leaf.join("ab").join(format!("{}{}", &hex[0..2], if &hex[2..4] == "cd" { "ef" } else { "cd" })),
        leaf.join("ab").join("cd").join("x"),
    ];
    for f in &foreign {
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(f, b"not a chunk").unwrap();
    }
    let mut scan = store.scan();
    let found: Vec<_> = scan.by_ref().map(|c| c.id).collect();
    assert_eq!(found, vec![k.id()]);
    let report = scan.report();
    assert_eq!((report.chunks, report.errors), (1, 0));
    assert_eq!(report.foreign, foreign.len() as u64);
    assert!(foreign.iter().all(|f| f.exists()), "foreign files are never deleted");
}

pub(super) async fn open_removes_stale_temp_files(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    drop(open(root.path(), &io));
    let tmp = root.path().join("v1/tmp");
    // A writer that has exited, and one that still runs (another slot sharing the root).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let live = std::os::unix::process::parent_id();
    let stale = tmp.join(format!("0123.{dead}.7.tmp"));
    let busy = tmp.join(format!("0456.{live}.3.tmp"));
    fs::write(&stale, b"half a chunk").unwrap();
    fs::write(&busy, b"being written").unwrap();
    fs::create_dir(tmp.join("subdir")).unwrap();
    fs::write(tmp.join("subdir/keep"), b"x").unwrap();
    let store = open(root.path(), &io);
    assert!(!stale.exists(), "a dead writer's temp file is removed");
    assert!(busy.exists(), "a live writer's temp file is kept");
    assert!(tmp.join("subdir/keep").exists(), "only regular files directly in tmp/ are removed");
    assert_eq!(store.scan().count(), 0);
}

pub(super) async fn scan_finds_exactly_the_chunks_put(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &io);
    let mut expected = BTreeSet::new();
    let mut total = 0;
    for i in 0..40u64 {
        let k = key(&format!("object-{}", i % 7), i);
        total += store.put(&k, Bytes::from(pattern(i as usize * 1000, i)), 0, false).await.unwrap();
        expected.insert(k.id());
    }
    let mut scan = store.scan();
    let found: BTreeSet<_> = scan.by_ref().map(|c| c.id).collect();
    assert_eq!(found, expected);
    assert_eq!((scan.report().chunks, scan.report().foreign), (40, 0));
    assert!(scan.report().bytes_on_disk >= total, "st_blocks covers the written bytes");
    let victim = *expected.iter().next().unwrap();
    assert!(store.remove(victim).unwrap() >= 4096);
    assert_eq!(store.remove(victim).unwrap(), 0);
    assert_eq!(store.scan().count(), 39);
}

pub(super) async fn concurrent_puts_of_one_key(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let store = Arc::new(open(root.path(), &io));
    let k = key("contended", 3);
    let data = Bytes::from(pattern(64 * 1024 + 3, 77));
    let puts: Vec<_> = (0..100)
        .map(|i| {
            let (store, k, data) = (Arc::clone(&store), k.clone(), data.clone());
            tokio::spawn(async move { store.put(&k, data, 0, i % 10 == 0).await })
        })
        .collect();
    for put in puts {
        put.await.unwrap().unwrap();
    }
    let ids: Vec<_> = store.scan().map(|c| c.id).collect();
    assert_eq!(ids, vec![k.id()]);
    let chunk = store.get(&k).await.unwrap().unwrap();
    assert!(store.read_verified(&chunk).await.unwrap() == data);
    assert_eq!(fs::read_dir(root.path().join("v1/tmp")).unwrap().count(), 0);
}

pub(super) async fn oversized_key_is_refused(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &io);
    let k = key(&"k".repeat(format::MAX_IDENTITY_LEN), 0);
    let result = store.put(&k, Bytes::from_static(b"x"), 0, false).await;
    assert!(matches!(result, Err(StoreError::KeyTooLarge { .. })), "{result:?}");
    assert_eq!(store.scan().count(), 0);
}

/// Replaces the chunk file at `path` with a `kind` of entry: a directory (not empty), a named pipe,
/// or a symlink to the directory `root`.
fn put_non_file(kind: &str, path: &Path, root: &Path) {
    fs::remove_file(path).unwrap();
    match kind {
        "directory" => {
            fs::create_dir(path).unwrap();
            fs::write(path.join("inside"), b"foreign").unwrap();
        }
        "named pipe" => nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap(),
        _ => std::os::unix::fs::symlink(root, path).unwrap(),
    }
}

/// Something other than a regular file where a chunk file should be — a directory, a named pipe, a
/// symlink to a directory — is corrupt: reported at once (opening a pipe would wait for a writer
/// forever), removed, and the chunk can be stored there again.
pub(super) async fn non_file_at_chunk_path_is_corrupt_and_removed(io: Arc<dyn IoEngine>) {
    for kind in ["directory", "named pipe", "symlink to a directory"] {
        let root = tempfile::tempdir().unwrap();
        let (store, k, path) = stored(root.path(), &io).await;
        put_non_file(kind, &path, root.path());
        let Ok(got) = tokio::time::timeout(std::time::Duration::from_secs(5), store.get(&k)).await else {
            // Let an open blocked on the pipe return, so the runtime can shut down.
            use std::os::unix::fs::OpenOptionsExt;
            let _ = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&path);
            panic!("get of a {kind} did not return");
        };
        assert_corrupt(got);
        assert!(fs::symlink_metadata(&path).is_err(), "the {kind} was removed");
        assert!(root.path().join("v1").is_dir(), "a symlink's target is left alone");
        store.put(&k, Bytes::from(pattern(5000, 5)), 0, false).await.unwrap();
        let chunk = store.get(&k).await.unwrap().expect("stored again");
        assert!(store.read_verified(&chunk).await.unwrap() == pattern(5000, 5));
    }
}

/// A well-formed chunk file of another owner (S9: no slot wrote it; whoever could plant it chose
/// its bytes, and its CRC32C checks out) is corrupt: never read, removed, stored again.
pub(super) async fn a_chunk_file_of_another_owner_is_corrupt_and_removed(io: Arc<dyn IoEngine>) {
    assert!(nix::unistd::geteuid().is_root(), "this case chowns a chunk file: run it as root (CI does)");
    let root = tempfile::tempdir().unwrap();
    let (store, k, path) = stored(root.path(), &io).await;
    nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    assert_corrupt(store.get(&k).await);
    assert!(fs::symlink_metadata(&path).is_err(), "the foreign file was removed");
    store.put(&k, Bytes::from(pattern(5000, 5)), 0, false).await.unwrap();
    let chunk = store.get(&k).await.unwrap().expect("stored again");
    assert!(store.read_verified(&chunk).await.unwrap() == pattern(5000, 5));
}

/// A fill of a chunk whose path holds a directory (or a symlink, or a pipe) that no read has met
/// yet (the index rebuild skips such entries, so a read goes to the origin without looking): the
/// fill replaces it, instead of failing on it for good.
pub(super) async fn put_over_a_non_file_at_chunk_path_replaces_it(io: Arc<dyn IoEngine>) {
    for kind in ["directory", "named pipe", "symlink to a directory"] {
        let root = tempfile::tempdir().unwrap();
        let (store, k, path) = stored(root.path(), &io).await;
        put_non_file(kind, &path, root.path());
        store
            .put(&k, Bytes::from(pattern(5001, 7)), 0, false)
            .await
            .unwrap_or_else(|e| panic!("put over a {kind}: {e}"));
        assert!(fs::symlink_metadata(&path).unwrap().is_file(), "the {kind} was replaced");
        let chunk = store.get(&k).await.unwrap().expect("stored");
        assert!(store.read_verified(&chunk).await.unwrap() == pattern(5001, 7));
        assert!(root.path().join("v1").is_dir(), "a symlink's target is left alone");
    }
}

/// Chunk files where the two-level layout of older caches kept them (`<2 hex>/<2 hex>/<id>`): a scan
/// finds them marked `legacy`, a lookup finds one and moves it to its path (removing the directory
/// it empties), `adopt_legacy` moves the others and removes the directories it empties (not one
/// holding a foreign file); after it, lookups no longer look there.
pub(super) async fn chunks_of_the_two_level_layout_are_found_and_moved(io: Arc<dyn IoEngine>) {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &io);
    let mut data = Vec::new();
    for i in 0..20u64 {
        let (k, d) = (key(&format!("old-{i}"), i), pattern(3000 + i as usize * 100, i));
        store.put(&k, Bytes::from(d.clone()), 0, false).await.unwrap();
        data.push((k, d));
    }
    let chunks = root.path().join("v1/chunks");
    let legacy = |k: &ChunkKey| {
        let hex = k.id().to_hex();
        chunks.join(&hex[0..2]).join(&hex[2..4]).join(&hex)
    };
    for (k, _) in &data {
        fs::create_dir_all(legacy(k).parent().unwrap()).unwrap();
        fs::rename(store.path_of(k.id()), legacy(k)).unwrap();
    }
    let foreign = legacy(&data[0].0).with_file_name("notes.txt");
    fs::write(&foreign, b"not a chunk").unwrap();
    // A lookup before the rebuild's scan moves its chunk, and the directory it leaves empty goes
    // (the scan will not report that chunk, so the rebuild would not know the directory).
    let (k1, d1) = &data[1];
    let chunk = store.get(k1).await.unwrap().expect("found at its old path");
    assert!(store.read_verified(&chunk).await.unwrap() == *d1);
    assert!(store.path_of(k1.id()).exists() && !legacy(k1).exists(), "moved by the lookup");
    let shared = data.iter().any(|(k, _)| k != k1 && legacy(k).parent() == legacy(k1).parent());
    assert!(shared || !legacy(k1).parent().unwrap().exists(), "the emptied old directory is removed");

    let scanned: Vec<_> = store.scan().collect();
    assert_eq!(scanned.len(), data.len());
    assert_eq!(scanned.iter().filter(|c| c.legacy).count(), data.len() - 1, "{scanned:?}");
    let ids: Vec<_> = scanned.iter().filter(|c| c.legacy).map(|c| c.id).collect();
    assert_eq!(store.adopt_legacy(&ids).unwrap(), data.len() as u64 - 1);
    let rescanned: Vec<_> = store.scan().collect();
    assert_eq!(rescanned.len(), data.len());
    assert!(rescanned.iter().all(|c| !c.legacy), "{rescanned:?}");
    for (k, d) in &data {
        let chunk = store.get(k).await.unwrap().expect("at its path");
        assert!(store.read_verified(&chunk).await.unwrap() == *d);
    }
    let old_dirs: Vec<_> = fs::read_dir(&chunks)
        .unwrap()
        .flatten()
        .flat_map(|fan| fs::read_dir(fan.path()).unwrap().flatten())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.path())
        .collect();
    assert_eq!(old_dirs, vec![foreign.parent().unwrap().to_path_buf()]);
    assert!(foreign.exists(), "foreign files are never deleted");

    let (k2, _) = &data[2];
    fs::create_dir_all(legacy(k2).parent().unwrap()).unwrap();
    fs::rename(store.path_of(k2.id()), legacy(k2)).unwrap();
    assert!(store.get(k2).await.unwrap().is_none(), "after adopt_legacy, old paths are not looked at");
}
