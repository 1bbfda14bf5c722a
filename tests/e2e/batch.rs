//! `ReadChunks`: several chunks in one round trip, a per-chunk error leaves the rest (and the
//! connection) intact, and an oversized batch is refused typed.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use memarts_protocol::{
    frame, ChunkBody, ChunkRequest, ErrorCode, Hello, Limits, Request, Response, PROTOCOL_VERSION,
};

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

fn call(s: &mut UnixStream, req: &Request) -> (Response, u32) {
    s.write_all(&frame::encode(req, 0).unwrap()).unwrap();
    let (head, resp) = frame::read_sync::<Response, _>(s, Limits::RESPONSE).unwrap();
    (resp, head.payload_len)
}

#[test]
fn a_batch_returns_every_chunk_and_isolates_a_bad_one() {
    let bucket = moto().bucket("batch");
    let want = pattern(400, 3 * CS as usize + 10);
    moto().put(&bucket, "o", &want);
    let fleet = Fleet::start(1, &[]);
    let url = format!("s3://{bucket}/o");
    let meta = fleet.client(CS).stat(&url).unwrap();
    let mut s = UnixStream::connect(fleet.run_dir.join("proxy-0.sock")).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let hello = Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "batch-test".into() });
    assert!(matches!(call(&mut s, &hello).0, Response::Welcome(_)));

    let req = |index| ChunkRequest {
        url: url.clone(),
        etag: meta.etag.clone().unwrap(),
        object_size: meta.size,
        chunk_size: CS,
        index,
        recheck: false,
    };
    let too_many = Request::ReadChunks((0..65).map(|_| req(0)).collect());
    match call(&mut s, &too_many).0 {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::BadRequest, "{e}"),
        other => panic!("an oversized batch was served: {other:?}"),
    }

    // Chunk ranges whose lengths add up past u64::MAX (found reading the fuzzed decoder's callers):
    // refused typed, not a wrapped total under the cap or a panic.
    let huge = |index| ChunkRequest { object_size: u64::MAX, chunk_size: 1 << 63, ..req(index) };
    match call(&mut s, &Request::ReadChunks(vec![huge(0), huge(0), huge(0)])).0 {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::BadRequest, "{e}"),
        other => panic!("a batch of 3 x 2^63 bytes was served: {other:?}"),
    }

    // Chunks 3 and 1 (cold: inline payloads, in request order) around one past the end.
    let (resp, payload_len) = call(&mut s, &Request::ReadChunks(vec![req(3), req(9), req(1)]));
    let Response::Chunks(results) = resp else { panic!("{resp:?}") };
    assert_eq!(results.len(), 3);
    assert!(matches!(&results[1], Err(e) if e.code == ErrorCode::BadRequest), "{:?}", results[1]);
    let lens: Vec<u64> = [&results[0], &results[2]]
        .iter()
        .map(|r| {
            let c = r.as_ref().unwrap();
            assert_eq!(c.body, ChunkBody::Inline);
            c.len
        })
        .collect();
    assert_eq!(lens, vec![10, CS]);
    assert_eq!(u64::from(payload_len), 10 + CS);
    let mut payload = vec![0u8; payload_len as usize];
    s.read_exact(&mut payload).unwrap();
    assert_eq!(&payload[..10], &want[3 * CS as usize..]);
    assert_eq!(&payload[10..], &want[CS as usize..2 * CS as usize]);

    // The connection is still in step.
    assert!(matches!(call(&mut s, &Request::Status).0, Response::Status(_)));
}
