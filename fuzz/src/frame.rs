//! The `frame` target: [`memarts_protocol::frame`] fed arbitrary bytes, as requests (proxy limits)
//! and as responses (shim limits), through every reader: the whole input at once, a stream that
//! hands out a few bytes per read and sometimes `Interrupted`, a head resumed after a partial read
//! (`read_head_sync` with `filled > 0`, as the shim does after its readiness peek) and the async
//! reader. All must reach the same outcome and leave the stream at the same place, which must be what
//! a model built from the two decoding steps (`FrameHead::decode`, `decode_message`) predicts.

use std::fmt::Debug;
use std::io::{self, Read};
use std::pin::Pin;
use std::task::{Context, Poll};

use memarts_protocol::{frame, FrameError, FrameHead, Limits, Request, Response, FRAME_HEAD_LEN};
use serde::{de::DeserializeOwned, Serialize};

/// Checks one input; panics on any disagreement or broken invariant.
pub fn check(data: &[u8]) {
    check_head(data);
    check_reads::<Request>(data, Limits::REQUEST);
    check_reads::<Response>(data, Limits::RESPONSE);
}

/// Seeds: every sample request and response framed, some with payload bytes after the message.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, request) in crate::samples::requests().iter().enumerate() {
        let payload = if matches!(request, Request::PutData) { 5 } else { 0 };
        let mut bytes = frame::encode(request, payload).expect("a sample request encodes");
        bytes.extend(std::iter::repeat_n(i as u8, payload));
        out.push(bytes);
    }
    for response in crate::samples::responses() {
        let payload = if matches!(response, Response::Chunk(_)) { 3 } else { 0 };
        let mut bytes = frame::encode(&response, payload).expect("a sample response encodes");
        bytes.extend_from_slice(&b"abc"[..payload]);
        out.push(bytes);
    }
    out
}

/// `FrameHead::decode` under limits taken from the input: accepts exactly the heads within them, and
/// re-encodes what it accepts to the same bytes.
fn check_head(data: &[u8]) {
    let Some(head) = data.first_chunk::<FRAME_HEAD_LEN>() else { return };
    let word =
        |at: usize| data.get(at..at + 4).map_or(u32::MAX, |b| u32::from_le_bytes(b.try_into().unwrap()));
    let limits = Limits { max_message: word(8), max_payload: word(12) };
    let (message_len, payload_len) = (word(0), word(4));
    match FrameHead::decode(*head, limits) {
        Ok(decoded) => {
            assert_eq!(decoded, FrameHead { message_len, payload_len });
            assert!(message_len <= limits.max_message && payload_len <= limits.max_payload);
            assert_eq!(&decoded.encode(), head);
        }
        Err(FrameError::TooLarge { what, len, max }) => {
            let (name, found, limit) = if message_len > limits.max_message {
                ("message", message_len, limits.max_message)
            } else {
                assert!(payload_len > limits.max_payload, "head {head:?} refused within {limits:?}");
                ("payload", payload_len, limits.max_payload)
            };
            assert_eq!((what, len, max), (name, found.into(), limit.into()));
        }
        Err(other) => panic!("FrameHead::decode failed with {other}"),
    }
}

/// How a read ended, comparable across readers; `consumed` is where the stream was left.
#[derive(Debug, PartialEq)]
enum Outcome<T> {
    Frame { head: FrameHead, message: T, consumed: usize },
    Closed,
    TooLarge { what: &'static str, len: u64, max: u64 },
    Decode(postcard::Error),
    Io(io::ErrorKind),
}

impl<T> Outcome<T> {
    fn of(result: Result<(FrameHead, T), FrameError>, consumed: usize) -> Outcome<T> {
        match result {
            Ok((head, message)) => Outcome::Frame { head, message, consumed },
            Err(FrameError::Closed) => Outcome::Closed,
            Err(FrameError::TooLarge { what, len, max }) => Outcome::TooLarge { what, len, max },
            Err(FrameError::Decode(e)) => Outcome::Decode(e),
            Err(FrameError::Io(e)) => Outcome::Io(e.kind()),
            Err(other) => panic!("a frame error the fuzzer does not know: {other}"),
        }
    }
}

/// What a read of `data` must give, built from the two decoding steps.
fn model<T: DeserializeOwned>(data: &[u8], limits: Limits) -> Outcome<T> {
    if data.is_empty() {
        return Outcome::Closed;
    }
    let Some(head) = data.first_chunk::<FRAME_HEAD_LEN>() else {
        return Outcome::Io(io::ErrorKind::UnexpectedEof);
    };
    let head = match FrameHead::decode(*head, limits) {
        Ok(head) => head,
        Err(e) => return Outcome::of(Err(e), 0),
    };
    let end = FRAME_HEAD_LEN + head.message_len as usize;
    let Some(body) = data.get(FRAME_HEAD_LEN..end) else {
        return Outcome::Io(io::ErrorKind::UnexpectedEof);
    };
    match frame::decode_message(body) {
        Ok(message) => Outcome::Frame { head, message, consumed: end },
        Err(e) => Outcome::of(Err(e), 0),
    }
}

/// Where the stream is left is compared for frames only: after an error the connection is dropped.
/// Outcomes that differ by `==` are compared as shown: a float of a message (a metrics histogram's
/// bucket bound) may be NaN, which is not equal to itself.
fn same<T: PartialEq + Debug>(what: &str, got: Outcome<T>, expected: &Outcome<T>) {
    if &got != expected {
        assert_eq!(format!("{got:?}"), format!("{expected:?}"), "{what} disagrees with the model");
    }
}

fn check_reads<T>(data: &[u8], limits: Limits)
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let expected = model::<T>(data, limits);

