//! Segment files: small chunks packed one after another into large files, as log-structured caches
//! keep small items (CacheLib's small-item engine, Kangaroo, foyer's small-object disk cache): a
//! chunk of a few KiB kept as a file of its own pays an inode, a directory entry, a header page
//! and block rounding (8 KiB and more on disk for a 4 KiB object, and a file creation per fill);
//! packed, it pays a 24-byte record header and its identity.
//!
//! A slot's segments live in `<root>/v1/segments/<slot>/` as `<seq:016x>.seg`, with, once a segment
//! is full ("sealed"), `<seq:016x>.idx`: where its records are, so that a restart reads the indexes,
//! not every record. This module is the bytes; the proxy's `chunk_store/segments.rs` does the I/O.
//!
//! Segment file (little-endian):
//!
//! ```text
//! offset  field
//! 0       magic b"MASEG001"
//! 8       seq: u64, the number in the file's name
//! 16      records, each at an offset that is a multiple of 8:
//!   +0      magic u32 = RECORD_MAGIC
//!   +4      identity_len: u32 (at most chunk_file::format::MAX_IDENTITY_LEN)
//!   +8      data_len: u32 (at most MAX_DATA)
//!   +12     data_crc32c: u32
//!   +16     flags: u16
//!   +18     0: u16
//!   +20     head_crc32c: u32, the CRC32C of bytes +0..+20 followed by the identity
//!   +24     the identity encoding (ChunkKey::encode_identity)
//!   +24+il  the data, then zeros to the next multiple of 8
//! ```
//!
//! Index file: magic b"MASEGIX1", count: u64, `count` entries of (id: u128, offset: u32,
//! record_len: u32), then the CRC32C (u32) of everything before it.
//!
//! A record is served only if its head decodes, its head CRC holds, its identity is the chunk
//! asked for and its data matches `data_crc32c`: a torn write (a crash mid-append), a record
//! overwritten or a segment file damaged is a miss, never a wrong byte.

use memarts_protocol::crc32c;

use crate::chunk_file::format::MAX_IDENTITY_LEN;

/// Word 0 of every segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"MASEG001";
/// Bytes before the first record.
pub const SEGMENT_HEADER: u64 = 16;
/// The first word of every record.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"MRC1");
/// Bytes of a record's head before its identity.
pub const HEAD: usize = 24;
/// Records are aligned to this.
pub const RECORD_ALIGN: u64 = 8;
/// The largest data a record holds (a bound for decoding; chunks packed are far smaller).
pub const MAX_DATA: u32 = 16 << 20;
/// Word 0 of every index file.
pub const INDEX_MAGIC: &[u8; 8] = b"MASEGIX1";
/// Bytes per index entry.
pub const INDEX_ENTRY: usize = 24;

/// The directory of the slots' segment directories under a cache root: `<root>/v1/segments`.
pub fn segments_dir(cache_root: &std::path::Path) -> std::path::PathBuf {
    cache_root.join("v1").join("segments")
}

/// Segment `seq` of `slot` under `segments` (see [`segments_dir`]): `<segments>/<slot>/<seq:016x>.seg`.
pub fn segment_path(segments: &std::path::Path, slot: u32, seq: u64) -> std::path::PathBuf {
    segments.join(slot.to_string()).join(format!("{seq:016x}.seg"))
}

/// Why bytes are not a record (or an index) this code can serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{needed} bytes needed, {have} read")]
    Truncated { needed: usize, have: usize },
    #[error("no record magic")]
    Magic,
    #[error("identity of {0} bytes is over the limit")]
    IdentityLen(u32),
    #[error("data of {0} bytes is over the limit")]
    DataLen(u32),
    #[error("record head CRC32C does not match")]
    HeadCrc,
    #[error("record holds another chunk")]
    OtherChunk,
    #[error("data CRC32C {computed:#010x}, record says {stored:#010x}")]
    DataCrc { computed: u32, stored: u32 },
    #[error("not a segment index, or a damaged one")]
    Index,
}

/// A record's head, decoded and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head<'a> {
    pub identity: &'a [u8],
    pub data_len: u32,
    pub data_crc32c: u32,
    pub flags: u16,
}

impl Head<'_> {
    /// Where the data starts, from the record's start.
    pub fn data_offset(&self) -> usize {
        HEAD + self.identity.len()
    }

    /// The whole record's length, padding included.
    pub fn record_len(&self) -> u64 {
        record_len(self.identity.len(), self.data_len as usize)
    }
}

/// The length of a record of `identity_len` bytes of identity and `data_len` of data.
pub fn record_len(identity_len: usize, data_len: usize) -> u64 {
    ((HEAD + identity_len + data_len) as u64).next_multiple_of(RECORD_ALIGN)
}

/// The segment file's header for segment `seq`.
pub fn segment_header(seq: u64) -> [u8; SEGMENT_HEADER as usize] {
    let mut out = [0u8; SEGMENT_HEADER as usize];
    out[..8].copy_from_slice(SEGMENT_MAGIC);
    out[8..].copy_from_slice(&seq.to_le_bytes());
    out
}

/// Whether `bytes` start with the header of segment `seq`.
pub fn is_segment_header(bytes: &[u8], seq: u64) -> bool {
    bytes.len() >= SEGMENT_HEADER as usize && bytes[..16] == segment_header(seq)
}

