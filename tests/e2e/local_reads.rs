//! Local hits (issue 17): a client of the fleet's own uid reads warm objects straight from the
//! chunk files, with no request to a proxy, and every promise of the proxy path still holds: every
//! byte checked (a corrupted file is never served: it is refetched, counted), one read never mixes
//! two versions, eviction racing readers never yields a wrong byte, another uid reads through the
//! proxy only, and the reads count for eviction (reported to the slots in batches).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memarts_disk::chunk_file::{chunk_path, chunks_dir, ChunkId};
use memarts_protocol::ObjectUrl;
use memarts_shim::{Client, ShimConfig};

use crate::common::foreign::{as_other_user, binaries_for_everyone};
use crate::common::raw::OTHER_UID;
use crate::common::{moto, pattern, text, Fleet};

const MIB: usize = 1 << 20;

fn local_counts(client: &Client) -> (u64, u64, u64) {
    let d = client.local_counters().expect("local reads are on for the fleet's own uid");
    (d.hits.load(Ordering::Relaxed), d.fallbacks.load(Ordering::Relaxed), d.corrupt.load(Ordering::Relaxed))
}

fn chunks_of(len: usize) -> u64 {
    len.div_ceil(MIB).max(1) as u64
}

/// The file of chunk `index` of the current version of `url` (whose ETag `client.stat` gives).
pub(crate) fn chunk_file(fleet: &Fleet, client: &Client, url: &str, index: u64) -> std::path::PathBuf {
    let etag = client.stat(url).unwrap().etag.unwrap();
    let id = memarts_protocol::chunk_id(&ObjectUrl::parse(url).unwrap(), &etag, MIB as u64, index);
    chunk_path(&chunks_dir(&fleet.cache_dir), ChunkId(id))
}

/// An object of `len` bytes in a new bucket, read once through a fleet of 2 slots until all its
/// chunks are cached: the bucket, the object, its URL, the fleet and its client.
fn warm_object(bucket: &str, seed: u64, len: usize) -> (String, Vec<u8>, String, Fleet, Client) {
    let bucket = moto().bucket(bucket);
    let data = pattern(seed, len);
    moto().put(&bucket, "o", &data);
    let url = format!("s3://{bucket}/o");
    let fleet = Fleet::start(2, &[]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    assert!(client.read(&url).unwrap() == data);
    fleet.wait_cached(chunks_of(len));
    (bucket, data, url, fleet, client)
}

/// One byte of a chunk file's data flipped in place (its header still says which chunk it is).
pub(crate) fn flip_a_data_byte(file: &std::path::Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x40;
    std::fs::write(file, &bytes).unwrap();
}

fn cut_short(file: &std::path::Path) {
    let len = std::fs::metadata(file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(len - 1).unwrap();
}

#[test]
fn warm_reads_of_the_fleets_own_uid_need_no_request_to_a_proxy_and_are_counted() {
    let bucket = moto().bucket("direct");
    let objects: Vec<(String, Vec<u8>)> = [100 << 10, MIB, 3 * MIB + 5, 1]
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("s3://{bucket}/o{i}"), pattern(7000 + i as u64, len)))
        .collect();
    for (url, data) in &objects {
        moto().put(&bucket, url.rsplit('/').next().unwrap(), data);
    }
    let chunks: u64 = objects.iter().map(|(_, d)| chunks_of(d.len())).sum();
    let fleet = Fleet::start(2, &[]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} cold");
    }
    fleet.wait_cached(chunks);
    // The cold reads looked for chunks 1.. of the larger object on disk first, in vain.
    let cold = local_counts(&client);
    assert_eq!(cold.0, 0, "a cold read has nothing to read directly");
    let proxy_hits = fleet.total("hits");
    let requests = fleet.total("requests");
    let gets = moto().gets_settled(&bucket);
    for round in 0..5 {
        for (url, data) in &objects {
            assert!(client.read(url).unwrap() == *data, "{url} warm, round {round}");
        }
    }
    let (hits, fallbacks, corrupt) = local_counts(&client);
    assert_eq!((hits, fallbacks - cold.1, corrupt), (5 * chunks, 0, 0), "every warm chunk read directly");
    // The status calls themselves are requests: 3 per slot each (`memarts status`).
    let asked = fleet.total("requests") - requests - 3 * 2;
    assert!(asked <= 2, "{asked} requests to the proxies for {} warm reads", 5 * objects.len());
    assert_eq!(moto().gets_settled(&bucket), gets, "nothing from the origin");
    // Copies to local files (what `mox.file.copy` and `memarts cp` do) need no request either.
    let copies = tempfile::tempdir().unwrap();
    let requests = fleet.total("requests");
    for (i, (url, data)) in objects.iter().enumerate() {
        let path = copies.path().join(format!("copy-{i}"));
        assert_eq!(client.download(url, &path, 4, u64::MAX).unwrap(), data.len() as u64);
        assert!(std::fs::read(&path).unwrap() == *data, "{url} copied");
    }
    assert_eq!(local_counts(&client).0 - hits, chunks, "every chunk copied directly");
    // At most a report of the local reads to each slot.
    let asked = fleet.total("requests") - requests - 3 * 2;
    assert!(asked <= 2, "the copies made {asked} requests to the proxies");
    let hits = local_counts(&client).0;
    // Reported to the slots (at the latest when the client goes), or noted in their resident tables
    // (reads of chunks made resident meanwhile): counted as the hits they were.
    drop(client);
    assert_eq!(fleet.total("hits") - proxy_hits, hits, "the slots counted the local hits");

    // Off by the setting: every read asks a proxy again.
    let off =
        Client::new(ShimConfig { local_reads: false, ..fleet.client(MIB as u64).config().clone() }).unwrap();
    assert!(off.local_counters().is_none());
    let requests = fleet.total("requests");
    for (url, data) in &objects {
        assert!(off.read(url).unwrap() == *data);
    }
    assert!(fleet.total("requests") - requests >= objects.len() as u64);
}

