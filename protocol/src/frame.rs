//! Frame layout, the single framing implementation for both sides.
//!
//! ```text
//! offset  size  field
//! 0       4     message length M, u32 little-endian
//! 4       4     payload length P, u32 little-endian
//! 8       M     the message: a postcard-encoded `Request` or `Response`
//! 8+M     P     raw payload bytes (inline chunk data), read by the caller straight into its buffer
//! ```
//!
//! Reading is two-phase (as mini-redis does): the 8-byte head is read and checked against the
//! receiver's [`Limits`] before a single byte of the message is allocated. The payload is left on the
//! stream so the caller can read it into its final destination without an intermediate copy.

use serde::{de::DeserializeOwned, Serialize};

use crate::error::FrameError;

/// Length of the fixed frame head.
pub const FRAME_HEAD_LEN: usize = 8;

/// The decoded fixed head of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub message_len: u32,
    pub payload_len: u32,
}

/// What a receiver accepts. Each side sets its own: a proxy accepts small requests, a shim accepts
/// list pages and chunk payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_message: u32,
    pub max_payload: u32,
}

impl Limits {
    /// What a proxy accepts from a client.
    pub const REQUEST: Limits = Limits { max_message: 64 << 10, max_payload: crate::MAX_CHUNK_SIZE as u32 };
    /// What a client accepts from a proxy.
    pub const RESPONSE: Limits = Limits { max_message: 16 << 20, max_payload: crate::MAX_CHUNK_SIZE as u32 };
}

impl FrameHead {
    /// Decodes and bounds-checks a head. Nothing is allocated before this returns `Ok`.
    pub fn decode(bytes: [u8; FRAME_HEAD_LEN], limits: Limits) -> Result<FrameHead, FrameError> {
        let message_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let payload_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if message_len > limits.max_message {
            return Err(FrameError::TooLarge {
                what: "message",
                len: message_len.into(),
                max: limits.max_message.into(),
            });
        }
        if payload_len > limits.max_payload {
            return Err(FrameError::TooLarge {
                what: "payload",
                len: payload_len.into(),
                max: limits.max_payload.into(),
            });
        }
        Ok(FrameHead { message_len, payload_len })
    }

    pub fn encode(self) -> [u8; FRAME_HEAD_LEN] {
        let mut out = [0u8; FRAME_HEAD_LEN];
        out[..4].copy_from_slice(&self.message_len.to_le_bytes());
        out[4..].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }
}

/// Encodes `message` into a complete frame head + message, announcing `payload_len` bytes of payload
/// that the caller writes after it.
pub fn encode<T: Serialize>(message: &T, payload_len: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; FRAME_HEAD_LEN];
    let out = postcard::to_extend(message, std::mem::take(&mut out))?;
    let message_len = out.len() - FRAME_HEAD_LEN;
    let too_large = |what, len: usize| FrameError::TooLarge { what, len: len as u64, max: u32::MAX.into() };
    let head = FrameHead {
        message_len: u32::try_from(message_len).map_err(|_| too_large("message", message_len))?,
        payload_len: u32::try_from(payload_len).map_err(|_| too_large("payload", payload_len))?,
    };
    let mut out = out;
    out[..FRAME_HEAD_LEN].copy_from_slice(&head.encode());
    Ok(out)
}

/// Decodes a message body. Trailing bytes after a complete message are an error: a frame holds
/// exactly one message.
pub fn decode_message<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(FrameError::Decode(postcard::Error::DeserializeBadEncoding));
    }
    Ok(value)
}

/// Synchronous reader (the shim). Returns the head and the decoded message; the payload is left on
/// the stream. `Closed` is returned only when the stream ends exactly between frames.
pub fn read_sync<T: DeserializeOwned, R: std::io::Read>(
    reader: &mut R,
    limits: Limits,
) -> Result<(FrameHead, T), FrameError> {
    let mut head = [0u8; FRAME_HEAD_LEN];
    read_head_sync(reader, &mut head, 0)?;
    finish_read_sync(reader, head, limits)
}

/// Fills `head[filled..]`, distinguishing a clean close (nothing read) from a torn frame.
pub fn read_head_sync<R: std::io::Read>(
    reader: &mut R,
    head: &mut [u8; FRAME_HEAD_LEN],
    mut filled: usize,
) -> Result<(), FrameError> {
    while filled < FRAME_HEAD_LEN {
        match reader.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Second phase of a synchronous read, once the head bytes are in hand.
pub fn finish_read_sync<T: DeserializeOwned, R: std::io::Read>(
    reader: &mut R,
    head: [u8; FRAME_HEAD_LEN],
    limits: Limits,
) -> Result<(FrameHead, T), FrameError> {
    let head = FrameHead::decode(head, limits)?;
    let mut body = vec![0u8; head.message_len as usize];
    reader.read_exact(&mut body)?;
    Ok((head, decode_message(&body)?))
}

/// Asynchronous reader (the proxy), same contract as [`read_sync`].
#[cfg(feature = "async")]
pub async fn read_async<T: DeserializeOwned, R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    limits: Limits,
) -> Result<(FrameHead, T), FrameError> {
    use tokio::io::AsyncReadExt;
    let head = FrameHead::decode(read_head_async(reader).await?, limits)?;
    let mut body = vec![0u8; head.message_len as usize];
    reader.read_exact(&mut body).await?;
    Ok((head, decode_message(&body)?))
}

/// The head's bytes, distinguishing a clean close (nothing read) from a torn frame.
#[cfg(feature = "async")]
async fn read_head_async<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<[u8; FRAME_HEAD_LEN], FrameError> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; FRAME_HEAD_LEN];
    let mut filled = 0;
    while filled < FRAME_HEAD_LEN {
        match reader.read(&mut head[filled..]).await? {
            0 if filled == 0 => return Err(FrameError::Closed),
            0 => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
            n => filled += n,
        }
    }
    Ok(head)
}

