//! The on-disk format of one chunk file: a checksummed header binding the file to its
//! [`ChunkKey`], zero padding up to a 4096-byte boundary, then the chunk's data.
//!
//! Layout (all integers little-endian; `N` = identity length):
//!
//! ```text
//! offset      size  field
//! 0           8     magic b"MACHUNK1"
//! 8           2     format version, u16 = 1
//! 10          2     flags, u16 (bit 0 = memarts-only object, reserved; other bits 0 for now)
//! 12          4     data_offset, u32 = round_up(32 + N + 4, 4096)
//! 16          8     data_len, u64: bytes of chunk data
//! 24          4     data_crc32c, u32: CRC32C of the data
//! 28          4     N, u32: identity length, at most MAX_IDENTITY_LEN (64 KiB)
//! 32          N     identity: ChunkKey::encode_identity (length-prefixed fields)
//! 32+N        4     header_crc32c, u32: CRC32C of bytes [0, 32+N)
//! 36+N        ..    zero padding up to data_offset (not checked)
//! data_offset len   the data (page aligned)
//! ```
//!
//! Decoding reads at most `32 + N + 4 <= MAX_HEADER_LEN` bytes, checks every length before
//! using it and never panics, whatever the input (see the property tests).

use super::key::ChunkKey;

/// The first 8 bytes of every chunk file.
pub const MAGIC: [u8; 8] = *b"MACHUNK1";
/// The format version this code writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Flag bit 0: the object exists only in memarts (reserved for later use).
pub const FLAG_MEMARTS_ONLY: u16 = 1;
/// Alignment of the data start (and unit of on-disk size accounting).
pub const ALIGN: u64 = 4096;
/// Length of the fixed part of the header, before the identity.
pub const FIXED_LEN: usize = 32;
/// Largest identity encoding a header may hold.
pub const MAX_IDENTITY_LEN: usize = 64 * 1024;
/// Largest header (through its CRC) a decoder ever needs.
pub const MAX_HEADER_LEN: usize = FIXED_LEN + MAX_IDENTITY_LEN + 4;

/// A decoded chunk file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub flags: u16,
    /// Where the data starts in the file (a multiple of [`ALIGN`]).
    pub data_offset: u64,
    pub data_len: u64,
    pub data_crc32c: u32,
    /// The chunk identity the file was written for.
    pub identity: ChunkKey,
}

impl Header {
    /// True when the file was written for exactly `key`.
    pub fn matches(&self, key: &ChunkKey) -> bool {
        self.identity == *key
    }

    /// `data_offset + data_len`: the file length needed to hold the data (`None` on overflow).
    pub fn end(&self) -> Option<u64> {
        self.data_offset.checked_add(self.data_len)
    }
}

/// Why a header could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("header truncated: {needed} bytes needed, {got} given")]
    Truncated { needed: usize, got: usize },
    #[error("bad magic (not a memarts chunk file)")]
    BadMagic,
    #[error("unsupported chunk format version {0}")]
    UnsupportedVersion(u16),
    #[error("identity of {0} bytes exceeds the {MAX_IDENTITY_LEN}-byte limit")]
    IdentityTooLong(usize),
    #[error("header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("data offset {found} is not the expected {expected}")]
    BadDataOffset { found: u64, expected: u64 },
    #[error("malformed identity in header")]
    BadIdentity,
}

/// Bytes from the start of the file through the header CRC, for an identity of `identity_len`.
pub fn header_len(identity_len: usize) -> usize {
    FIXED_LEN + identity_len + 4
}

/// The data offset for an identity of `identity_len` bytes: the header rounded up to [`ALIGN`].
pub fn data_offset_for(identity_len: usize) -> u64 {
    round_up(header_len(identity_len) as u64)
}

/// Bytes on disk of a chunk file of `key` holding `len` bytes: header, data, block rounding.
pub fn on_disk_len(key: &super::ChunkKey, len: u64) -> u64 {
    round_up(data_offset_for(key.identity_len()) + len)
}

/// `n` rounded up to a multiple of [`ALIGN`] (saturating near `u64::MAX`).
pub fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN).saturating_mul(ALIGN)
}

/// Encodes the header for `key`, zero-padded to the data offset (a multiple of 4096 bytes).
/// Fails only when the key's identity is longer than [`MAX_IDENTITY_LEN`].
pub fn encode_header(
    key: &ChunkKey,
    data_len: u64,
    data_crc: u32,
    flags: u16,
) -> Result<Vec<u8>, FormatError> {
    let identity_len = key.identity_len();
    if identity_len > MAX_IDENTITY_LEN {
        return Err(FormatError::IdentityTooLong(identity_len));
    }
    let data_offset = data_offset_for(identity_len);
    let mut out = Vec::with_capacity(data_offset as usize);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(data_offset as u32).to_le_bytes());
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&data_crc.to_le_bytes());
    out.extend_from_slice(&(identity_len as u32).to_le_bytes());
    key.encode_identity(&mut out);
    let crc = memarts_protocol::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.resize(data_offset as usize, 0);
    Ok(out)
}

/// A header as [`decode_raw`] reads it: every field checked, the identity still encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeader<'a> {
    pub flags: u16,
    pub data_offset: u64,
    pub data_len: u64,
    pub data_crc32c: u32,
    /// The identity encoding (`ChunkKey::encode_identity`), its checksum verified.
    pub identity: &'a [u8],
}

