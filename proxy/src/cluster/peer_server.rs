//! The peer listener of a slot: `host:port + slot` of this node's peer address. Before a single
//! request is parsed, the client must prove it holds the cluster secret and name a registered member
//! (S6, `auth.rs`); then every frame is sealed (S8, `sealed.rs`) and bounded as on the Unix socket.
//! It serves chunk reads of object-store URLs (from this slot's cache, or filled from the origin by
//! its single flight: never forwarded), first reads and its counters: no uploads, no deletes, no
//! local paths, no `recheck` (S7, `engine/peers.rs`). A reply holds its bytes in the slot's share of
//! the memory budget for peers from before they are read until they are sent, so members that ask
//! and do not read wait for room instead of taking memory. Strangers, wrong secrets, garbage,
//! oversized frames, forged records and silent clients are refused, counted and logged, within a
//! connection limit and timeouts, while members keep being served.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::peer::{PeerRequest, PeerResponse, PeerWelcome};
use memarts_protocol::{frame, ChunkBody, ChunkReply, ErrorCode, Limits, WireError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::HandshakeError;
use super::sealed::{Sealed, SealedError};
use super::Cluster;
use crate::engine::{Engine, Fetched};

/// Members' connections a slot serves at once; more are refused after their handshake (counted).
const MAX_MEMBER_CONNECTIONS: usize = 512;
/// Connections that have not proved themselves yet, at most: past it, the oldest of them is dropped
/// to make room (counted), so a crowd of strangers that connect and say nothing cannot keep a member
/// out (a member proves itself within a millisecond or so of connecting).
const MAX_PENDING: usize = 64;
/// A client must have proved itself within this long of connecting.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A member's connection idle this long is closed (its pool reconnects).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Sending one reply must take no longer than this.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections in their handshake, oldest first, each with the token that drops it.
#[derive(Default)]
struct Pending {
    next: u64,
    queue: std::collections::VecDeque<(u64, CancellationToken)>,
}

/// Serves `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    cluster: Arc<Cluster>,
    shutdown: CancellationToken,
) {
    let members = Arc::new(Semaphore::new(MAX_MEMBER_CONNECTIONS));
    let pending = Arc::new(std::sync::Mutex::new(Pending::default()));
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, from) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (id, dropped) = {
            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
            let id = p.next;
            p.next += 1;
            let token = shutdown.child_token();
            p.queue.push_back((id, token.clone()));
            let oldest = if p.queue.len() > MAX_PENDING { p.queue.pop_front().map(|(_, t)| t) } else { None };
            (id, (token, oldest))
        };
        let (token, oldest) = dropped;
        if let Some(oldest) = oldest {
            oldest.cancel();
        }
        let (engine, cluster, members, pending) =
            (engine.clone(), cluster.clone(), members.clone(), pending.clone());
        tracker.spawn(async move {
            let done = |pending: &std::sync::Mutex<Pending>| {
                pending.lock().unwrap_or_else(|e| e.into_inner()).queue.retain(|(i, _)| *i != id);
            };
            if let Err(why) = connection(stream, &engine, &cluster, &members, &token, || done(&pending)).await
            {
                tracing::debug!(%from, "peer connection closed: {why}");
            }
            done(&pending);
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
}

/// One peer connection: the handshake (dropped by `drain` if a newer connection needs its place),
/// then, once `proved` has taken it off the pending list, a member's requests until it leaves.
async fn connection(
    mut stream: TcpStream,
    engine: &Arc<Engine>,
    cluster: &Cluster,
    members: &Arc<Semaphore>,
    drain: &CancellationToken,
    proved: impl FnOnce(),
) -> Result<(), Ended> {
    stream.set_nodelay(true)?;
    let welcome = |node: &str| {
        if node == cluster.plan.me.id || cluster.roster().member(node).is_none() {
            return Err(HandshakeError::Refused(format!("{node:?} is not a member of this cluster")));
        }
        Ok(PeerWelcome { node: cluster.plan.me.id.clone(), slot: cluster.slot, slots: cluster.slots })
    };
    let shaken = tokio::select! {
        _ = drain.cancelled() => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            return Err(Ended::Dropped);
        }
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, super::auth::server(&mut stream, &cluster.plan.secret, welcome)) => r,
    };
    let (noise, peer) = match shaken {
        Ok(Ok(shaken)) => shaken,
        Ok(Err(why)) => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("peer refused: {why}");
            let refused = PeerResponse::Refused(WireError::new(ErrorCode::PermissionDenied, why.to_string()));
            if let Ok(bytes) = frame::encode_checked(&refused, 0) {
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
            }
            return Err(Ended::Refused(why));
        }
        Err(_) => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("peer refused: no proof within {HANDSHAKE_TIMEOUT:?}");
            return Err(Ended::HandshakeTimeout);
        }
    };
    proved();
    let mut sealed = Sealed::new(stream, noise);
    let Ok(_permit) = members.clone().try_acquire_owned() else {
        cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
        let busy = WireError::new(ErrorCode::Unavailable, "too many peer connections to this slot");
        let _ = send(&mut sealed, &PeerResponse::Error(busy), &[]).await;
        return Err(Ended::Busy { peer });
    };
    let replies = engine.peer_reply_budget();
    loop {
        let next = tokio::select! {
            _ = drain.cancelled() => return Ok(()),
            r = tokio::time::timeout(IDLE_TIMEOUT, sealed.recv::<PeerRequest>(Limits::REQUEST)) => r,
        };
        let request = match next {
            Err(_) => return Ok(()),
            Ok(Err(SealedError::Closed)) => return Ok(()),
            Ok(Err(SealedError::Forged)) => {
                cluster.stats.forged_frames.fetch_add(1, Ordering::Relaxed);
                return Err(Ended::Bad { peer, why: SealedError::Forged });
            }
            Ok(Err(e)) => {
                let bad = PeerResponse::Error(WireError::new(ErrorCode::BadRequest, e.to_string()));
                let _ = send(&mut sealed, &bad, &[]).await;
                return Err(Ended::Bad { peer, why: e });
            }
            Ok(Ok((_, payload))) if !payload.is_empty() => return Err(Ended::Payload { peer }),
            Ok(Ok((request, _))) => request,
        };
        match request {
            PeerRequest::Hello { .. } => return Err(Ended::HelloTwice { peer }),
            PeerRequest::ReadChunk(req) => {
                // The reply's bytes, in the budget from before they are read until they are sent.
                let _held = replies.hold(req.range().map_or(0, |r| r.end - r.start)).await;
                match engine.serve_peer_chunk(&peer, &req).await {
                    Ok(f) => {
                        count_served(cluster, &f);
                        // Sealed, then let go of: what waits for a slow reader is one copy.
                        sealed.seal(&PeerResponse::Chunk(inline(&f)), &f.data).map_err(Ended::Send)?;
                        drop(f);
                        flush(&mut sealed).await?
                    }
                    Err(e) => send(&mut sealed, &PeerResponse::Error(e), &[]).await?,
                }
            }
            PeerRequest::ReadFirst(req) => {
                let _held = replies.hold(req.chunk_size).await;
                match engine.serve_peer_first(&peer, &req).await {
                    Ok(first) => {
                        let chunk = first.chunk.as_ref();
                        if let Some(f) = chunk {
                            count_served(cluster, f);
                        }
                        let reply = PeerResponse::First {
                            meta: first.meta,
                            confirmed_ms_ago: first.confirmed_ago.as_millis() as u64,
                            chunk: chunk.map(inline),
                        };
                        let payload = chunk.map_or(&[][..], |f| &f.data);
                        sealed.seal(&reply, payload).map_err(Ended::Send)?;
                        drop(first.chunk);
                        flush(&mut sealed).await?
                    }
                    Err(e) => send(&mut sealed, &PeerResponse::Error(e), &[]).await?,
                }
            }
            PeerRequest::Revalidate(req) => {
                let answer = engine.serve_peer_revalidate(&peer, &req).await;
                let reply = answer.map_or_else(PeerResponse::Error, PeerResponse::Revalidated);
                send(&mut sealed, &reply, &[]).await?
            }
            PeerRequest::Forget { url } => {
                let reply = match engine.serve_peer_forget(&peer, &url) {
                    Ok(()) => PeerResponse::Forgotten,
                    Err(e) => PeerResponse::Error(e),
                };
                send(&mut sealed, &reply, &[]).await?
            }
            PeerRequest::Status => {
                send(&mut sealed, &PeerResponse::Status(engine.cluster_status()), &[]).await?
            }
        }
    }
}

