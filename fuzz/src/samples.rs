//! Valid values of every decoded type, one or more per enum variant, for the seed corpus. They are
//! built from the real types (not hand-written bytes), so the seeds follow any change of encoding.

use memarts_protocol::{
    AdmissionStatus, ChunkBody, ChunkReply, ChunkRequest, ErrorCode, FirstRequest, Hello, ListEntry,
    ListPage, ListRequest, ObjectMeta, Request, Response, SlotStatus, Welcome, WireError, PROTOCOL_VERSION,
};
use memarts_proxy::chunk_store::ChunkKey;

fn chunk_request(index: u64) -> ChunkRequest {
    ChunkRequest {
        url: "s3://bucket/train/shard-0001.tar".into(),
        etag: "\"9b2cf535f27731c974343645a3985328\"".into(),
        object_size: 5 << 20 | 17,
        chunk_size: 1 << 20,
        index,
        recheck: index == 5,
    }
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        size: 5 << 20 | 17,
        etag: Some("\"9b2cf535f27731c974343645a3985328\"".into()),
        version: None,
        last_modified_ms: 1_700_000_000_000,
    }
}

fn confirmed() -> memarts_protocol::ConfirmedMeta {
    memarts_protocol::ConfirmedMeta { meta: meta(), confirmed_ms_ago: 1500 }
}

fn revalidate() -> memarts_protocol::RevalidateRequest {
    memarts_protocol::RevalidateRequest {
        url: "s3://bucket/images/0004.jpg".into(),
        chunk_size: 1 << 20,
        slot: 2,
        slots: 8,
    }
}

fn chunk_reply(body: ChunkBody) -> ChunkReply {
    let from_cache = matches!(body, ChunkBody::Fd { .. });
    ChunkReply { len: 1 << 20, crc32c: 0xe306_9283, body, from_cache }
}

/// One request of every variant.
pub fn requests() -> Vec<Request> {
    vec![
        Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "memarts-shim/0.1.0 pid=42".into(),
        }),
        Request::Stat { url: "obs://bucket/images/0001.jpg".into(), refresh: false },
        Request::ReadChunk(chunk_request(3)),
        Request::List(ListRequest {
            url: "s3://bucket/images/".into(),
            recursive: false,
            start_after: Some("s3://bucket/images/0100.jpg".into()),
            max_entries: 1000,
        }),
        Request::Status,
        Request::ReadFirst(FirstRequest {
            url: "/data/local/file.bin".into(),
            chunk_size: 1 << 20,
            refresh: true,
        }),
        Request::ReadChunks(vec![chunk_request(0), chunk_request(1), chunk_request(5)]),
        Request::PutStart { url: "s3://bucket/ckpt/step-100.pt".into() },
        Request::PutData,
        Request::PutFinish { size: 123_456, crc32c: 0x1234_5678 },
        Request::Delete { url: "file:///tmp/old".into() },
        Request::PutMemartsStart { url: "s3://bucket/scratch/x".into() },
        Request::ReadMemarts { url: "s3://bucket/scratch/x".into() },
        Request::Prefetch(memarts_protocol::PrefetchRequest {
            urls: vec!["obs://bucket/images/0002.jpg".into(), "/data/local.bin".into()],
            chunk_size: 1 << 20,
        }),
        Request::PrefetchStatus,
        Request::AdmissionStatus,
        Request::Metrics,
        Request::Touched(vec![memarts_protocol::Touch { id: 0x0123_4567_89ab_cdef, len: 1 << 20 }]),
        Request::Fill(memarts_protocol::FillRequest {
            urls: vec!["s3://bucket/images/0003.jpg".into()],
            chunk_size: 1 << 20,
        }),
        Request::Revalidate(revalidate()),
        Request::Forget { url: "s3://bucket/images/0004.jpg".into() },
        Request::Confirm(vec![("s3://bucket/images/0005.jpg".into(), confirmed())]),
        Request::Listed(vec![memarts_protocol::ListedRange {
            dir: "s3://bucket/images".into(),
            after: Some("images/0003.jpg".into()),
            last: None,
            more: false,
            listed_ms_ago: 12,
            entries: vec![("images/0004.jpg".into(), meta())],
        }]),
        // Boundary values: the last chunk of the largest object, whose nominal end is past u64::MAX.
        Request::ReadChunk(ChunkRequest {
            object_size: u64::MAX,
            chunk_size: u64::MAX - 1,
            index: 1,
            ..chunk_request(0)
        }),
    ]
}

