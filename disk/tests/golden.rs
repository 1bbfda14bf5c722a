//! Golden bytes: the layouts of the files other processes map or read (chunk files, the metadata
//! table, the resident table, the packed table, segment files and their indexes) are frozen here. A process of an older build may read them across a
//! rolling restart, and a cache outlives the build that wrote it: if one of these fails, the change
//! broke that; make a new format version (a new magic or layout version) instead of editing these.

use std::sync::atomic::{AtomicU64, Ordering};

use memarts_disk::chunk_file::format::{self, decode_header, encode_header, FLAG_MEMARTS_ONLY};
use memarts_disk::chunk_file::{chunk_relative_path, verify, ChunkKey};
use memarts_disk::meta_table::{self, MetaTable, Published, TableFile};
use memarts_disk::packed_table::{self, PackedTable, RecordPlace};
use memarts_disk::resident_table::{self, ResidentFile, ResidentTable, Stamp};
use memarts_disk::segment::{self, IndexEntry};

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
fn chunk_header_bytes() {
    let header = encode_header(&small_key(), 5, 0xdead_beef, FLAG_MEMARTS_ONLY).unwrap();
    assert_eq!(header.len(), 4096);
    #[rustfmt::skip]
    let expected: &[u8] = &[
        b'M', b'A', b'C', b'H', b'U', b'N', b'K', b'1', // magic
        1, 0,                                           // version 1
        1, 0,                                           // flags: memarts-only
        0x00, 0x10, 0, 0,                               // data_offset 4096
        5, 0, 0, 0, 0, 0, 0, 0,                         // data_len 5
        0xef, 0xbe, 0xad, 0xde,                         // data_crc32c
        55, 0, 0, 0,                                    // identity length 4*8+7+2*8
        4, 0, 0, 0, 0, 0, 0, 0, b'f', b'i', b'l', b'e', // origin
        1, 0, 0, 0, 0, 0, 0, 0, b'b',                   // bucket
        1, 0, 0, 0, 0, 0, 0, 0, b'k',                   // key
        1, 0, 0, 0, 0, 0, 0, 0, b'e',                   // etag
        0, 0, 0x10, 0, 0, 0, 0, 0,                      // chunk_size 1 MiB
        2, 0, 0, 0, 0, 0, 0, 0,                         // index 2
        0x23, 0xad, 0xc8, 0xcd,                         // header_crc32c (0xcdc8ad23)
    ];
    assert_eq!(&header[..expected.len()], expected);
    assert!(header[expected.len()..].iter().all(|&b| b == 0));
    let decoded = decode_header(&header).unwrap();
    assert_eq!(decoded.data_offset, 4096);
    assert_eq!(decoded.data_len, 5);
    assert_eq!(decoded.data_crc32c, 0xdead_beef);
    assert_eq!(decoded.flags, FLAG_MEMARTS_ONLY);
    assert!(decoded.matches(&small_key()));
    let mut other = small_key();
    other.index = 3;
    assert!(!decoded.matches(&other));
}

