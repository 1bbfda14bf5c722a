//! The checks a chunk file passes before its bytes are served, written once: for the proxy, which
//! reads chunk files through its I/O engine (`proxy/src/chunk_store/store.rs`), and for the shims,
//! which read them directly with `pread`/`preadv` or a mapping (`shim/src/chunk_check.rs`). The
//! I/O is the caller's; these functions only judge the bytes it read.
//!
//! A file serves a chunk if
//! - its header decodes ([`format::decode_raw`]: magic, version, header CRC32C, data offset) and
//!   holds the chunk's own identity encoding ([`header`]: a file of another chunk, misplaced or
//!   colliding, is refused),
//! - the length of data it claims is what the reader can have: within the file ([`fits_file`], the
//!   proxy, which learns the length from the header) or exactly the length expected ([`length`], a
//!   shim, which knows the object's size),
//! - the data matches the header's CRC32C ([`data`], or [`data_crc`] for a CRC computed piece by
//!   piece).

use super::format::{self, FormatError};

/// What a checked header says of its chunk's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Data {
    /// Where the data starts in the file (a multiple of [`format::ALIGN`]).
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
    pub flags: u16,
}

/// Why a chunk file fails its checks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The header does not decode (or more bytes are needed: [`FormatError::Truncated`]).
    #[error("bad header: {0}")]
    Header(#[from] FormatError),
    #[error("header identity is another chunk's")]
    OtherChunk,
    #[error("file is {file_len} bytes, header claims {data_len} of data")]
    Short { file_len: u64, data_len: u64 },
    #[error("header claims {found} bytes of data, {expected} expected")]
    Length { found: u64, expected: u64 },
    #[error("data CRC32C {computed:#010x}, header says {stored:#010x}")]
    DataCrc { computed: u32, stored: u32 },
}

/// The header at the start of `bytes` (at least through its CRC), checked: it decodes and was
/// written for the chunk whose identity encoding is `identity` (`ChunkKey::encode_identity`,
/// `memarts_protocol::encode_identity`). The data offset needs no check of its own: the decoder
/// requires the one an identity of this length has.
pub fn header(bytes: &[u8], identity: &[u8]) -> Result<Data, Invalid> {
    let raw = format::decode_raw(bytes)?;
    if raw.identity != identity {
        return Err(Invalid::OtherChunk);
    }
    Ok(Data::from(&raw))
}

impl From<&format::RawHeader<'_>> for Data {
    /// What a decoded header says of the data (for a reader that checks the identity its own way:
    /// by the id it hashes to, as a slot making a chunk resident does).
    fn from(raw: &format::RawHeader<'_>) -> Data {
        Data { offset: raw.data_offset, len: raw.data_len, crc32c: raw.data_crc32c, flags: raw.flags }
    }
}

/// Checks that the data `data` claims lies within a file of `file_len` bytes.
pub fn fits_file(data: &Data, file_len: u64) -> Result<(), Invalid> {
    match data.offset.checked_add(data.len) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(Invalid::Short { file_len, data_len: data.len }),
    }
}

/// Checks that `data` claims exactly `expected` bytes.
pub fn length(data: &Data, expected: u64) -> Result<(), Invalid> {
    if data.len == expected {
        Ok(())
    } else {
        Err(Invalid::Length { found: data.len, expected })
    }
}

/// Checks the CRC32C `computed` of the data read against the header's.
pub fn data_crc(data: &Data, computed: u32) -> Result<(), Invalid> {
    if computed == data.crc32c {
        Ok(())
    } else {
        Err(Invalid::DataCrc { computed, stored: data.crc32c })
    }
}

/// Checks the data read, `bytes`, against the header's CRC32C.
pub fn data(data: &Data, bytes: &[u8]) -> Result<(), Invalid> {
    data_crc(data, memarts_protocol::crc32c(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk_file::ChunkKey;

    fn key(index: u64) -> ChunkKey {
        ChunkKey {
            origin: "s3".into(),
            bucket: "b".into(),
            key: "k".into(),
            etag: "\"e\"".into(),
            chunk_size: 4096,
            index,
        }
    }

    fn file(key: &ChunkKey, bytes: &[u8]) -> Vec<u8> {
        let crc = memarts_protocol::crc32c(bytes);
        let mut file = format::encode_header(key, bytes.len() as u64, crc, 0).unwrap();
        file.extend_from_slice(bytes);
        file
    }

    #[test]
    fn a_chunks_own_file_passes_every_check() {
        let k = key(1);
        let f = file(&k, b"hello");
        let data = header(&f, &k.identity_bytes()).unwrap();
        assert_eq!((data.offset, data.len), (4096, 5));
        assert_eq!(fits_file(&data, f.len() as u64), Ok(()));
        assert_eq!(length(&data, 5), Ok(()));
        assert_eq!(self::data(&data, &f[4096..]), Ok(()));
    }

    #[test]
    fn each_check_refuses_what_it_is_for() {
        let k = key(1);
        let mut f = file(&k, b"hello");
        assert_eq!(header(&f, &key(2).identity_bytes()), Err(Invalid::OtherChunk));
        assert!(matches!(
            header(&f[..40], &k.identity_bytes()),
            Err(Invalid::Header(FormatError::Truncated { .. }))
        ));
        let data = header(&f, &k.identity_bytes()).unwrap();
        assert_eq!(fits_file(&data, 4100), Err(Invalid::Short { file_len: 4100, data_len: 5 }));
        let huge = Data { len: u64::MAX, ..data };
        assert!(fits_file(&huge, u64::MAX).is_err(), "an end that overflows");
        assert_eq!(length(&data, 6), Err(Invalid::Length { found: 5, expected: 6 }));
        f[4096] ^= 1;
        assert!(matches!(self::data(&data, &f[4096..]), Err(Invalid::DataCrc { .. })));
        f[20] ^= 1;
        assert!(matches!(
            header(&f, &k.identity_bytes()),
            Err(Invalid::Header(FormatError::HeaderCrc { .. }))
        ));
    }
}
