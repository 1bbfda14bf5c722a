//! The SSD chunk store: 1 MiB chunks of origin objects kept as files on local disk.
//!
//! - [`ChunkKey`] / [`ChunkId`] and [`mod@format`]: a chunk's identity, its 128-bit hash and the chunk
//!   file format (checksummed header bound to the key, page-aligned data), and [`mod@verify`], the
//!   checks a chunk file passes. They live in `memarts_disk::chunk_file`, since shims read and
//!   check chunk files too (a local hit), by the same rules.
//! - [`IoEngine`] (`io_engine.rs`): async positional I/O with owned buffers, implemented by
//!   [`UringEngine`] (`uring.rs`, `uring_ring.rs`: one thread owning an io_uring) and
//!   [`PreadEngine`] (`pread.rs`: blocking syscalls on tokio's blocking pool);
//!   [`select_io_engine`] picks one, falling back to pread where io_uring is refused.
//! - [`ChunkStore`] (`store.rs`): put / get / read_verified / remove on the cache root, with the
//!   careful file operations (publish by rename, leftovers of dead writers) in `files.rs`, and
//!   [`Scan`] (`scan.rs`) to walk what is on disk; chunks of up to [`PACK_MAX`] bytes packed into
//!   segment files (`segments.rs`, their files in `segment_files.rs`, their compaction in
//!   `segment_compaction.rs`, where their records lie published for shims in `record_places.rs`)
//!   once the slot opened them.

mod files;
mod io_engine;
mod pread;
mod record_places;
mod scan;
mod segment_files;
mod segments;
mod store;
mod uring;
mod uring_ring;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_store;
#[cfg(test)]
mod crash_tests;

pub use io_engine::{
    select_io_engine, select_io_engine_with, BoxFuture, IoEngine, IoEngineKind, UnknownIoEngine,
    DEFAULT_URING_ENTRIES,
};
pub use memarts_disk::chunk_file::format::{FormatError, Header};
pub use memarts_disk::chunk_file::{format, verify};
pub use memarts_disk::chunk_file::{ChunkId, ChunkKey};
pub use pread::PreadEngine;
pub use scan::{Scan, ScanReport, ScannedChunk};
pub use segments::{Packed, DEFAULT_PACK_MAX, PACK_MAX};
pub use store::{CachedChunk, ChunkStore, StoreError};
pub use uring::UringEngine;
