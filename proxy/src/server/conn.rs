//! One client connection: peer-credential check, handshake, then one request and one response at a
//! time until the client leaves, idles out, misbehaves, or the slot drains.

use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::spin::Spinner;
use memarts_protocol::{
    frame, ChunkBody, ChunkReply, ChunkRequest, ErrorCode, FrameError, Limits, Request, Response, Welcome,
    WireError, MAX_BATCH, PROTOCOL_VERSION,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::fdpass::send_with_fds;
use super::local_access::LocalAccess;
use super::upload::Uploads;
use crate::budget::{Held, MemoryBudget};
use crate::cache::{Cache, ChunkOutcome};

/// Settings every connection of a slot shares.
#[derive(Debug, Clone)]
pub struct ConnSettings {
    pub slot: u32,
    pub slots: u32,
    pub allowed_uids: Vec<u32>,
    /// What clients of those other uids may do with local paths (`local_roots`).
    pub local: LocalAccess,
    pub idle_timeout: Duration,
    pub io_timeout: Duration,
    /// Polling budget between requests (see `memarts_protocol::spin`).
    pub spin: Duration,
    /// Set while one of the slot's connections polls: at most one does, so polling never holds
    /// both runtime threads.
    pub spinning: Arc<AtomicBool>,
}

/// Why a connection ended abnormally (logged at debug level; the client already got a typed error
/// where one could be sent).
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("timed out {0}")]
    Timeout(&'static str),
    #[error("refused: {0}")]
    Refused(String),
}

pub async fn serve(
    mut stream: UnixStream,
    cache: Arc<Cache>,
    settings: Arc<ConnSettings>,
    drain: CancellationToken,
) {
    cache.stats.connections.fetch_add(1, Ordering::Relaxed);
    let mut uploads = Uploads::default();
    if let Err(e) = serve_inner(&mut stream, &cache, &settings, &drain, &mut uploads).await {
        tracing::debug!("connection closed: {e}");
    }
    // A client that left in the middle of an upload leaves nothing visible at the origin.
    uploads.abandon().await;
    cache.stats.connections.fetch_sub(1, Ordering::Relaxed);
}

async fn serve_inner(
    stream: &mut UnixStream,
    cache: &Arc<Cache>,
    settings: &ConnSettings,
    drain: &CancellationToken,
    uploads: &mut Uploads,
) -> Result<(), ConnError> {
    // S1: the peer's uid is checked before a single byte of it is read.
    let uid = stream.peer_cred().map_err(FrameError::Io)?.uid();
    if uid != nix::unistd::getuid().as_raw() && !settings.allowed_uids.contains(&uid) {
        let err = WireError::new(ErrorCode::PermissionDenied, format!("uid {uid} may not use this proxy"));
        let _ = send(stream, &Response::Error(err), settings).await;
        linger_close(stream).await;
        return Err(ConnError::Refused(format!("uid {uid}")));
    }

    match read_request(stream, settings, cache.budget()).await?.0 {
        Request::Hello(h) if h.protocol_version == PROTOCOL_VERSION => {
            let welcome = Welcome {
                protocol_version: PROTOCOL_VERSION,
                slot: settings.slot,
                slots: settings.slots,
                server: concat!("memarts-proxy/", env!("CARGO_PKG_VERSION")).into(),
            };
            send(stream, &Response::Welcome(welcome), settings).await?;
        }
        Request::Hello(h) => {
            let message = format!(
                "client speaks protocol {}, this proxy speaks {PROTOCOL_VERSION}; upgrade the older side",
                h.protocol_version
            );
            let _ = send(stream, &Response::Incompatible { supported: PROTOCOL_VERSION, message }, settings)
                .await;
            return Err(ConnError::Refused("incompatible protocol".into()));
        }
        _ => return refuse(stream, settings, "the first frame must be Hello").await,
    }

    let mut spinner = Spinner::new(settings.spin);
    loop {
        // A client reading back to back sends its next request within microseconds: poll for it
        // briefly (one connection per slot at a time) instead of paying for a wake-up.
        let mut arrived = false;
        if !settings.spin.is_zero()
            && settings.spinning.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            arrived = spinner.wait_readable(stream.as_raw_fd());
            settings.spinning.store(false, Ordering::Release);
        }
        // Between requests: wait for the next one (unless polling already saw it), unless the slot
        // is draining or the client idles.
        if drain.is_cancelled()
            || (!arrived && !wait_for_request(stream, settings.idle_timeout, drain).await?)
        {
            return Ok(());
        }
        // `_held`: the payload's share of the slot's memory budget, given back after the request.
        let (request, payload, _held) = match read_request(stream, settings, cache.budget()).await {
            Ok(r) => r,
            Err(ConnError::Frame(FrameError::Closed)) => return Ok(()),
            Err(e) => return Err(e),
        };
        cache.stats.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(refused) = settings.local.check_request(uid, &request).await {
            send(stream, &Response::Error(refused), settings).await?;
            continue;
        }
        match request {
            Request::Hello(_) => return refuse(stream, settings, "Hello may only be sent once").await,
            Request::Stat { url, refresh } => {
                let reply = cache.stat(&url, refresh).await.map_or_else(Response::Error, Response::Stat);
                send(stream, &reply, settings).await?;
            }
            Request::ReadChunk(req) => match cache.read_chunk(&req).await {
                Ok(outcome) => send_chunk(stream, settings, outcome, Response::Chunk).await?,
                Err(e) => send(stream, &Response::Error(e), settings).await?,
            },
            Request::ReadFirst(req) => match cache.read_first(&req).await {
                Ok((meta, Some(outcome))) => {
                    send_chunk(stream, settings, outcome, |c| Response::First { meta, chunk: Some(c) })
                        .await?
                }
                Ok((meta, None)) => send(stream, &Response::First { meta, chunk: None }, settings).await?,
                Err(e) => send(stream, &Response::Error(e), settings).await?,
            },
            Request::List(req) => {
                let reply = cache.list(&req).await.map_or_else(Response::Error, Response::List);
                send(stream, &reply, settings).await?;
            }
            Request::Status => send(stream, &Response::Status(cache.status()), settings).await?,
            Request::ReadChunks(reqs) => send_batch(stream, settings, cache, reqs).await?,
            Request::Delete { url } => {
                let reply = cache.delete(&url).await.map_or_else(Response::Error, |()| Response::Deleted);
                send(stream, &reply, settings).await?;
            }
            Request::PutStart { url } => send(stream, &uploads.start(cache, &url).await, settings).await?,
            Request::PutData => send(stream, &uploads.data(payload).await, settings).await?,
            Request::PutMemartsStart { url } => {
                send(stream, &uploads.start_memarts_only(cache, &url).await, settings).await?
            }
            Request::ReadMemarts { url } => match cache.read_memarts(&url).await {
                Ok(outcome) => send_chunk(stream, settings, outcome, Response::Chunk).await?,
                Err(e) => send(stream, &Response::Error(e), settings).await?,
            },
            Request::PutFinish { size, crc32c } => {
                send(stream, &uploads.finish(cache, size, crc32c).await, settings).await?
            }
        }
    }
}