/// Length of the CRC32C that ends the head and message of a checked frame.
pub const CHECK_LEN: usize = 4;

/// A checked frame (the peer protocol's, which crosses a network): [`encode`]'s head and message,
/// then the CRC32C of both (u32 little-endian); the payload the caller writes after it carries its
/// own CRC32C in the message. TCP's 16-bit checksum lets damaged segments through now and then; a
/// request or reply damaged on the way must never be taken for another one.
pub fn encode_checked<T: Serialize>(message: &T, payload_len: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = encode(message, payload_len)?;
    let crc = crate::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads a frame of [`encode_checked`]: the head (bounded by `limits` before any allocation), the
/// message and its CRC32C, which must match before the message is decoded. The payload is left on the
/// stream.
#[cfg(feature = "async")]
pub async fn read_checked_async<T: DeserializeOwned, R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    limits: Limits,
) -> Result<(FrameHead, T), FrameError> {
    use tokio::io::AsyncReadExt;
    let raw = read_head_async(reader).await?;
    let head = FrameHead::decode(raw, limits)?;
    let mut body = vec![0u8; FRAME_HEAD_LEN + head.message_len as usize + CHECK_LEN];
    body[..FRAME_HEAD_LEN].copy_from_slice(&raw);
    reader.read_exact(&mut body[FRAME_HEAD_LEN..]).await?;
    let (checked, crc) = body.split_at(body.len() - CHECK_LEN);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let got = crate::crc32c(checked);
    if got != want {
        return Err(FrameError::Damaged { got, want });
    }
    Ok((head, decode_message(&checked[FRAME_HEAD_LEN..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_over_limit_is_rejected_before_allocation() {
        let head = FrameHead { message_len: u32::MAX, payload_len: 0 }.encode();
        let err = FrameHead::decode(head, Limits::REQUEST).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { what: "message", .. }), "{err}");
        let head = FrameHead { message_len: 1, payload_len: u32::MAX }.encode();
        let err = FrameHead::decode(head, Limits::REQUEST).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { what: "payload", .. }), "{err}");
    }

    /// Runs a future over in-memory bytes, which never waits.
    #[cfg(feature = "async")]
    fn ready<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("an in-memory read waited"),
        }
    }

    #[cfg(feature = "async")]
    #[test]
    fn a_checked_frame_with_any_byte_flipped_is_never_read_as_a_message() {
        let message = (7u64, String::from("s3://bucket/key"), 3u32);
        let frame = encode_checked(&message, 5).unwrap();
        let mut r: &[u8] = &frame;
        let (head, got) =
            ready(read_checked_async::<(u64, String, u32), _>(&mut r, Limits::REQUEST)).unwrap();
        assert_eq!((head.payload_len, &got), (5, &message));
        assert!(r.is_empty());
        for i in 0..frame.len() {
            for bit in [0x01u8, 0x80] {
                let mut damaged = frame.clone();
                damaged[i] ^= bit;
                let mut r: &[u8] = &damaged;
                match ready(read_checked_async::<(u64, String, u32), _>(&mut r, Limits::REQUEST)) {
                    Ok(other) => panic!("byte {i} flipped and still read, as {other:?}"),
                    Err(FrameError::Damaged { .. } | FrameError::TooLarge { .. } | FrameError::Io(_)) => {}
                    Err(e) => panic!("byte {i} flipped: {e}"),
                }
            }
        }
    }

    #[test]
    fn torn_head_is_not_a_clean_close() {
        let mut r: &[u8] = &[1, 0, 0];
        let err = read_sync::<u32, _>(&mut r, Limits::REQUEST).unwrap_err();
        assert!(matches!(err, FrameError::Io(_)), "{err}");
        let mut r: &[u8] = &[];
        assert!(matches!(read_sync::<u32, _>(&mut r, Limits::REQUEST), Err(FrameError::Closed)));
    }

    #[test]
    fn trailing_bytes_in_message_are_rejected() {
        let mut frame = encode(&7u32, 0).unwrap();
        frame.push(0);
        frame[0] += 1;
        let mut r: &[u8] = &frame;
        assert!(matches!(read_sync::<u32, _>(&mut r, Limits::REQUEST), Err(FrameError::Decode(_))));
    }
}
