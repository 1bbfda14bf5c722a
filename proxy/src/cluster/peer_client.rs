//! Reads from other nodes: a pool of sealed TCP connections per (node, slot) (`auth.rs`,
//! `sealed.rs`), each request sent to the slot that owns the chunk on that node (its slot count
//! comes with every handshake), and every reply checked before it is used (C3): the exact length
//! of the chunk's range, and the CRC32C of the bytes received, computed here.
//!
//! A failure to reach or hear from a peer in time is [`PeerError::Unreachable`], a reply that fails
//! to open (tampered with on the way) [`PeerError::Forged`]; the engine routes around both. A typed
//! answer of the peer (the object is gone, or changed) is the read's answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use memarts_protocol::peer::{ClusterStatus, PeerRequest, PeerResponse};
use memarts_protocol::{
    chunk_owner, owner_slot, ChunkBody, ChunkReply, ChunkRequest, ErrorCode, FirstRequest, Limits,
    ObjectMeta, ObjectUrl, WireError,
};
use tokio::net::TcpStream;

use super::auth::Secret;
use super::config::{check_address, BadAddress};
use super::members::Member;
use super::sealed::{Sealed, SealedError};
use crate::engine::Fetched;

/// Connections kept per remote slot.
const POOL_PER_SLOT: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Refused, reset, timed out, a failed handshake, bytes that do not check out: go elsewhere.
    #[error("peer {node} unreachable: {why}")]
    Unreachable { node: String, why: String },
    /// A sealed reply that failed to open: tampered with on the way (S8). Go elsewhere, and count it.
    #[error("peer {node}: {why}")]
    Forged { node: String, why: String },
    /// The peer's typed answer (not found, changed, refused by the origin...).
    #[error("{0}")]
    Answer(WireError),
}

/// An answer to `ReadFirst`: the metadata, how long ago the origin confirmed it, and chunk 0.
pub struct First {
    pub meta: ObjectMeta,
    pub confirmed_ago: Duration,
    pub chunk: Option<Fetched>,
}

pub struct PeerClient {
    me: String,
    secret: Secret,
    connect_timeout: Duration,
    peer_timeout: Duration,
    pools: Mutex<HashMap<(String, u32), Vec<Sealed>>>,
    /// Each node's slot count, from its last handshake.
    slots: Mutex<HashMap<String, u32>>,
    forged: AtomicU64,
}

impl PeerClient {
    pub fn new(me: &str, secret: Secret, connect_timeout: Duration, peer_timeout: Duration) -> PeerClient {
        PeerClient {
            me: me.to_string(),
            secret,
            connect_timeout,
            peer_timeout,
            pools: Mutex::default(),
            slots: Mutex::default(),
            forged: AtomicU64::new(0),
        }
    }

    /// Chunk `req` from `member` (its owning slot there), checked.
    pub async fn read_chunk(&self, member: &Member, req: &ChunkRequest) -> Result<Fetched, PeerError> {
        let unreachable = |why: String| PeerError::Unreachable { node: member.id.clone(), why };
        let url = ObjectUrl::parse(&req.url).map_err(|e| PeerError::Answer(bad_request(e.to_string())))?;
        let expected = req.range().map_or(0, |r| r.end - r.start);
        let slots = self.remote_slots(member).await?;
        let id = memarts_protocol::chunk_id(&url, &req.etag, req.chunk_size, req.index);
        let slot = owner_slot(id, slots);
        let (response, payload) =
            self.call(member, slot, &PeerRequest::ReadChunk(req.clone()), expected).await?;
        match response {
            PeerResponse::Chunk(reply) => {
                check(&reply, payload, expected).map_err(|e| unreachable(e.to_string()))
            }
            PeerResponse::Error(e) => Err(answer_or_unreachable(member, e)),
            other => Err(unreachable(format!("unexpected answer to ReadChunk: {other:?}"))),
        }
    }

