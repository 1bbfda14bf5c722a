//! The engine's side of the cluster pool. A miss of a chunk another node owns is read from that node
//! (its owning slot), inside the chunk's single flight, so one read per chunk leaves this slot however
//! many clients want it; a peer that cannot be reached is marked suspect and the next owner is asked,
//! down to this node, which then fills the chunk from the origin and keeps it (its turn has come). A
//! chunk read from a peer is not kept here: the pool holds the sum of the nodes' capacity. Reads a
//! peer asks of this slot are served from its cache or filled from the origin, never forwarded.
//!
//! Only object-store URLs are placed in the pool: a local path names a file of each node's own, so
//! it is read here, and a member that asks this node for one (or for anything but an object-store
//! URL) is refused, counted and logged (S7). A member cannot make this slot drop a cached chunk
//! (`recheck`) or skip its metadata cache (`refresh`). Metadata a peer answers with is trusted here
//! only for what is left of its TTL since the origin confirmed it on that node.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use memarts_protocol::peer::ClusterStatus;
use memarts_protocol::{ChunkRequest, ErrorCode, FirstRequest, ObjectMeta, ObjectUrl, OriginKind, WireError};

use super::{parse_url, ChunkOutcome, Engine, Fetched, ReadBy};
use crate::budget::MemoryBudget;
use crate::cluster::peer_client::{First, PeerError};
use crate::cluster::Cluster;

/// Whether chunks of `url` are placed in the pool: object-store objects only.
pub(super) fn pooled(url: &ObjectUrl) -> bool {
    url.kind == OriginKind::S3
}

impl Engine {
    /// Makes this slot part of `cluster`; once, before it serves. Half of the slot's memory budget
    /// becomes the budget of its replies to peers (`peer_server.rs`), the other half stays its own
    /// fills' and uploads'.
    pub fn join_cluster(&self, cluster: Arc<Cluster>) {
        if self.cluster.set(cluster).is_ok() {
            let _ = self.peer_replies.set(self.budget.split_off(self.info.memory_budget / 2));
        }
    }

    /// Bytes of the memory budget held now: fills and uploads, and replies to peers.
    pub fn memory_held(&self) -> u64 {
        let free = self.budget.free() + self.peer_replies.get().map_or(0, MemoryBudget::free);
        self.info.memory_budget.saturating_sub(free)
    }

    /// What the slot's replies to peers may hold at once.
    pub fn peer_reply_budget(&self) -> &MemoryBudget {
        self.peer_replies.get().unwrap_or(&self.budget)
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Chunk `req` from the first owner of `placement` that answers, or `None` when the turn comes to
    /// this node (the caller fills it from the origin and keeps it). A typed answer of a peer (the
    /// object is gone or changed) is the read's.
    pub(super) async fn read_from_peers(
        &self,
        req: &ChunkRequest,
        placement: u64,
    ) -> Option<Result<Fetched, WireError>> {
        let cluster = self.cluster()?;
        let req = ChunkRequest { recheck: false, ..req.clone() };
        for member in cluster.owners(placement) {
            if member.id == cluster.me() {
                return None;
            }
            match cluster.peers.read_chunk(&member, &req).await {
                Ok(f) => {
                    cluster.succeeded(&member.id);
                    cluster.stats.peer_reads.fetch_add(1, Ordering::Relaxed);
                    cluster.stats.bytes_from_peers.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                    return Some(Ok(f));
                }
                Err(PeerError::Answer(e)) => {
                    cluster.succeeded(&member.id);
                    return Some(Err(e));
                }
                Err(e) => self.route_around(cluster, &member.id, &e),
            }
        }
        None
    }

    /// An object's metadata and chunk 0 from the first owner of its chunk 0 that answers, or `None`
    /// when that is this node. The metadata is kept for what is left of its TTL.
    pub(super) async fn read_first_from_peers(
        &self,
        req: &FirstRequest,
        url: &ObjectUrl,
    ) -> Option<Result<(ObjectMeta, Option<ChunkOutcome>), WireError>> {
        let cluster = self.cluster().filter(|_| pooled(url))?;
        let placement =
            memarts_protocol::placement(url.kind.as_str(), &url.bucket, &url.key, req.chunk_size, 0);
        for member in cluster.owners(placement) {
            if member.id == cluster.me() {
                return None;
            }
            let asked = std::time::Instant::now();
            match cluster.peers.read_first(&member, req).await {
                Ok(First { meta, confirmed_ago, chunk }) => {
                    cluster.succeeded(&member.id);
                    if meta.etag.is_some() {
                        // Confirmed by the origin at least that long before we asked.
                        let ago = confirmed_ago.saturating_add(asked.elapsed());
                        self.metadata.cache().put_confirmed(url.to_string(), meta.clone(), ago);
                    }
                    let outcome = chunk.map(|f| {
                        cluster.stats.peer_reads.fetch_add(1, Ordering::Relaxed);
                        cluster.stats.bytes_from_peers.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                        self.stats.misses.fetch_add(1, Ordering::Relaxed);
                        ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false }
                    });
                    return Some(Ok((meta, outcome)));
                }
                Err(PeerError::Answer(e)) => {
                    cluster.succeeded(&member.id);
                    return Some(Err(e));
                }
                Err(e) => self.route_around(cluster, &member.id, &e),
            }
        }
        None
    }

