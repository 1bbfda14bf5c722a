//! Golden bytes: the wire encoding of the handshake and of representative messages is frozen here.
//! If one of these fails, the change broke compatibility with deployed shims or proxies: add a new
//! variant or bump `PROTOCOL_VERSION` instead of editing an existing one.

use memarts_protocol::{
    frame, ChunkBody, ChunkReply, ChunkRequest, ErrorCode, Hello, Limits, Request, Response, WireError,
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
