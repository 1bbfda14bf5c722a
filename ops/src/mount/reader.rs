//! One file opened for reading: the object version pinned at open (its ETag, so a changed object
//! is never served mixed: a chunk of another version is a `Stale` error, `ESTALE`), read through
//! the shim's one read-ahead (`memarts_shim::readahead`: whole chunks, so the kernel's 128 KiB
//! requests cost one fleet read per chunk, a window ahead of a sequential reader, the memory bound
//! of all open files).

use std::sync::Arc;

use fuser::Errno;
use memarts_shim::readahead::{Readahead, Source};
use memarts_shim::ObjectMeta;

use super::errno::failed;
use super::Fleet;

pub struct Reader {
    window: Readahead,
}

impl Reader {
    pub fn new(fleet: Arc<Fleet>, url: String, meta: ObjectMeta) -> Reader {
        let source: Source = fleet;
        Reader { window: Readahead::new(source, &url, meta) }
    }

    pub fn url(&self) -> &str {
        self.window.url()
    }

    pub fn meta(&self) -> &ObjectMeta {
        self.window.meta()
    }

    /// Up to `size` bytes from `offset` (fewer at the end of the object, none past it).
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let len = u64::from(size).min(self.meta().size.saturating_sub(offset)) as usize;
        let mut out = Vec::with_capacity(len);
        let n = self
            .window
            .read(offset, &mut out.spare_capacity_mut()[..len])
            .map_err(|e| failed(&format!("read {} at {offset}", self.url()), &e))?;
        // SAFETY: `read` returned Ok(n): it wrote the first `n` bytes of the spare capacity.
        unsafe { out.set_len(n) };
        Ok(out)
    }

    /// The file was released: its chunks go now.
    pub fn close(&self) {
        self.window.close();
    }
}
