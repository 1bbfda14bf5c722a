//! The `chunk_header` target: the on-disk chunk header decoder ([`format::decode_header`]) and the
//! identity encoding it carries ([`ChunkKey::decode_identity`]).
//!
//! Arbitrary bytes rarely carry a valid header CRC, so each input is decoded twice: as given, and
//! with its header CRC recomputed, which takes the fuzzer past the checksum into the identity and
//! offset checks. A header that decodes re-encodes to the exact bytes it was read from; a truncated
//! input says how much to read, and reading that much makes progress.

use memarts_proxy::chunk_store::format::{self, FormatError, FIXED_LEN, MAX_HEADER_LEN};
use memarts_proxy::chunk_store::ChunkKey;

/// Checks one input; panics on any broken invariant.
pub fn check(data: &[u8]) {
    check_header(data);
    if let Some(fixed) = with_valid_crc(data) {
        check_header(&fixed);
    }
    if let Some(key) = ChunkKey::decode_identity(data) {
        assert_eq!(key.identity_bytes(), data, "an identity decodes from bytes it does not encode to");
        assert_eq!(key.identity_len(), data.len());
    }
}

/// Seeds: the padded header of the first sample key, the bare headers (through the CRC) of all, and
/// the bare identity encodings.
pub fn seeds() -> Vec<Vec<u8>> {
    let keys = crate::samples::chunk_keys();
    let header =
        |key: &ChunkKey| format::encode_header(key, 1 << 20, 0xe306_9283, 0).expect("a sample key encodes");
    let mut out = vec![header(&keys[0])];
    out.extend(keys.iter().map(|key| header(key)[..format::header_len(key.identity_len())].to_vec()));
    out.extend(keys.iter().map(ChunkKey::identity_bytes));
    out
}

fn check_header(data: &[u8]) {
    match format::decode_header(data) {
        Ok(header) => {
            let covered = format::header_len(header.identity.identity_len());
            assert_eq!(header.version, format::FORMAT_VERSION);
            assert_eq!(header.data_offset, format::data_offset_for(header.identity.identity_len()));
            assert_eq!(header.data_offset % format::ALIGN, 0);
            let encoded =
                format::encode_header(&header.identity, header.data_len, header.data_crc32c, header.flags)
                    .expect("a decoded header encodes");
            assert_eq!(
                &encoded[..covered],
                &data[..covered],
                "a header decodes from bytes it does not encode to"
            );
            assert_eq!(encoded.len() as u64, header.data_offset);
            assert_eq!(format::decode_header(&data[..covered]).as_ref(), Ok(&header), "padding was read");
        }
        Err(FormatError::Truncated { needed, got }) => {
            assert_eq!(got, data.len());
            assert!(got < needed && needed <= MAX_HEADER_LEN, "needed {needed} of {got}");
            // The caller reads `needed` bytes and retries: that must not ask for the same again.
            let mut more = data.to_vec();
            more.resize(needed, 0);
            if let Err(FormatError::Truncated { needed: again, .. }) = format::decode_header(&more) {
                assert!(again > needed, "asked for {needed} bytes, then for {again}");
            }
        }
        Err(_) => {}
    }
}

/// `data` with the header CRC its identity length calls for, or `None` when too short to hold it.
fn with_valid_crc(data: &[u8]) -> Option<Vec<u8>> {
    let fixed = data.first_chunk::<FIXED_LEN>()?;
    let identity_len = u32::from_le_bytes(fixed[28..32].try_into().unwrap()) as usize;
    let crc_at = FIXED_LEN.checked_add(identity_len)?;
    data.get(crc_at..crc_at.checked_add(4)?)?;
    let mut out = data.to_vec();
    let crc = memarts_protocol::crc32c(&out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    Some(out)
}
