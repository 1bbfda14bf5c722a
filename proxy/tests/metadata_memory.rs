//! Proxy memory per object's metadata, measured: a node caching ~47 million small objects must
//! need under 100 B of proxy memory per object in all, so the metadata cache may take at most
//! 64 B per entry besides the last component of its URL, and the listed versions of a directory
//! at most 48 B per entry besides its key.
//!
//! Heap bytes are counted by this binary's global allocator, per thread (bytes asked for: the
//! allocator's own rounding is not counted). One test, so that nothing else runs beside it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use memarts_protocol::ObjectMeta;
use memarts_proxy::engine::metadata::DirVersions;
use memarts_proxy::engine::MetaCache;

thread_local! {
    /// Heap bytes this thread holds (allocated minus freed).
    static HELD: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    // `try_with`: nothing to count while the thread's locals are torn down.
    let _ = HELD.try_with(|held| held.set(held.get() + bytes));
}

fn held() -> isize {
    HELD.with(Cell::get)
}

struct Counting;

// SAFETY: every call is forwarded to the system allocator under the caller's contract; the count
// beside it allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps `alloc`'s contract, which `System.alloc` has too.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller keeps `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const PER_DIR: usize = 1000;

/// Object `i`'s directory (ImageNet's layout: 1,000 objects a directory) and name.
fn dir_and_name(i: usize) -> (String, String) {
    let dir = format!("n{:08}", 1_440_764 + i / PER_DIR);
    let name = format!("{dir}_{}.JPEG", 10_000 + i % PER_DIR);
    (format!("datasets/imagenet/train/{dir}/"), name)
}

/// An object of 100 KiB or so with a quoted MD5 ETag, as S3 gives one uploaded in one part.
fn meta(i: usize) -> ObjectMeta {
    let md5 = xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes());
    ObjectMeta {
        size: 100_000 + i as u64,
        etag: Some(format!("\"{md5:032x}\"")),
        version: None,
        last_modified_ms: 1_700_000_000_000 + i as i64,
    }
}

#[test]
fn metadata_takes_a_few_dozen_bytes_per_object() {
    let ttl = Duration::from_secs(3600);

    // The metadata cache: a million entries (a slot's bound is 2^20).
    let objects = 1_000_000;
    let before = held();
    let cache = MetaCache::new(ttl, 1 << 20);
    let mut names = 0;
    for i in 0..objects {
        let (dir, name) = dir_and_name(i);
        names += name.len();
        cache.put(format!("s3://bucket/{dir}{name}"), meta(i));
    }
    let per_entry = (held() - before) as f64 / objects as f64;
    let name_len = names as f64 / objects as f64;
    println!("metadata cache: {per_entry:.1} B per entry, its name {name_len:.1} of them");
    for i in [0, 4321, objects - 1] {
        let (dir, name) = dir_and_name(i);
        assert_eq!(cache.get(&format!("s3://bucket/{dir}{name}")), Some(meta(i)), "held as put");
    }
    assert!(per_entry <= 64.0 + name_len, "{per_entry:.1} B per entry, over 64 + {name_len:.1}");
    drop(cache);

    // The listed versions: as many entries as a slot keeps (`MAX_ENTRIES`, 2^19), 1,000 a page.
    let dirs = (512 << 10) / PER_DIR;
    let before = held();
    let versions = DirVersions::new(ttl);
    let mut keys = 0;
    for d in 0..dirs {
        let at = Instant::now();
        let page: Vec<(String, ObjectMeta)> = (d * PER_DIR..(d + 1) * PER_DIR)
            .map(|i| {
                let (dir, name) = dir_and_name(i);
                (format!("{dir}{name}"), meta(i))
            })
            .collect();
        keys += page.iter().map(|(k, _)| k.len()).sum::<usize>();
        let dir_url = format!("s3://bucket/{}", dir_and_name(d * PER_DIR).0);
        versions.record(&dir_url, None, None, false, at, page);
    }
    let entries = dirs * PER_DIR;
    let per_entry = (held() - before) as f64 / entries as f64;
    let key_len = keys as f64 / entries as f64;
    println!("listed versions: {per_entry:.1} B per entry, its key {key_len:.1} of them");
    let fresh = versions.fresh_entries(&format!("s3://bucket/{}", dir_and_name(0).0));
    assert_eq!(fresh.len(), PER_DIR, "every entry held");
    assert_eq!(fresh[7].1, meta(7));
    assert!(per_entry <= 48.0 + key_len, "{per_entry:.1} B per entry, over 48 + {key_len:.1}");
}
