//! Writing replies: a response frame, with the descriptors of passed chunk files on its first byte
//! (`SCM_RIGHTS`) and inline chunk bytes as its payload, each within the connection's I/O timeout.

use std::os::fd::AsFd;
use std::sync::Arc;

use memarts_protocol::{frame, ChunkBody, ChunkReply, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::conn::{ConnError, ConnSettings};
use super::fdpass::send_with_fds;
use crate::engine::ChunkOutcome;

/// A chunk outcome as it goes on the wire: its reply, the descriptor passed with it (large hits),
/// or its bytes as payload (small hits and misses).
pub(super) fn chunk_parts(
    outcome: ChunkOutcome,
) -> (ChunkReply, Option<Arc<std::fs::File>>, Option<bytes::Bytes>) {
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
pub(super) async fn send_chunk(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    outcome: ChunkOutcome,
    wrap: impl FnOnce(ChunkReply) -> Response,
) -> Result<(), ConnError> {
    let (reply, fd, data) = chunk_parts(outcome);
    send_with(stream, settings, &wrap(reply), fd.as_slice(), data.as_slice()).await
}

/// Sends `response` with `fds` passed on its first byte and `payload` after it.
pub(super) async fn send_with(
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

/// Sends a response without payload.
pub(super) async fn send(
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
