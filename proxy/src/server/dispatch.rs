//! One handler per request kind: each maps its frame to engine calls and the answer back to a
//! response, as mini-redis does with its commands. The server drives neither the origin nor the
//! memarts-only store itself; it only keeps what belongs to the connection (its peer's uid, its
//! upload in progress).

use std::sync::Arc;
use std::time::Instant;

use memarts_protocol::{
    ChunkRequest, ErrorCode, FirstRequest, Limits, ListRequest, Request, Response, Touch, WireError,
    MAX_BATCH, MAX_TOUCHES,
};
use tokio::net::UnixStream;

use super::conn::{refuse, ConnError, ConnSettings};
use super::reply::{chunk_parts, send, send_chunk, send_with};
use crate::engine::{Engine, Upload};

/// What a connection holds between requests.
pub(super) struct Session {
    pub uid: u32,
    /// At most one upload per connection; one left unfinished is abandoned when the next starts or
    /// the connection ends.
    pub upload: Option<Upload>,
}

impl Session {
    pub async fn abandon_upload(&mut self) {
        if let Some(upload) = self.upload.take() {
            upload.abort().await;
        }
    }
}

/// The connection a request came on, with what it needs to answer.
pub(super) struct Ctx<'a> {
    pub stream: &'a mut UnixStream,
    pub engine: &'a Arc<Engine>,
    pub settings: &'a ConnSettings,
    pub session: &'a mut Session,
}

impl Ctx<'_> {
    async fn answer(&mut self, reply: Result<Response, WireError>) -> Result<(), ConnError> {
        let response = reply.unwrap_or_else(Response::Error);
        send(self.stream, &response, self.settings).await
    }
}

/// Answers one request (after the handshake); `payload` is what a `PutData` frame carried.
pub(super) async fn dispatch(mut cx: Ctx<'_>, request: Request, payload: Vec<u8>) -> Result<(), ConnError> {
    if let Err(refused) = cx.settings.local.check_request(cx.session.uid, &request).await {
        return cx.answer(Err(refused)).await;
    }
    match request {
        Request::Hello(_) => refuse(cx.stream, cx.settings, "Hello may only be sent once").await,
        Request::Stat { url, refresh } => stat(cx, &url, refresh).await,
        Request::ReadChunk(req) => read_chunk(cx, &req).await,
        Request::ReadFirst(req) => read_first(cx, &req).await,
        Request::List(req) => list(cx, &req).await,
        Request::Status => status(cx).await,
        Request::ReadChunks(reqs) => read_chunks(cx, reqs).await,
        Request::Delete { url } => delete(cx, &url).await,
        Request::PutStart { url } => put_start(cx, &url, false).await,
        Request::PutMemartsStart { url } => put_start(cx, &url, true).await,
        Request::PutData => put_data(cx, payload).await,
        Request::PutFinish { size, crc32c } => put_finish(cx, size, crc32c).await,
        Request::ReadMemarts { url } => read_memarts(cx, &url).await,
        Request::ClusterStatus => {
            let status = cx.engine.cluster_status();
            cx.answer(Ok(Response::ClusterStatus(status))).await
        }
        Request::Prefetch(req) => {
            let reply = cx.engine.prefetch(&req).map(|queued| Response::Prefetched { queued });
            cx.answer(reply).await
        }
        Request::PrefetchStatus => {
            let status = cx.engine.prefetch_status();
            cx.answer(Ok(Response::PrefetchStatus(status))).await
        }
        Request::AdmissionStatus => {
            let status = cx.engine.admission_status();
            cx.answer(Ok(Response::AdmissionStatus(status))).await
        }
        Request::Metrics => {
            let metrics = cx.engine.metrics();
            cx.answer(Ok(Response::Metrics(metrics))).await
        }
        Request::Touched(touches) => touched(cx, &touches).await,
        Request::Fill(req) => {
            let reply = cx.engine.fill(&req).await.map(Response::Filled);
            cx.answer(reply).await
        }
        Request::Revalidate(req) => revalidate(cx, &req).await,
        Request::Forget { url } => forget(cx, &url).await,
        Request::Listed(ranges) => listed(cx, ranges).await,
        Request::Confirm(versions) => confirm(cx, versions).await,
    }
}

