use super::*;

use memarts_disk::chunk_file::ChunkKey;

fn key(index: u64) -> ChunkKey {
    ChunkKey {
        origin: "s3|http://127.0.0.1:9000".into(),
        bucket: "train".into(),
        key: "resident".into(),
        etag: "\"0123abcd\"".into(),
        chunk_size: 1 << 20,
        index,
    }
}

/// A chunk file of `len` bytes of data for `key(0)` at `path`; the data's offset.
fn chunk_file(path: &Path, len: usize) -> usize {
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let mut bytes = format::encode_header(&key(0), len as u64, memarts_protocol::crc32c(&data), 0).unwrap();
    let offset = bytes.len();
    bytes.extend_from_slice(&data);
    std::fs::write(path, bytes).unwrap();
    offset
}

fn check(path: &Path, id: u128) -> Option<u64> {
    let file = File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    check_file(&file, id, len)
}

#[test]
fn a_chunk_is_made_resident_only_if_its_file_is_whole_its_own_and_matches_its_crc() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunk");
    let id = key(0).id().0;
    // Longer than one piece of the check, and not a multiple of it.
    let offset = chunk_file(&path, 3 * PIECE + 1234);
    assert_eq!(check(&path, id), Some((3 * PIECE + 1234) as u64));
    assert_eq!(check(&path, key(1).id().0), None, "another chunk's file");
    // One byte flipped in the last piece.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = offset + 3 * PIECE + 7;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(check(&path, id), None, "a damaged byte");
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(check(&path, id), Some((3 * PIECE + 1234) as u64));
    // Cut short after it was looked at (the length the caller saw is the old one): a short read,
    // not a fault.
    let len = bytes.len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len as u64 - 100).unwrap();
    let file = File::open(&path).unwrap();
    assert_eq!(check_file(&file, id, len), None, "a file cut short");
    // A small chunk: header and data in one piece.
    chunk_file(&path, 10);
    assert_eq!(check(&path, id), Some(10));
}

/// A resident file cut short while resident: the slot never touches its mapping, so it lives on; the
/// pages past the new end simply go.
#[test]
fn a_resident_file_cut_short_does_not_hurt_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunk");
    chunk_file(&path, 2 * PIECE);
    let resident = ResidentChunks::create(&dir.path().join("resident-0.table"), 64 << 20).unwrap();
    let id = key(0).id().0;
    // Settled: a file changed in the last moments is not resident.
    std::thread::sleep(SETTLED + Duration::from_millis(20));
    resident.make_resident(id, &path);
    assert_eq!(resident.usage().0, format::round_up(std::fs::metadata(&path).unwrap().len()), "resident");
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
    resident.release(id);
    assert_eq!(resident.usage().0, 0);
    // Making resident it again (as a read heard meanwhile would) finds a short file and resident chunks nothing.
    resident.make_resident(id, &path);
    assert_eq!(resident.usage().0, 0);
}
