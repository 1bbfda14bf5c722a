//! An upload to the origin in progress (`Origin::start_upload`): a multipart upload whose parts are
//! sent in the background, a bounded number at a time.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, WriteMultipart};

use super::OriginError;

/// An upload in progress: bytes are buffered into parts and sent in the background, a bounded
/// number at a time. Dropping it without [`Upload::finish`] abandons it (nothing becomes visible).
pub struct Upload {
    writer: WriteMultipart,
    written: u64,
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl Upload {
    /// Parts sent at once per upload; a writer waits for room before buffering more.
    const PARTS_IN_FLIGHT: usize = 4;

    pub(super) fn new(writer: WriteMultipart, store: Arc<dyn ObjectStore>, path: Path) -> Upload {
        Upload { writer, written: 0, store, path }
    }

    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), OriginError> {
        self.writer.wait_for_capacity(Self::PARTS_IN_FLIGHT).await.map_err(OriginError::from_store)?;
        self.writer.write(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Completes the upload; the new version becomes visible. Returns its ETag and version.
    pub async fn finish(self) -> Result<(Option<String>, Option<String>), OriginError> {
        if self.written == 0 {
            // A multipart upload needs at least one part: an empty object is a plain PUT.
            let _ = self.writer.abort().await;
            let put =
                self.store.put(&self.path, Vec::<u8>::new().into()).await.map_err(OriginError::from_store)?;
            return Ok((put.e_tag, put.version));
        }
        let put = self.writer.finish().await.map_err(OriginError::from_store)?;
        Ok((put.e_tag, put.version))
    }

    /// Abandons the upload (its parts are deleted).
    pub async fn abort(self) {
        let _ = self.writer.abort().await;
    }
}