    let mut whole = data;
    let result = frame::read_sync::<T, _>(&mut whole, limits);
    same("read_sync", Outcome::of(result, data.len() - whole.len()), &expected);

    let mut pieces = Pieces::new(data);
    let result = frame::read_sync::<T, _>(&mut pieces, limits);
    same("read_sync in pieces", Outcome::of(result, pieces.at), &expected);

    // The shim's resumed read: part of the head is already in hand when it calls read_head_sync.
    let filled = data.len() % (FRAME_HEAD_LEN + 1);
    let mut head = [0u8; FRAME_HEAD_LEN];
    head[..filled].copy_from_slice(&data[..filled]);
    let mut rest = Pieces::new(data);
    rest.at = filled;
    let result = frame::read_head_sync(&mut rest, &mut head, filled)
        .and_then(|()| frame::finish_read_sync(&mut rest, head, limits));
    same("resumed head", Outcome::of(result, rest.at), &expected);

    let mut pieces = Pieces::new(data);
    let result = poll_to_end(frame::read_async::<T, _>(&mut pieces, limits));
    same("read_async in pieces", Outcome::of(result, pieces.at), &expected);

    if let Outcome::Frame { head, message, .. } = expected {
        round_trip(&message, head, limits);
    }
}

/// A decoded frame, encoded again with the same payload length, reads back as the same message.
fn round_trip<T>(message: &T, head: FrameHead, limits: Limits)
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let encoded = frame::encode(message, head.payload_len as usize).expect("a decoded message encodes");
    let mut r: &[u8] = &encoded;
    let (again_head, again) =
        frame::read_sync::<T, _>(&mut r, limits).expect("a re-encoded frame reads back");
    assert!(r.is_empty(), "the re-encoded frame was not read to its end");
    // As shown, not with `==`: a float of the message may be NaN (see `same`).
    assert_eq!(format!("{again:?}"), format!("{message:?}"));
    assert_eq!(again_head.payload_len, head.payload_len);
    assert_eq!(again_head.message_len as usize, encoded.len() - FRAME_HEAD_LEN);
}

/// A stream over `data` that hands out 1 to 16 bytes per read, in a pattern drawn from the data,
/// and now and then fails a read with `Interrupted` (sync) or returns `Pending` (async).
struct Pieces<'a> {
    data: &'a [u8],
    at: usize,
    rng: u32,
}

impl<'a> Pieces<'a> {
    fn new(data: &'a [u8]) -> Pieces<'a> {
        Pieces { data, at: 0, rng: memarts_protocol::crc32c(data) | 1 }
    }

    /// xorshift32: deterministic for a given input, so a crash reproduces.
    fn next(&mut self) -> u32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 17;
        self.rng ^= self.rng << 5;
        self.rng
    }

    /// Copies the next piece into `buf`; `None` when this call should be interrupted instead.
    fn piece(&mut self, buf: &mut [u8]) -> Option<usize> {
        let draw = self.next();
        if draw.is_multiple_of(8) {
            return None;
        }
        let n = (1 + (draw >> 8) as usize % 16).min(buf.len()).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Some(n)
    }
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.piece(buf).ok_or_else(|| io::ErrorKind::Interrupted.into())
    }
}

impl tokio::io::AsyncRead for Pieces<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut tmp = [0u8; 16];
        let room = buf.remaining().min(tmp.len());
        match this.piece(&mut tmp[..room]) {
            Some(n) => {
                buf.put_slice(&tmp[..n]);
                Poll::Ready(Ok(()))
            }
            None => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

/// Drives a future whose reader never waits on anything real: it may return `Pending` (having woken
/// itself), so it is polled until ready, within a bound that a correct reader never reaches.
fn poll_to_end<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    for _ in 0..10_000_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("read_async did not finish on a stream that is always ready again");
}
