//! The `message` target: `Request` and `Response` decoding (`frame::decode_message`, postcard), and
//! the peer protocol's `PeerRequest` and `PeerResponse`.
//!
//! A decoded message must encode again, to a canonical form (encoding what that decodes to gives
//! the same bytes) that decodes to the same value, framed or not. Then what the proxy and the shim
//! compute from a decoded message before any validation of their own must hold its invariants:
//! [`ChunkRequest::range`] (the batch size check runs it on every request of a `ReadChunks`) and
//! [`ObjectUrl::parse`] with its display form (the proxy re-parses the URLs it formats).

use std::fmt::Debug;

use memarts_protocol::peer::{PeerRequest, PeerResponse};
use memarts_protocol::{
    frame, ChunkRequest, FrameHead, Limits, ObjectUrl, Request, Response, FRAME_HEAD_LEN,
};
use serde::{de::DeserializeOwned, Serialize};

/// Checks one input; panics on any broken invariant.
pub fn check(data: &[u8]) {
    if let Ok(request) = frame::decode_message::<Request>(data) {
        round_trip(&request);
        check_request(&request);
    }
    if let Ok(response) = frame::decode_message::<Response>(data) {
        round_trip(&response);
        check_response(&response);
    }
    // The peer protocol's messages, which a node decodes from the network (the handshake's in clear,
    // the others once their sealed records opened).
    if let Ok(request) = frame::decode_message::<PeerRequest>(data) {
        round_trip(&request);
    }
    if let Ok(response) = frame::decode_message::<PeerResponse>(data) {
        round_trip(&response);
    }
    if let Ok(hello) = frame::decode_message::<memarts_protocol::peer::PeerHello>(data) {
        round_trip(&hello);
    }
    if let Ok(welcome) = frame::decode_message::<memarts_protocol::peer::PeerWelcome>(data) {
        round_trip(&welcome);
    }
}

/// Seeds: the postcard encoding of every sample request and response, and of the peer protocol's.
pub fn seeds() -> Vec<Vec<u8>> {
    let requests = crate::samples::requests().into_iter().map(|r| postcard::to_stdvec(&r));
    let responses = crate::samples::responses().into_iter().map(|r| postcard::to_stdvec(&r));
    let ours = requests.chain(responses).map(|bytes| bytes.expect("a sample message encodes"));
    ours.chain(crate::samples::peer_messages()).collect()
}

fn round_trip<T>(value: &T)
where
    T: DeserializeOwned + Serialize + Debug,
{
    let bytes = postcard::to_stdvec(value).expect("a decoded message encodes");
    let again: T = frame::decode_message(&bytes).expect("an encoded message decodes");
    // Compared as shown, not with `==`: a float field (a member's weight in a cluster status) may be
    // NaN, which is not equal to itself; the bytes are compared below.
    assert_eq!(format!("{again:?}"), format!("{value:?}"));
    assert_eq!(postcard::to_stdvec(&again).unwrap(), bytes, "the encoding of {value:?} is not canonical");

    let framed = frame::encode(value, 0).expect("a decoded message frames");
    let (head, message) = framed.split_at(FRAME_HEAD_LEN);
    assert_eq!(message, &bytes[..]);
    let limits = Limits { max_message: u32::MAX, max_payload: 0 };
    let head = FrameHead::decode(head.try_into().unwrap(), limits).expect("the head of a framed message");
    assert_eq!(head, FrameHead { message_len: bytes.len() as u32, payload_len: 0 });
}

fn check_request(request: &Request) {
    match request {
        Request::ReadChunk(chunk) => check_chunk_request(chunk),
        Request::ReadChunks(chunks) => chunks.iter().for_each(check_chunk_request),
        Request::List(list) => {
            check_url(&list.url);
            list.start_after.as_deref().map(check_url);
        }
        Request::ReadFirst(first) => check_url(&first.url),
        Request::Prefetch(p) => p.urls.iter().for_each(|u| check_url(u)),
        Request::Fill(f) => f.urls.iter().for_each(|u| check_url(u)),
        Request::Stat { url, .. }
        | Request::PutStart { url }
        | Request::Delete { url }
        | Request::PutMemartsStart { url }
        | Request::ReadMemarts { url }
        | Request::Forget { url } => check_url(url),
        Request::Revalidate(r) => check_url(&r.url),
        Request::Listed(ranges) => ranges.iter().for_each(|r| check_url(&r.dir)),
        Request::Confirm(versions) => versions.iter().for_each(|(u, _)| check_url(u)),
        Request::Hello(_)
        | Request::Status
        | Request::ClusterStatus
        | Request::PrefetchStatus
        | Request::AdmissionStatus
        | Request::Metrics
        | Request::PutData
        | Request::PutFinish { .. }
        | Request::Touched(_) => {}
    }
}

fn check_response(response: &Response) {
    let check_error = |e: &memarts_protocol::WireError| {
        let _ = (e.code.is_retryable(), e.to_string());
    };
    match response {
        Response::List(page) => page.entries.iter().for_each(|entry| check_url(&entry.url)),
        Response::Error(e) => check_error(e),
        Response::Chunks(results) => results.iter().filter_map(|r| r.as_ref().err()).for_each(check_error),
        _ => {}
    }
}

/// `range()` is the chunk's byte range inside the object, or `None` past its end.
fn check_chunk_request(chunk: &ChunkRequest) {
    check_url(&chunk.url);
    let start = chunk.index.checked_mul(chunk.chunk_size);
    match chunk.range() {
        Some(range) => {
            assert_eq!(Some(range.start), start, "{chunk:?}");
            assert!(range.start <= range.end && range.end <= chunk.object_size, "{chunk:?} gives {range:?}");
            assert!(range.end - range.start <= chunk.chunk_size, "{chunk:?} gives {range:?}");
            assert_eq!(range.is_empty(), chunk.chunk_size == 0, "{chunk:?} gives {range:?}");
        }
        None => assert!(start.is_none_or(|start| start >= chunk.object_size), "{chunk:?} has a range"),
    }
}

/// A URL that parses displays as a URL that parses back to the same location.
fn check_url(url: &str) {
    let Ok(parsed) = ObjectUrl::parse(url) else { return };
    let shown = parsed.to_string();
    assert_eq!(
        ObjectUrl::parse(&shown).as_ref(),
        Ok(&parsed),
        "{url:?} parses, its display {shown:?} does not"
    );
    let _ = memarts_protocol::chunk_id(&parsed, "etag", 1 << 20, 0);
}
