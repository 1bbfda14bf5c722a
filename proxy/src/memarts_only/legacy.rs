//! The header of memarts-only object files written by releases before the chunk-format codec
//! (magic `MAMONLY1`). Frozen: files in this format are still read, never written. Its layout:
//!
//! ```text
//! offset  size  field
//! 0       8     magic "MAMONLY1"
//! 8       2     format version (1), u16 LE
//! 10      2     reserved, 0
//! 12      4     data offset D (the header rounded up to 4096), u32 LE
//! 16      8     data length, u64 LE
//! 24      4     CRC32C of the data, u32 LE
//! 28      4     URL length U, u32 LE (at most MAX_URL_LEN)
//! 32      U     the URL (normalised, e.g. s3://bucket/key)
//! 32+U    4     CRC32C of bytes 0..32+U
//! D       ...   the data
//! ```
//!
//! `testdata/v1-*.bin` are files written by the last release that wrote this format; the tests read
//! them back.

use memarts_protocol::{crc32c, ObjectUrl, MAX_URL_LEN};

use super::codec::{Layout, Refused};

pub const MAGIC: &[u8; 8] = b"MAMONLY1";
const VERSION: u16 = 1;
const FIXED: usize = 32;

/// Decodes a legacy header for `url`; bounded, never panics.
pub fn decode(bytes: &[u8], url: &ObjectUrl) -> Result<Layout, Refused> {
    let bad = |why: &str| Err(Refused::Bad(why.to_string()));
    if bytes.len() < FIXED || &bytes[..8] != MAGIC {
        return if bytes.starts_with(MAGIC) {
            Err(Refused::Truncated { needed: FIXED + 4 })
        } else {
            bad("bad magic")
        };
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    if u16_at(8) != VERSION {
        return Err(Refused::Bad(format!("unknown format version {}", u16_at(8))));
    }
    let url_len = u32_at(28) as usize;
    if url_len > MAX_URL_LEN {
        return bad("truncated header");
    }
    if bytes.len() < FIXED + url_len + 4 {
        return Err(Refused::Truncated { needed: FIXED + url_len + 4 });
    }
    if u32_at(FIXED + url_len) != crc32c(&bytes[..FIXED + url_len]) {
        return bad("header checksum mismatch");
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let Ok(stored) = std::str::from_utf8(&bytes[FIXED..FIXED + url_len]) else { return bad("URL not UTF-8") };
    if stored != url.to_string() {
        return Err(Refused::Bad(format!("file holds {stored}")));
    }
    Ok(Layout { data_offset: u64::from(u32_at(12)), len: u64::from_le_bytes(len), crc32c: u32_at(24) })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const OBJECT: &[u8] = include_bytes!("testdata/v1-object.bin");
    const EMPTY: &[u8] = include_bytes!("testdata/v1-empty.bin");

    /// The data the golden files hold: `(i * 31 + 7) as u8` for each index `i`.
    pub(crate) fn golden_data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + 7) as u8).collect()
    }

    #[test]
    fn the_golden_files_decode() {
        let url = ObjectUrl::parse("s3://bucket/features/part-0.bin").unwrap();
        let layout = decode(OBJECT, &url).unwrap();
        assert_eq!(layout.data_offset, 4096);
        assert_eq!(layout.len, 10_000);
        let data = &OBJECT[4096..];
        assert_eq!(data, golden_data(10_000).as_slice());
        assert_eq!(layout.crc32c, crc32c(data));
        let empty = ObjectUrl::parse("s3://bucket/empty").unwrap();
        assert_eq!(decode(EMPTY, &empty).unwrap().len, 0);
        assert!(matches!(decode(OBJECT, &empty), Err(Refused::Bad(_))));
        let mut flipped = OBJECT.to_vec();
        flipped[20] ^= 1;
        assert!(matches!(decode(&flipped, &url), Err(Refused::Bad(_))));
        assert!(matches!(decode(&OBJECT[..40], &url), Err(Refused::Truncated { .. })));
    }
}
