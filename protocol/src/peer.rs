//! The peer protocol: chunk reads between the nodes of a cluster pool, over TCP.
//!
//! ```text
//! server -> client   PeerChallenge { protocol_version, nonce }        a checked frame, in clear
//! client -> server   PeerRequest::Hello { protocol_version }          a checked frame, in clear; its
//!                    payload: Noise `-> psk, e` sealing a PeerHello   payload is the Noise message
//! server -> client   PeerResponse::Welcome, payload: Noise `<- e, ee` sealing a PeerWelcome
//!                    (or PeerResponse::Refused, no payload, and the server closes)
//! then, both ways    sealed frames: records of [u16 big-endian length][Noise transport message]
//! ```
//!
//! The handshake is [`PEER_NOISE`]: both sides prove they hold the cluster secret (the pre-shared key
//! is derived from it) and agree on keys fresh to this connection (ephemeral X25519), so a recorded
//! connection cannot be decrypted later, even with the secret. The prologue binds the server's
//! challenge, so a recorded `Hello` cannot be replayed into another connection (S6, S8).
//!
//! After the handshake every frame is sealed: its plaintext is a frame of [`crate::frame::encode`]
//! (head and message) followed by its payload, cut into records of at most [`SEALED_RECORD_MAX`]
//! plaintext bytes; a frame starts a new record, and its message and its payload never share one.
//! Each record is an AES-256-GCM message under the direction's key with a counter nonce: a flipped,
//! replayed, reordered, dropped or injected record fails to open, and the connection ends (counted).
//! Then one request and one response at a time, as on the Unix socket. The listener serves chunk
//! reads of object-store URLs, first reads and its counters only: no uploads, no deletes, no local
//! paths (S7).
//!
//! Enum variants are append-only within a protocol version, as in [`crate::message`].

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::message::{ChunkReply, ChunkRequest, FirstRequest, ObjectMeta, RevalidateRequest, Revalidated};

/// The peer protocol version this build speaks. 3: the Noise handshake and sealed frames (2 was an
/// HMAC challenge and response, then frames in clear).
pub const PEER_PROTOCOL_VERSION: u32 = 3;

/// Bytes of the server's challenge nonce.
pub const PEER_NONCE_LEN: usize = 32;

/// The Noise protocol of the handshake and the sealed frames.
pub const PEER_NOISE: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// Most bytes of one Noise message (the Noise specification's limit), and of its tag.
pub const NOISE_MESSAGE_MAX: usize = 65535;
pub const NOISE_TAG_LEN: usize = 16;

/// Most plaintext bytes of one sealed record.
pub const SEALED_RECORD_MAX: usize = NOISE_MESSAGE_MAX - NOISE_TAG_LEN;

/// Bytes of a record's length prefix (big-endian).
pub const SEALED_LEN_PREFIX: usize = 2;

/// The first frame of every peer connection, from the server, in clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerChallenge {
    pub protocol_version: u32,
    pub nonce: [u8; PEER_NONCE_LEN],
}

/// What the client's first Noise message seals: who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerHello {
    pub node: String,
}

/// What the server's Noise answer seals: who it is, and which of its slots answers (slot `k`
/// listens on the node's port + `k`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerWelcome {
    pub node: String,
    pub slot: u32,
    pub slots: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRequest {
    /// The client's first frame (in clear); its payload is the Noise message sealing a
    /// [`PeerHello`]. Variant 0 forever.
    Hello { protocol_version: u32 },
    /// One chunk of an object-store object, served from the server's cache or filled from the
    /// origin by its single flight; answered with `Chunk` (its bytes as the payload) or `Error`.
    /// Never forwarded to another node. `recheck` is ignored.
    ReadChunk(ChunkRequest),
    /// An object's metadata and chunk 0 from the node that owns chunk 0; answered with `First`.
    /// `refresh` is ignored.
    ReadFirst(FirstRequest),
    /// The slot's cluster counters and view of the members; answered with `Status`.
    Status,
    /// The version of an object-store object as the listing of its directory shows it, asked of
    /// the node that owns the directory (and its slot that does), which lists it once for the pool;
    /// answered with `Revalidated` (with the other objects the asking node's slot serves).
    Revalidate(RevalidateRequest),
    /// `url` was written or deleted through the asking node: the node that owns its directory
    /// forgets what listings showed of it. Answered with `Forgotten`.
    Forget { url: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerResponse {
    /// The server's answer to `Hello` (in clear); its payload is the Noise message sealing a
    /// [`PeerWelcome`].
    Welcome,
    /// The client was not let in (wrong secret, unknown version, not a member); in clear, and the
    /// server closes.
    Refused(WireError),
    /// A chunk; its bytes follow as the payload (`body` is always inline on this protocol).
    Chunk(ChunkReply),
    /// A request that failed, typed as on the Unix socket.
    Error(WireError),
    /// Answer to `ReadFirst`: the metadata, how long ago the origin last confirmed it (the
    /// receiving node trusts it only for what is left of its own TTL), and chunk 0 (as `Chunk`,
    /// bytes in the payload) unless the object is empty.
    First {
        meta: ObjectMeta,
        confirmed_ms_ago: u64,
        chunk: Option<ChunkReply>,
    },
    Status(ClusterStatus),
    /// Answer to `Revalidate` (as on the Unix socket).
    Revalidated(Revalidated),
    /// Answer to `Forget`.
    Forgotten,
}

/// What one member looks like from a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Reads go to it.
    Alive,
    /// A read failed (refused, reset, no answer in time): reads go around it until it answers again.
    Suspect,
    /// The membership says it is not up (its lease expired), or it has failed for a long time.
    Down,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: String,
    pub address: String,
    pub weight: f64,
    pub state: MemberState,
    /// When the member entered `state`, milliseconds since the Unix epoch (0: since the slot started).
    pub since_ms: i64,
}

/// A slot's part of the cluster: its counters and its view of the members.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This node's id (empty when the slot is not part of a cluster).
    pub node: String,
    pub slot: u32,
    pub slots: u32,
    /// Bytes this slot served its clients from its node's SSD, and fetched from the origin.
    pub bytes_from_cache: u64,
    pub bytes_from_origin: u64,
    /// Chunks and bytes this slot read from peers for its own clients.
    pub peer_reads: u64,
    pub bytes_from_peers: u64,
    /// Peer reads that failed (refused, reset, timed out, bad bytes), and the reads that then went
    /// to the next owner or the origin instead.
    pub peer_errors: u64,
    pub fallbacks: u64,
    /// Chunks and bytes this slot served to other nodes.
    pub served_chunks: u64,
    pub served_bytes: u64,
    /// Peer connections refused (wrong secret, garbage, too many) before a request was parsed.
    pub refused_connections: u64,
    pub members: Vec<MemberStatus>,
    /// Requests of members this slot refused: local paths, anything but an object-store URL (S7).
    pub refused_requests: u64,
    /// Peer connections ended because a sealed record failed to open (flipped, replayed,
    /// reordered, injected: S8), on either side.
    pub forged_frames: u64,
}
