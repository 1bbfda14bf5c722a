//! Golden bytes: the wire encoding of the handshake and of representative messages is frozen here.
//! If one of these fails, the change broke compatibility with deployed shims or proxies: add a new
//! variant or bump `PROTOCOL_VERSION` instead of editing an existing one.

use memarts_protocol::{
    frame, AdmissionStatus, ChunkBody, ChunkReply, ChunkRequest, ErrorCode, Hello, Limits, Request, Response,
    SlotStatus, WireError,
};

fn frame_of(msg: &impl serde::Serialize) -> Vec<u8> {
    frame::encode(msg, 0).unwrap()
}

#[test]
fn hello_is_variant_zero_with_version_first() {
    let bytes = frame_of(&Request::Hello(Hello { protocol_version: 1, client: "ab".into() }));
    assert_eq!(bytes, [5, 0, 0, 0, 0, 0, 0, 0, /* Hello */ 0, /* version */ 1, /* len */ 2, b'a', b'b']);
}

#[test]
fn read_chunk_request_bytes() {
    let req = Request::ReadChunk(ChunkRequest {
        url: "s3://b/k".into(),
        etag: "\"e\"".into(),
        object_size: 300,
        chunk_size: 1 << 20,
        index: 1,
        recheck: false,
    });
    let bytes = frame_of(&req);
    let body: Vec<u8> = [
        &[2u8][..], // ReadChunk
        &[8],
        b"s3://b/k", // url
        &[3],
        b"\"e\"",            // etag
        &[0xac, 0x02],       // 300 as varint
        &[0x80, 0x80, 0x40], // 1 MiB as varint
        &[1],                // index
        &[0],                // recheck
    ]
    .concat();
    assert_eq!(&bytes[8..], &body[..]);
    assert_eq!(bytes[..4], (body.len() as u32).to_le_bytes());
}

#[test]
fn chunk_reply_and_error_bytes() {
    let reply = Response::Chunk(ChunkReply {
        len: 5,
        crc32c: 0x0102_0304,
        body: ChunkBody::Fd { offset: 64 },
        from_cache: true,
    });
    assert_eq!(&frame::encode(&reply, 0).unwrap()[8..], &[3, 5, 0x84, 0x86, 0x88, 0x08, 1, 64, 1]);
    let err = Response::Error(WireError::new(ErrorCode::Stale, "x"));
    assert_eq!(&frame::encode(&err, 0).unwrap()[8..], &[6, 1, 1, b'x', 0]);
}

#[test]
fn every_message_round_trips_through_the_sync_reader() {
    let msgs = vec![
        Request::Hello(Hello { protocol_version: 1, client: "c".into() }),
        Request::Stat { url: "/tmp/x".into(), refresh: true },
        Request::Status,
    ];
    for m in msgs {
        let bytes = frame_of(&m);
        let mut r: &[u8] = &bytes;
        let (head, back): (_, Request) = frame::read_sync(&mut r, Limits::REQUEST).unwrap();
        assert_eq!(head.payload_len, 0);
        assert_eq!(back, m);
        assert!(r.is_empty());
    }
}

#[test]
fn read_first_is_appended_after_the_original_variants() {
    use memarts_protocol::FirstRequest;
    let req = Request::ReadFirst(FirstRequest { url: "/a".into(), chunk_size: 4096, refresh: false });
    assert_eq!(&frame_of(&req)[8..], &[5, 2, b'/', b'a', 0x80, 0x20, 0]);
    let resp = Response::First {
        meta: memarts_protocol::ObjectMeta { size: 0, etag: None, version: None, last_modified_ms: 0 },
        chunk: None,
    };
    assert_eq!(&frame_of(&resp)[8..], &[7, 0, 0, 0, 0, 0]);
}