/// An S3 chunk's file: its name (the id, from the identity: a cached chunk is found by it after a
/// restart of any build) and its header, which a shim checks with the rules the proxy uses.
#[test]
fn s3_chunk_file_name_and_header() {
    let url = memarts_protocol::ObjectUrl::parse("s3://bkt/key").unwrap();
    let key = ChunkKey::new(&url, "etag", 1 << 20, 3);
    assert_eq!(key.id().to_hex(), "f068402104a11ea8981acb8c208a9002");
    assert_eq!(chunk_relative_path(key.id()), "f0/f068402104a11ea8981acb8c208a9002");
    let data = b"chunk data";
    let header = encode_header(&key, data.len() as u64, memarts_protocol::crc32c(data), 0).unwrap();
    #[rustfmt::skip]
    let fixed: &[u8] = &[
        b'M', b'A', b'C', b'H', b'U', b'N', b'K', b'1',
        1, 0, 0, 0,                                     // version 1, no flags
        0x00, 0x10, 0, 0,                               // data_offset 4096
        10, 0, 0, 0, 0, 0, 0, 0,                        // data_len 10
    ];
    assert_eq!(&header[..fixed.len()], fixed);
    assert_eq!(header[24..28], memarts_protocol::crc32c(data).to_le_bytes());
    assert_eq!(header[28..32], 60u32.to_le_bytes(), "identity length 4*8+2+3+3+4+2*8");
    assert_eq!(&header[32..42], &[2, 0, 0, 0, 0, 0, 0, 0, b's', b'3']);
    let crc_at = format::header_len(60) - 4;
    assert_eq!(header[crc_at..crc_at + 4], memarts_protocol::crc32c(&header[..crc_at]).to_le_bytes());
    let checked = verify::header(&header, &key.identity_bytes()).unwrap();
    assert_eq!(
        checked,
        verify::Data { offset: 4096, len: 10, crc32c: memarts_protocol::crc32c(data), flags: 0 }
    );
    assert_eq!(verify::data(&checked, data), Ok(()));
}

fn words(len: usize) -> Vec<AtomicU64> {
    (0..len / 8).map(|_| AtomicU64::new(0)).collect()
}

fn loaded(words: &[AtomicU64]) -> Vec<u64> {
    words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
}

#[test]
fn meta_table_header_and_entry_words() {
    let w = words(meta_table::table_len(16));
    let table = MetaTable::init(&w, 60_000).unwrap();
    let magic = u64::from_le_bytes(*b"MAMETAT1");
    assert_eq!(loaded(&w[..8]), [magic, 4, 16, 60_000, 0, 0, 0, 0]);
    table.mark_superseded();
    assert_eq!(w[4].load(Ordering::Relaxed), 1, "word 4: superseded");
    // Key 5 (low) | 7 (high): homes 9 and 1 of 16 (`seq_table.rs`), both windows free, so the
    // first's first place; entry i at word 8 + 8i. An ETag of no other form, as it is (form 5, its
    // length in the argument).
    let key = 7u128 << 64 | 5;
    let published =
        Published { size: 300, etag: "\"abcdefghi\"".into(), last_modified_ms: -2, verified_ms: 1234 };
    table.publish(key, &published);
    let etag = [u64::from_le_bytes(*b"\"abcdefg"), u64::from_le_bytes([b'h', b'i', b'"', 0, 0, 0, 0, 0])];
    let entry = 8 + 8 * 9;
    let want = [2, 5, 7, 300, 1234 << 20 | 5 << 16 | 11, (-2i64) as u64, etag[0], etag[1]];
    assert_eq!(loaded(&w[entry..entry + 8]), want);
    // A quoted MD5 (form 2): its 16 bytes. Key 6 | 7: homes 3 and 4.
    let key = 7u128 << 64 | 6;
    let md5 = "\"000102030405060708090a0b0c0d0e0f\"";
    table.publish(key, &Published { size: 1, etag: md5.into(), last_modified_ms: 0, verified_ms: 9 });
    let entry = 8 + 8 * 3;
    let want = [2, 6, 7, 1, 9 << 20 | 2 << 16, 0, 0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
    assert_eq!(loaded(&w[entry..entry + 8]), want);
    // The same through a file: a fresh table's first words.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta-0.table");
    let _file = TableFile::create(&path, 100, 5000).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), meta_table::table_len(100), "sized as asked");
    let head: Vec<u64> = bytes[..64].chunks(8).map(|b| u64::from_ne_bytes(b.try_into().unwrap())).collect();
    assert_eq!(head, [magic, 4, 100, 5000, 0, 0, 0, 0]);
}

