//! Chunk files, as both sides read them: a chunk's identity ([`ChunkKey`]) and its 128-bit hash
//! ([`ChunkId`], which names the file), the file's byte layout (`format.rs`: a checksummed header
//! bound to the identity, then the page-aligned data), and where a chunk's file lives under a cache
//! root ([`chunk_path`]). The proxies write chunk files; a shim of the fleet's own uid may open and
//! verify one itself (a local hit, with no round trip to a proxy). Both check a file by the same
//! rules, [`verify`]'s.

pub mod format;
mod key;
pub mod verify;

use std::path::{Path, PathBuf};

pub use key::{ChunkId, ChunkKey};

/// The directory of chunk files under a cache root: `<root>/v1/chunks`.
pub fn chunks_dir(cache_root: &Path) -> PathBuf {
    cache_root.join("v1").join("chunks")
}

/// Where the chunk `id` lives under `chunks` (see [`chunks_dir`]): `<chunks>/<hex[0..2]>/<hex>`,
/// whether or not it exists.
pub fn chunk_path(chunks: &Path, id: ChunkId) -> PathBuf {
    chunks.join(chunk_relative_path(id))
}

/// [`chunk_path`] relative to the chunks directory: `<hex[0..2]>/<hex>`.
///
/// One level of 256 fan-out directories: a fresh cache creates each once, where the earlier two
/// levels (`<hex[0..2]>/<hex[2..4]>/<hex>`, up to 65,792 directories) cost a `mkdir` (an inode)
/// for nearly every chunk of its first tens of thousands. A slot moves the chunk files of that
/// layout to their place when it starts (the proxy's index rebuild).
pub fn chunk_relative_path(id: ChunkId) -> String {
    let hex = id.to_hex();
    format!("{}/{hex}", &hex[0..2])
}
