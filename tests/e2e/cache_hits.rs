//! The cache works: second reads never reach the origin, and concurrent misses are coalesced.

use std::sync::Arc;

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn second_read_is_served_from_cache_with_zero_origin_gets() {
    let bucket = moto().bucket("warm");
    let want = pattern(1, 20 * CS as usize + 7);
    moto().put(&bucket, "a", &want);
    let fleet = Fleet::start(4, &[]);
    let client = fleet.client(CS);
    let url = format!("s3://{bucket}/a");
    assert_eq!(client.read(&url).unwrap(), want);
    let after_cold = moto().gets_settled(&bucket);
    assert_eq!(after_cold, 21, "one ranged GET per chunk on the cold read");
    for _ in 0..3 {
        assert_eq!(client.read(&url).unwrap(), want);
    }
    assert_eq!(moto().gets_settled(&bucket), after_cold, "warm reads reached the origin");
    // Warm chunks are read straight from their files (local hits), counted by the slots once
    // reported.
    client.send_read_reports();
    assert_eq!(fleet.total("hits"), 63);
    assert!(fleet.total("bytes_from_cache") >= 3 * want.len() as u64);
}

#[test]
fn sixty_four_concurrent_readers_of_a_cold_object_cause_one_get_per_chunk() {
    let bucket = moto().bucket("herd");
    let want = Arc::new(pattern(2, 16 * CS as usize));
    moto().put(&bucket, "hot", &want);
    let fleet = Fleet::start(2, &[]);
    fleet.wait_index_ready();
    let client = Arc::new(fleet.client(CS));
    let url = format!("s3://{bucket}/hot");
    let barrier = Arc::new(std::sync::Barrier::new(64));
    let readers: Vec<_> = (0..64)
        .map(|_| {
            let (client, url, want, barrier) = (client.clone(), url.clone(), want.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let got = client.read(&url).unwrap();
                assert!(got == *want, "a reader got different bytes");
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(moto().gets_settled(&bucket), 16, "exactly one origin GET per chunk");
    // The first read of a cold object asks for chunk 0 and learns the metadata from that answer.
    assert_eq!(moto().requests(&format!("HEAD /{bucket}/hot")), 0, "a HEAD for a cold object");
}
