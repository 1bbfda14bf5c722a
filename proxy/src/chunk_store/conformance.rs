//! Conformance suite: every case is an async function taking `Arc<dyn IoEngine>`, and the
//! `conformance!` macro runs each one against both [`PreadEngine`] and [`UringEngine`]. This
//! file holds the I/O-engine-level cases; `conformance_store.rs` holds the `ChunkStore` ones.

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::Bytes;

use super::conformance_store as store_cases;
use super::{IoEngine, PreadEngine, UringEngine};

pub(super) fn pread_engine() -> Arc<dyn IoEngine> {
    Arc::new(PreadEngine::new())
}

/// A deliberately small ring (6 ops in flight) so that the concurrency cases overflow it.
pub(super) fn uring_engine() -> Arc<dyn IoEngine> {
    Arc::new(UringEngine::new(8).expect("io_uring must be available on the test machines"))
}

/// Deterministic, position-dependent test bytes.
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn temp_file(dir: &tempfile::TempDir, name: &str) -> Arc<File> {
    let file = File::options().read(true).write(true).create_new(true).open(dir.path().join(name)).unwrap();
    Arc::new(file)
}

const SIZES: [usize; 8] = [0, 1, 4095, 4096, 4097, 1 << 20, (1 << 20) + 1, 8 << 20];

async fn round_trip_sizes(io: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        for offset in [0u64, 4096, 4097] {
            let file = temp_file(&dir, &format!("f{i}-{offset}"));
            let data = pattern(len, i as u64 + offset);
            io.write_at(Arc::clone(&file), offset, Bytes::from(data.clone())).await.unwrap();
            io.fsync(Arc::clone(&file), true).await.unwrap();
            assert_eq!(file.metadata().unwrap().len(), if len == 0 { 0 } else { offset + len as u64 });
            let read = io.read_at(Arc::clone(&file), offset, len).await.unwrap();
            assert_eq!(read.len(), len);
            assert!(read == data, "round trip of {len} bytes at {offset} differs");
            if offset > 0 && len > 0 {
                let hole = io.read_at(Arc::clone(&file), 0, offset as usize).await.unwrap();
                assert!(hole.iter().all(|&b| b == 0));
            }
        }
    }
}

async fn read_past_eof_is_unexpected_eof(io: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = temp_file(&dir, "short");
    io.write_at(Arc::clone(&file), 0, Bytes::from(pattern(10_000, 1))).await.unwrap();
    for (offset, len) in [(0, 10_001), (9_999, 2), (10_000, 1), (1 << 30, 4096), (5_000, 1 << 20)] {
        let err = io.read_at(Arc::clone(&file), offset, len).await.expect_err("read past EOF");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "offset {offset} len {len}: {err}");
    }
    assert_eq!(io.read_at(Arc::clone(&file), 10_000, 0).await.unwrap(), Vec::<u8>::new());
    assert_eq!(io.read_at(file, 9_990, 10).await.unwrap(), pattern(10_000, 1)[9_990..]);
}

async fn many_concurrent_ops(io: Arc<dyn IoEngine>) {
    const OPS: usize = 256;
    const LEN: usize = 8192 + 17;
    let dir = tempfile::tempdir().unwrap();
    let shared = temp_file(&dir, "shared");
    let writes: Vec<_> = (0..OPS)
        .map(|i| {
            let data = Bytes::from(pattern(LEN, i as u64));
            tokio::spawn(io.write_at(Arc::clone(&shared), (i * LEN) as u64, data))
        })
        .collect();
    for write in writes {
        write.await.unwrap().unwrap();
    }
    let syncs: Vec<_> = (0..8).map(|i| tokio::spawn(io.fsync(Arc::clone(&shared), i % 2 == 0))).collect();
    let reads: Vec<_> =
        (0..OPS).map(|i| (i, tokio::spawn(io.read_at(Arc::clone(&shared), (i * LEN) as u64, LEN)))).collect();
    for (i, read) in reads {
        assert!(read.await.unwrap().unwrap() == pattern(LEN, i as u64), "read {i} differs");
    }
    for sync in syncs {
        sync.await.unwrap().unwrap();
    }
    // Many files at once, each with its own fd, mixing all three operations.
    let tasks: Vec<_> = (0..OPS)
        .map(|i| {
            let (io, file) = (Arc::clone(&io), temp_file(&dir, &format!("own{i}")));
            tokio::spawn(async move {
                let data = pattern(4096 + i, i as u64 + 1000);
                io.write_at(Arc::clone(&file), 0, Bytes::from(data.clone())).await?;
                io.fsync(Arc::clone(&file), true).await?;
                let back = io.read_at(file, 0, data.len()).await?;
                io::Result::Ok(back == data)
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap());
    }
}

async fn dropped_futures_do_not_disturb_others(io: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = temp_file(&dir, "f");
    io.write_at(Arc::clone(&file), 0, Bytes::from(pattern(1 << 20, 9))).await.unwrap();
    for _ in 0..64 {
        drop(io.read_at(Arc::clone(&file), 0, 1 << 20));
    }
    assert!(io.read_at(file, 0, 1 << 20).await.unwrap() == pattern(1 << 20, 9));
}

macro_rules! conformance {
    ($($case:path => $name:ident),* $(,)?) => {
        mod pread {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $case(super::pread_engine()).await
                }
            )*
        }
        mod uring {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $case(super::uring_engine()).await
                }
            )*
        }
    };
}

conformance! {
    super::round_trip_sizes => round_trip_sizes,
    super::read_past_eof_is_unexpected_eof => read_past_eof_is_unexpected_eof,
    super::many_concurrent_ops => many_concurrent_ops,
    super::dropped_futures_do_not_disturb_others => dropped_futures_do_not_disturb_others,
    super::store_cases::put_get_read_round_trip => store_put_get_read_round_trip,
    super::store_cases::data_flip_is_corrupt => store_data_flip_is_corrupt,
    super::store_cases::header_flip_is_corrupt_and_removed => store_header_flip_is_corrupt_and_removed,
    super::store_cases::truncation_is_corrupt_and_removed => store_truncation_is_corrupt_and_removed,
    super::store_cases::zero_length_file_is_corrupt => store_zero_length_file_is_corrupt,
    super::store_cases::other_keys_file_is_corrupt => store_other_keys_file_is_corrupt,
    super::store_cases::scan_skips_foreign_files => store_scan_skips_foreign_files,
    super::store_cases::open_removes_stale_temp_files => store_open_removes_stale_temp_files,
    super::store_cases::scan_finds_exactly_the_chunks_put => store_scan_finds_exactly_the_chunks_put,
    super::store_cases::concurrent_puts_of_one_key => store_concurrent_puts_of_one_key,
    super::store_cases::oversized_key_is_refused => store_oversized_key_is_refused,
    super::store_cases::non_file_at_chunk_path_is_corrupt_and_removed =>
        store_non_file_at_chunk_path_is_corrupt_and_removed,
    super::store_cases::a_chunk_file_of_another_owner_is_corrupt_and_removed =>
        store_a_chunk_file_of_another_owner_is_corrupt_and_removed,
    super::store_cases::put_over_a_non_file_at_chunk_path_replaces_it =>
        store_put_over_a_non_file_at_chunk_path_replaces_it,
    super::store_cases::chunks_of_the_two_level_layout_are_found_and_moved =>
        store_chunks_of_the_two_level_layout_are_found_and_moved,
}
