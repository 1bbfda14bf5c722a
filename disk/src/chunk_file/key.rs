//! Chunk identity: [`ChunkKey`] names one chunk of one version of an origin object, and
//! [`ChunkId`] is its 128-bit hash, which names the chunk's file in the store.
//!
//! The identity encoding (see [`ChunkKey::encode_identity`]) is length-prefixed and therefore
//! unambiguous: `("ab", "c")` and `("a", "bc")` encode differently. The same bytes are hashed
//! for the id and stored in the chunk file header, so a reader can check that a file really
//! holds the chunk it asked for (protection against hash collisions and misplaced files).

use std::fmt;

/// The identity of one chunk: which origin object version, cut at which chunk size, which chunk.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkKey {
    /// The kind of origin: `s3` (any S3-compatible bucket on the configured endpoint) or `file`.
    pub origin: String,
    /// The bucket (empty where the origin has none).
    pub bucket: String,
    /// The object key (or path) within the bucket.
    pub key: String,
    /// The object version's ETag, so a changed object never serves stale chunks.
    pub etag: String,
    /// The chunk size the object was cut with, in bytes.
    pub chunk_size: u64,
    /// The chunk's index: it covers `[index * chunk_size, (index + 1) * chunk_size)`.
    pub index: u64,
}

impl ChunkKey {
    /// The key of chunk `index` of the version `etag` of `url`, cut at `chunk_size`. Its id equals
    /// [`memarts_protocol::chunk_id`], which shims use to route the chunk to its owning slot.
    pub fn new(url: &memarts_protocol::ObjectUrl, etag: &str, chunk_size: u64, index: u64) -> ChunkKey {
        ChunkKey {
            origin: url.kind.as_str().to_string(),
            bucket: url.bucket.clone(),
            key: url.key.clone(),
            etag: etag.to_string(),
            chunk_size,
            index,
        }
    }

    /// The chunk's id, as [`memarts_protocol::chunk_id_of`] computes it for routing.
    pub fn id(&self) -> ChunkId {
        ChunkId(memarts_protocol::chunk_id_of(
            &self.origin,
            &self.bucket,
            &self.key,
            &self.etag,
            self.chunk_size,
            self.index,
        ))
    }

    /// Length in bytes of the identity encoding.
    pub fn identity_len(&self) -> usize {
        4 * 8 + self.origin.len() + self.bucket.len() + self.key.len() + self.etag.len() + 2 * 8
    }

    /// The identity encoding: for each of `origin`, `bucket`, `key`, `etag` in that order its
    /// length as u64 little-endian followed by its UTF-8 bytes, then `chunk_size` and `index`
    /// as u64 little-endian.
    pub fn identity_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.identity_len());
        self.encode_identity(&mut out);
        out
    }

    /// Appends the identity encoding (see [`ChunkKey::identity_bytes`]) to `out`.
    pub fn encode_identity(&self, out: &mut Vec<u8>) {
        self.write_identity(|part| out.extend_from_slice(part));
    }

    fn write_identity(&self, mut sink: impl FnMut(&[u8])) {
        for field in [&self.origin, &self.bucket, &self.key, &self.etag] {
            sink(&(field.len() as u64).to_le_bytes());
            sink(field.as_bytes());
        }
        sink(&self.chunk_size.to_le_bytes());
        sink(&self.index.to_le_bytes());
    }

    /// Decodes an identity encoding that must span all of `bytes`; `None` when it is malformed
    /// (bad lengths, invalid UTF-8, trailing bytes). Bounded by `bytes` and never panics.
    pub fn decode_identity(bytes: &[u8]) -> Option<ChunkKey> {
        let mut rest = bytes;
        let mut strings = [String::new(), String::new(), String::new(), String::new()];
        for slot in &mut strings {
            let len = usize::try_from(take_u64(&mut rest)?).ok()?;
            if len > rest.len() {
                return None;
            }
            let (text, tail) = rest.split_at(len);
            *slot = String::from_utf8(text.to_vec()).ok()?;
            rest = tail;
        }
        let chunk_size = take_u64(&mut rest)?;
        let index = take_u64(&mut rest)?;
        if !rest.is_empty() {
            return None;
        }
        let [origin, bucket, key, etag] = strings;
        Some(ChunkKey { origin, bucket, key, etag, chunk_size, index })
    }
}

fn take_u64(rest: &mut &[u8]) -> Option<u64> {
    let (head, tail) = rest.split_first_chunk::<8>()?;
    *rest = tail;
    Some(u64::from_le_bytes(*head))
}

/// The 128-bit id of a chunk; its 32-digit lowercase hex form names the chunk's file.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub u128);

impl ChunkId {
    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses exactly 32 hex digits (either case); anything else gives `None`.
    pub fn from_hex(text: &str) -> Option<ChunkId> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(text, 16).ok().map(ChunkId)
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({:032x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_matches_the_protocol_routing_id() {
        for url in ["s3://bkt/dir/a.jpg", "/data/x", "obs://b/k"] {
            let url = memarts_protocol::ObjectUrl::parse(url).unwrap();
            for (etag, cs, idx) in [("e1", 1u64 << 20, 0u64), ("\"abc\"", 65536, 17)] {
                assert_eq!(
                    ChunkKey::new(&url, etag, cs, idx).id().0,
                    memarts_protocol::chunk_id(&url, etag, cs, idx)
                );
            }
        }
    }

    fn key(bucket: &str, object: &str) -> ChunkKey {
        ChunkKey {
            origin: "s3|http://127.0.0.1:9000".into(),
            bucket: bucket.into(),
            key: object.into(),
            etag: "\"abc\"".into(),
            chunk_size: 1 << 20,
            index: 3,
        }
    }

    #[test]
    fn id_is_unambiguous_across_field_boundaries() {
        assert_ne!(key("ab", "c").id(), key("a", "bc").id());
        assert_ne!(key("", "abc").id(), key("abc", "").id());
        let mut other = key("a", "b");
        other.index = 4;
        assert_ne!(key("a", "b").id(), other.id());
    }

    #[test]
    fn id_low_half_hashes_the_identity_bytes() {
        let k = key("bucket", "path/to/object");
        assert_eq!(k.id().0 as u64, xxhash_rust::xxh3::xxh3_64(&k.identity_bytes()));
        assert_eq!(k.identity_bytes().len(), k.identity_len());
    }

    #[test]
    fn identity_round_trips_and_rejects_trailing_bytes() {
        let k = key("b", "k\u{e9}");
        let mut bytes = k.identity_bytes();
        assert_eq!(ChunkKey::decode_identity(&bytes), Some(k));
        bytes.push(0);
        assert_eq!(ChunkKey::decode_identity(&bytes), None);
        assert_eq!(ChunkKey::decode_identity(&bytes[..10]), None);
        assert_eq!(ChunkKey::decode_identity(&[0xff; 8]), None);
    }

    #[test]
    fn hex_round_trip_and_rejects() {
        let id = ChunkId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(id.to_hex(), "0123456789abcdef0011223344556677");
        assert_eq!(ChunkId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(ChunkId::from_hex("0123456789ABCDEF0011223344556677"), Some(id));
        assert_eq!(ChunkId(0).to_hex().len(), 32);
        for bad in ["", "0123", "+123456789abcdef0011223344556677", "g123456789abcdef0011223344556677"] {
            assert_eq!(ChunkId::from_hex(bad), None, "{bad:?}");
        }
        assert_eq!(ChunkId::from_hex("0123456789abcdef00112233445566778"), None);
        assert_eq!(ChunkId::from_hex("\u{e9}23456789abcdef001122334455667"), None);
    }
}
