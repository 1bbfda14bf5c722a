//! `memarts_shim::Stream`: a sequential reader of one pinned version with read-ahead. Byte-exact in
//! odd pieces across chunk boundaries, after seeks and at the end; an object replaced mid-stream is
//! a typed `Stale` error, never bytes of the new version; and the window really is in flight: the
//! origin sees GETs for chunks ahead of the reader before the reader asks for them.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_shim::{Client, ShimConfig};

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

fn client(fleet: &Fleet, readahead: u64) -> Arc<Client> {
    Arc::new(Client::new(ShimConfig { readahead, ..fleet.client(CS).config().clone() }).unwrap())
}

#[test]
fn a_stream_is_byte_exact_in_odd_pieces_after_seeks_and_at_the_end() {
    let bucket = moto().bucket("stream-exact");
    let want = pattern(1500, 20 * CS as usize + 333);
    moto().put(&bucket, "big", &want);
    let fleet = Fleet::start(2, &[]);
    let client = client(&fleet, 4 * CS);
    let url = format!("s3://{bucket}/big");
    let mut stream = client.open_stream(&url).unwrap();
    assert_eq!(stream.size(), want.len() as u64);
    // Odd pieces, then one read spanning several chunks, to the end.
    let mut got = Vec::new();
    let mut piece = vec![0u8; 7777];
    for _ in 0..30 {
        let n = stream.read(&mut piece[..]).unwrap();
        got.extend_from_slice(&piece[..n]);
    }
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    got.extend_from_slice(&rest);
    assert!(got == want, "a streamed read differs ({} of {} bytes)", got.len(), want.len());
    assert_eq!(stream.read(&mut piece[..]).unwrap(), 0, "a read at the end returns nothing");
    // Seeks: into the middle of a chunk, backwards, past the end, from the end.
    for (to, len) in [(5 * CS + 11, 3 * CS as usize), (CS - 1, 2), (17, 100_000)] {
        assert_eq!(stream.seek(SeekFrom::Start(to)).unwrap(), to);
        let mut buf = vec![0u8; len];
        stream.read_exact(&mut buf).unwrap();
        assert!(buf[..] == want[to as usize..to as usize + len], "after a seek to {to}");
        assert_eq!(stream.stream_position().unwrap(), to + len as u64);
    }
    stream.seek(SeekFrom::Start(want.len() as u64 + 10)).unwrap();
    assert_eq!(stream.read(&mut piece[..]).unwrap(), 0, "a read past the end returns nothing");
    stream.seek(SeekFrom::End(-5)).unwrap();
    let mut tail = Vec::new();
    stream.read_to_end(&mut tail).unwrap();
    assert_eq!(tail[..], want[want.len() - 5..]);
    assert!(stream.seek(SeekFrom::Current(-(want.len() as i64) - 1)).is_err(), "a seek before 0");
}

#[test]
fn an_object_replaced_mid_stream_is_stale_never_mixed() {
    let bucket = moto().bucket("stream-stale");
    let (v1, v2) = (pattern(1600, 16 * CS as usize), pattern(1601, 16 * CS as usize));
    moto().put(&bucket, "o", &v1);
    let fleet = Fleet::start(2, &[]);
    // A window of two chunks, so most of the object is still to fetch when it is replaced.
    let client = client(&fleet, 2 * CS);
    let url = format!("s3://{bucket}/o");
    let mut stream = client.open_stream(&url).unwrap();
    let mut got = vec![0u8; 1000];
    stream.read_exact(&mut got).unwrap();
    moto().put(&bucket, "o", &v2);
    let mut piece = vec![0u8; 10_000];
    let err = loop {
        match stream.read(&mut piece[..]) {
            Ok(0) => panic!("the stream ended without meeting the replaced object"),
            Ok(n) => got.extend_from_slice(&piece[..n]),
            Err(e) => break e,
        }
    };
    assert!(got[..] == v1[..got.len()], "a stream returned bytes of another version");
    assert!(got.len() < v1.len());
    assert!(matches!(err, memarts_shim::Error::Stale(_)), "expected Stale, got {err}");
    // Once the fleet's metadata is refreshed, a new stream pins the new version.
    client.stat_opts(&url, true).unwrap();
    let mut again = Vec::new();
    client.open_stream(&url).unwrap().read_to_end(&mut again).unwrap();
    assert!(again == v2);
}