#[test]
fn a_corrupted_chunk_file_is_never_served_it_is_refetched_and_counted() {
    let (bucket, data, url, fleet, client) = warm_object("directcorrupt", 7100, 2 * MIB + 40_000);
    flip_a_data_byte(&chunk_file(&fleet, &client, &url, 1));
    let gets = moto().gets_settled(&bucket);
    assert!(client.read(&url).unwrap() == data, "the damaged byte was served");
    let (hits, _, corrupt) = local_counts(&client);
    assert_eq!((hits, corrupt), (2, 1), "chunks 0 and 2 read directly, chunk 1 refused");
    assert_eq!(moto().gets_settled(&bucket), gets + 1, "the damaged chunk was fetched again, once");
    assert_eq!(fleet.total("corrupt_chunks"), 1, "and counted by its slot");
    // Its file was replaced by the refetch: the next read is direct again.
    assert!(client.read(&url).unwrap() == data);
    assert_eq!(local_counts(&client).0, 5);
    // A file cut short, and one holding another chunk's bytes, are refused the same way.
    cut_short(&chunk_file(&fleet, &client, &url, 0));
    std::fs::copy(chunk_file(&fleet, &client, &url, 2), chunk_file(&fleet, &client, &url, 1)).unwrap();
    assert!(client.read(&url).unwrap() == data);
    assert_eq!(local_counts(&client).2, 3);
}

/// The lines of an strace output (`-f -yy`) that are calls named in `names`.
fn traced_calls(trace: &std::path::Path, names: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(trace).unwrap();
    text.lines()
        .filter(|l| {
            let call = l.split_whitespace().nth(1).and_then(|w| w.split('(').next());
            call.is_some_and(|c| names.contains(&c))
        })
        .map(str::to_string)
        .collect()
}

