//! The peer handshake (S6, S8): [`PEER_NOISE`] (Noise NNpsk0 over X25519, AES-256-GCM, SHA-256,
//! from the `snow` crate with ring's primitives; nothing here is a cryptographic primitive of our
//! own). The pre-shared key is derived from the cluster secret with HKDF-SHA256, so each side proves
//! it holds the secret, and both agree on keys fresh to the connection (ephemeral X25519: a recorded
//! connection cannot be opened later, even with the secret). The server's challenge nonce is in the
//! prologue, so a client's first message recorded on one connection is refused on any other.
//!
//! In clear: the challenge, and the frames that carry the two Noise messages (a refusal too). Sealed
//! inside them: the client's node id ([`PeerHello`]) and the server's node, slot and slot count
//! ([`PeerWelcome`]). Then every frame is sealed (`sealed.rs`).

use std::sync::LazyLock;

use hkdf::Hkdf;
use memarts_protocol::peer::{
    PeerChallenge, PeerHello, PeerRequest, PeerResponse, PeerWelcome, NOISE_MESSAGE_MAX, PEER_NOISE,
    PEER_NONCE_LEN, PEER_PROTOCOL_VERSION,
};
use memarts_protocol::{frame, Limits};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::sealed::Sealed;

/// What either side sends in clear, before the channel is sealed: small frames, and Noise messages
/// that carry a node id at most.
pub const HANDSHAKE_LIMITS: Limits = Limits { max_message: 4 << 10, max_payload: 1 << 10 };

/// The cluster secret: shared by every member, never logged.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes>)", self.0.len())
    }
}

/// Secrets shorter than this are refused: they could be guessed.
pub const MIN_SECRET_LEN: usize = 16;

impl Secret {
    /// `bytes` with surrounding whitespace (a trailing newline) dropped; `None` if shorter than
    /// [`MIN_SECRET_LEN`].
    pub fn new(bytes: &[u8]) -> Option<Secret> {
        let text = bytes.trim_ascii();
        (text.len() >= MIN_SECRET_LEN).then(|| Secret(text.to_vec()))
    }

    /// Exactly `bytes`, as the cluster's secret file gave them (`secret_file.rs` checks and trims them).
    pub fn from_bytes(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    /// The Noise pre-shared key: HKDF-SHA256 of the secret, bound to this protocol.
    fn psk(&self) -> [u8; 32] {
        let mut key = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"memarts peer psk"), &self.0)
            .expand(PEER_NOISE.as_bytes(), &mut key)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        key
    }

    /// The handshake of one side of the connection `challenge` opened.
    fn noise(&self, challenge: &PeerChallenge, side: Side) -> Result<snow::HandshakeState, HandshakeError> {
        static PARAMS: LazyLock<snow::params::NoiseParams> =
            LazyLock::new(|| PEER_NOISE.parse().expect("a Noise protocol name snow knows"));
        let mut prologue = b"memarts peer\0".to_vec();
        prologue.extend_from_slice(&challenge.protocol_version.to_le_bytes());
        prologue.extend_from_slice(&challenge.nonce);
        let psk = self.psk();
        let builder = snow::Builder::new(PARAMS.clone()).psk(0, &psk).map_err(noise_error)?;
        let builder = builder.prologue(&prologue).map_err(noise_error)?;
        match side {
            Side::Client => builder.build_initiator(),
            Side::Server => builder.build_responder(),
        }
        .map_err(noise_error)
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Client,
    Server,
}

/// Why a handshake failed, as the log and the other side are told.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] memarts_protocol::FrameError),
    #[error("{0}")]
    Refused(String),
}

fn refused(why: impl Into<String>) -> HandshakeError {
    HandshakeError::Refused(why.into())
}

/// A fresh random challenge nonce.
pub fn nonce() -> [u8; PEER_NONCE_LEN] {
    rand::random()
}

/// The client's side: reads the challenge, proves it holds the secret as node `me`, and checks the
/// server's proof; returns the sealed connection and who answered.
pub async fn client(
    mut stream: TcpStream,
    secret: &Secret,
    me: &str,
) -> Result<(Sealed, PeerWelcome), HandshakeError> {
    let (_, challenge): (_, PeerChallenge) = frame::read_checked_async(&mut stream, HANDSHAKE_LIMITS).await?;
    if challenge.protocol_version != PEER_PROTOCOL_VERSION {
        return Err(refused(format!(
            "peer speaks peer protocol {}, this node {PEER_PROTOCOL_VERSION}",
            challenge.protocol_version
        )));
    }
    let mut noise = secret.noise(&challenge, Side::Client)?;
    let hello =
        postcard::to_stdvec(&PeerHello { node: me.to_string() }).map_err(|e| refused(e.to_string()))?;
    let mut message = vec![0u8; NOISE_MESSAGE_MAX];
    let n = noise.write_message(&hello, &mut message).map_err(noise_error)?;
    let mut out = frame::encode_checked(&PeerRequest::Hello { protocol_version: PEER_PROTOCOL_VERSION }, n)?;
    out.extend_from_slice(&message[..n]);
    stream.write_all(&out).await?;
    let (head, answer): (_, PeerResponse) = frame::read_checked_async(&mut stream, HANDSHAKE_LIMITS).await?;
    let mut sealed = vec![0u8; head.payload_len as usize];
    stream.read_exact(&mut sealed).await?;
    match answer {
        PeerResponse::Welcome => {}
        PeerResponse::Refused(e) => return Err(refused(format!("refused: {}", e.message))),
        other => return Err(refused(format!("unexpected answer to Hello: {other:?}"))),
    }
    let n = noise
        .read_message(&sealed, &mut message)
        .map_err(|_| refused("the peer answered without proof of the cluster secret"))?;
    let welcome: PeerWelcome =
        frame::decode_message(&message[..n]).map_err(|e| refused(format!("welcome: {e}")))?;
    let transport = noise.into_transport_mode().map_err(noise_error)?;
    Ok((Sealed::new(stream, transport), welcome))
}

