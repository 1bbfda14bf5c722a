//! One client connection: the handshake (`handshake.rs`), then one request and one response at a
//! time (each handled in `dispatch.rs`) until the client leaves, idles out, misbehaves, or the slot
//! drains. Reading requests is here: waiting for the next one (polling briefly first), a bounded
//! read of its frame and payload, refusing what is malformed.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::spin::Spinner;
use memarts_protocol::{frame, ErrorCode, FrameError, Limits, Request, Response, WireError};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::dispatch::{dispatch, Ctx, Session};
use super::handshake::handshake;
use super::local_access::LocalAccess;
use super::reply::send;
use crate::budget::{Held, MemoryBudget};
use crate::engine::Engine;

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
pub(super) enum ConnError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("timed out {0}")]
    Timeout(&'static str),
    #[error("refused: {0}")]
    Refused(String),
}

pub async fn serve(
    mut stream: UnixStream,
    engine: Arc<Engine>,
    settings: Arc<ConnSettings>,
    drain: CancellationToken,
) {
    engine.stats.connections.fetch_add(1, Ordering::Relaxed);
    let mut session = Session { uid: u32::MAX, upload: None };
    if let Err(e) = serve_inner(&mut stream, &engine, &settings, &drain, &mut session).await {
        tracing::debug!("connection closed: {e}");
    }
    // A client that left in the middle of an upload leaves nothing visible at the origin.
    session.abandon_upload().await;
    engine.stats.connections.fetch_sub(1, Ordering::Relaxed);
}

async fn serve_inner(
    stream: &mut UnixStream,
    engine: &Arc<Engine>,
    settings: &ConnSettings,
    drain: &CancellationToken,
    session: &mut Session,
) -> Result<(), ConnError> {
    session.uid = handshake(stream, settings, engine.budget()).await?;
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
        let (request, payload, _held) = match read_request(stream, settings, engine.budget()).await {
            Ok(r) => r,
            Err(ConnError::Frame(FrameError::Closed)) => return Ok(()),
            Err(e) => return Err(e),
        };
        engine.stats.requests.fetch_add(1, Ordering::Relaxed);
        let cx = Ctx { stream: &mut *stream, engine, settings, session: &mut *session };
        dispatch(cx, request, payload).await?;
    }
}

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

/// Reads one request and its payload (only `PutData` carries one); a payload on any other request,
/// a malformed frame or an oversized one gets a typed `BadRequest` before the connection closes.
pub(super) async fn read_request(
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

pub(super) async fn refuse<T>(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    why: &str,
) -> Result<T, ConnError> {
    let _ = send(stream, &Response::Error(WireError::new(ErrorCode::BadRequest, why)), settings).await;
    linger_close(stream).await;
    Err(ConnError::Refused(why.to_string()))
}

/// Before closing on a client we refused: stop writing, then discard (never parse) what it may still
/// be sending, briefly and boundedly. Closing a Unix socket with unread input resets the peer, which
/// would make it lose the typed error we just sent.
pub(super) async fn linger_close(stream: &mut UnixStream) {
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