/// The head and identity of a record (the data and the padding, `padding(..)` zeros, follow).
pub fn encode_head(identity: &[u8], data_len: u32, data_crc32c: u32, flags: u16) -> Result<Vec<u8>, Invalid> {
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(Invalid::IdentityLen(identity.len() as u32));
    }
    if data_len > MAX_DATA {
        return Err(Invalid::DataLen(data_len));
    }
    let mut out = Vec::with_capacity(HEAD + identity.len());
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&data_crc32c.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(identity);
    let crc = head_crc(&out);
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Zeros after the data of a record of `identity_len` and `data_len` bytes, to its aligned end.
pub fn padding(identity_len: usize, data_len: usize) -> usize {
    (record_len(identity_len, data_len) - (HEAD + identity_len + data_len) as u64) as usize
}

fn head_crc(head_and_identity: &[u8]) -> u32 {
    let mut bytes = Vec::with_capacity(head_and_identity.len() - 4);
    bytes.extend_from_slice(&head_and_identity[..20]);
    bytes.extend_from_slice(&head_and_identity[HEAD..]);
    crc32c(&bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The head of the record at the start of `bytes` (at least its head and identity), checked: magic,
/// bounds and head CRC. `Truncated` says how many bytes it needs.
pub fn decode_head(bytes: &[u8]) -> Result<Head<'_>, Invalid> {
    if bytes.len() < HEAD {
        return Err(Invalid::Truncated { needed: HEAD, have: bytes.len() });
    }
    if u32_at(bytes, 0) != RECORD_MAGIC {
        return Err(Invalid::Magic);
    }
    let identity_len = u32_at(bytes, 4);
    if identity_len as usize > MAX_IDENTITY_LEN {
        return Err(Invalid::IdentityLen(identity_len));
    }
    let data_len = u32_at(bytes, 8);
    if data_len > MAX_DATA {
        return Err(Invalid::DataLen(data_len));
    }
    let end = HEAD + identity_len as usize;
    if bytes.len() < end {
        return Err(Invalid::Truncated { needed: end, have: bytes.len() });
    }
    if head_crc(&bytes[..end]) != u32_at(bytes, 20) {
        return Err(Invalid::HeadCrc);
    }
    Ok(Head {
        identity: &bytes[HEAD..end],
        data_len,
        data_crc32c: u32_at(bytes, 12),
        flags: u16::from_le_bytes([bytes[16], bytes[17]]),
    })
}

/// The data of the whole record `bytes` if it is the chunk whose identity encoding is `identity`
/// (`None`: any chunk's) and every check holds.
pub fn check_record<'a>(bytes: &'a [u8], identity: Option<&[u8]>) -> Result<(Head<'a>, &'a [u8]), Invalid> {
    let head = decode_head(bytes)?;
    if identity.is_some_and(|want| want != head.identity) {
        return Err(Invalid::OtherChunk);
    }
    let start = head.data_offset();
    let end = start + head.data_len as usize;
    if bytes.len() < end {
        return Err(Invalid::Truncated { needed: end, have: bytes.len() });
    }
    let data = &bytes[start..end];
    check_data(&head, data)?;
    Ok((head, data))
}

/// The checks of [`check_record`] on a record read in parts (a shim reads the data straight into
/// its caller's buffer): `head` is the record's head and identity, `data` the bytes read where its
/// data is. The same rules, in the same order: head, identity, length, data CRC32C.
pub fn check_parts<'a>(head: &'a [u8], data: &[u8], identity: &[u8]) -> Result<Head<'a>, Invalid> {
    let head = decode_head(head)?;
    if identity != head.identity {
        return Err(Invalid::OtherChunk);
    }
    if data.len() != head.data_len as usize {
        return Err(Invalid::Truncated { needed: head.data_len as usize, have: data.len() });
    }
    check_data(&head, data)?;
    Ok(head)
}

fn check_data(head: &Head<'_>, data: &[u8]) -> Result<(), Invalid> {
    let computed = crc32c(data);
    if computed != head.data_crc32c {
        return Err(Invalid::DataCrc { computed, stored: head.data_crc32c });
    }
    Ok(())
}

/// One record of a segment, as its index lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub id: u128,
    pub offset: u32,
    pub record_len: u32,
}

/// The index file of a sealed segment holding `entries`.
pub fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + entries.len() * INDEX_ENTRY + 4);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.id.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.record_len.to_le_bytes());
    }
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The entries of an index file, if it is whole and undamaged.
pub fn decode_index(bytes: &[u8]) -> Result<Vec<IndexEntry>, Invalid> {
    if bytes.len() < 20 || &bytes[..8] != INDEX_MAGIC {
        return Err(Invalid::Index);
    }
    let count = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let body = usize::try_from(count).ok().and_then(|n| n.checked_mul(INDEX_ENTRY)).ok_or(Invalid::Index)?;
    if bytes.len() != 16 + body + 4 || crc32c(&bytes[..16 + body]) != u32_at(bytes, 16 + body) {
        return Err(Invalid::Index);
    }
    Ok(bytes[16..16 + body]
        .chunks_exact(INDEX_ENTRY)
        .map(|e| IndexEntry {
            id: u128::from_le_bytes(e[..16].try_into().expect("16 bytes")),
            offset: u32_at(e, 16),
            record_len: u32_at(e, 20),
        })
        .collect())
}

#[cfg(test)]
#[path = "segment_tests.rs"]
mod tests;
