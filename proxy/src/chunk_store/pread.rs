//! `PreadEngine`: the portable [`IoEngine`], running blocking `pread`/`pwrite`/`fsync` on
//! tokio's blocking thread pool. Used where io_uring is unavailable (old kernels, seccomp).
//!
//! Operations start when their future is first polled, which must happen inside a tokio
//! runtime. Read buffers are zero-filled before reading (simple and safe; the cost is small
//! next to a blocking-pool hop).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use super::engine::{BoxFuture, IoEngine};

/// The [`IoEngine`] built on blocking positional syscalls.
#[derive(Clone, Copy, Debug, Default)]
pub struct PreadEngine;

impl PreadEngine {
    pub fn new() -> Self {
        PreadEngine
    }
}

/// Runs blocking file work on tokio's blocking pool.
pub(super) async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| io::Error::other(format!("blocking I/O task failed: {e}")))?
}

impl IoEngine for PreadEngine {
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>> {
        Box::pin(async move {
            if len == 0 {
                return Ok(Vec::new());
            }
            run_blocking(move || {
                let mut buf = vec![0; len];
                // `read_exact_at` continues after short reads and reports EOF as UnexpectedEof.
                file.read_exact_at(&mut buf, offset)?;
                Ok(buf)
            })
            .await
        })
    }

    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>> {
        Box::pin(async move {
            if data.is_empty() {
                return Ok(());
            }
            // `write_all_at` continues after short writes.
            run_blocking(move || file.write_all_at(&data, offset)).await
        })
    }

    fn fsync(&self, file: Arc<File>, data_only: bool) -> BoxFuture<io::Result<()>> {
        Box::pin(run_blocking(move || if data_only { file.sync_data() } else { file.sync_all() }))
    }

    fn name(&self) -> &'static str {
        "pread"
    }
}
