use super::*;
use proptest::prelude::*;

fn record(identity: &[u8], data: &[u8], flags: u16) -> Vec<u8> {
    let mut out = encode_head(identity, data.len() as u32, crc32c(data), flags).unwrap();
    out.extend_from_slice(data);
    out.resize(out.len() + padding(identity.len(), data.len()), 0);
    assert_eq!(out.len() as u64, record_len(identity.len(), data.len()));
    assert_eq!(out.len() as u64 % RECORD_ALIGN, 0);
    out
}

#[test]
fn the_layout_is_frozen() {
    let rec = record(b"id", b"data", 3);
    assert_eq!(rec.len(), 32);
    assert_eq!(&rec[..4], b"MRC1");
    assert_eq!(&rec[4..20], &[2, 0, 0, 0, 4, 0, 0, 0, 0xd1, 0x7d, 0xd8, 0xae, 3, 0, 0, 0]);
    assert_eq!(&rec[24..30], b"iddata");
    assert_eq!(&segment_header(0x0102)[..], b"MASEG001\x02\x01\0\0\0\0\0\0");
    let index = encode_index(&[IndexEntry { id: 7, offset: 16, record_len: 32 }]);
    assert_eq!(index.len(), 16 + INDEX_ENTRY + 4);
}

#[test]
fn a_record_of_another_chunk_is_refused() {
    let rec = record(b"chunk-a", b"bytes", 0);
    assert_eq!(check_record(&rec, Some(b"chunk-b")).unwrap_err(), Invalid::OtherChunk);
    let (head, data) = check_record(&rec, None).unwrap();
    assert_eq!((head.identity, data), (&b"chunk-a"[..], &b"bytes"[..]));
}

#[test]
fn zeros_are_no_record() {
    // What a segment holds past its last record, or where a torn append left a hole.
    assert_eq!(decode_head(&[0u8; 64]).unwrap_err(), Invalid::Magic);
}

proptest! {
    #[test]
    fn records_read_back_and_every_damage_is_refused(
        identity in proptest::collection::vec(any::<u8>(), 1..200),
        data in proptest::collection::vec(any::<u8>(), 0..5000),
        flags in any::<u16>(),
        flip in any::<usize>(),
        bit in 0u8..8,
        cut in any::<usize>(),
    ) {
        let rec = record(&identity, &data, flags);
        let (head, got) = check_record(&rec, Some(&identity)).unwrap();
        prop_assert_eq!(got, &data[..]);
        prop_assert_eq!(head.flags, flags);
        prop_assert_eq!(head.record_len(), rec.len() as u64);
        // Any bit flipped before the padding: refused (CRC32C catches every single-bit error).
        let meaningful = HEAD + identity.len() + data.len();
        let mut bad = rec.clone();
        bad[flip % meaningful] ^= 1 << bit;
        prop_assert!(check_record(&bad, Some(&identity)).is_err());
        // Any torn write (a prefix of the record): refused, never served short.
        let torn = &rec[..cut % meaningful];
        prop_assert!(check_record(torn, Some(&identity)).is_err());
        // Read in parts (a shim's read: head and identity, then the data where it is): the same
        // verdicts, for the record, for the damaged one and for another chunk's.
        let split = |r: &[u8]| {
            let at = (HEAD + identity.len()).min(r.len());
            let end = (at + data.len()).min(r.len());
            (r[..at].to_vec(), r[at..end].to_vec())
        };
        let (h, d) = split(&rec);
        prop_assert_eq!(check_parts(&h, &d, &identity).unwrap().flags, flags);
        let (h, d) = split(&bad);
        prop_assert!(check_parts(&h, &d, &identity).is_err());
        let mut other = identity.clone();
        other[0] ^= 1;
        let (h, d) = split(&rec);
        if !d.is_empty() {
            let short = &d[..d.len() - 1 - cut % d.len()];
            let truncated = matches!(check_parts(&h, short, &identity), Err(Invalid::Truncated { .. }));
            prop_assert!(truncated);
        }
        prop_assert_eq!(check_parts(&h, &d, &other).unwrap_err(), Invalid::OtherChunk);
    }

    #[test]
    fn indexes_read_back_and_every_damage_is_refused(
        entries in proptest::collection::vec((any::<u128>(), any::<u32>(), any::<u32>()), 0..50),
        flip in any::<usize>(),
        bit in 0u8..8,
        cut in any::<usize>(),
    ) {
        let entries: Vec<IndexEntry> =
            entries.into_iter().map(|(id, offset, record_len)| IndexEntry { id, offset, record_len }).collect();
        let bytes = encode_index(&entries);
        prop_assert_eq!(decode_index(&bytes).unwrap(), entries);
        let mut bad = bytes.clone();
        let at = flip % bad.len();
        bad[at] ^= 1 << bit;
        prop_assert!(decode_index(&bad).is_err());
        prop_assert!(decode_index(&bytes[..cut % bytes.len()]).is_err());
    }
}
