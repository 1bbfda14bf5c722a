//! The memarts shim: the light, synchronous client every training worker links.
//!
//! No async runtime, and no background threads but the read-ahead's fetchers: workers fork (PyTorch DataLoader), so the shim uses
//! std Unix sockets, connects lazily and, after a `fork`, drops inherited connections and opens its own.
//! Layout:
//! - [`config`]: settings from the MoXing / memarts environment variables.
//! - `answer`: taking the expected variant out of a proxy's answer, or the error it stands for.
//! - `conn`: one connection to one slot (handshake, lockstep calls, receiving passed descriptors).
//! - [`client`]: the fleet: routing to the owning slot, connection pools, retry until the deadline.
//! - `read`: chunked, parallel reads into the caller's buffer; checksum of descriptor-served chunks.
//! - `sources`: where a chunk comes from: the client's ordered chunk sources (the cache's files
//!   read locally, then the slots), asked in turn until one serves it.
//! - `chunk_files`: the chunk files local reads open: only those of the fleet's uid.
//! - [`local_reads`]: warm chunks read straight from their files (the version from the slots' published
//!   metadata), checked as the proxy checks them, with no round trip; reported to the slots in
//!   batches by `touch` (the rest when the client goes or the process ends); small chunks its
//!   slot packed are read from their records in the slot's segment files by `packed_reads`.
//! - [`stream`]: a sequential reader of one pinned version (`cat`, Python `File` reads, fsspec).
//! - [`readahead`]: the one read-ahead, of streams and of `memarts mount`'s files: a growing window
//!   of chunk fetches in flight on the process's fetch threads, within one memory budget.
//! - [`prefetch`]: hints of what will be read next, each sent to the slot its read starts at.
//! - `warm`: objects brought into the cache without their bytes coming back (`memarts warmup`).
//! - `write`: uploads and deletes at the origin, through the fleet.
//! - `download`: an object into a local file, in bounded memory.
//! - [`local_file`]: a local file written whole or not at all (temp file, then rename).
//! - [`trust`]: which fleets a client trusts: the run dir's owner and mode, each socket's peer uid.
//! - [`error`]: typed errors mirroring the wire's error codes.

mod answer;
mod chunk_check;
mod chunk_files;
mod chunk_io;
pub mod client;
pub mod config;
mod conn;
mod connections;
mod download;
pub mod error;
mod fleet_file;
pub mod local_file;
pub mod local_reads;
mod packed_reads;
mod per_process;
pub mod prefetch;
mod read;
pub mod readahead;
mod room;
mod slot_tables;
mod sources;
pub mod stream;
mod touch;
pub mod trust;
mod warm;
mod write;

pub use client::{absolutize, fleet_running, fleet_slots, Client};
pub use config::ShimConfig;
pub use download::download_streamed;
pub use error::{Error, Result};
pub use fleet_file::{FleetFile, FleetOrigin};
pub use memarts_protocol::{AdmissionStatus, ListEntry, ListPage, ObjectMeta, PrefetchStatus, SlotStatus};
pub use room::{ReadBuf, Room, Sink, VecSink};
pub use stream::Stream;
pub use touch::send_all_read_reports;