#[test]
fn resident_table_header_and_entry_words() {
    let w = words(resident_table::table_len(16));
    let table = ResidentTable::init(&w).unwrap();
    let magic = u64::from_le_bytes(*b"MAPINTB1");
    assert_eq!(loaded(&w[..16]), [magic, 2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    table.mark_superseded();
    assert_eq!(w[3].load(Ordering::Relaxed), 1, "word 3: superseded");
    // Id 3 (low) | 9 (high): homes 5 and 4, entry i at word 16 + 8i.
    let id = 9u128 << 64 | 3;
    let stamp = Stamp { ino: 77, size: 8192, mtime_ns: 1_000, ctime_ns: -1 };
    assert_eq!(table.insert(id, stamp), Some(5));
    let entry = 16 + 8 * 5;
    assert_eq!(loaded(&w[entry..entry + 8]), [2, 3, 9, 77, 8192, 1_000, u64::MAX, 0]);
    let found = table.lookup(id).unwrap();
    table.note_read(&found);
    assert_eq!(w[entry + 7].load(Ordering::Relaxed), 1, "word +7: reads, outside the seqlock");
    assert!(table.withdraw(id));
    assert_eq!(loaded(&w[entry..entry + 3]), [4, 0, 0], "withdrawn: the id zeroed under a new seq");
    // A fresh table in its file: the header, then the owner lock (glibc's, not frozen here).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resident-0.table");
    let _file = ResidentFile::create(&path, 100).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), resident_table::table_len(100), "sized as asked");
    let head: Vec<u64> = bytes[..64].chunks(8).map(|b| u64::from_ne_bytes(b.try_into().unwrap())).collect();
    assert_eq!(head, [magic, 2, 100, 0, 0, 0, 0, 0]);
}

#[test]
fn packed_table_header_and_entry_words() {
    let w = words(packed_table::table_len(16));
    let table = PackedTable::init(&w).unwrap();
    let magic = u64::from_le_bytes(*b"MAPACKT1");
    assert_eq!(loaded(&w[..8]), [magic, 3, 16, 0, 0, 0, 0, 0]);
    table.mark_superseded();
    assert_eq!(w[3].load(Ordering::Relaxed), 1, "word 3: superseded");
    // Chunk id 5 (low) | 7 (high): homes 9 and 1, entry i at word 8 + 5i.
    let id = 7u128 << 64 | 5;
    table.publish(id, RecordPlace { segment: 0x2a, offset: 0x1234_5678, len: 4160 });
    let entry = 8 + 5 * 9;
    assert_eq!(loaded(&w[entry..entry + 5]), [2, 5, 7, 4160 << 32 | 0x2a, 0x1234_5678]);
}

#[test]
fn segment_header_record_and_index_bytes() {
    let mut header = b"MASEG001".to_vec();
    header.extend_from_slice(&0x2au64.to_le_bytes());
    assert_eq!(segment::segment_header(0x2a).to_vec(), header);
    // A record of 3 bytes of data for a 5-byte identity: head, identity, data, zeros to 8.
    let head = segment::encode_head(b"ident", 3, 0xdead_beef, 1).unwrap();
    let mut want = b"MRC1".to_vec();
    want.extend_from_slice(&5u32.to_le_bytes());
    want.extend_from_slice(&3u32.to_le_bytes());
    want.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    want.extend_from_slice(&[1, 0, 0, 0]);
    let mut crc_input = want.clone();
    crc_input.extend_from_slice(b"ident");
    want.extend_from_slice(&memarts_protocol::crc32c(&crc_input).to_le_bytes());
    want.extend_from_slice(b"ident");
    assert_eq!(head, want);
    assert_eq!(segment::padding(5, 3), 0, "24 + 5 + 3 = 32: already a multiple of 8");
    assert_eq!(segment::padding(5, 4), 7);
    assert_eq!(segment::record_len(5, 4), 40);
    // An index of one entry: magic, count, (id, offset, record length), CRC32C of all before.
    let index = segment::encode_index(&[IndexEntry { id: 7u128 << 64 | 5, offset: 16, record_len: 32 }]);
    let mut want = b"MASEGIX1".to_vec();
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&(7u128 << 64 | 5).to_le_bytes());
    want.extend_from_slice(&16u32.to_le_bytes());
    want.extend_from_slice(&32u32.to_le_bytes());
    let crc = memarts_protocol::crc32c(&want);
    want.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(index, want);
}