    /// An object's metadata and chunk 0 from `member` (the slot owning chunk 0 there).
    pub async fn read_first(&self, member: &Member, req: &FirstRequest) -> Result<First, PeerError> {
        let unreachable = |why: String| PeerError::Unreachable { node: member.id.clone(), why };
        let url = ObjectUrl::parse(&req.url).map_err(|e| PeerError::Answer(bad_request(e.to_string())))?;
        let slots = self.remote_slots(member).await?;
        let slot = chunk_owner(&url, req.chunk_size, 0, slots);
        let (response, payload) =
            self.call(member, slot, &PeerRequest::ReadFirst(req.clone()), req.chunk_size).await?;
        match response {
            PeerResponse::First { meta, confirmed_ms_ago, chunk } => {
                let chunk = match chunk {
                    Some(reply) => {
                        let expected = meta.size.min(req.chunk_size);
                        Some(check(&reply, payload, expected).map_err(|e| unreachable(e.to_string()))?)
                    }
                    None => None,
                };
                Ok(First { meta, confirmed_ago: Duration::from_millis(confirmed_ms_ago), chunk })
            }
            PeerResponse::Error(e) => Err(answer_or_unreachable(member, e)),
            other => Err(unreachable(format!("unexpected answer to ReadFirst: {other:?}"))),
        }
    }

    /// The version of `req.url` as the listing of its directory `dir_url` shows it, from `member`
    /// (the slot that owns the directory there), with the others the asking slot serves.
    pub async fn revalidate(
        &self,
        member: &Member,
        dir_url: &str,
        req: &memarts_protocol::RevalidateRequest,
    ) -> Result<memarts_protocol::Revalidated, PeerError> {
        let slots = self.remote_slots(member).await?;
        let slot = memarts_protocol::meta_owner_slot(dir_url, slots);
        match self.call(member, slot, &PeerRequest::Revalidate(req.clone()), 0).await? {
            (PeerResponse::Revalidated(answer), _) => Ok(answer),
            (PeerResponse::Error(e), _) => Err(answer_or_unreachable(member, e)),
            (other, _) => Err(PeerError::Unreachable {
                node: member.id.clone(),
                why: format!("unexpected answer to Revalidate: {other:?}"),
            }),
        }
    }

    /// Tells `member` (the slot that owns directory `dir_url` there) that `url` was written or
    /// deleted here: it forgets what its listings showed of it.
    pub async fn tell_changed(&self, member: &Member, dir_url: &str, url: &str) -> Result<(), PeerError> {
        let slots = self.remote_slots(member).await?;
        let slot = memarts_protocol::meta_owner_slot(dir_url, slots);
        match self.call(member, slot, &PeerRequest::Forget { url: url.to_string() }, 0).await? {
            (PeerResponse::Forgotten, _) => Ok(()),
            (PeerResponse::Error(e), _) => Err(answer_or_unreachable(member, e)),
            (other, _) => Err(PeerError::Unreachable {
                node: member.id.clone(),
                why: format!("unexpected answer to Forget: {other:?}"),
            }),
        }
    }

    /// The counters and member view of `slot` on `member`.
    pub async fn status(&self, member: &Member, slot: u32) -> Result<ClusterStatus, PeerError> {
        match self.call(member, slot, &PeerRequest::Status, 0).await?.0 {
            PeerResponse::Status(s) => Ok(s),
            other => Err(PeerError::Unreachable {
                node: member.id.clone(),
                why: format!("unexpected answer to Status: {other:?}"),
            }),
        }
    }

    /// `member`'s slot count, asking its slot 0 if no handshake told it yet.
    pub async fn remote_slots(&self, member: &Member) -> Result<u32, PeerError> {
        if let Some(n) = self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(&member.id) {
            return Ok(*n);
        }
        let stream = self.connect(member, 0).await?;
        self.checkin(member, 0, stream);
        Ok(self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(&member.id).copied().unwrap_or(1))
    }

