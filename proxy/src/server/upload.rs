//! Uploads on one connection: `PutStart`, any number of `PutData`, then `PutFinish`, which checks
//! the size and CRC32C of everything received before the new version becomes visible at the origin.
//! At most one upload per connection; one left unfinished is abandoned (aborted) when the next
//! starts or the connection ends.

use memarts_protocol::{Crc32c, ErrorCode, ObjectMeta, ObjectUrl, Response, WireError};

use crate::cache::Cache;
use crate::origin::Upload;

/// Bytes per multipart part sent to the origin.
const PART_SIZE: usize = 8 << 20;

struct Current {
    url: ObjectUrl,
    upload: Upload,
    crc: Crc32c,
}

#[derive(Default)]
pub struct Uploads {
    current: Option<Current>,
}

fn error(code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::Error(WireError::new(code, msg))
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
                self.current = Some(Current { url, upload, crc: Crc32c::default() });
                Response::PutAck { received: 0 }
            }
            Err(e) => Response::Error(e.into()),
        }
    }

    pub async fn data(&mut self, bytes: &[u8]) -> Response {
        let Some(cur) = self.current.as_mut() else {
            return error(ErrorCode::BadRequest, "PutData without PutStart");
        };
        cur.crc.update(bytes);
        match cur.upload.write(bytes).await {
            Ok(()) => Response::PutAck { received: cur.upload.written() },
            Err(e) => {
                self.abandon().await;
                Response::Error(e.into())
            }
        }
    }

    pub async fn finish(&mut self, cache: &Cache, size: u64, crc32c: u32) -> Response {
        let Some(cur) = self.current.take() else {
            return error(ErrorCode::BadRequest, "PutFinish without PutStart");
        };
        let (written, crc) = (cur.upload.written(), cur.crc.finish());
        if written != size || crc != crc32c {
            cur.upload.abort().await;
            return error(
                ErrorCode::BadRequest,
                format!("upload of {} ended with {written} bytes (crc {crc:08x}); the client sent {size} (crc {crc32c:08x}); nothing was written", cur.url),
            );
        }
        match cur.upload.finish().await {
            Ok((etag, version)) => {
                let now =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let meta = ObjectMeta { size, etag, version, last_modified_ms: now.as_millis() as i64 };
                cache.note_written(&cur.url, &meta);
                Response::Put(meta)
            }
            Err(e) => Response::Error(e.into()),
        }
    }

    pub async fn abandon(&mut self) {
        if let Some(cur) = self.current.take() {
            cur.upload.abort().await;
        }
    }
}