/// Decodes a header from the start of a chunk file. `bytes` may be shorter than the padded
/// header: [`FormatError::Truncated`] says how many bytes are needed (never more than
/// [`MAX_HEADER_LEN`]) so the caller can read more and retry.
pub fn decode_header(bytes: &[u8]) -> Result<Header, FormatError> {
    let raw = decode_raw(bytes)?;
    let identity = ChunkKey::decode_identity(raw.identity).ok_or(FormatError::BadIdentity)?;
    Ok(Header {
        version: FORMAT_VERSION,
        flags: raw.flags,
        data_offset: raw.data_offset,
        data_len: raw.data_len,
        data_crc32c: raw.data_crc32c,
        identity,
    })
}

/// [`decode_header`] without decoding the identity: for a reader that knows which identity it
/// expects and compares the bytes (a shim's local hit), with no allocation.
pub fn decode_raw(bytes: &[u8]) -> Result<RawHeader<'_>, FormatError> {
    let truncated = |needed: usize| FormatError::Truncated { needed, got: bytes.len() };
    if bytes.len() >= MAGIC.len() && bytes[..MAGIC.len()] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let Some(fixed) = bytes.first_chunk::<FIXED_LEN>() else {
        return Err(truncated(FIXED_LEN));
    };
    let le16 = |at: usize| u16::from_le_bytes([fixed[at], fixed[at + 1]]);
    let le32 = |at: usize| u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]]);
    let le64 = |at: usize| u64::from(le32(at)) | (u64::from(le32(at + 4)) << 32);
    let version = le16(8);
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let identity_len = le32(28) as usize;
    if identity_len > MAX_IDENTITY_LEN {
        return Err(FormatError::IdentityTooLong(identity_len));
    }
    let crc_at = FIXED_LEN + identity_len;
    let Some(crc_bytes) = bytes.get(crc_at..crc_at + 4) else {
        return Err(truncated(header_len(identity_len)));
    };
    let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
    let computed = memarts_protocol::crc32c(&bytes[..crc_at]);
    if stored != computed {
        return Err(FormatError::HeaderCrc { stored, computed });
    }
    let data_offset = u64::from(le32(12));
    let expected = data_offset_for(identity_len);
    if data_offset != expected {
        return Err(FormatError::BadDataOffset { found: data_offset, expected });
    }
    Ok(RawHeader {
        flags: le16(10),
        data_offset,
        data_len: le64(16),
        data_crc32c: le32(24),
        identity: &bytes[FIXED_LEN..crc_at],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small_key() -> ChunkKey {
        ChunkKey {
            origin: "file".into(),
            bucket: "b".into(),
            key: "k".into(),
            etag: "e".into(),
            chunk_size: 1 << 20,
            index: 2,
        }
    }

    #[test]
    fn truncated_reports_needed_length() {
        let header = encode_header(&small_key(), 0, 0, 0).unwrap();
        assert_eq!(decode_header(&header[..4]), Err(FormatError::Truncated { needed: 32, got: 4 }));
        assert_eq!(decode_header(&header[..40]), Err(FormatError::Truncated { needed: 91, got: 40 }));
        assert!(decode_header(&header[..91]).is_ok());
        assert_eq!(decode_header(b"NOTCHUNK"), Err(FormatError::BadMagic));
    }

    #[test]
    fn oversized_identity_is_refused() {
        let mut key = small_key();
        key.key = "x".repeat(MAX_IDENTITY_LEN);
        assert!(matches!(encode_header(&key, 0, 0, 0), Err(FormatError::IdentityTooLong(_))));
        key.key = "x".repeat(MAX_IDENTITY_LEN - 54);
        assert_eq!(key.identity_len(), MAX_IDENTITY_LEN);
        let header = encode_header(&key, 0, 0, 0).unwrap();
        assert_eq!(header.len() as u64, data_offset_for(MAX_IDENTITY_LEN));
        assert_eq!(decode_header(&header).unwrap().identity, key);
    }

    fn arb_key() -> impl Strategy<Value = ChunkKey> {
        (".{0,20}", ".{0,10}", ".{0,300}", ".{0,40}", any::<u64>(), any::<u64>()).prop_map(
            |(origin, bucket, key, etag, chunk_size, index)| ChunkKey {
                origin,
                bucket,
                key,
                etag,
                chunk_size,
                index,
            },
        )
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = decode_header(&bytes);
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = decode_header(&with_magic);
        }

        #[test]
        fn round_trip(key in arb_key(), len in any::<u64>(), crc in any::<u32>(), flags in any::<u16>()) {
            let bytes = encode_header(&key, len, crc, flags).unwrap();
            prop_assert_eq!(bytes.len() as u64 % ALIGN, 0);
            let header = decode_header(&bytes).unwrap();
            prop_assert!(header.matches(&key));
            prop_assert_eq!((header.data_len, header.data_crc32c, header.flags), (len, crc, flags));
            prop_assert_eq!(header.data_offset, bytes.len() as u64);
        }

        #[test]
        fn any_byte_change_in_header_is_detected(
            key in arb_key(), pos in any::<prop::sample::Index>(), delta in 1u8..=255,
        ) {
            let mut bytes = encode_header(&key, 7, 9, 0).unwrap();
            let covered = header_len(key.identity_len());
            bytes[pos.index(covered)] ^= delta;
            prop_assert!(decode_header(&bytes).is_err());
        }

        #[test]
        fn mutated_headers_never_panic(
            key in arb_key(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
            ident_len in any::<u32>(),
        ) {
            let mut bytes = encode_header(&key, 7, 9, 0).unwrap();
            for (pos, value) in &edits {
                let at = pos.index(bytes.len());
                bytes[at] = *value;
            }
            let _ = decode_header(&bytes);
            let _ = decode_header(&bytes[..cut.index(bytes.len())]);
            bytes[28..32].copy_from_slice(&ident_len.to_le_bytes());
            let _ = decode_header(&bytes);
        }
    }
}