#[test]
fn prefetch_is_appended_after_cluster_status() {
    use memarts_protocol::PrefetchRequest;
    let req = Request::Prefetch(PrefetchRequest { urls: vec!["/a".into()], chunk_size: 4096 });
    assert_eq!(&frame_of(&req)[8..], &[14, 1, 2, b'/', b'a', 0x80, 0x20]);
    assert_eq!(&frame_of(&Request::PrefetchStatus)[8..], &[15]);
    assert_eq!(&frame_of(&Response::Prefetched { queued: 3 })[8..], &[13, 3]);
    let status =
        Response::PrefetchStatus(memarts_protocol::PrefetchStatus { hinted: 1, ..Default::default() });
    assert_eq!(&frame_of(&status)[8..], &[14, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
}

/// `memarts status` across a rolling upgrade: `SlotStatus` is the struct of protocol version 1,
/// field for field. (Postcard has no optional fields: a struct is its fields in order, and a frame
/// with bytes left over does not decode, so one more field would break `Status` between builds
/// both ways. New counters go in new variants: `AdmissionStatus`.)
fn v1_status_bytes() -> Vec<u8> {
    [
        &[5u8][..],    // Response::Status
        &[1, 4],       // slot, slots
        &[0xac, 0x02], // pid 300
        &[5, 0, 0],    // uptime_ms, connections, requests
        &[10, 3],      // hits, misses
        &[0; 8],       // bytes from cache / origin, origin requests / retries, corrupt, evicted, cached, used
        &[0x80, 0x08], // cache_capacity 1024
        &[1],          // index_ready
        &[5],
        b"pread", // io_engine
        &[2],
        b"/c", // cache_dir
    ]
    .concat()
}

fn v1_status() -> Response {
    Response::Status(SlotStatus {
        slot: 1,
        slots: 4,
        pid: 300,
        uptime_ms: 5,
        hits: 10,
        misses: 3,
        cache_capacity: 1024,
        index_ready: true,
        io_engine: "pread".into(),
        cache_dir: "/c".into(),
        ..SlotStatus::default()
    })
}

#[test]
fn slot_status_keeps_the_bytes_of_version_1() {
    assert_eq!(&frame_of(&v1_status())[8..], &v1_status_bytes()[..]);
}

#[test]
fn a_status_from_a_proxy_of_an_older_build_decodes_and_a_longer_one_is_refused() {
    let old = v1_status_bytes();
    assert_eq!(frame::decode_message::<Response>(&old).unwrap(), v1_status());
    // What the first cut of the eviction branch sent (one more u64 at the end): a client of any
    // build refuses it, which is why the counter is not a field of `SlotStatus`.
    let longer = [&old[..], &[7]].concat();
    assert!(frame::decode_message::<Response>(&longer).is_err());
}

#[test]
fn admission_status_is_appended_after_the_prefetch_variants() {
    assert_eq!(&frame_of(&Request::AdmissionStatus)[8..], &[16]);
    let resp = Response::AdmissionStatus(AdmissionStatus { eviction: "lru".into(), rejected_chunks: 300 });
    assert_eq!(&frame_of(&resp)[8..], &[15, 3, b'l', b'r', b'u', 0xac, 0x02]);
}

#[test]
fn metrics_is_appended_after_admission_status() {
    assert_eq!(&frame_of(&Request::Metrics)[8..], &[17]);
    let resp = Response::Metrics(memarts_protocol::MetricsSnapshot::default());
    assert_eq!(&frame_of(&resp)[8..], &[16, 0]);
}

#[test]
fn touched_is_appended_after_metrics() {
    let req = Request::Touched(vec![memarts_protocol::Touch { id: 1 << 64 | 5, len: 300 }]);
    assert_eq!(
        &frame_of(&req)[8..],
        &[18, 1, 0x85, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 0xac, 0x02]
    );
    assert_eq!(&frame_of(&Response::Touched { counted: 3 })[8..], &[17, 3]);
}

#[test]
fn fill_is_appended_after_touched() {
    let req = Request::Fill(memarts_protocol::FillRequest { urls: vec!["s3://b/k".into()], chunk_size: 300 });
    assert_eq!(&frame_of(&req)[8..], &[19, 1, 8, b's', b'3', b':', b'/', b'/', b'b', b'/', b'k', 0xac, 0x02]);
    let err = memarts_protocol::WireError::new(memarts_protocol::ErrorCode::NotFound, "no");
    let resp = Response::Filled(vec![Err(err)]);
    assert_eq!(frame_of(&resp)[8], 18);
    assert_eq!(&frame_of(&resp)[9..12], &[1, 1, 0], "one result, Err, of code 0");
}

/// The peer protocol's first frames: the server's challenge keeps its layout across versions (so two
/// nodes of different versions tell each other which they speak), and the client's Hello is variant 0
/// with its version first; what follows is a Noise message in the payload.
#[test]
fn peer_challenge_and_hello_bytes() {
    use memarts_protocol::peer::{PeerChallenge, PeerRequest, PeerResponse, PEER_PROTOCOL_VERSION};
    assert_eq!(PEER_PROTOCOL_VERSION, 3);
    let challenge = frame::encode_checked(&PeerChallenge { protocol_version: 3, nonce: [7; 32] }, 0).unwrap();
    let body = [&[3u8][..], &[7; 32]].concat();
    assert_eq!(&challenge[..8], &[33, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&challenge[8..41], &body[..]);
    assert_eq!(challenge[41..], memarts_protocol::crc32c(&challenge[..41]).to_le_bytes());
    let hello = frame::encode_checked(&PeerRequest::Hello { protocol_version: 3 }, 48).unwrap();
    assert_eq!(&hello[..10], &[2, 0, 0, 0, 48, 0, 0, 0, /* Hello */ 0, /* version */ 3]);
    assert_eq!(&frame_of(&PeerResponse::Welcome)[8..], &[0]);
    let refused = PeerResponse::Refused(WireError::new(ErrorCode::PermissionDenied, "x"));
    assert_eq!(frame_of(&refused)[8], 1);
}