/// The server's side: sends a fresh challenge, checks the client's proof, asks `welcome` whether
/// the node it names may come in (and what to answer), and proves the secret back. A refusal is
/// the caller's to send (in clear: the channel is not sealed).
pub async fn server(
    stream: &mut TcpStream,
    secret: &Secret,
    welcome: impl FnOnce(&str) -> Result<PeerWelcome, HandshakeError>,
) -> Result<(snow::TransportState, String), HandshakeError> {
    let challenge = PeerChallenge { protocol_version: PEER_PROTOCOL_VERSION, nonce: nonce() };
    stream.write_all(&frame::encode_checked(&challenge, 0)?).await?;
    let (head, hello): (_, PeerRequest) = frame::read_checked_async(stream, HANDSHAKE_LIMITS)
        .await
        .map_err(|e| refused(format!("bad first frame: {e}")))?;
    let PeerRequest::Hello { protocol_version } = hello else {
        return Err(refused("the first frame is not Hello"));
    };
    let mut sealed = vec![0u8; head.payload_len as usize];
    stream.read_exact(&mut sealed).await?;
    if protocol_version != PEER_PROTOCOL_VERSION {
        return Err(refused(format!(
            "the client speaks peer protocol {protocol_version}, this node {PEER_PROTOCOL_VERSION}"
        )));
    }
    let mut noise = secret.noise(&challenge, Side::Server)?;
    let mut message = vec![0u8; NOISE_MESSAGE_MAX];
    let n = noise
        .read_message(&sealed, &mut message)
        .map_err(|_| refused("the client did not prove it holds the cluster secret"))?;
    let PeerHello { node } =
        frame::decode_message(&message[..n]).map_err(|e| refused(format!("hello: {e}")))?;
    let answer = welcome(&node)?;
    let answer = postcard::to_stdvec(&answer).map_err(|e| refused(e.to_string()))?;
    let n = noise.write_message(&answer, &mut message).map_err(noise_error)?;
    let mut out = frame::encode_checked(&PeerResponse::Welcome, n)?;
    out.extend_from_slice(&message[..n]);
    stream.write_all(&out).await?;
    Ok((noise.into_transport_mode().map_err(noise_error)?, node))
}

fn noise_error(e: snow::Error) -> HandshakeError {
    refused(format!("noise: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::sealed::SealedError;

    /// A connected pair of sockets on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    fn welcome(node: &str) -> Result<PeerWelcome, HandshakeError> {
        match node {
            "node-a" => Ok(PeerWelcome { node: "node-b".into(), slot: 1, slots: 4 }),
            other => Err(HandshakeError::Refused(format!("{other:?} is not a member of this cluster"))),
        }
    }

    async fn shake(
        client_secret: &Secret,
        server_secret: &Secret,
        me: &str,
    ) -> (Result<(Sealed, PeerWelcome), HandshakeError>, Result<Sealed, HandshakeError>) {
        let (c, mut s) = pair().await;
        let server = async {
            let (noise, node) = server(&mut s, server_secret, welcome).await?;
            assert_eq!(node, "node-a");
            Ok(Sealed::new(s, noise))
        };
        tokio::join!(client(c, client_secret, me), server)
    }

    #[tokio::test]
    async fn members_with_the_secret_get_a_sealed_channel_both_ways() {
        let secret = Secret::new(b"correct horse battery staple, longer\n").unwrap();
        let (client, server) = shake(&secret, &secret, "node-a").await;
        let (mut client, welcome) = client.unwrap();
        let mut server = server.unwrap();
        assert_eq!(welcome, PeerWelcome { node: "node-b".into(), slot: 1, slots: 4 });
        // A frame of several records each way, and an empty one.
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        client.send(&PeerRequest::Status, &big).await.unwrap();
        let (got, payload): (PeerRequest, _) = server.recv(Limits::REQUEST).await.unwrap();
        assert_eq!((got, payload), (PeerRequest::Status, big.clone()));
        server.send(&PeerResponse::Welcome, &[]).await.unwrap();
        let (got, payload): (PeerResponse, _) = client.recv(Limits::RESPONSE).await.unwrap();
        assert_eq!((got, payload.len()), (PeerResponse::Welcome, 0));
        drop(client);
        assert!(matches!(server.recv::<PeerRequest>(Limits::REQUEST).await, Err(SealedError::Closed)));
    }

    #[tokio::test]
    async fn a_wrong_secret_or_a_stranger_is_refused_on_both_sides() {
        let secret = Secret::new(b"correct horse battery staple, longer").unwrap();
        let wrong = Secret::new(b"another secret, as long as the first").unwrap();
        let (client, server) = shake(&wrong, &secret, "node-a").await;
        assert!(client.is_err());
        let why = server.err().unwrap().to_string();
        assert!(why.contains("did not prove"), "{why}");
        let (client, server) = shake(&secret, &secret, "node-z").await;
        assert!(client.is_err());
        assert!(server.err().unwrap().to_string().contains("not a member"));
    }

    #[test]
    fn secrets_are_never_shown_and_short_ones_refused() {
        assert!(Secret::new(b"  short \n").is_none());
        let s = Secret::new(b"0123456789abcdef").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<16 bytes>)");
        let other = Secret::new(b"0123456789abcdeg").unwrap();
        assert_ne!(s.psk(), other.psk());
    }
}
