//! Sealed frames (S8): a peer connection after its handshake (`auth.rs`). A frame's plaintext is
//! the frame of [`frame::encode`] (head and message) followed by its payload; each part is cut into
//! records of at most [`SEALED_RECORD_MAX`] bytes, each sent as `[u16 big-endian length][Noise
//! transport message]` (AES-256-GCM under this direction's key, with a counter nonce snow keeps). A
//! record that fails to open (a byte flipped, a record replayed, reordered, dropped or injected: its
//! nonce or its tag is not the one expected) is [`SealedError::Forged`], and the connection is done:
//! the nonces are out of step for good.
//!
//! The receiver bounds the frame's head by its [`Limits`] before it allocates, as on the Unix
//! socket, and opens the payload's records straight into the buffer it returns.

use memarts_protocol::frame::{self, FrameHead, FRAME_HEAD_LEN};
use memarts_protocol::peer::{NOISE_MESSAGE_MAX, NOISE_TAG_LEN, SEALED_LEN_PREFIX, SEALED_RECORD_MAX};
use memarts_protocol::{FrameError, Limits};
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes read from the socket at once, at most (a few records).
const READ_BUFFER: usize = 256 << 10;
/// A send buffer larger than this is given back after its frame is sent (a pooled connection that
/// carried one 64 MiB chunk does not keep 64 MiB).
const KEEP_SEND_BUFFER: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SealedError {
    /// The peer closed the connection between two frames.
    #[error("the peer closed the connection")]
    Closed,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A record that does not open under this connection's key and next nonce: tampered with on
    /// the way (flipped, replayed, reordered, injected) or not from the peer at all.
    #[error("a sealed record failed to open (flipped, replayed, reordered or injected on the way)")]
    Forged,
    /// The frame inside opened but breaks the receiver's limits or does not decode.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Records that opened but do not have the shape of a frame (the peer's fault, not the path's).
    #[error("a sealed frame out of shape: {0}")]
    Shape(&'static str),
}

/// One peer connection after its handshake.
pub struct Sealed {
    stream: TcpStream,
    noise: snow::TransportState,
    /// Bytes read from the socket and not yet used: `inbox[start..end]`.
    inbox: Vec<u8>,
    start: usize,
    end: usize,
    /// The records of the frame being sent.
    outbox: Vec<u8>,
    /// The first record of the frame being received ([`SEALED_RECORD_MAX`] bytes).
    first: Vec<u8>,
}

impl Sealed {
    pub fn new(stream: TcpStream, noise: snow::TransportState) -> Sealed {
        Sealed {
            stream,
            noise,
            inbox: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
            outbox: Vec::new(),
            first: vec![0; SEALED_RECORD_MAX],
        }
    }

    /// Sends `message` and `payload` as one sealed frame.
    pub async fn send<T: Serialize>(&mut self, message: &T, payload: &[u8]) -> Result<(), SealedError> {
        self.seal(message, payload)?;
        self.flush().await
    }

    /// Seals `message` and `payload` as the next frame to send, so that the caller can let go of the
    /// payload before it waits for the peer to take the frame ([`Sealed::flush`]).
    pub fn seal<T: Serialize>(&mut self, message: &T, payload: &[u8]) -> Result<(), SealedError> {
        let head = frame::encode(message, payload.len())?;
        self.outbox.clear();
        seal(&mut self.noise, &head, &mut self.outbox)?;
        seal(&mut self.noise, payload, &mut self.outbox)
    }

    /// Sends the frame [`Sealed::seal`] made.
    pub async fn flush(&mut self) -> Result<(), SealedError> {
        self.stream.write_all(&self.outbox).await?;
        self.outbox.clear();
        if self.outbox.capacity() > KEEP_SEND_BUFFER {
            self.outbox = Vec::new();
        }
        Ok(())
    }

    /// Receives one sealed frame: its message, bounded by `limits` before anything is allocated
    /// past one record, and its payload.
    pub async fn recv<T: DeserializeOwned>(&mut self, limits: Limits) -> Result<(T, Vec<u8>), SealedError> {
        let mut first = std::mem::take(&mut self.first);
        let opened = self.open_record_into(&mut first).await;
        let mut message = first[..*opened.as_ref().unwrap_or(&0)].to_vec();
        self.first = first;
        let n = match opened {
            Err(SealedError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof && self.idle() => {
                return Err(SealedError::Closed)
            }
            r => r?,
        };
        if n < FRAME_HEAD_LEN {
            return Err(SealedError::Shape("a frame's first record is shorter than its head"));
        }
        let head = FrameHead::decode(message[..FRAME_HEAD_LEN].try_into().expect("8 bytes"), limits)?;
        let total = FRAME_HEAD_LEN + head.message_len as usize;
        if n > total {
            return Err(SealedError::Shape("a frame's message shares a record with what follows it"));
        }
        message.resize(total, 0);
        let mut filled = n;
        while filled < total {
            filled += self.open_record_into(&mut message[filled..]).await?;
        }
        let value = frame::decode_message(&message[FRAME_HEAD_LEN..])?;
        let mut payload = vec![0u8; head.payload_len as usize];
        let mut filled = 0;
        while filled < payload.len() {
            filled += self.open_record_into(&mut payload[filled..]).await?;
        }
        Ok((value, payload))
    }

    /// Whether nothing of a next record has been read (a close here is a clean one).
    fn idle(&self) -> bool {
        self.start == self.end
    }

    /// Reads the next record and opens it into the front of `into`; returns its plaintext length.
    /// A record longer than `into` is out of shape.
    async fn open_record_into(&mut self, into: &mut [u8]) -> Result<usize, SealedError> {
        self.fill(SEALED_LEN_PREFIX).await?;
        let len = u16::from_be_bytes([self.inbox[self.start], self.inbox[self.start + 1]]) as usize;
        if len <= NOISE_TAG_LEN {
            // Too short to carry a tag and a byte: nothing a peer sends.
            return Err(SealedError::Forged);
        }
        if len - NOISE_TAG_LEN > into.len() {
            return Err(SealedError::Shape("a record longer than what is left of its frame"));
        }
        self.fill(SEALED_LEN_PREFIX + len).await?;
        let record = &self.inbox[self.start + SEALED_LEN_PREFIX..self.start + SEALED_LEN_PREFIX + len];
        let opened = self.noise.read_message(record, into).map_err(|_| SealedError::Forged)?;
        self.start += SEALED_LEN_PREFIX + len;
        Ok(opened)
    }

    /// Reads until at least `want` unused bytes are in the inbox (at most one record and its
    /// prefix, which always fit).
    async fn fill(&mut self, want: usize) -> Result<(), SealedError> {
        debug_assert!(want <= SEALED_LEN_PREFIX + NOISE_MESSAGE_MAX);
        if self.end - self.start >= want {
            return Ok(());
        }
        if self.start + want > self.inbox.len() {
            self.inbox.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < want {
            let n = self.stream.read(&mut self.inbox[self.end..]).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            self.end += n;
        }
        Ok(())
    }
}

/// Appends `plain` to `out` as records of at most [`SEALED_RECORD_MAX`] plaintext bytes.
fn seal(noise: &mut snow::TransportState, plain: &[u8], out: &mut Vec<u8>) -> Result<(), SealedError> {
    for piece in plain.chunks(SEALED_RECORD_MAX) {
        let at = out.len();
        let len = piece.len() + NOISE_TAG_LEN;
        out.resize(at + SEALED_LEN_PREFIX + len, 0);
        out[at..at + SEALED_LEN_PREFIX].copy_from_slice(&(len as u16).to_be_bytes());
        let written = noise
            .write_message(piece, &mut out[at + SEALED_LEN_PREFIX..])
            .map_err(|e| SealedError::Io(std::io::Error::other(format!("sealing a record: {e}"))))?;
        debug_assert_eq!(written, len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarts_protocol::peer::{PeerRequest, PEER_NOISE};

    /// Both ends of a finished handshake, in memory.
    fn transports() -> (snow::TransportState, snow::TransportState) {
        let build = || snow::Builder::new(PEER_NOISE.parse().unwrap()).psk(0, &[7; 32]).unwrap();
        let (mut i, mut r) = (build().build_initiator().unwrap(), build().build_responder().unwrap());
        let (mut m, mut p) = ([0u8; 1024], [0u8; 1024]);
        let n = i.write_message(&[], &mut m).unwrap();
        r.read_message(&m[..n], &mut p).unwrap();
        let n = r.write_message(&[], &mut m).unwrap();
        i.read_message(&m[..n], &mut p).unwrap();
        (i.into_transport_mode().unwrap(), r.into_transport_mode().unwrap())
    }

    /// The records of one frame as the sender seals them.
    fn frame_bytes(noise: &mut snow::TransportState, payload: &[u8]) -> (Vec<u8>, Vec<usize>) {
        let (mut out, mut bounds) = (Vec::new(), vec![0]);
        let head = frame::encode(&PeerRequest::Status, payload.len()).unwrap();
        for part in [&head[..], payload] {
            for piece in part.chunks(SEALED_RECORD_MAX) {
                seal(noise, piece, &mut out).unwrap();
                bounds.push(out.len());
            }
        }
        (out, bounds)
    }

    /// What a receiver makes of `wire` (then the sender's close).
    async fn receive(receiver: snow::TransportState, wire: Vec<u8>) -> Vec<Result<Vec<u8>, String>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let writer = tokio::spawn(async move {
            let mut s = TcpStream::connect(address).await.unwrap();
            s.write_all(&wire).await.unwrap();
        });
        let mut sealed = Sealed::new(listener.accept().await.unwrap().0, receiver);
        writer.await.unwrap();
        let mut got = Vec::new();
        loop {
            match sealed.recv::<PeerRequest>(Limits::RESPONSE).await {
                Ok((_, payload)) => got.push(Ok(payload)),
                Err(SealedError::Closed) => return got,
                Err(e) => {
                    got.push(Err(e.to_string()));
                    return got;
                }
            }
        }
    }

    fn forged(got: &[Result<Vec<u8>, String>]) -> bool {
        got.last().is_some_and(|r| r.as_ref().is_err_and(|e| e.contains("failed to open")))
    }

    #[tokio::test]
    async fn frames_of_many_records_arrive_whole_and_in_order() {
        let (mut tx, rx) = transports();
        let payloads: Vec<Vec<u8>> = [0usize, 1, SEALED_RECORD_MAX, SEALED_RECORD_MAX + 1, 1 << 20]
            .iter()
            .map(|&n| vec![n as u8; n])
            .collect();
        let mut wire = Vec::new();
        for p in &payloads {
            wire.extend(frame_bytes(&mut tx, p).0);
        }
        let got = receive(rx, wire).await;
        assert_eq!(got, payloads.into_iter().map(Ok).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_flipped_byte_anywhere_is_never_taken_for_a_frame() {
        let (mut tx, _) = transports();
        let (wire, _) = frame_bytes(&mut tx, b"the bytes of a chunk");
        for at in 0..wire.len() {
            let (mut tx, rx) = transports();
            let (mut damaged, _) = frame_bytes(&mut tx, b"the bytes of a chunk");
            damaged[at] ^= 0x40;
            let got = receive(rx, damaged).await;
            assert!(got.iter().all(|r| r.is_err()), "byte {at} flipped and still read: {got:?}");
        }
    }

    #[tokio::test]
    async fn replayed_reordered_dropped_and_injected_records_end_the_connection() {
        let payload = vec![3u8; SEALED_RECORD_MAX + 10];
        // Replayed: the same frame twice.
        let (mut tx, rx) = transports();
        let (one, _) = frame_bytes(&mut tx, &payload);
        let got = receive(rx, [one.clone(), one].concat()).await;
        assert!(got[0].is_ok() && forged(&got) && got.len() == 2, "{got:?}");
        // Reordered: the payload's two records swapped.
        let (mut tx, rx) = transports();
        let (wire, b) = frame_bytes(&mut tx, &payload);
        let swapped = [&wire[..b[1]], &wire[b[2]..b[3]], &wire[b[1]..b[2]]].concat();
        assert!(forged(&receive(rx, swapped).await));
        // Dropped: a frame missing, the next one arrives.
        let (mut tx, rx) = transports();
        let _lost = frame_bytes(&mut tx, b"lost");
        let (next, _) = frame_bytes(&mut tx, b"next");
        assert!(forged(&receive(rx, next).await));
        // Injected: a frame sealed under other keys (a recorded connection's), then the real one.
        let (mut tx, rx) = transports();
        let (mut other, _) = transports();
        let (fake, _) = frame_bytes(&mut other, b"inject");
        let (real, _) = frame_bytes(&mut tx, b"real");
        assert!(forged(&receive(rx, [fake, real].concat()).await));
    }

    /// Records that open (the peer's own) but hold anything at all: the receiver answers with a frame
    /// or a typed error, never a panic, and never allocates past its limits (a message head over
    /// them is refused before the rest is read).
    #[tokio::test]
    async fn records_of_any_plaintext_give_a_frame_or_a_typed_error() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..300 {
            let (mut tx, rx) = transports();
            let mut wire = Vec::new();
            for _ in 0..rng.random_range(1..4) {
                let len = rng.random_range(1..3 * SEALED_RECORD_MAX / 2);
                let mut plain: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                if rng.random_bool(0.5) && plain.len() >= FRAME_HEAD_LEN {
                    // A plausible head: small lengths, so the reader goes on past it.
                    let head = FrameHead {
                        message_len: rng.random_range(0..64),
                        payload_len: rng.random_range(0..200_000),
                    };
                    plain[..FRAME_HEAD_LEN].copy_from_slice(&head.encode());
                }
                for piece in plain.chunks(rng.random_range(1..=SEALED_RECORD_MAX)) {
                    seal(&mut tx, piece, &mut wire).unwrap();
                }
            }
            let got = receive(rx, wire).await;
            // Bytes were sent, so each case ends in frames read and then a close, or in an error.
            assert!(!got.is_empty(), "case {case}: bytes sent and nothing read, no error");
            for payload in got.iter().flatten() {
                assert!(payload.len() <= Limits::RESPONSE.max_payload as usize, "case {case}");
            }
        }
    }
}