/// `memarts cat URL` under strace (`mlock` and the `pread`s), behind `wrapper` (a command line
/// prefix); returns its output and the traced calls.
fn traced_cat(fleet: &Fleet, url: &str, wrapper: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    let probe = std::process::Command::new("strace").arg("-V").output();
    assert!(probe.is_ok_and(|o| o.status.success()), "this test needs strace (apt-get install strace)");
    let trace = fleet.dir.path().join("cat.trace");
    let cat = fleet.command(&["cat", url]);
    let out = std::process::Command::new("strace")
        .args(["-f", "-qq", "-yy", "-e", "trace=mlock,pread64,preadv,preadv2", "-o"])
        .arg(&trace)
        .args(wrapper)
        .arg(cat.get_program())
        .args(cat.get_args())
        .envs(cat.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    (out, trace)
}

/// `memarts cat` of a warm object writes each chunk from its file's mapping, checked and locked in
/// memory, with no read of the data into a buffer (strace: one `mlock` per chunk, no `pread` of a
/// chunk file); where memory cannot be locked it reads them into buffers instead; a damaged chunk
/// file, or one cut short, is never written from: its chunk is refetched by its slot and the
/// output is the object, byte for byte.
#[test]
fn memarts_cat_writes_warm_chunks_from_their_mappings_and_never_a_damaged_one() {
    let (bucket, data, url, fleet, client) = warm_object("directcat", 7150, 3 * MIB + 40_000);
    let chunks = chunks_dir(&fleet.cache_dir);
    let chunk_reads = |trace: &std::path::Path| {
        let reads = traced_calls(trace, &["pread64", "preadv", "preadv2"]);
        reads.into_iter().filter(|l| l.contains(chunks.to_str().unwrap())).count()
    };
    let (out, trace) = traced_cat(&fleet, &url, &[]);
    assert!(out.status.success(), "memarts cat: {}", text(&out.stderr));
    assert!(out.stdout == data, "memarts cat: wrong bytes");
    let locks = traced_calls(&trace, &["mlock"]);
    assert_eq!(
        locks.iter().filter(|l| l.ends_with("= 0")).count(),
        4,
        "one mapping locked per chunk: {locks:?}"
    );
    assert_eq!(chunk_reads(&trace), 0, "chunk data read into a buffer");
    // No memory to lock (no CAP_IPC_LOCK, RLIMIT_MEMLOCK 0): the chunks are read into buffers.
    let (out, trace) = traced_cat(
        &fleet,
        &url,
        &["setpriv", "--bounding-set", "-ipc_lock", "prlimit", "--memlock=0:0", "--"],
    );
    assert!(out.status.success(), "memarts cat: {}", text(&out.stderr));
    assert!(out.stdout == data, "memarts cat without mlock: wrong bytes");
    assert!(traced_calls(&trace, &["mlock"]).iter().all(|l| !l.ends_with("= 0")), "a lock was taken");
    assert!(chunk_reads(&trace) >= 4, "the chunks were not read into buffers");

    // One byte of chunk 1's data flipped; chunk 2 cut short by a byte.
    flip_a_data_byte(&chunk_file(&fleet, &client, &url, 1));
    cut_short(&chunk_file(&fleet, &client, &url, 2));
    let gets = moto().gets_settled(&bucket);
    let out = fleet.memarts(&["cat", &url]);
    assert!(out.status.success(), "memarts cat: {}", text(&out.stderr));
    assert!(out.stdout == data, "memarts cat wrote bytes of a damaged chunk file");
    assert_eq!(moto().gets_settled(&bucket), gets + 2, "each damaged chunk fetched again, once");
    assert_eq!(fleet.total("corrupt_chunks"), 2, "and counted by its slot");
}

#[test]
fn an_object_replaced_at_the_origin_is_never_mixed() {
    let bucket = moto().bucket("directversion");
    let (v1, v2) = (pattern(7200, 3 * MIB), pattern(7201, 3 * MIB));
    moto().put(&bucket, "o", &v1);
    let url = format!("s3://{bucket}/o");
    let fleet = Fleet::start(2, &[]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    assert!(client.read(&url).unwrap() == v1);
    fleet.wait_cached(3);
    moto().put(&bucket, "o", &v2);
    // Within the metadata TTL the cached version is served, whole (as through the proxy).
    assert!(client.read(&url).unwrap() == v1);
    // One of its chunks gone: that chunk is asked of its slot, pinned to v1's ETag, which the origin
    // refuses (412): the read starts over on the new version, whole, never a mix.
    std::fs::remove_file(chunk_file(&fleet, &client, &url, 1)).unwrap();
    let got = client.read(&url).unwrap();
    assert!(got == v2, "after the object changed: {}", if got == v1 { "v1" } else { "a mix" });
    // From then on the slot published v2: read directly once cached.
    fleet.wait_cached(5);
    let hits = local_counts(&client).0;
    assert!(client.read(&url).unwrap() == v2);
    assert_eq!(local_counts(&client).0, hits + 3);
}

/// Readers reading directly while the cache, far smaller than the data, evicts all the time: every
/// read returns its object's bytes exactly.
#[test]
fn eviction_racing_direct_readers_never_yields_a_wrong_byte() {
    let bucket = moto().bucket("directrace");
    let objects: Vec<(String, Vec<u8>)> = (0..64)
        .map(|i| (format!("s3://{bucket}/o{i}"), pattern(7300 + i, MIB + (i as usize * 7919) % MIB)))
        .collect();
    moto().put_many(
        &bucket,
        objects.iter().map(|(u, d)| (u.rsplit('/').next().unwrap().to_string(), d.clone())),
    );
    // 64 MiB (the least a cache may have) for 64 objects of 1-2 MiB: reads of cold ones evict, and
    // files vanish under readers.
    let fleet = Fleet::start(2, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", "lru")]);
    fleet.wait_index_ready();
    let stop = Instant::now() + Duration::from_secs(4);
    let (reads, wrong) = (std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0));
    let clients: Vec<Client> = (0..4).map(|_| fleet.client(MIB as u64)).collect();
    std::thread::scope(|s| {
        for (t, client) in clients.iter().enumerate() {
            let (objects, reads, wrong) = (&objects, &reads, &wrong);
            s.spawn(move || {
                let mut i = t * 7;
                while Instant::now() < stop {
                    // Mostly a hot few (local hits), sometimes a cold one (an eviction).
                    let pick = if i % 3 == 0 { i % objects.len() } else { i % 5 };
                    let (url, data) = &objects[pick];
                    if client.read(url).unwrap() != *data {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
    });
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "wrong bytes in {} reads", reads.load(Ordering::Relaxed));
    let local_hits: u64 = clients.iter().map(|c| local_counts(c).0).sum();
    assert!(local_hits > 0, "no local hit in {} reads", reads.load(Ordering::Relaxed));
    assert!(fleet.total("evicted_chunks") > 0, "nothing was evicted: the race did not happen");
}

/// With plain LRU, what decides what goes is recency: chunks read directly must count as read, or
/// they would be evicted as if nobody read them.
#[test]
fn direct_reads_keep_what_is_read_and_what_is_not_goes() {
    let bucket = moto().bucket("directlru");
    let set = |name: &str, seed: u64| -> Vec<(String, Vec<u8>)> {
        (0..30).map(|i| (format!("s3://{bucket}/{name}{i}"), pattern(seed + i, MIB))).collect()
    };
    let (a, b, c) = (set("a", 7400), set("b", 7500), set("c", 7600));
    let keyed = |set: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        set.iter().map(|(u, d)| (u.rsplit('/').next().unwrap().to_string(), d.clone())).collect()
    };
    moto().put_many(&bucket, keyed(&a).into_iter().chain(keyed(&b)).chain(keyed(&c)));
    // 64 MiB: room for 63 chunks (each chunk file takes 1 MiB and its 4 KiB header: 1,028 KiB), so
    // A and B fit and C pushes out 27.
    let fleet = Fleet::start(1, &[("MEMARTS_CACHE_CAPACITY", "64MiB"), ("MEMARTS_EVICTION", "lru")]);
    fleet.wait_index_ready();
    let read_all = |client: &Client, objects: &[(String, Vec<u8>)]| {
        for (url, data) in objects {
            assert!(client.read(url).unwrap() == *data, "{url}");
        }
    };
    let client = fleet.client(MIB as u64);
    read_all(&client, &a);
    read_all(&client, &b);
    fleet.wait_cached(60);
    // A again, directly: reported when the client goes, A is then more recent than B.
    let hits = local_counts(&client).0;
    read_all(&client, &a);
    assert_eq!(local_counts(&client).0, hits + 30, "A read directly");
    drop(client);
    // C pushes out the 27 least recently read chunks: B's, not A's.
    let client = fleet.client(MIB as u64);
    read_all(&client, &c);
    drop(client);
    let gets = moto().gets_settled(&bucket);
    let client = fleet.client(MIB as u64);
    read_all(&client, &a);
    assert_eq!(moto().gets_settled(&bucket), gets, "A was evicted although it was read last");
    read_all(&client, &b);
    assert!(moto().gets_settled(&bucket) >= gets + 27, "B stayed although nobody read it");
}

/// A client of another allowed uid cannot read the table or the chunk files (0600 in 0700 dirs), so
/// it has no local reads: it reads through the proxy, as before, and gets the same bytes.
#[test]
fn another_allowed_uid_reads_through_the_proxy_and_cannot_read_the_files() {
    use std::os::unix::fs::PermissionsExt;
    let bucket = moto().bucket("directuid");
    let data = pattern(7700, 2 * MIB + 3);
    moto().put(&bucket, "o", &data);
    let url = format!("s3://{bucket}/o");
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = base.path().join("fleet.toml");
    std::fs::write(&config, format!("allowed_uids = [{OTHER_UID}]\n")).unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    std::fs::set_permissions(fleet.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let client = fleet.client(MIB as u64);
    assert!(client.read(&url).unwrap() == data);
    fleet.wait_cached(3);
    assert!(client.read(&url).unwrap() == data);
    assert_eq!(local_counts(&client).0, 3, "the fleet's own uid reads directly");
    let bin = binaries_for_everyone(base.path());
    let hits = fleet.total("hits");
    let out = as_other_user(&bin.join("memarts"))
        .args(["cat", &url])
        .env("MEMARTS_RUN_DIR", &fleet.run_dir)
        .env("MEMARTS_TRUSTED_UIDS", "0")
        .env("HOME", base.path())
        .envs(moto().env())
        .env_remove("MEMARTS_CONFIG")
        .output()
        .expect("run memarts as uid 65534");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout == data, "uid {OTHER_UID} got other bytes");
    assert!(fleet.total("hits") >= hits + 3, "its reads were served by the proxy");
    let table = fleet.run_dir.join("meta-0.table");
    let chunk = chunk_file(&fleet, &client, &url, 0);
    for file in [&table, &chunk] {
        assert!(file.exists(), "{}", file.display());
        let out = as_other_user(std::path::Path::new("/bin/cat")).arg(file).output().unwrap();
        assert!(!out.status.success(), "uid {OTHER_UID} read {}", file.display());
    }
}
