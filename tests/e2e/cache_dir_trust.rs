//! S9: the cache dir is trusted like the run dir. `memarts start_proxy` refuses a cache dir (or a
//! directory in it) of another uid, one others can write into, or a symlinked `v1/tmp`, naming the
//! directory and the fix, before a slot reads or removes anything there; the default cache dir
//! without `HOME`, which another user can create first in `/tmp`, is refused the same way. A chunk
//! file of another owner in a warm fleet's cache, well-formed with other bytes (a CRC32C is no MAC),
//! is never served: not by a local read, not by a slot.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use memarts_disk::chunk_file::{chunk_path, chunks_dir, format, ChunkKey};
use memarts_protocol::ObjectUrl;
use memarts_shim::Client;

use crate::common::fleet::memarts_bin;
use crate::common::raw::OTHER_UID;
use crate::common::{moto, pattern, text, Fleet};

const MIB: usize = 1 << 20;

/// Files named like leftover temp files of dead writers (`<id>.<pid>.<serial>.tmp`: start-up
/// removes those from a trusted `v1/tmp`), in `dir`.
fn plant_canaries(dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    [
        "chunk.999991.tmp",
        "x.40000001.y",
        "ab.999992.1.only.tmp",
        "c.999993.2.tmp",
        "d.999994.3.tmp",
        "e.999995.4.tmp",
    ]
    .iter()
    .map(|name| {
        let path = dir.join(name);
        std::fs::write(&path, b"canary").unwrap();
        path
    })
    .collect()
}

fn assert_all_there(canaries: &[PathBuf]) {
    for c in canaries {
        assert_eq!(std::fs::read(c).ok().as_deref(), Some(&b"canary"[..]), "{} was deleted", c.display());
    }
}

