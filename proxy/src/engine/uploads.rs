//! Writes through a slot: a new version of an object at the origin (a multipart upload, sent in
//! parts as the bytes arrive), or a memarts-only object (`write_memarts`, the cache holds the only
//! copy). Either way the size and CRC32C of everything received are checked against what the client
//! says it sent before the new version becomes visible (at the origin) or durable (memarts-only);
//! an upload abandoned or refused leaves nothing behind.

use std::sync::Arc;

use memarts_protocol::{Crc32c, ErrorCode, ObjectMeta, ObjectUrl, WireError};

use super::{parse_url, Engine};
use crate::memarts_only::{wire_error, OnlyStore, Writer, MEMARTS_ONLY_ETAG};

/// Bytes per multipart part sent to the origin.
const PART_SIZE: usize = 8 << 20;

/// One upload in progress (a connection holds at most one).
pub struct Upload {
    url: ObjectUrl,
    target: Target,
}

enum Target {
    Origin {
        upload: crate::origin::Upload,
        crc: Crc32c,
    },
    /// The writer is taken while a blocking write holds it.
    Only {
        store: Arc<OnlyStore>,
        writer: Option<Writer>,
    },
}

fn internal(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Internal, msg)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Engine {
    /// Starts writing a new version of `url` at the origin.
    pub async fn start_upload(&self, url: &str) -> Result<Upload, WireError> {
        let url = parse_url(url)?;
        let upload = self.origin.start_upload(&url, PART_SIZE).await?;
        Ok(Upload { url, target: Target::Origin { upload, crc: Crc32c::default() } })
    }

    /// Starts writing the memarts-only object `url`.
    pub async fn start_memarts_only(&self, url: &str) -> Result<Upload, WireError> {
        let url = parse_url(url)?;
        let store = self.only_store()?;
        let (begun, url) = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || (store.begin(&url), url))
                .await
                .map_err(|e| internal(e.to_string()))?
        };
        match begun {
            Ok(writer) => Ok(Upload { url, target: Target::Only { store, writer: Some(writer) } }),
            Err(e) => Err(wire_error(e.into(), &url)),
        }
    }

    /// Completes `upload` if it received exactly `size` bytes with CRC32C `crc32c`: the new version
    /// is visible at the origin (and to reads through this slot at once), or the memarts-only object
    /// is durable. Otherwise nothing is written.
    pub async fn finish_upload(
        self: &Arc<Self>,
        upload: Upload,
        size: u64,
        crc32c: u32,
    ) -> Result<ObjectMeta, WireError> {
        let url = upload.url;
        let mismatch = |written: u64, crc: u32| {
            WireError::new(
                ErrorCode::BadRequest,
                format!(
                    "upload of {url} ended with {written} bytes (crc {crc:08x}); the client sent {size} \
                     (crc {crc32c:08x}); nothing was written"
                ),
            )
        };
        match upload.target {
            Target::Origin { upload, crc } => {
                let (written, crc) = (upload.written(), crc.finish());
                if written != size || crc != crc32c {
                    upload.abort().await;
                    return Err(mismatch(written, crc));
                }
                let (etag, version) = upload.finish().await?;
                let meta = ObjectMeta { size, etag, version, last_modified_ms: now_ms() };
                self.metadata.note_written(&url, &meta).await;
                Ok(meta)
            }
            Target::Only { store, writer } => {
                let Some(w) = writer else { return Err(internal("upload state lost")) };
                let (written, crc) = (w.written(), w.crc());
                if written != size || crc != crc32c {
                    return Err(mismatch(written, crc));
                }
                match tokio::task::spawn_blocking(move || store.commit(w)).await {
                    Ok(Ok(_)) => Ok(ObjectMeta {
                        size,
                        etag: Some(MEMARTS_ONLY_ETAG.into()),
                        version: None,
                        last_modified_ms: now_ms(),
                    }),
                    Ok(Err(e)) => Err(wire_error(e, &url)),
                    Err(e) => Err(internal(e.to_string())),
                }
            }
        }
    }
}

impl Upload {
    /// Appends `bytes`; returns how many bytes the upload holds now.
    pub async fn write(&mut self, bytes: Vec<u8>) -> Result<u64, WireError> {
        match &mut self.target {
            Target::Origin { upload, crc } => {
                crc.update(&bytes);
                upload.write(&bytes).await?;
                Ok(upload.written())
            }
            Target::Only { writer, .. } => {
                let Some(mut w) = writer.take() else { return Err(internal("upload state lost")) };
                let (w, wrote) = tokio::task::spawn_blocking(move || {
                    let r = w.write(&bytes);
                    (w, r)
                })
                .await
                .map_err(|e| internal(e.to_string()))?;
                let written = w.written();
                *writer = Some(w);
                wrote.map(|()| written).map_err(|e| wire_error(e.into(), &self.url))
            }
        }
    }

    /// Gives up: nothing becomes visible at the origin, and a memarts-only temp file is removed.
    pub async fn abort(self) {
        match self.target {
            Target::Origin { upload, .. } => upload.abort().await,
            // Dropping the writer removes its temp file.
            Target::Only { writer, .. } => drop(writer),
        }
    }
}
