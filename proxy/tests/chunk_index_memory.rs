//! The chunk index's memory per cached chunk, as the allocator sees it: a node caching tens of
//! millions of small objects has about 100 bytes of proxy memory for each, and the index's share is
//! at most 48 bytes a chunk. Its own binary, because it counts through a global allocator: the
//! count is per thread, so what the test harness allocates elsewhere is not in it.
//!
//! The index is measured under the `lru` policy, which keeps nothing per chunk: what is counted is
//! the index's own (its chunks, their bytes, read times and recency order, and their placements).
//! The `tinylfu` policy's read clock and frequency sketch are sized in `recency.rs` and
//! `admission.rs`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use memarts_proxy::engine::ChunkIndex;
use memarts_settings::Eviction;

/// The system allocator, counting what this thread holds: each block's usable size and the
/// allocator's word of header (glibc's malloc), so that many small blocks cost what they cost.
struct Counting;

thread_local! {
    static HELD: Cell<i64> = const { Cell::new(0) };
}

fn footprint(p: *mut u8) -> i64 {
    // SAFETY: `p` is a live block of the system allocator (glibc's malloc, or posix_memalign for
    // large alignments), which `malloc_usable_size` accepts.
    let usable = unsafe { libc::malloc_usable_size(p.cast()) };
    (usable + std::mem::size_of::<usize>()) as i64
}

fn count(delta: i64) {
    // Not during the thread's teardown, when its counter is gone.
    let _ = HELD.try_with(|h| h.set(h.get() + delta));
}

// SAFETY: every call is forwarded to the system allocator under the caller's contract; the
// counting around it allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(footprint(p));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(footprint(p));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-footprint(ptr));
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = footprint(ptr);
        // SAFETY: the caller's contract for `realloc`, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(footprint(p) - before);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn held() -> i64 {
    HELD.with(Cell::get)
}

/// Chunk ids as the proxy makes them: a placement hash above a version hash.
fn id(i: u64) -> u128 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    (u128::from(mix(i)) << 64) | u128::from(mix(!i))
}

const CHUNKS: u64 = 1_000_000;
const MAX_BYTES_PER_CHUNK: i64 = 48;

#[test]
fn the_index_holds_at_most_48_bytes_a_chunk() {
    let start = held();
    let mut index = ChunkIndex::new(Eviction::Lru);
    for i in 0..CHUNKS {
        index.insert(id(i), 4096 + (i % 4096));
    }
    let filled = (held() - start) / CHUNKS as i64;

    // Churn: half of them go, as many others come.
    for i in 0..CHUNKS / 2 {
        index.remove(id(2 * i));
    }
    for i in CHUNKS..CHUNKS + CHUNKS / 2 {
        index.insert(id(i), 4096);
    }
    assert_eq!(index.len() as u64, CHUNKS);
    let churned = (held() - start) / CHUNKS as i64;
    drop(index);
    // Read before anything prints: the harness's capture of the output allocates on this thread.
    let left = held();
    println!("chunk index: {filled} B per chunk filled, {churned} after churn");
    assert_eq!(left, start, "the index gives back all it held");
    assert!(filled <= MAX_BYTES_PER_CHUNK, "{filled} B per chunk filled");
    assert!(churned <= MAX_BYTES_PER_CHUNK, "{churned} B per chunk after churn");
}