fn count_served(cluster: &Cluster, f: &Fetched) {
    cluster.stats.served_chunks.fetch_add(1, Ordering::Relaxed);
    cluster.stats.served_bytes.fetch_add(f.data.len() as u64, Ordering::Relaxed);
}

fn inline(f: &Fetched) -> ChunkReply {
    ChunkReply { len: f.data.len() as u64, crc32c: f.crc32c, body: ChunkBody::Inline, from_cache: true }
}

async fn send<T: serde::Serialize>(sealed: &mut Sealed, message: &T, payload: &[u8]) -> Result<(), Ended> {
    sealed.seal(message, payload).map_err(Ended::Send)?;
    flush(sealed).await
}

/// Sends the sealed reply, within [`IO_TIMEOUT`].
async fn flush(sealed: &mut Sealed) -> Result<(), Ended> {
    match tokio::time::timeout(IO_TIMEOUT, sealed.flush()).await {
        Ok(r) => r.map_err(Ended::Send),
        Err(_) => Err(Ended::SendTimeout),
    }
}

/// Why a peer connection ended before its member left (logged, at debug level).
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("refused: {0}")]
    Refused(HandshakeError),
    #[error("dropped in its handshake to make room")]
    Dropped,
    #[error("handshake timed out")]
    HandshakeTimeout,
    #[error("{peer}: too many member connections")]
    Busy { peer: String },
    #[error("{peer}: {why}")]
    Bad { peer: String, why: SealedError },
    #[error("{peer}: a request with a payload")]
    Payload { peer: String },
    #[error("{peer}: Hello twice")]
    HelloTwice { peer: String },
    #[error("sending a reply: {0}")]
    Send(SealedError),
    #[error("sending a reply timed out")]
    SendTimeout,
}