    /// One request on a pooled (else new) connection to `slot` of `member`; a pooled connection that
    /// fails (the peer restarted) is replaced by a new one once, but one that does not answer in time
    /// is not tried again: a hung peer costs one deadline. `max_payload` bounds the reply's bytes.
    async fn call(
        &self,
        member: &Member,
        slot: u32,
        request: &PeerRequest,
        max_payload: u64,
    ) -> Result<(PeerResponse, Vec<u8>), PeerError> {
        let deadline = self.peer_timeout + Duration::from_secs_f64(max_payload as f64 / (16u64 << 20) as f64);
        let pooled = self.checkout(member, slot);
        let fresh = pooled.is_none();
        let mut sealed = match pooled {
            Some(s) => s,
            None => self.connect(member, slot).await?,
        };
        let mut result =
            tokio::time::timeout(deadline, self.exchange(&mut sealed, request, max_payload)).await;
        if !fresh && matches!(result, Ok(Err(_))) {
            // A connection from before the peer restarted (or one a forged record ended): drop it,
            // and the others to that slot.
            self.drop_connections(member, slot);
            sealed = self.connect(member, slot).await?;
            result = tokio::time::timeout(deadline, self.exchange(&mut sealed, request, max_payload)).await;
        }
        let node = member.id.clone();
        match result {
            Ok(Ok(reply)) => {
                self.checkin(member, slot, sealed);
                Ok(reply)
            }
            Ok(Err(SealedError::Forged)) => {
                self.drop_connections(member, slot);
                Err(PeerError::Forged { node, why: SealedError::Forged.to_string() })
            }
            Ok(Err(why)) => {
                self.forget_slots(member);
                Err(PeerError::Unreachable { node, why: why.to_string() })
            }
            Err(_) => Err(PeerError::Unreachable { node, why: format!("no answer within {deadline:?}") }),
        }
    }

    /// Connects to `slot` of `member` and authenticates both ways (`auth.rs`): a sealed connection
    /// of its own (tests send what they like on it).
    pub async fn connect(&self, member: &Member, slot: u32) -> Result<Sealed, PeerError> {
        let unreachable = |why: String| PeerError::Unreachable { node: member.id.clone(), why };
        let address = slot_address(&member.address, slot).map_err(|e| unreachable(e.to_string()))?;
        let handshake = async {
            let stream = TcpStream::connect(&address).await.map_err(|e| format!("connect {address}: {e}"))?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sealed, welcome) =
                super::auth::client(stream, &self.secret, &self.me).await.map_err(|e| e.to_string())?;
            if welcome.node != member.id {
                return Err(format!("{address} answered as {:?}, not {:?}", welcome.node, member.id));
            }
            self.slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(member.id.clone(), welcome.slots.max(1));
            Ok(sealed)
        };
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(sealed)) => Ok(sealed),
            Ok(Err(why)) => Err(unreachable(why)),
            Err(_) => {
                Err(unreachable(format!("no handshake with {address} within {:?}", self.connect_timeout)))
            }
        }
    }

    /// Sends `request`, reads the response and its payload (at most `max_payload` bytes); counts a
    /// reply that fails to open.
    async fn exchange(
        &self,
        sealed: &mut Sealed,
        request: &PeerRequest,
        max_payload: u64,
    ) -> Result<(PeerResponse, Vec<u8>), SealedError> {
        sealed.send(request, &[]).await?;
        let limits = Limits {
            max_message: Limits::RESPONSE.max_message,
            max_payload: max_payload.min(u32::MAX.into()) as u32,
        };
        let reply = sealed.recv(limits).await;
        if matches!(reply, Err(SealedError::Forged)) {
            self.forged.fetch_add(1, Ordering::Relaxed);
        }
        reply
    }

    /// Replies that failed to open (S8), since the slot started.
    pub fn forged(&self) -> u64 {
        self.forged.load(Ordering::Relaxed)
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Vec<Sealed>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn checkout(&self, member: &Member, slot: u32) -> Option<Sealed> {
        self.pools().get_mut(&(member.id.clone(), slot)).and_then(Vec::pop)
    }

    fn checkin(&self, member: &Member, slot: u32, stream: Sealed) {
        let mut pools = self.pools();
        let pool = pools.entry((member.id.clone(), slot)).or_default();
        if pool.len() < POOL_PER_SLOT {
            pool.push(stream);
        }
    }

    fn drop_connections(&self, member: &Member, slot: u32) {
        self.pools().remove(&(member.id.clone(), slot));
    }

    /// After a failure the node may have restarted with another slot count: ask again next time.
    fn forget_slots(&self, member: &Member) {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).remove(&member.id);
    }
}

