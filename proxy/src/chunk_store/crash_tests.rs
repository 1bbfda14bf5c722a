//! I5: a chunk becomes visible only whole. A `put` is stopped for good at each of its steps (the
//! process dies there): nothing is visible under the chunk's name, and the next `open` of the store
//! removes the half-written temp file. Readers racing with writers of the same chunk never see a
//! torn file.

use std::fs;
use std::io;
use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;
use tokio::sync::Notify;

use super::conformance::pattern;
use super::{BoxFuture, ChunkKey, ChunkStore, IoEngine, PreadEngine, StoreError};

fn key() -> ChunkKey {
    ChunkKey {
        origin: "s3|http://127.0.0.1:9000".into(),
        bucket: "train".into(),
        key: "crash".into(),
        etag: "\"0123abcd\"".into(),
        chunk_size: 1 << 20,
        index: 2,
    }
}

/// The pread engine, except that the write of a new chunk file stops for good: after half its
/// bytes, or after all of them (before the rename). `reached` is notified when it gets there; once
/// `release` says so, the writing thread dies there (a panic), so nothing after that step runs, as
/// when the process is killed at that instant.
struct StopsAt {
    whole: bool,
    reached: Arc<Notify>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl IoEngine for StopsAt {
    fn read_at(&self, file: Arc<fs::File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>> {
        PreadEngine.read_at(file, offset, len)
    }

    fn write_at(&self, file: Arc<fs::File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>> {
        PreadEngine.write_at(file, offset, data)
    }

    fn write_parts_blocking(&self, file: &fs::File, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        let all: Vec<u8> = parts.concat();
        let upto = if self.whole { all.len() } else { all.len() / 2 };
        PreadEngine.write_parts_blocking(file, offset, &[&all[..upto]])?;
        self.reached.notify_one();
        let _ = self.release.lock().unwrap().recv();
        panic!("the process dies here (a test's simulated crash)");
    }

    fn fsync(&self, file: Arc<fs::File>, data_only: bool) -> BoxFuture<io::Result<()>> {
        PreadEngine.fsync(file, data_only)
    }

    fn name(&self) -> &'static str {
        "stops-at"
    }
}

fn temp_files(root: &std::path::Path) -> usize {
    fs::read_dir(root.join("v1/tmp")).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_stopped_at_any_step_leaves_nothing_visible_and_its_temp_file_goes_at_the_next_open() {
    let data = Bytes::from(pattern(300_000, 42));
    // The steps of a durable put: the write of header and data, then the fsync and the rename.
    for (whole, step) in
        [(false, "the middle of the write"), (true, "the end of the write, before the rename")]
    {
        let root = tempfile::tempdir().unwrap();
        let reached = Arc::new(Notify::new());
        let (release, released) = mpsc::channel();
        let io = StopsAt { whole, reached: Arc::clone(&reached), release: Mutex::new(released) };
        let store = Arc::new(ChunkStore::open(root.path(), Arc::new(io)).unwrap());
        let put = {
            let (store, data) = (Arc::clone(&store), data.clone());
            tokio::spawn(async move { store.put(&key(), data, 0, true).await })
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), reached.notified())
            .await
            .unwrap_or_else(|_| panic!("the put never reached {step}"));
        // Stopped there: the chunk is not visible, in any way a reader or a rebuild could find it.
        assert!(store.get(&key()).await.unwrap().is_none(), "stopped at {step}: the chunk is visible");
        assert!(!store.path_of(key().id()).exists(), "stopped at {step}: a file has the chunk's name");
        assert_eq!(store.scan().count(), 0, "stopped at {step}: a scan finds a chunk");
        assert_eq!(temp_files(root.path()), 1, "stopped at {step}: the temp file holds the bytes so far");
        // The process dies here: nothing of the put runs any more.
        put.abort();
        assert!(put.await.unwrap_err().is_cancelled());
        release.send(()).unwrap();
        drop(store);

        // The next start: the leftover goes, the chunk is absent, and it can be written whole.
        let store = ChunkStore::open(root.path(), Arc::new(PreadEngine)).unwrap();
        assert_eq!(temp_files(root.path()), 0, "stopped at {step}: the temp file outlived a restart");
        assert!(store.get(&key()).await.unwrap().is_none());
        store.put(&key(), data.clone(), 0, true).await.unwrap();
        let chunk = store.get(&key()).await.unwrap().expect("written again");
        assert!(store.read_verified(&chunk).await.unwrap() == data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_racing_with_writers_of_a_chunk_see_one_whole_version_or_nothing() {
    let root = tempfile::tempdir().unwrap();
    let store = Arc::new(ChunkStore::open(root.path(), Arc::new(PreadEngine)).unwrap());
    let versions: Arc<Vec<Bytes>> =
        Arc::new((0..4).map(|v| Bytes::from(pattern(200_000, 100 + v))).collect());
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, versions) = (Arc::clone(&store), Arc::clone(&versions));
            tokio::spawn(async move {
                for i in 0..40 {
                    store.put(&key(), versions[(w + i) % versions.len()].clone(), 0, false).await.unwrap();
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (store, versions) = (Arc::clone(&store), Arc::clone(&versions));
            tokio::spawn(async move {
                let mut whole = 0;
                for _ in 0..200 {
                    let chunk = match store.get(&key()).await {
                        Ok(Some(chunk)) => chunk,
                        Ok(None) => continue,
                        Err(e) => panic!("a reader met a torn chunk file: {e}"),
                    };
                    match store.read_verified(&chunk).await {
                        Ok(got) => {
                            assert!(versions.iter().any(|v| *v == got), "a reader got bytes of no version");
                            whole += 1;
                        }
                        Err(e @ StoreError::Corrupt { .. }) => panic!("a reader met a torn chunk file: {e}"),
                        Err(e) => panic!("{e}"),
                    }
                }
                whole
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let mut whole = 0;
    for r in readers {
        whole += r.await.unwrap();
    }
    assert!(whole > 0, "no reader ever saw the chunk");
    assert_eq!(temp_files(root.path()), 0);
}

/// Found by the e2e crash test: a slot killed with `kill -9` stays a zombie until its parent reaps it
/// (init in a container may do so late, or never), and its temp files were kept as a live writer's.
#[test]
fn a_killed_writer_that_is_not_reaped_yet_leaves_no_temp_file_behind() {
    let root = tempfile::tempdir().unwrap();
    drop(ChunkStore::open(root.path(), Arc::new(PreadEngine)).unwrap());
    let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let pid = child.id();
    let leftover = root.path().join(format!("v1/tmp/{}.{pid}.0.tmp", key().id().to_hex()));
    fs::write(&leftover, b"half a chunk").unwrap();
    child.kill().unwrap();
    // Not reaped: a zombie, which `kill(pid, 0)` still finds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().contains(") Z") {
        assert!(std::time::Instant::now() < deadline, "the child never became a zombie");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(ChunkStore::open(root.path(), Arc::new(PreadEngine)).unwrap());
    child.wait().unwrap();
    assert!(!leftover.exists(), "the temp file of a dead, unreaped writer was kept");
}