/// Another slot wrote or deleted an object of a directory this slot lists: the fleet's own uid only.
async fn forget(mut cx: Ctx<'_>, url: &str) -> Result<(), ConnError> {
    let reply = if cx.settings.local.is_own(cx.session.uid) {
        cx.engine.metadata().serve_forget(url).map(|()| Response::Forgotten)
    } else {
        Err(WireError::new(ErrorCode::PermissionDenied, "only the fleet's own slots tell one another"))
    };
    cx.answer(reply).await
}

/// Another slot kept what a client's listing showed of directories this slot owns: the fleet's
/// own uid only (whoever else could would vouch for versions of objects to every slot).
async fn listed(mut cx: Ctx<'_>, ranges: Vec<memarts_protocol::ListedRange>) -> Result<(), ConnError> {
    let reply = if cx.settings.local.is_own(cx.session.uid) {
        cx.engine.metadata().serve_listed(ranges).map(|()| Response::Recorded)
    } else {
        Err(WireError::new(ErrorCode::PermissionDenied, "only the fleet's own slots tell one another"))
    };
    cx.answer(reply).await
}

/// The slot that owns a directory confirms versions of it again (`refresh.rs`): the fleet's own
/// uid only (whoever else could would vouch for versions of objects to this slot).
async fn confirm(
    mut cx: Ctx<'_>,
    versions: Vec<(String, memarts_protocol::ConfirmedMeta)>,
) -> Result<(), ConnError> {
    let reply = if cx.settings.local.is_own(cx.session.uid) {
        cx.engine.metadata().serve_confirm(versions).map(|()| Response::Recorded)
    } else {
        Err(WireError::new(ErrorCode::PermissionDenied, "only the fleet's own slots tell one another"))
    };
    cx.answer(reply).await
}

/// Another slot asks for a version its directory's listing shows: only the fleet's own uid may
/// (whoever else could would vouch for versions of objects to the slot that asks).
async fn revalidate(mut cx: Ctx<'_>, req: &memarts_protocol::RevalidateRequest) -> Result<(), ConnError> {
    let reply = if cx.settings.local.is_own(cx.session.uid) {
        cx.engine.metadata().serve_revalidate(req).await.map(Response::Revalidated)
    } else {
        Err(WireError::new(ErrorCode::PermissionDenied, "only the fleet's own slots ask one another"))
    };
    cx.answer(reply).await
}

/// Local hits a client reports: only the fleet's own uid can read chunk files, so only it may.
async fn touched(mut cx: Ctx<'_>, touches: &[Touch]) -> Result<(), ConnError> {
    let reply = if touches.len() > MAX_TOUCHES {
        Err(WireError::new(ErrorCode::BadRequest, format!("more than {MAX_TOUCHES} chunks in one Touched")))
    } else if !cx.settings.local.is_own(cx.session.uid) {
        Err(WireError::new(
            ErrorCode::PermissionDenied,
            "only the fleet's own uid reads chunk files directly, so only it reports such reads",
        ))
    } else {
        Ok(Response::Touched { counted: cx.engine.disk().touched(touches) })
    };
    cx.answer(reply).await
}

async fn stat(mut cx: Ctx<'_>, url: &str, refresh: bool) -> Result<(), ConnError> {
    let reply = cx.engine.metadata().stat(url, refresh).await.map(Response::Stat);
    cx.answer(reply).await
}

async fn read_chunk(mut cx: Ctx<'_>, req: &ChunkRequest) -> Result<(), ConnError> {
    let started = Instant::now();
    match cx.engine.read_chunk(req).await {
        Ok(outcome) => {
            let hit = outcome.is_hit();
            send_chunk(cx.stream, cx.settings, outcome, Response::Chunk).await?;
            cx.engine.stats.observe_read(hit, started.elapsed());
            Ok(())
        }
        Err(e) => cx.answer(Err(e)).await,
    }
}

async fn read_first(mut cx: Ctx<'_>, req: &FirstRequest) -> Result<(), ConnError> {
    let started = Instant::now();
    match cx.engine.read_first(req).await {
        Ok((meta, Some(outcome))) => {
            let hit = outcome.is_hit();
            send_chunk(cx.stream, cx.settings, outcome, |c| Response::First { meta, chunk: Some(c) }).await?;
            cx.engine.stats.observe_read(hit, started.elapsed());
            Ok(())
        }
        Ok((meta, None)) => cx.answer(Ok(Response::First { meta, chunk: None })).await,
        Err(e) => cx.answer(Err(e)).await,
    }
}