/// A chunk outcome as it goes on the wire: its reply, the descriptor passed with it (large hits),
/// or its bytes as payload (small hits and misses).
fn chunk_parts(outcome: ChunkOutcome) -> (ChunkReply, Option<Arc<std::fs::File>>, Option<bytes::Bytes>) {
    match outcome {
        ChunkOutcome::Fd(chunk) => {
            let reply = ChunkReply {
                len: chunk.len,
                crc32c: chunk.crc32c,
                body: ChunkBody::Fd { offset: chunk.data_offset },
                from_cache: true,
            };
            (reply, Some(chunk.file), None)
        }
        ChunkOutcome::Bytes { data, crc32c, from_cache } => {
            let reply = ChunkReply { len: data.len() as u64, crc32c, body: ChunkBody::Inline, from_cache };
            (reply, None, Some(data))
        }
    }
}

/// Sends one chunk, wrapped in the response `wrap` builds.
async fn send_chunk(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    outcome: ChunkOutcome,
    wrap: impl FnOnce(ChunkReply) -> Response,
) -> Result<(), ConnError> {
    let (reply, fd, data) = chunk_parts(outcome);
    send_with(stream, settings, &wrap(reply), fd.as_slice(), data.as_slice()).await
}

/// Serves `ReadChunks`: every chunk at once (misses fetched concurrently), then one frame with all
/// descriptors and all inline bytes, in request order.
async fn send_batch(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    cache: &Arc<Cache>,
    reqs: Vec<ChunkRequest>,
) -> Result<(), ConnError> {
    // Saturating: the ranges come from the client, and their sum must not wrap below the cap.
    let total: u64 = reqs.iter().filter_map(|r| r.range()).fold(0, |t, r| t.saturating_add(r.end - r.start));
    if reqs.len() > MAX_BATCH || total > u64::from(Limits::RESPONSE.max_payload) {
        let why = format!(
            "a batch of {} chunks ({total} bytes) exceeds {MAX_BATCH} chunks or {} bytes",
            reqs.len(),
            Limits::RESPONSE.max_payload
        );
        return send(stream, &Response::Error(WireError::new(ErrorCode::BadRequest, why)), settings).await;
    }
    let outcomes = futures::future::join_all(reqs.iter().map(|r| cache.read_chunk(r))).await;
    let (mut results, mut fds, mut payload) = (Vec::new(), Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            Ok(o) => {
                let (reply, fd, data) = chunk_parts(o);
                results.push(Ok(reply));
                fds.extend(fd);
                payload.extend(data);
            }
            Err(e) => results.push(Err(e)),
        }
    }
    send_with(stream, settings, &Response::Chunks(results), &fds, &payload).await
}