/// `host:port` of slot `slot`: the node's port plus the slot number.
pub fn slot_address(address: &str, slot: u32) -> Result<String, BadAddress> {
    let port = check_address(address, slot + 1)?;
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    Ok(format!("{host}:{}", u32::from(port) + slot))
}

/// A chunk a peer sent that is not what was asked for.
#[derive(Debug, thiserror::Error)]
enum BadChunk {
    #[error("sent {sent} bytes ({body:?}) where {expected} were asked for")]
    Length { sent: usize, body: ChunkBody, expected: u64 },
    #[error("sent bytes whose CRC32C {computed:08x} is not the announced {announced:08x}")]
    Crc { computed: u32, announced: u32 },
}

/// The chunk a peer sent, if it is exactly what was asked for: an inline body of `expected` bytes
/// whose CRC32C, computed here, is the one the peer announced.
fn check(reply: &ChunkReply, payload: Vec<u8>, expected: u64) -> Result<Fetched, BadChunk> {
    if reply.body != ChunkBody::Inline || reply.len != payload.len() as u64 || reply.len != expected {
        return Err(BadChunk::Length { sent: payload.len(), body: reply.body.clone(), expected });
    }
    let crc32c = memarts_protocol::crc32c(&payload);
    if crc32c != reply.crc32c {
        return Err(BadChunk::Crc { computed: crc32c, announced: reply.crc32c });
    }
    Ok(Fetched { data: Bytes::from(payload), crc32c })
}

/// What the peer says of the object or the origin (gone, changed, refused, failing after its retries)
/// is the read's answer; anything else (shutting down, overloaded, no room, a request it could not
/// read, a bug of its own) is routed around like a peer that is gone.
fn answer_or_unreachable(member: &Member, e: WireError) -> PeerError {
    match e.code {
        ErrorCode::NotFound | ErrorCode::Stale | ErrorCode::PermissionDenied | ErrorCode::OriginError => {
            PeerError::Answer(e)
        }
        _ => PeerError::Unreachable { node: member.id.clone(), why: format!("{:?}: {}", e.code, e.message) },
    }
}

fn bad_request(msg: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_listen_on_the_nodes_port_plus_their_number() {
        assert_eq!(slot_address("127.0.0.2:7070", 3).unwrap(), "127.0.0.2:7073");
        assert_eq!(slot_address("[::1]:7070", 0).unwrap(), "[::1]:7070");
        assert!(slot_address("h:65535", 1).is_err());
        assert!(slot_address("nohost", 0).is_err());
    }

    #[test]
    fn a_reply_is_used_only_if_its_length_and_crc_check_out() {
        let data = b"twelve bytes".to_vec();
        let reply = ChunkReply {
            len: 12,
            crc32c: memarts_protocol::crc32c(&data),
            body: ChunkBody::Inline,
            from_cache: true,
        };
        assert_eq!(check(&reply, data.clone(), 12).unwrap().data, Bytes::from(data.clone()));
        assert!(
            matches!(check(&reply, data.clone(), 13), Err(BadChunk::Length { .. })),
            "not the range asked for"
        );
        let mut flipped = data.clone();
        flipped[0] ^= 1;
        assert!(matches!(check(&reply, flipped, 12), Err(BadChunk::Crc { .. })));
        let fd = ChunkReply { body: ChunkBody::Fd { offset: 0 }, ..reply };
        assert!(check(&fd, data, 12).is_err());
    }
}
