//! The header of a memarts-only object file: the chunk format's header (`chunk_store::format`,
//! magic `MACHUNK1`) with its flag `FLAG_MEMARTS_ONLY` set, bound to the object by an identity of
//! the same kind as a chunk's: the object URL, the ETag [`MEMARTS_ONLY_ETAG`], chunk size 0 and
//! index 0 (no origin chunk has chunk size 0, so neither kind of file can pass for the other).
//!
//! Files written before this codec (format `MAMONLY1`, see `legacy.rs`) are still read: they are
//! the only copy of their data. New files are always written in the chunk format.

use memarts_protocol::ObjectUrl;

use super::legacy;
use crate::chunk_store::format::{decode_header, encode_header, FormatError, ALIGN, FLAG_MEMARTS_ONLY};
use crate::chunk_store::ChunkKey;

/// The ETag memarts-only objects report and bind their files to (they have no origin version).
pub const MEMARTS_ONLY_ETAG: &str = "memarts-only";

/// What a header says of the object's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub data_offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

/// Why a header does not describe the object asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// More bytes of the file are needed to decide (at most [`crate::chunk_store::format::MAX_HEADER_LEN`]).
    Truncated { needed: usize },
    /// Not a header of this object: the reason, for the `Corrupt` error.
    Bad(String),
}

/// The identity a memarts-only object's header binds its file to.
pub fn identity(url: &ObjectUrl) -> ChunkKey {
    ChunkKey::new(url, MEMARTS_ONLY_ETAG, 0, 0)
}

/// Where the data of `url`'s object starts in its file (the header rounded up to 4096 bytes).
pub fn data_offset(url: &ObjectUrl) -> u64 {
    crate::chunk_store::format::data_offset_for(identity(url).identity_len())
}

/// The header of `url`'s object holding `len` bytes with CRC32C `crc32c`, padded to the data offset.
pub fn encode(url: &ObjectUrl, len: u64, crc32c: u32) -> Result<Vec<u8>, FormatError> {
    encode_header(&identity(url), len, crc32c, FLAG_MEMARTS_ONLY)
}

/// Decodes the start of the file of `url`'s object, in either format; bounded, never panics.
pub fn decode(bytes: &[u8], url: &ObjectUrl) -> Result<Layout, Refused> {
    if bytes.starts_with(legacy::MAGIC) {
        return legacy::decode(bytes, url);
    }
    let header = match decode_header(bytes) {
        Ok(h) => h,
        Err(FormatError::Truncated { needed, .. }) => return Err(Refused::Truncated { needed }),
        Err(e) => return Err(Refused::Bad(e.to_string())),
    };
    if header.flags & FLAG_MEMARTS_ONLY == 0 {
        return Err(Refused::Bad("a chunk file, not a memarts-only object".into()));
    }
    if !header.matches(&identity(url)) {
        let found = &header.identity;
        return Err(Refused::Bad(format!("file holds {}://{}/{}", found.origin, found.bucket, found.key)));
    }
    Ok(Layout { data_offset: header.data_offset, len: header.data_len, crc32c: header.data_crc32c })
}

/// How many bytes of a file to read first for its header: enough for any URL but very long ones.
pub const FIRST_READ: usize = ALIGN as usize;

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> ObjectUrl {
        ObjectUrl::parse("obs://bkt/dir/features.bin").unwrap()
    }

    #[test]
    fn round_trip_and_binding() {
        let header = encode(&url(), 12_345, 0xfeed_f00d).unwrap();
        assert_eq!(header.len() as u64, data_offset(&url()));
        assert_eq!(&header[..8], b"MACHUNK1");
        let layout = decode(&header, &url()).unwrap();
        assert_eq!(layout, Layout { data_offset: 4096, len: 12_345, crc32c: 0xfeed_f00d });
        let other = ObjectUrl::parse("obs://bkt/dir/other.bin").unwrap();
        assert!(matches!(decode(&header, &other), Err(Refused::Bad(why)) if why.contains("features.bin")));
    }

    #[test]
    fn a_chunk_file_is_not_a_memarts_only_object() {
        let chunk = encode_header(&identity(&url()), 5, 1, 0).unwrap();
        assert!(matches!(decode(&chunk, &url()), Err(Refused::Bad(why)) if why.contains("chunk file")));
    }

    #[test]
    fn a_long_url_asks_for_more_bytes() {
        let long = ObjectUrl::parse(&format!("s3://b/{}", "k".repeat(6000))).unwrap();
        let header = encode(&long, 1, 2).unwrap();
        match decode(&header[..FIRST_READ], &long) {
            Err(Refused::Truncated { needed }) => assert!(needed > FIRST_READ && needed <= header.len()),
            other => panic!("{other:?}"),
        }
        assert_eq!(decode(&header, &long).unwrap().len, 1);
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = decode(&bytes, &url());
            let mut h = encode(&url(), 5, 1).unwrap();
            h.truncate(len.min(h.len()));
            let _ = decode(&h, &url());
            let mut old = legacy::MAGIC.to_vec();
            old.extend_from_slice(&bytes);
            let _ = decode(&old, &url());
        }
    }
}