/// Sends `response` with `fds` passed on its first byte and `payload` after it.
async fn send_with(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    response: &Response,
    fds: &[Arc<std::fs::File>],
    payload: &[bytes::Bytes],
) -> Result<(), ConnError> {
    let bytes = frame::encode(response, payload.iter().map(|p| p.len()).sum())?;
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    with_timeout(settings, "sending a reply", async {
        send_with_fds(stream, &bytes, &borrowed).await?;
        for part in payload {
            stream.write_all(part).await?;
        }
        Ok(())
    })
    .await
}

/// Reads one request and its payload (only `PutData` carries one); a payload on any other request,
/// a malformed frame or an oversized one gets a typed `BadRequest` before the connection closes.
/// Waits until the client has sent something (or closed): false if the slot started draining first.
///
/// tokio's readiness is cached: after a request was read without hitting `WouldBlock`, `readable()`
/// answers at once although nothing has arrived. Trusting it would start the I/O timeout of
/// `read_request` while the client is merely idle, and refuse a client that is idle for longer than
/// that. So the socket is peeked, and a stale readiness cleared (race-free, by `try_io`) before
/// waiting again.
async fn wait_for_request(
    stream: &mut UnixStream,
    idle_timeout: Duration,
    drain: &CancellationToken,
) -> Result<bool, ConnError> {
    let deadline = tokio::time::Instant::now() + idle_timeout;
    loop {
        tokio::select! {
            _ = drain.cancelled() => return Ok(false),
            ready = tokio::time::timeout_at(deadline, stream.readable()) => match ready {
                Ok(r) => r.map_err(FrameError::Io)?,
                Err(_) => return Err(ConnError::Timeout("idle")),
            },
        }
        // The peek runs inside `try_io`, so a stale readiness is cleared only as of before the peek:
        // bytes that arrive after it raise a new readiness event instead of being lost.
        let fd = stream.as_raw_fd();
        let peeked = stream.try_io(Interest::READABLE, || {
            if memarts_protocol::spin::readable_now(fd) {
                Ok(())
            } else {
                Err(std::io::ErrorKind::WouldBlock.into())
            }
        });
        if peeked.is_ok() {
            return Ok(true);
        }
    }
}

async fn read_request(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    budget: &MemoryBudget,
) -> Result<(Request, Vec<u8>, Option<Held>), ConnError> {
    use tokio::io::AsyncReadExt;
    let read = tokio::time::timeout(settings.io_timeout, async {
        let (head, req) = frame::read_async::<Request, _>(stream, Limits::REQUEST).await?;
        let mut payload = Vec::new();
        let mut held = None;
        if head.payload_len > 0 && matches!(req, Request::PutData) {
            // Bounded by Limits::REQUEST.max_payload, checked with the head, and all connections
            // together by the slot's memory budget (waiting for it counts against the I/O timeout).
            held = Some(budget.hold(u64::from(head.payload_len)).await);
            payload = vec![0u8; head.payload_len as usize];
            stream.read_exact(&mut payload).await.map_err(FrameError::Io)?;
        }
        Ok::<_, FrameError>((head, req, payload, held))
    })
    .await;
    match read {
        Err(_) => {
            let _ = refuse::<()>(stream, settings, "the request frame did not arrive in time").await;
            Err(ConnError::Timeout("reading a request"))
        }
        Ok(Ok((head, req, ..))) if head.payload_len > 0 && !matches!(req, Request::PutData) => {
            refuse(stream, settings, "this request takes no payload").await
        }
        Ok(Ok((_, req, payload, held))) => Ok((req, payload, held)),
        Ok(Err(e @ (FrameError::TooLarge { .. } | FrameError::Decode(_)))) => {
            let _ = refuse::<()>(stream, settings, &e.to_string()).await;
            Err(e.into())
        }
        Ok(Err(e)) => Err(e.into()),
    }
}

async fn refuse<T>(stream: &mut UnixStream, settings: &ConnSettings, why: &str) -> Result<T, ConnError> {
    let _ = send(stream, &Response::Error(WireError::new(ErrorCode::BadRequest, why)), settings).await;
    linger_close(stream).await;
    Err(ConnError::Refused(why.to_string()))
}

/// Before closing on a client we refused: stop writing, then discard (never parse) what it may still
/// be sending, briefly and boundedly. Closing a Unix socket with unread input resets the peer, which
/// would make it lose the typed error we just sent.
async fn linger_close(stream: &mut UnixStream) {
    use tokio::io::AsyncReadExt;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut budget = 64usize << 10;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while budget > 0 {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => budget = budget.saturating_sub(n),
            _ => return,
        }
    }
}

async fn send(
    stream: &mut UnixStream,
    response: &Response,
    settings: &ConnSettings,
) -> Result<(), ConnError> {
    let bytes = frame::encode(response, 0)?;
    with_timeout(settings, "sending a reply", stream.write_all(&bytes)).await
}

async fn with_timeout(
    settings: &ConnSettings,
    what: &'static str,
    fut: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), ConnError> {
    match tokio::time::timeout(settings.io_timeout, fut).await {
        Ok(r) => r.map_err(|e| ConnError::Frame(e.into())),
        Err(_) => Err(ConnError::Timeout(what)),
    }
}
