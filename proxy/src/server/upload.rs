//! Uploads on one connection: `PutStart` (to the origin) or `PutMemartsStart` (a memarts-only
//! object), any number of `PutData`, then `PutFinish`, which checks the size and CRC32C of everything
//! received before the new version becomes visible (at the origin) or durable (memarts-only). At most
//! one upload per connection; one left unfinished is abandoned when the next starts or the
//! connection ends.

use std::sync::Arc;

use memarts_protocol::{Crc32c, ErrorCode, ObjectMeta, ObjectUrl, Response, WireError};

use crate::cache::Cache;
use crate::memarts_only::{OnlyError, OnlyStore, Writer};
use crate::origin::Upload;

/// Bytes per multipart part sent to the origin.
const PART_SIZE: usize = 8 << 20;

/// The ETag reported for memarts-only objects (they have no origin version).
pub const MEMARTS_ONLY_ETAG: &str = "memarts-only";

enum Target {
    Origin { upload: Upload, crc: Crc32c },
    Only { store: Arc<OnlyStore>, writer: Option<Writer> },
}

struct Current {
    url: ObjectUrl,
    target: Target,
}

#[derive(Default)]
pub struct Uploads {
    current: Option<Current>,
}

fn error(code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::Error(WireError::new(code, msg))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Uploads {
    pub async fn start(&mut self, cache: &Cache, url: &str) -> Response {
        self.abandon().await;
        let url = match ObjectUrl::parse(url) {
            Ok(u) => u,
            Err(e) => return error(ErrorCode::BadRequest, e.to_string()),
        };
        match cache.origin().start_upload(&url, PART_SIZE).await {
            Ok(upload) => {
                self.current =
                    Some(Current { url, target: Target::Origin { upload, crc: Crc32c::default() } });
                Response::PutAck { received: 0 }
            }
            Err(e) => Response::Error(e.into()),
        }
    }

    pub async fn start_memarts_only(&mut self, cache: &Cache, url: &str) -> Response {
        self.abandon().await;
        let url = match ObjectUrl::parse(url) {
            Ok(u) => u,
            Err(e) => return error(ErrorCode::BadRequest, e.to_string()),
        };
        let store = match cache.only_store() {
            Ok(s) => s,
            Err(e) => return Response::Error(e),
        };
        let (begun, url) = {
            let store = store.clone();
            match tokio::task::spawn_blocking(move || (store.begin(&url), url)).await {
                Ok(r) => r,
                Err(e) => return error(ErrorCode::Internal, e.to_string()),
            }
        };
        match begun {
            Ok(writer) => {
                self.current = Some(Current { url, target: Target::Only { store, writer: Some(writer) } });
                Response::PutAck { received: 0 }
            }
            Err(e) => Response::Error(only_io(&e, &url)),
        }
    }

    pub async fn data(&mut self, bytes: Vec<u8>) -> Response {
        let Some(cur) = self.current.as_mut() else {
            return error(ErrorCode::BadRequest, "PutData without PutStart");
        };
        let result = match &mut cur.target {
            Target::Origin { upload, crc } => {
                crc.update(&bytes);
                upload.write(&bytes).await.map(|()| upload.written()).map_err(WireError::from)
            }
            Target::Only { writer, .. } => {
                let Some(mut w) = writer.take() else {
                    return error(ErrorCode::Internal, "upload state lost");
                };
                match tokio::task::spawn_blocking(move || {
                    let r = w.write(&bytes);
                    (w, r)
                })
                .await
                {
                    Ok((w, r)) => {
                        let written = w.written();
                        *writer = Some(w);
                        r.map(|()| written).map_err(|e| only_io(&e, &cur.url))
                    }
                    Err(e) => Err(WireError::new(ErrorCode::Internal, e.to_string())),
                }
            }
        };
        match result {
            Ok(received) => Response::PutAck { received },
            Err(e) => {
                self.abandon().await;
                Response::Error(e)
            }
        }
    }

    pub async fn finish(&mut self, cache: &Cache, size: u64, crc32c: u32) -> Response {
        let Some(cur) = self.current.take() else {
            return error(ErrorCode::BadRequest, "PutFinish without PutStart");
        };
        let url = cur.url;
        let mismatch = |written: u64, crc: u32| {
            error(
                ErrorCode::BadRequest,
                format!(
                    "upload of {url} ended with {written} bytes (crc {crc:08x}); the client sent {size} \
                     (crc {crc32c:08x}); nothing was written"
                ),
            )
        };
        match cur.target {
            Target::Origin { upload, crc } => {
                let (written, crc) = (upload.written(), crc.finish());
                if written != size || crc != crc32c {
                    upload.abort().await;
                    return mismatch(written, crc);
                }
                match upload.finish().await {
                    Ok((etag, version)) => {
                        let meta = ObjectMeta { size, etag, version, last_modified_ms: now_ms() };
                        cache.note_written(&url, &meta);
                        Response::Put(meta)
                    }
                    Err(e) => Response::Error(e.into()),
                }
            }
            Target::Only { store, writer } => {
                let Some(w) = writer else { return error(ErrorCode::Internal, "upload state lost") };
                let (written, crc) = (w.written(), w.crc());
                if written != size || crc != crc32c {
                    return mismatch(written, crc);
                }
                match tokio::task::spawn_blocking(move || store.commit(w)).await {
                    Ok(Ok(_)) => Response::Put(ObjectMeta {
                        size,
                        etag: Some(MEMARTS_ONLY_ETAG.into()),
                        version: None,
                        last_modified_ms: now_ms(),
                    }),
                    Ok(Err(OnlyError::Quota { need, used, quota })) => error(
                        ErrorCode::NoSpace,
                        format!("memarts-only quota: {need} more bytes do not fit ({used} of {quota} used)"),
                    ),
                    Ok(Err(OnlyError::Io(e))) => Response::Error(only_io(&e, &url)),
                    Ok(Err(e)) => error(ErrorCode::Internal, e.to_string()),
                    Err(e) => error(ErrorCode::Internal, e.to_string()),
                }
            }
        }
    }

    pub async fn abandon(&mut self) {
        if let Some(cur) = self.current.take() {
            match cur.target {
                Target::Origin { upload, .. } => upload.abort().await,
                // Dropping the writer removes its temp file.
                Target::Only { writer, .. } => drop(writer),
            }
        }
    }
}

/// A failed write of a memarts-only object: `NoSpace` when the cache disk is full (logged, with what
/// the operator can do), else `Internal`.
fn only_io(e: &std::io::Error, url: &impl std::fmt::Display) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => {
            let msg = format!(
                "write_memarts {url}: the cache disk is full ({e}); memarts-only objects are never \
                 evicted to make room, so delete some or give the cache more disk"
            );
            tracing::warn!("{msg}");
            WireError::new(ErrorCode::NoSpace, msg)
        }
        _ => WireError::new(ErrorCode::Internal, format!("write_memarts {url}: {e}")),
    }
}