#[test]
fn the_window_is_in_flight_ahead_of_the_reader() {
    let fleet = Fleet::start(2, &[]);
    // Without read-ahead the origin sees exactly the chunks the reader asked for.
    let bucket = moto().bucket("stream-none");
    moto().put(&bucket, "o", &pattern(1700, 64 * CS as usize));
    let mut stream = client(&fleet, 64 * CS).open_stream(&format!("s3://{bucket}/o")).unwrap();
    stream.set_readahead(0);
    let mut chunk = vec![0u8; CS as usize];
    for _ in 0..4 {
        stream.read_exact(&mut chunk).unwrap();
    }
    assert_eq!(moto().gets_settled(&bucket), 4, "without read-ahead, one GET per chunk read");
    // With it, reading chunks 0..4 in order grows the window 1, 2, 4, 8 and puts chunks up to 11
    // in flight: the origin sees GETs for chunks the reader has not asked for.
    let bucket = moto().bucket("stream-ahead");
    let want = pattern(1701, 64 * CS as usize);
    moto().put(&bucket, "o", &want);
    let mut stream = client(&fleet, 64 * CS).open_stream(&format!("s3://{bucket}/o")).unwrap();
    for i in 0..4 {
        stream.read_exact(&mut chunk).unwrap();
        assert!(chunk[..] == want[i * CS as usize..(i + 1) * CS as usize]);
    }
    assert_eq!(stream.window_chunks(), 8);
    let deadline = Instant::now() + Duration::from_secs(20);
    while moto().gets(&bucket) < 12 {
        assert!(Instant::now() < deadline, "only {} GETs: the window is not in flight", moto().gets(&bucket));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Bounded: nothing beyond the window was fetched.
    assert_eq!(moto().gets_settled(&bucket), 12, "the window fetched more than it holds");
    // The rest streams byte-exact, and the window stops at its bound.
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest[..] == want[4 * CS as usize..]);
    assert_eq!(stream.window_chunks(), 64);
}

#[test]
fn dropping_a_stream_ends_its_fetches() {
    let bucket = moto().bucket("stream-drop");
    moto().put(&bucket, "o", &pattern(1800, 64 * CS as usize));
    let fleet = Fleet::start(2, &[]);
    let cfg = ShimConfig { readahead_workers: 3, ..fleet.client(CS).config().clone() };
    let client = Arc::new(Client::new(cfg).unwrap());
    let mut stream = client.open_stream(&format!("s3://{bucket}/o")).unwrap();
    let mut chunk = vec![0u8; CS as usize];
    for _ in 0..4 {
        stream.read_exact(&mut chunk).unwrap();
    }
    let probe = stream.workers_probe();
    assert!(probe() >= 1, "the stream holds its window");
    assert!(client.readahead_memory_used() > 0, "the window holds chunks ahead");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    while probe() > 0 {
        assert!(Instant::now() < deadline, "{} fetches still hold the window of a dropped stream", probe());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(client.readahead_memory_used(), 0, "a dropped stream's chunks are given back");
}

#[test]
fn the_streams_of_a_process_share_one_read_ahead_memory() {
    let bucket = moto().bucket("stream-budget");
    let objects: Vec<Vec<u8>> = (0..3).map(|i| pattern(1900 + i, 24 * CS as usize)).collect();
    for (i, data) in objects.iter().enumerate() {
        moto().put(&bucket, &format!("o{i}"), data);
    }
    let fleet = Fleet::start(2, &[]);
    let budget = 5 * CS;
    let cfg =
        ShimConfig { readahead: 16 * CS, readahead_memory: budget, ..fleet.client(CS).config().clone() };
    let client = Arc::new(Client::new(cfg).unwrap());
    let mut streams: Vec<_> =
        (0..3).map(|i| client.open_stream(&format!("s3://{bucket}/o{i}")).unwrap()).collect();
    let mut got = vec![Vec::new(); 3];
    let mut piece = vec![0u8; (CS / 3) as usize];
    let mut most = 0;
    // Three streams read in turns, each wanting a window of 16 chunks: together they hold at
    // most the budget, and every byte is right.
    loop {
        let mut any = false;
        for (s, out) in streams.iter_mut().zip(&mut got) {
            let n = s.read(&mut piece[..]).unwrap();
            out.extend_from_slice(&piece[..n]);
            any |= n > 0;
            most = most.max(client.readahead_memory_used());
        }
        if !any {
            break;
        }
    }
    for (i, data) in objects.iter().enumerate() {
        assert!(got[i] == *data, "stream {i} read other bytes");
    }
    assert!(most <= budget, "the windows held {most} bytes, over the {budget}-byte budget");
    assert!(most >= 2 * CS, "only {most} bytes were ever read ahead: no window at all");
}
