//! Chunk identity and ownership: one function each, shared by the shim (to route a chunk to its
//! owning slot) and the proxy (to name the chunk file and to rebuild its index after a restart).
//!
//! A chunk's identity is (origin kind, bucket, key, ETag, chunk size, index). Its 128-bit id has two
//! halves: the high 64 bits are the *placement* hash of (origin kind, bucket, key, chunk size,
//! index), the low 64 bits a hash of the whole identity, ETag included. The id names the chunk file,
//! so a new object version can never be served from old chunks; ownership depends on the placement
//! half only, so a shim can route chunk 0 of an object before it knows the object's ETag (one round
//! trip for stat + first chunk), and a restarted slot can still tell its chunks by file name.
//! The id carries no location: in a later cluster, node ownership is another rendezvous over it.

use xxhash_rust::xxh3::xxh3_64;

use crate::url::ObjectUrl;

fn put_str(out: &mut Vec<u8>, field: &str) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field.as_bytes());
}

/// Appends the identity encoding: `u64 LE length + bytes` for each of origin kind, bucket, key and
/// ETag, then `u64 LE` chunk size and index. The proxy's chunk headers store these same bytes.
pub fn encode_identity(out: &mut Vec<u8>, url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) {
    for field in [url.kind.as_str(), &url.bucket, &url.key, etag] {
        put_str(out, field);
    }
    out.extend_from_slice(&chunk_size.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
}

/// The placement hash: which chunk of which object, whatever its version.
pub fn placement(kind: &str, bucket: &str, key: &str, chunk_size: u64, index: u64) -> u64 {
    let mut buf = Vec::with_capacity(48 + bucket.len() + key.len());
    for field in [kind, bucket, key] {
        put_str(&mut buf, field);
    }
    buf.extend_from_slice(&chunk_size.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    xxh3_64(&buf)
}

/// The chunk's id from its fields (`kind` is [`crate::OriginKind::as_str`]).
pub fn chunk_id_of(kind: &str, bucket: &str, key: &str, etag: &str, chunk_size: u64, index: u64) -> u128 {
    let mut buf = Vec::with_capacity(64 + bucket.len() + key.len() + etag.len());
    for field in [kind, bucket, key, etag] {
        put_str(&mut buf, field);
    }
    buf.extend_from_slice(&chunk_size.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    (u128::from(placement(kind, bucket, key, chunk_size, index)) << 64) | u128::from(xxh3_64(&buf))
}

/// The chunk's id from its identity encoding ([`encode_identity`] of the same fields), for a reader
/// that needs both (it compares the encoding with a chunk file's header).
pub fn chunk_id_from_identity(url: &ObjectUrl, chunk_size: u64, index: u64, identity: &[u8]) -> u128 {
    let placement = placement(url.kind.as_str(), &url.bucket, &url.key, chunk_size, index);
    (u128::from(placement) << 64) | u128::from(xxh3_64(identity))
}

/// The chunk's id: placement half, then the hash of its whole identity.
pub fn chunk_id(url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) -> u128 {
    chunk_id_of(url.kind.as_str(), &url.bucket, &url.key, etag, chunk_size, index)
}

/// The slot that owns the chunk with id `id` among `slots` live slots: rendezvous (highest random
/// weight) hashing over the placement half, so changing the number of slots moves only the chunks
/// whose winner changed.
pub fn owner_slot(id: u128, slots: u32) -> u32 {
    owner_of_placement((id >> 64) as u64, slots)
}

/// The owner of chunk `index` of `url` at `chunk_size`, whatever the object's version.
pub fn chunk_owner(url: &ObjectUrl, chunk_size: u64, index: u64, slots: u32) -> u32 {
    owner_of_placement(placement(url.kind.as_str(), &url.bucket, &url.key, chunk_size, index), slots)
}

fn owner_of_placement(place: u64, slots: u32) -> u32 {
    let mut best = (0u64, 0u32);
    for slot in 0..slots.max(1) {
        let mut buf = [0u8; 12];
        buf[..8].copy_from_slice(&place.to_le_bytes());
        buf[8..].copy_from_slice(&slot.to_le_bytes());
        let score = xxh3_64(&buf);
        if slot == 0 || score > best.0 {
            best = (score, slot);
        }
    }
    best.1
}

/// The slot that answers metadata requests (stat, list) for `url`.
pub fn meta_owner_slot(url: &str, slots: u32) -> u32 {
    owner_of_placement(xxh3_64(url.as_bytes()), slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_from_the_identity_is_the_id() {
        let url = ObjectUrl::parse("s3://b/some/key").unwrap();
        let mut identity = Vec::new();
        encode_identity(&mut identity, &url, "\"etag\"", 1 << 20, 3);
        assert_eq!(
            chunk_id_from_identity(&url, 1 << 20, 3, &identity),
            chunk_id(&url, "\"etag\"", 1 << 20, 3)
        );
    }

    #[test]
    fn fields_cannot_bleed_into_each_other() {
        let a = ObjectUrl::parse("s3://ab/c").unwrap();
        let b = ObjectUrl::parse("s3://a/bc").unwrap();
        assert_ne!(chunk_id(&a, "e", 1, 0), chunk_id(&b, "e", 1, 0));
        assert_ne!(chunk_id(&a, "e", 1, 0), chunk_id(&a, "e", 1, 1));
        assert_ne!(chunk_id(&a, "e", 1, 0), chunk_id(&a, "f", 1, 0));
        assert_ne!(chunk_id(&a, "e", 1, 0), chunk_id(&a, "e", 2, 0));
    }

    #[test]
    fn golden_chunk_id() {
        // Frozen: changing the identity encoding orphans every cached chunk.
        let url = ObjectUrl::parse("s3://bkt/key").unwrap();
        assert_eq!(format!("{:032x}", chunk_id(&url, "etag", 1 << 20, 3)), GOLDEN_ID);
    }
    const GOLDEN_ID: &str = "f068402104a11ea8981acb8c208a9002";

    #[test]
    fn rendezvous_is_balanced_and_moves_little() {
        let url = ObjectUrl::parse("s3://bkt/key").unwrap();
        let ids: Vec<u128> = (0..8000).map(|i| chunk_id(&url, "e", 1 << 20, i)).collect();
        let mut counts = [0u32; 8];
        for id in &ids {
            counts[owner_slot(*id, 8) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        // Ownership ignores the version: routing works before the ETag is known.
        for i in 0..100 {
            let id = chunk_id(&url, "other-etag", 1 << 20, i);
            assert_eq!(owner_slot(id, 8), chunk_owner(&url, 1 << 20, i, 8));
            assert_eq!(owner_slot(id, 8), owner_slot(ids[i as usize], 8));
        }
        // Going from 8 to 9 slots moves only chunks to the new slot.
        for id in &ids {
            let (before, after) = (owner_slot(*id, 8), owner_slot(*id, 9));
            assert!(before == after || after == 8);
        }
        assert_eq!(owner_slot(ids[0], 1), 0);
        assert_eq!(owner_slot(ids[0], 0), 0);
    }
}
