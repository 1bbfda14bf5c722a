//! The cache's on-disk and shared-memory contract: the files the proxies write and the shims of
//! the fleet's uid read directly, whose bytes other processes (of other builds, too, across a
//! rolling restart) depend on. Nothing here does I/O on a chunk's data: the proxy reads chunk files
//! through its io engine, a shim with `pread`/`preadv` or a mapping; both judge what they read
//! with the same rules. Layout:
//! - [`chunk_file`]: a chunk's identity ([`chunk_file::ChunkKey`]) and id, which names its file;
//!   the file's byte layout (`format.rs`: a checksummed header bound to the identity, then the
//!   page-aligned data); where it lives under a cache root; [`chunk_file::verify`], the checks a
//!   chunk file passes before its bytes are served, written once for both sides.
//! - [`meta_table`]: the metadata a slot publishes in a shared file, with which a shim reads a warm
//!   object with no round trip; [`resident_table`]: the chunks a slot holds locked in memory and
//!   checked, whose readers skip the CRC32C. Both are thin typed layers over one shared table
//!   (`seq_table.rs`: header, seqlocked entries, probing; `seqlock.rs`: the entry's sequence
//!   number), in a file of words mapped shared (`shared_file.rs`).
//! - [`segment`]: small chunks packed into segment files (records checked as chunk files are), and
//!   the index a full segment leaves beside it, which a restart reads instead of every record;
//!   [`packed_table`]: where a slot's packed records lie, published (on `seq_table.rs` too) so that
//!   shims read them with no round trip.
//! - [`layout`]: the run directory's files (sockets, `fleet.json`, the tables); [`table_size`]: how
//!   large a slot makes the tables it fills as it goes.
//!
//! The byte layouts are documented at the top of `chunk_file/format.rs`, `meta_table/mod.rs` and
//! `resident_table.rs`, and frozen by `tests/golden.rs`. Chunk identity and ownership, URLs and the
//! CRC32C are the wire's too (a shim routes a chunk by its id): they are `memarts-protocol`'s, which
//! this crate depends on (never the reverse).

pub mod chunk_file;
pub mod layout;
pub mod meta_table;
pub mod packed_table;
pub mod resident_table;
pub mod segment;
mod seq_table;
mod seqlock;
mod shared_file;
pub mod table_size;