/// One response of every variant (two where a variant holds an inner enum).
pub fn responses() -> Vec<Response> {
    let entry = |url: &str, is_dir| ListEntry {
        url: url.into(),
        is_dir,
        size: if is_dir { 0 } else { 4096 },
        etag: (!is_dir).then(|| "\"e\"".into()),
        last_modified_ms: -1,
    };
    vec![
        Response::Welcome(Welcome {
            protocol_version: PROTOCOL_VERSION,
            slot: 2,
            slots: 4,
            server: "memarts-proxy/0.1.0".into(),
        }),
        Response::Incompatible { supported: PROTOCOL_VERSION, message: "speaks version 1 only".into() },
        Response::Stat(meta()),
        Response::Chunk(chunk_reply(ChunkBody::Inline)),
        Response::Chunk(chunk_reply(ChunkBody::Fd { offset: 4096 })),
        Response::List(ListPage {
            entries: vec![entry("s3://bucket/images/a/", true), entry("s3://bucket/images/b.jpg", false)],
            next: Some("s3://bucket/images/b.jpg".into()),
        }),
        Response::Status(SlotStatus {
            slot: 1,
            slots: 4,
            pid: 4242,
            io_engine: "io_uring".into(),
            cache_dir: "/var/cache/memarts/v1".into(),
            hits: 10,
            misses: 3,
            ..SlotStatus::default()
        }),
        Response::Error(WireError::new(ErrorCode::Stale, "ETag changed during the read")),
        Response::First { meta: meta(), chunk: Some(chunk_reply(ChunkBody::Inline)) },
        Response::Chunks(vec![
            Ok(chunk_reply(ChunkBody::Fd { offset: 4096 })),
            Err(WireError::new(ErrorCode::OriginError, "503 after 3 retries")),
        ]),
        Response::PutAck { received: 1 << 20 },
        Response::Put(meta()),
        Response::Deleted,
        Response::Prefetched { queued: 2 },
        Response::PrefetchStatus(memarts_protocol::PrefetchStatus {
            hinted: 3,
            limit: 8,
            ..Default::default()
        }),
        Response::AdmissionStatus(AdmissionStatus { eviction: "tinylfu".into(), rejected_chunks: 12 }),
        Response::Metrics(memarts_protocol::MetricsSnapshot {
            families: vec![
                memarts_protocol::MetricFamily {
                    name: "hits".into(),
                    help: "Chunks served from the cache".into(),
                    kind: memarts_protocol::MetricKind::Counter,
                    points: vec![memarts_protocol::MetricPoint {
                        labels: vec![],
                        value: memarts_protocol::MetricValue::Number(12.0),
                    }],
                },
                memarts_protocol::MetricFamily {
                    name: "read_seconds".into(),
                    help: "Time to answer a chunk read".into(),
                    kind: memarts_protocol::MetricKind::Histogram,
                    points: vec![memarts_protocol::MetricPoint {
                        labels: vec![("source".into(), "cache".into())],
                        value: memarts_protocol::MetricValue::Histogram {
                            sum: 0.5,
                            count: 3,
                            buckets: vec![(0.001, 2), (f64::INFINITY, 1)],
                        },
                    }],
                },
            ],
        }),
        Response::Touched { counted: 3 },
        Response::Filled(vec![Ok(meta()), Err(WireError::new(ErrorCode::NotFound, "gone"))]),
        Response::Revalidated(memarts_protocol::Revalidated {
            meta: Some(confirmed()),
            more: vec![("s3://bucket/images/0005.jpg".into(), confirmed())],
        }),
        Response::Revalidated(memarts_protocol::Revalidated::default()),
        Response::Forgotten,
        Response::Recorded,
    ]
}

/// Chunk keys of both origin kinds, including empty and non-ASCII fields.
pub fn chunk_keys() -> Vec<ChunkKey> {
    let key = |origin: &str, bucket: &str, key: &str, etag: &str, index| ChunkKey {
        origin: origin.into(),
        bucket: bucket.into(),
        key: key.into(),
        etag: etag.into(),
        chunk_size: 1 << 20,
        index,
    };
    vec![
        key("s3", "bucket", "train/shard-0001.tar", "\"9b2cf535f27731c974343645a3985328\"", 3),
        key("file", "", "/data/local/file.bin", "1700000000-4096", 0),
        key("s3", "b", "d\u{e9}j\u{e0}/vu.jpg", "", u64::MAX),
    ]
}

/// The peer protocol's messages (inside a sealed frame, once opened), one of every variant.
pub fn peer_messages() -> Vec<Vec<u8>> {
    use memarts_protocol::peer::{PeerHello, PeerRequest, PeerResponse, PeerWelcome};
    fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
        postcard::to_stdvec(v).expect("a sample message encodes")
    }
    let first =
        FirstRequest { url: "s3://bucket/train/shard-0001.tar".into(), chunk_size: 1 << 20, refresh: false };
    let inline = || chunk_reply(ChunkBody::Inline);
    vec![
        encode(&PeerRequest::Hello { protocol_version: 3 }),
        encode(&PeerRequest::ReadChunk(chunk_request(2))),
        encode(&PeerRequest::ReadFirst(first)),
        encode(&PeerRequest::Status),
        encode(&PeerRequest::Revalidate(revalidate())),
        encode(&PeerRequest::Forget { url: "s3://bucket/images/0004.jpg".into() }),
        encode(&PeerResponse::Welcome),
        encode(&PeerResponse::Refused(WireError::new(ErrorCode::PermissionDenied, "not a member"))),
        encode(&PeerResponse::Chunk(inline())),
        encode(&PeerResponse::First { meta: meta(), confirmed_ms_ago: 1234, chunk: Some(inline()) }),
        encode(&PeerResponse::Revalidated(memarts_protocol::Revalidated { meta: Some(confirmed()), more: vec![] })),
        encode(&PeerResponse::Forgotten),
        encode(&PeerHello { node: "node-a".into() }),
        encode(&PeerWelcome { node: "node-b".into(), slot: 1, slots: 8 }),
    ]
}
