//! The wire protocol between the memarts shim (in every training worker) and the proxies.
//!
//! This crate is pure data plus the one framing implementation both sides use; it depends on nothing
//! else of ours, and it holds nothing of the cache's files (those are `memarts-disk`'s, which depends
//! on this crate for chunk identity, URLs and the checksum). Layout:
//! - [`frame`]: the byte layout of a frame (a fixed head, a postcard message, an optional raw payload),
//!   size limits checked before any allocation, sync and (feature `async`) tokio readers.
//! - [`message`]: requests, responses and the handshake. Enum variants are append-only: a variant's
//!   index is its wire tag, so new variants go at the end and old ones are never reordered.
//! - [`error`]: typed error codes carried on the wire and the framing error type.
//! - [`spin`]: adaptive busy-polling of a socket before blocking, used by both ends.
//! - [`peer`]: the node-to-node protocol of the cluster pool (TCP, the same framing).
//! - [`identity`]: a chunk's identity, id and owning slot (how a shim routes a chunk); [`url`]: object
//!   URLs as both sides parse them; [`checksum`]: CRC32C, of chunk data on the wire and on disk.
//! - [`listed`]: what slots tell each other of a listing; [`metrics`]: the metrics snapshot.
//!
//! A connection starts with `Request::Hello`, answered by `Response::Welcome` or
//! `Response::Incompatible`; then the client sends one request and reads one response, in lockstep.
//! A chunk served from the cache arrives as `ChunkBody::Fd`: the chunk file's descriptor travels as
//! `SCM_RIGHTS` ancillary data on the first byte of the response frame, so the bytes themselves never
//! cross the socket.

pub mod checksum;
pub mod error;
pub mod frame;
pub mod listed;
pub mod message;
pub mod metrics;
pub mod peer;
pub mod spin;

pub use checksum::{crc32c, Crc32c};
pub use error::{ErrorCode, FrameError, WireError};
pub use frame::{FrameHead, Limits, FRAME_HEAD_LEN};
pub use message::*;
pub use metrics::{MetricFamily, MetricKind, MetricPoint, MetricValue, MetricsSnapshot};

/// The protocol version this build speaks. Bumped only for changes an older peer cannot decode.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest chunk size a proxy accepts (`MOX_FILE_CHUNK_SIZE` is validated against it).
pub const MAX_CHUNK_SIZE: u64 = 64 << 20;

/// Smallest chunk size a proxy accepts.
pub const MIN_CHUNK_SIZE: u64 = 4 << 10;

/// Default chunk size, the MoXing default for `MOX_FILE_CHUNK_SIZE`.
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;

/// Largest object key (after the bucket) accepted on the wire; S3's own limit is 1 KiB, we allow more
/// for local paths but keep a hard bound so a key can never be used to grow memory.
pub const MAX_URL_LEN: usize = 8 << 10;

pub mod identity;
pub mod url;
pub use identity::{
    chunk_id, chunk_id_from_identity, chunk_id_of, chunk_owner, encode_identity, meta_owner_slot, owner_slot,
    placement,
};
pub use url::{ObjectUrl, OriginKind, UrlError};