async fn list(mut cx: Ctx<'_>, req: &ListRequest) -> Result<(), ConnError> {
    let reply = cx.engine.metadata().list(req).await.map(Response::List);
    cx.answer(reply).await
}

async fn status(mut cx: Ctx<'_>) -> Result<(), ConnError> {
    let status = cx.engine.status();
    cx.answer(Ok(Response::Status(status))).await
}

/// `ReadChunks`: every chunk at once (misses fetched concurrently), then one frame with all
/// descriptors and all inline bytes, in request order.
async fn read_chunks(mut cx: Ctx<'_>, reqs: Vec<ChunkRequest>) -> Result<(), ConnError> {
    // Saturating: the ranges come from the client, and their sum must not wrap below the cap.
    let total: u64 = reqs.iter().filter_map(|r| r.range()).fold(0, |t, r| t.saturating_add(r.end - r.start));
    if reqs.len() > MAX_BATCH || total > u64::from(Limits::RESPONSE.max_payload) {
        let why = format!(
            "a batch of {} chunks ({total} bytes) exceeds {MAX_BATCH} chunks or {} bytes",
            reqs.len(),
            Limits::RESPONSE.max_payload
        );
        return cx.answer(Err(WireError::new(ErrorCode::BadRequest, why))).await;
    }
    let started = Instant::now();
    let outcomes = futures::future::join_all(reqs.iter().map(|r| cx.engine.read_chunk(r))).await;
    let (mut results, mut fds, mut payload, mut hits) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            Ok(o) => {
                hits.push(o.is_hit());
                let (reply, fd, data) = chunk_parts(o);
                results.push(Ok(reply));
                fds.extend(fd);
                payload.extend(data);
            }
            Err(e) => results.push(Err(e)),
        }
    }
    send_with(cx.stream, cx.settings, &Response::Chunks(results), &fds, &payload).await?;
    // Each chunk of the batch took as long as the batch: its reply came with the others'.
    let took = started.elapsed();
    hits.into_iter().for_each(|hit| cx.engine.stats.observe_read(hit, took));
    Ok(())
}

async fn delete(mut cx: Ctx<'_>, url: &str) -> Result<(), ConnError> {
    let reply = cx.engine.delete(url).await.map(|()| Response::Deleted);
    cx.answer(reply).await
}

/// `PutStart` (to the origin) or `PutMemartsStart` (`memarts_only`): abandons any upload in
/// progress, then starts this one.
async fn put_start(mut cx: Ctx<'_>, url: &str, memarts_only: bool) -> Result<(), ConnError> {
    cx.session.abandon_upload().await;
    let started = match memarts_only {
        false => cx.engine.start_upload(url).await,
        true => cx.engine.start_memarts_only(url).await,
    };
    let reply = started.map(|upload| {
        cx.session.upload = Some(upload);
        Response::PutAck { received: 0 }
    });
    cx.answer(reply).await
}

async fn put_data(mut cx: Ctx<'_>, payload: Vec<u8>) -> Result<(), ConnError> {
    let Some(upload) = cx.session.upload.as_mut() else {
        return cx.answer(Err(WireError::new(ErrorCode::BadRequest, "PutData without PutStart"))).await;
    };
    let reply = match upload.write(payload).await {
        Ok(received) => Ok(Response::PutAck { received }),
        Err(e) => {
            cx.session.abandon_upload().await;
            Err(e)
        }
    };
    cx.answer(reply).await
}

async fn put_finish(mut cx: Ctx<'_>, size: u64, crc32c: u32) -> Result<(), ConnError> {
    let Some(upload) = cx.session.upload.take() else {
        return cx.answer(Err(WireError::new(ErrorCode::BadRequest, "PutFinish without PutStart"))).await;
    };
    let reply = cx.engine.finish_upload(upload, size, crc32c).await.map(Response::Put);
    cx.answer(reply).await
}

async fn read_memarts(mut cx: Ctx<'_>, url: &str) -> Result<(), ConnError> {
    match cx.engine.read_memarts(url).await {
        Ok(outcome) => send_chunk(cx.stream, cx.settings, outcome, Response::Chunk).await,
        Err(e) => cx.answer(Err(e)).await,
    }
}
