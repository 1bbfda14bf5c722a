//! Chunk identity and ownership: one function each, shared by the shim (to route a chunk to its
//! owning slot) and the proxy (to name the chunk file and to rebuild its index after a restart).
//!
//! A chunk's identity is (origin kind, bucket, key, ETag, chunk size, index). Its 128-bit id is
//! xxh3-128 over an unambiguous length-prefixed encoding of those fields; the id names the chunk file,
//! so a new object version (new ETag) or another chunk size can never be served from old chunks.
//! The id carries no location: in a later cluster, node ownership is another rendezvous over the same id.

use crate::url::ObjectUrl;

/// Appends the identity encoding: `u64 LE length + bytes` for each of origin kind, bucket, key and
/// ETag, then `u64 LE` chunk size and index. The proxy's chunk headers store these same bytes.
pub fn encode_identity(out: &mut Vec<u8>, url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) {
    for field in [url.kind.as_str(), &url.bucket, &url.key, etag] {
        out.extend_from_slice(&(field.len() as u64).to_le_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out.extend_from_slice(&chunk_size.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
}

/// The chunk's id: the hash of its identity encoding.
pub fn chunk_id(url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) -> u128 {
    let mut buf = Vec::with_capacity(64 + url.bucket.len() + url.key.len() + etag.len());
    encode_identity(&mut buf, url, etag, chunk_size, index);
    xxhash_rust::xxh3::xxh3_128(&buf)
}

/// The slot that owns `id` among `slots` live slots: rendezvous (highest random weight) hashing, so
/// changing the number of slots moves only the chunks whose winner changed.
pub fn owner_slot(id: u128, slots: u32) -> u32 {
    let mut best = (0u64, 0u32);
    let id_bytes = id.to_le_bytes();
    for slot in 0..slots.max(1) {
        let mut buf = [0u8; 20];
        buf[..16].copy_from_slice(&id_bytes);
        buf[16..].copy_from_slice(&slot.to_le_bytes());
        let score = xxhash_rust::xxh3::xxh3_64(&buf);
        if slot == 0 || score > best.0 {
            best = (score, slot);
        }
    }
    best.1
}

/// The slot that answers metadata requests (stat, list) for `url`.
pub fn meta_owner_slot(url: &str, slots: u32) -> u32 {
    owner_slot(xxhash_rust::xxh3::xxh3_128(url.as_bytes()), slots)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    const GOLDEN_ID: &str = "40882cb154c88b321a53db502da75f14";

    #[test]
    fn rendezvous_is_balanced_and_moves_little() {
        let url = ObjectUrl::parse("s3://bkt/key").unwrap();
        let ids: Vec<u128> = (0..8000).map(|i| chunk_id(&url, "e", 1 << 20, i)).collect();
        let mut counts = [0u32; 8];
        for id in &ids {
            counts[owner_slot(*id, 8) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        // Going from 8 to 9 slots moves only chunks to the new slot.
        for id in &ids {
            let (before, after) = (owner_slot(*id, 8), owner_slot(*id, 9));
            assert!(before == after || after == 8);
        }
        assert_eq!(owner_slot(ids[0], 1), 0);
        assert_eq!(owner_slot(ids[0], 0), 0);
    }
}