    fn route_around(&self, cluster: &Cluster, node: &str, e: &PeerError) {
        tracing::warn!(node, "peer read failed, asking the next owner: {e}");
        cluster.failed(node);
        cluster.stats.peer_errors.fetch_add(1, Ordering::Relaxed);
        cluster.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// A chunk member `peer` asks for: from this slot's cache, or filled from the origin here (and
    /// kept). Object-store URLs only; its `recheck` is ignored.
    pub async fn serve_peer_chunk(
        self: &Arc<Self>,
        peer: &str,
        req: &ChunkRequest,
    ) -> Result<Fetched, WireError> {
        self.refuse_unpooled(peer, &req.url)?;
        let req = ChunkRequest { recheck: false, ..req.clone() };
        let outcome = self.read_chunk_routed(&req, false, ReadBy::Client).await?;
        match self.outcome_bytes(outcome).await {
            Ok(f) => Ok(f),
            // The file changed under us between its header check and this read: drop it, fill again.
            Err(_) => {
                let again = ChunkRequest { recheck: true, ..req };
                let outcome = self.read_chunk_routed(&again, false, ReadBy::Client).await?;
                self.outcome_bytes(outcome).await
            }
        }
    }

    /// An object's metadata (and how long ago the origin confirmed it) and chunk 0 for member
    /// `peer`, from this node only. Object-store URLs only; its `refresh` is ignored.
    pub async fn serve_peer_first(
        self: &Arc<Self>,
        peer: &str,
        req: &FirstRequest,
    ) -> Result<First, WireError> {
        let url = self.refuse_unpooled(peer, &req.url)?;
        let req = FirstRequest { refresh: false, ..req.clone() };
        let (meta, outcome) = self.read_first_routed(&req, false, ReadBy::Client).await?;
        let confirmed_ago = self.metadata.cache().confirmed_ago(&url.to_string(), &meta).unwrap_or_default();
        let chunk = match outcome {
            Some(o) => Some(self.outcome_bytes(o).await?),
            None => None,
        };
        Ok(First { meta, confirmed_ago, chunk })
    }

    /// `PeerRequest::Revalidate` of member `peer`: this node's answer for the directory it owns
    /// (object-store URLs only).
    pub async fn serve_peer_revalidate(
        self: &Arc<Self>,
        peer: &str,
        req: &memarts_protocol::RevalidateRequest,
    ) -> Result<memarts_protocol::Revalidated, WireError> {
        self.refuse_unpooled(peer, &req.url)?;
        self.metadata.serve_revalidate_of(req, false).await
    }

    /// `PeerRequest::Forget` of member `peer` (object-store URLs only).
    pub fn serve_peer_forget(&self, peer: &str, url: &str) -> Result<(), WireError> {
        self.refuse_unpooled(peer, url)?;
        self.metadata.serve_forget(url)
    }

    /// `url` parsed, if it is one the pool serves; otherwise a typed refusal, counted and logged.
    fn refuse_unpooled(&self, peer: &str, url: &str) -> Result<ObjectUrl, WireError> {
        match parse_url(url) {
            Ok(parsed) if pooled(&parsed) => return Ok(parsed),
            _ => {}
        }
        if let Some(c) = self.cluster() {
            c.stats.refused_requests.fetch_add(1, Ordering::Relaxed);
            c.refusals.note(|suppressed| {
                tracing::warn!(
                    peer,
                    suppressed,
                    "refused a member's read of {:?}: the peer port serves object-store URLs only",
                    url.chars().take(256).collect::<String>()
                )
            });
        }
        Err(WireError::new(
            ErrorCode::PermissionDenied,
            "the peer port serves chunks of object-store URLs (s3://, obs://, oss://) only",
        ))
    }

    /// The bytes of an outcome: as they are, or read (and checked) from the file a hit would pass.
    async fn outcome_bytes(&self, outcome: ChunkOutcome) -> Result<Fetched, WireError> {
        match outcome {
            ChunkOutcome::Bytes { data, crc32c, .. } => Ok(Fetched { data, crc32c }),
            ChunkOutcome::Fd(f) => {
                let read = tokio::task::spawn_blocking(move || {
                    let mut data = vec![0u8; f.len as usize];
                    std::os::unix::fs::FileExt::read_exact_at(&*f.file, &mut data, f.data_offset)?;
                    Ok::<_, std::io::Error>((data, f.crc32c))
                })
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
                let (data, crc32c) = read.map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
                if memarts_protocol::crc32c(&data) != crc32c {
                    return Err(WireError::new(ErrorCode::Corrupt, "a cached chunk failed its checksum"));
                }
                Ok(Fetched { data: Bytes::from(data), crc32c })
            }
        }
    }

    /// This slot's part of the cluster (empty outside one).
    pub fn cluster_status(&self) -> ClusterStatus {
        let Some(c) = self.cluster() else {
            return ClusterStatus {
                slot: self.info.slot,
                slots: self.info.slots,
                ..ClusterStatus::default()
            };
        };
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        ClusterStatus {
            node: c.me().to_string(),
            slot: self.info.slot,
            slots: self.info.slots,
            bytes_from_cache: load(&self.stats.bytes_from_cache),
            bytes_from_origin: load(&self.stats.bytes_from_origin),
            peer_reads: load(&c.stats.peer_reads),
            bytes_from_peers: load(&c.stats.bytes_from_peers),
            peer_errors: load(&c.stats.peer_errors),
            fallbacks: load(&c.stats.fallbacks),
            served_chunks: load(&c.stats.served_chunks),
            served_bytes: load(&c.stats.served_bytes),
            refused_connections: load(&c.stats.refused_connections),
            members: c.members(),
            refused_requests: load(&c.stats.refused_requests),
            forged_frames: load(&c.stats.forged_frames) + c.peers.forged(),
        }
    }
}
