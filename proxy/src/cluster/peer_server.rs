//! The peer listener of a slot: `host:port + slot` of this node's peer address. Before a single
//! request is parsed, the client must prove it holds the cluster secret and name a registered member
//! (S6); frames are bounded as on the Unix socket. It serves chunk reads (from this slot's cache, or
//! filled from the origin by its single flight: never forwarded), first reads and its counters: no
//! uploads, no deletes, no local paths. Strangers, wrong secrets, garbage, oversized frames and
//! silent clients are refused, counted and logged, within a connection limit and timeouts, while
//! members keep being served.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::peer::{PeerChallenge, PeerRequest, PeerResponse, PEER_PROTOCOL_VERSION};
use memarts_protocol::{frame, ChunkBody, ChunkReply, ErrorCode, FrameError, Limits, WireError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::{nonce, Side};
use super::peer_client::HANDSHAKE_LIMITS;
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
) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let shaken = tokio::select! {
        _ = drain.cancelled() => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            return Err("dropped in its handshake to make room".into());
        }
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut stream, cluster)) => r,
    };
    let peer = match shaken {
        Ok(Ok(node)) => node,
        Ok(Err(why)) => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("peer refused: {why}");
            let refused = PeerResponse::Refused(WireError::new(ErrorCode::PermissionDenied, why.clone()));
            if let Ok(bytes) = frame::encode_checked(&refused, 0) {
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
            }
            return Err(why);
        }
        Err(_) => {
            cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("peer refused: no proof within {HANDSHAKE_TIMEOUT:?}");
            return Err("handshake timed out".into());
        }
    };
    proved();
    let Ok(_permit) = members.clone().try_acquire_owned() else {
        cluster.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
        let busy = WireError::new(ErrorCode::Unavailable, "too many peer connections to this slot");
        let _ = send(&mut stream, &PeerResponse::Error(busy), &[]).await;
        return Err(format!("{peer}: too many member connections"));
    };
    loop {
        let next = tokio::select! {
            _ = drain.cancelled() => return Ok(()),
            r = tokio::time::timeout(IDLE_TIMEOUT, frame::read_checked_async::<PeerRequest, _>(&mut stream, Limits::REQUEST)) => r,
        };
        let request = match next {
            Err(_) => return Ok(()),
            Ok(Err(FrameError::Closed)) => return Ok(()),
            Ok(Err(e)) => {
                let _ = send(
                    &mut stream,
                    &PeerResponse::Error(WireError::new(ErrorCode::BadRequest, e.to_string())),
                    &[],
                )
                .await;
                return Err(format!("{peer}: {e}"));
            }
            Ok(Ok((head, _))) if head.payload_len > 0 => {
                return Err(format!("{peer}: a request with a payload"))
            }
            Ok(Ok((_, request))) => request,
        };
        match request {
            PeerRequest::Hello { .. } => return Err(format!("{peer}: Hello twice")),
            PeerRequest::ReadChunk(req) => match engine.serve_peer_chunk(&req).await {
                Ok(f) => {
                    cluster.stats.served_chunks.fetch_add(1, Ordering::Relaxed);
                    cluster.stats.served_bytes.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                    send(&mut stream, &PeerResponse::Chunk(inline(&f)), &f.data).await?
                }
                Err(e) => send(&mut stream, &PeerResponse::Error(e), &[]).await?,
            },
            PeerRequest::ReadFirst(req) => match engine.serve_peer_first(&req).await {
                Ok((meta, Some(f))) => {
                    cluster.stats.served_chunks.fetch_add(1, Ordering::Relaxed);
                    cluster.stats.served_bytes.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                    send(&mut stream, &PeerResponse::First { meta, chunk: Some(inline(&f)) }, &f.data).await?
                }
                Ok((meta, None)) => {
                    send(&mut stream, &PeerResponse::First { meta, chunk: None }, &[]).await?
                }
                Err(e) => send(&mut stream, &PeerResponse::Error(e), &[]).await?,
            },
            PeerRequest::Status => {
                send(&mut stream, &PeerResponse::Status(engine.cluster_status()), &[]).await?
            }
        }
    }
}

/// The challenge, the client's proof, and ours; returns the client's node id.
async fn handshake(stream: &mut TcpStream, cluster: &Cluster) -> Result<String, String> {
    let ours = nonce();
    let challenge = PeerChallenge { protocol_version: PEER_PROTOCOL_VERSION, nonce: ours };
    send(stream, &challenge, &[]).await?;
    let (head, hello) = frame::read_checked_async::<PeerRequest, _>(stream, HANDSHAKE_LIMITS)
        .await
        .map_err(|e| format!("bad first frame: {e}"))?;
    let PeerRequest::Hello { protocol_version, node, nonce: theirs, proof } = hello else {
        return Err("the first frame is not Hello".into());
    };
    if head.payload_len > 0 {
        return Err("Hello with a payload".into());
    }
    if protocol_version != PEER_PROTOCOL_VERSION {
        return Err(format!(
            "{node:?} speaks peer protocol {protocol_version}, this node {PEER_PROTOCOL_VERSION}"
        ));
    }
    if !cluster.plan.secret.verify(Side::Client, &ours, &theirs, &node, &proof) {
        return Err(format!("{node:?} did not prove it holds the cluster secret"));
    }
    if node == cluster.plan.me.id || cluster.roster().member(&node).is_none() {
        return Err(format!("{node:?} is not a member of this cluster"));
    }
    let proof = cluster.plan.secret.proof(Side::Server, &theirs, &ours, &cluster.plan.me.id);
    let welcome = PeerResponse::Welcome {
        node: cluster.plan.me.id.clone(),
        slot: cluster.slot,
        slots: cluster.slots,
        proof,
    };
    send(stream, &welcome, &[]).await?;
    Ok(node)
}

fn inline(f: &Fetched) -> ChunkReply {
    ChunkReply { len: f.data.len() as u64, crc32c: f.crc32c, body: ChunkBody::Inline, from_cache: true }
}

async fn send<T: serde::Serialize>(
    stream: &mut TcpStream,
    message: &T,
    payload: &[u8],
) -> Result<(), String> {
    let head = frame::encode_checked(message, payload.len()).map_err(|e| e.to_string())?;
    let write = async {
        stream.write_all(&head).await?;
        stream.write_all(payload).await
    };
    match tokio::time::timeout(IO_TIMEOUT, write).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("sending a reply timed out".into()),
    }
}
