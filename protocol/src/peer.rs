//! The peer protocol: chunk reads between the nodes of a cluster pool, over TCP, framed exactly as
//! the Unix-socket protocol ([`crate::frame`], its limits checked before any allocation).
//!
//! A connection opens with the server's [`PeerChallenge`] (a fresh nonce); the client answers with
//! [`PeerRequest::Hello`]: its node id, its own nonce, and a proof (an HMAC over both nonces and its
//! id, keyed by the cluster secret); the server answers [`PeerResponse::Welcome`] with its own proof
//! over the nonces and its id, so each side knows the other holds the secret before a request is
//! parsed (S6). Then one request and one response at a time, as on the Unix socket. The listener
//! serves chunk reads and its counters only: no uploads, no deletes, no metadata of its own.
//!
//! Enum variants are append-only, as in [`crate::message`].

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::message::{ChunkReply, ChunkRequest, FirstRequest, ObjectMeta};

/// The peer protocol version this build speaks.
pub const PEER_PROTOCOL_VERSION: u32 = 2;

/// Bytes of a nonce and of a proof (HMAC-SHA256).
pub const PEER_NONCE_LEN: usize = 32;

/// The first frame of every peer connection, from the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerChallenge {
    pub protocol_version: u32,
    pub nonce: [u8; PEER_NONCE_LEN],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Must be the first frame from the client. Variant 0 forever.
    Hello { protocol_version: u32, node: String, nonce: [u8; PEER_NONCE_LEN], proof: [u8; PEER_NONCE_LEN] },
    /// One chunk, served from the server's cache or filled from the origin by its single flight;
    /// answered with `Chunk` (its bytes as the payload) or `Error`. Never forwarded to another node.
    ReadChunk(ChunkRequest),
    /// An object's metadata and chunk 0 from the node that owns chunk 0; answered with `First`.
    ReadFirst(FirstRequest),
    /// The slot's cluster counters and view of the members; answered with `Status`.
    Status,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerResponse {
    /// The server's proof; `slot` of `slots` answers (slot `k` listens on the node's port + `k`).
    Welcome {
        node: String,
        slot: u32,
        slots: u32,
        proof: [u8; PEER_NONCE_LEN],
    },
    /// The client was not let in (wrong secret, unknown version, not a member); the server closes.
    Refused(WireError),
    /// A chunk; its bytes follow as the payload (`body` is always inline on this protocol).
    Chunk(ChunkReply),
    /// A request that failed, typed as on the Unix socket.
    Error(WireError),
    /// Answer to `ReadFirst`: the metadata, and chunk 0 (as `Chunk`, bytes in the payload) unless the
    /// object is empty.
    First {
        meta: ObjectMeta,
        chunk: Option<ChunkReply>,
    },
    Status(ClusterStatus),
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
}