/// `start_proxy 2` of `fleet`, which must fail with no slot started; its error.
fn start_refused(fleet: &Fleet) -> String {
    let out = fleet.memarts(&["start_proxy", "2"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "start_proxy went ahead:\n{}{err}", text(&out.stdout));
    for slot in 0..2 {
        assert!(!fleet.run_dir.join(format!("proxy-{slot}.sock")).exists(), "slot {slot} started");
    }
    err
}

fn assert_names(err: &str, parts: &[&str]) {
    for part in parts {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
}

/// A cache dir as earlier versions made it (0700, every directory ours), with `canaries` in `v1/tmp`.
fn cache_dir_with_canaries(fleet: &Fleet) -> Vec<PathBuf> {
    for dir in ["", "v1", "v1/chunks", "v1/memarts"] {
        std::fs::create_dir_all(fleet.cache_dir.join(dir)).unwrap();
        std::fs::set_permissions(fleet.cache_dir.join(dir), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    plant_canaries(&fleet.cache_dir.join("v1/tmp"))
}

#[test]
fn a_cache_dir_of_another_uid_is_refused_and_nothing_in_it_is_deleted() {
    let fleet = Fleet::new(&[]);
    let canaries = cache_dir_with_canaries(&fleet);
    let other = Some(nix::unistd::Uid::from_raw(OTHER_UID));
    nix::unistd::chown(&fleet.cache_dir, other, None).unwrap();
    let err = start_refused(&fleet);
    let dir = fleet.cache_dir.display().to_string();
    assert_names(&err, &["refusing the cache dir", &dir, "uid 65534", "MEMARTS_CACHE_DIR", "XDG_CACHE_HOME"]);
    assert_all_there(&canaries);
}

#[test]
fn a_group_writable_cache_dir_is_refused_and_nothing_in_it_is_deleted() {
    let fleet = Fleet::new(&[]);
    let canaries = cache_dir_with_canaries(&fleet);
    std::fs::set_permissions(&fleet.cache_dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    let err = start_refused(&fleet);
    let dir = fleet.cache_dir.display().to_string();
    assert_names(&err, &[&dir, "mode 0770", &format!("chmod go-w {dir}")]);
    assert_all_there(&canaries);
    // Once fixed as the message says, the same cache dir is used (and its leftovers cleaned).
    std::fs::set_permissions(&fleet.cache_dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    fleet.start_proxy(2);
    assert!(canaries.iter().all(|c| !c.exists()), "the leftovers of a trusted v1/tmp stay");
}

#[test]
fn a_symlinked_tmp_is_refused_and_the_files_it_leads_to_stay() {
    let fleet = Fleet::new(&[]);
    cache_dir_with_canaries(&fleet);
    std::fs::remove_dir_all(fleet.cache_dir.join("v1/tmp")).unwrap();
    let elsewhere = fleet.dir.path().join("elsewhere");
    let canaries = plant_canaries(&elsewhere);
    std::os::unix::fs::symlink(&elsewhere, fleet.cache_dir.join("v1/tmp")).unwrap();
    let err = start_refused(&fleet);
    let link = fleet.cache_dir.join("v1/tmp").display().to_string();
    assert_names(&err, &[&link, "is a symlink", &format!("rm {link}")]);
    assert_all_there(&canaries);
}

#[test]
fn the_squatted_default_cache_dir_is_refused_with_the_fix_named_and_nothing_planted_is_touched() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/squat-default-cache-dir.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(memarts_bin().parent().unwrap())
        .args(["--", "sh", "-c", "\"$SQUAT_BIN/memarts\" start_proxy 1"])
        .envs(moto().env())
        .output()
        .expect("run the squat script");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "the squat script failed:\n{stdout}\n{stderr}");
    let exit = stdout.lines().find_map(|l| l.strip_prefix("victim-exit ")).expect("victim-exit");
    assert_ne!(exit, "0", "start_proxy used the squatted cache dir:\n{stdout}\n{stderr}");
    let uid = nix::unistd::geteuid().as_raw();
    let dir = format!("/tmp/memarts-cache-{uid}");
    assert_names(&stderr, &["refusing the cache dir", &dir, "uid 65534", "MEMARTS_CACHE_DIR"]);
    // Every planted file is still there, unread (strictatime: a read would move its access time).
    let listed = |tag: &str| -> Vec<String> {
        stdout.lines().filter_map(|l| l.strip_prefix(tag)).map(str::to_string).collect()
    };
    let planted = listed("planted ");
    assert_eq!(planted.len(), 6, "{stdout}");
    assert_eq!(listed("still "), planted, "a planted file was read, changed or deleted");
}

/// A chunk file for `key` that checks out in every respect (header bound to the chunk, CRC32C of
/// its data) but holds `data` and belongs to uid 65534, as another user with access to the cache
/// could plant it, in place of the cached one at `path`.
fn plant_chunk(path: &Path, key: &ChunkKey, data: &[u8]) {
    let header = format::encode_header(key, data.len() as u64, memarts_protocol::crc32c(data), 0).unwrap();
    let tmp = path.with_extension("planted");
    std::fs::write(&tmp, [header.as_slice(), data].concat()).unwrap();
    nix::unistd::chown(&tmp, Some(nix::unistd::Uid::from_raw(OTHER_UID)), None).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The cached chunk `index` of `url` in `fleet`: its key and its file.
fn cached_chunk(fleet: &Fleet, client: &Client, url: &str, index: u64) -> (ChunkKey, PathBuf) {
    let etag = client.stat(url).unwrap().etag.unwrap();
    let key = ChunkKey::new(&ObjectUrl::parse(url).unwrap(), &etag, MIB as u64, index);
    let path = chunk_path(&chunks_dir(&fleet.cache_dir), key.id());
    assert!(path.is_file(), "chunk {index} of {url} is not cached");
    (key, path)
}

#[test]
fn a_chunk_file_of_another_owner_is_never_served_and_the_read_gets_the_right_bytes() {
    let bucket = moto().bucket("foreign-chunk");
    let objects: Vec<(String, Vec<u8>)> =
        (0..2).map(|i| (format!("s3://{bucket}/o{i}"), pattern(9100 + i, 2 * MIB))).collect();
    for (url, data) in &objects {
        moto().put(&bucket, url.rsplit('/').next().unwrap(), data);
    }
    // No resident chunks: a slot serves a chunk from its file, not from memory it locked earlier.
    let fleet = Fleet::start(2, &[("MEMARTS_RESIDENT_MEMORY", "0")]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB as u64);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} cold");
    }
    fleet.wait_cached(4);
    let poison = pattern(666, MIB);
    let mut planted = Vec::new();
    for (url, _) in &objects {
        for index in 0..2 {
            let (key, path) = cached_chunk(&fleet, &client, url, index);
            plant_chunk(&path, &key, &poison);
            planted.push(path);
        }
    }
    let gets = moto().gets_settled(&bucket);

    // A local read: the planted files are refused, the slots drop them and fetch the chunks again.
    let counters = client.local_counters().expect("local reads of the fleet's own uid");
    let (hits, corrupt) = (counters.hits.load(Ordering::Relaxed), counters.corrupt.load(Ordering::Relaxed));
    let (url, data) = &objects[0];
    assert!(client.read(url).unwrap() == *data, "a local read served the planted chunk");
    assert_eq!(counters.hits.load(Ordering::Relaxed), hits, "a planted chunk counted as a local hit");
    assert_eq!(counters.corrupt.load(Ordering::Relaxed) - corrupt, 2, "both planted chunks refused");
    // Through the slots only: they do not read the planted files either.
    let (url, data) = &objects[1];
    assert!(fleet.proxy_client(MIB as u64).read(url).unwrap() == *data, "a slot served the planted chunk");
    assert_eq!(moto().gets_settled(&bucket) - gets, 4, "each planted chunk fetched again, once");
    // The fills are written after the replies: each planted file replaced by one of the slots'.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !planted
        .iter()
        .all(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw()))
    {
        assert!(std::time::Instant::now() < deadline, "a planted file was not replaced: {planted:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Warm again: served directly from the files the slots wrote.
    let (url, data) = &objects[0];
    assert!(client.read(url).unwrap() == *data);
    assert_eq!(counters.hits.load(Ordering::Relaxed) - hits, 2, "the refetched chunks read directly");
}
