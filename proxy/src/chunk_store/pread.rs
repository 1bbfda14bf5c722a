//! `PreadEngine`: the portable [`IoEngine`], running blocking `pread`/`pwrite`/`fsync` on
//! tokio's blocking thread pool. Used where io_uring is unavailable (old kernels, seccomp); its
//! [`write_all_vectored_at`] fills every new chunk file, whatever the I/O engine (`store.rs` says why).
//!
//! Operations start when their future is first polled, which must happen inside a tokio
//! runtime. Read buffers are zero-filled before reading (simple and safe; the cost is small
//! next to a blocking-pool hop).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use super::io_engine::{BoxFuture, IoEngine};

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

/// Writes all of `parts`, one after the other, at `offset`: one `pwritev` for all of them, continued
/// after a short write.
pub(super) fn write_all_vectored_at(file: &File, mut offset: u64, parts: &[&[u8]]) -> io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let mut first = 0;
    while first < parts.len() {
        let slices: Vec<io::IoSlice<'_>> = parts[first..].iter().map(|p| io::IoSlice::new(p)).collect();
        let offset_arg = i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut n = match nix::sys::uio::pwritev(file, &slices, offset_arg) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += n as u64;
        while first < parts.len() && n >= parts[first].len() {
            n -= parts[first].len();
            first += 1;
        }
        if n > 0 {
            parts[first] = &parts[first][n..];
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_put_every_part_in_order_at_the_offset() {
        let file = tempfile::tempfile().unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        write_all_vectored_at(&file, 10, &[b"head", b"", &big, b"tail"]).unwrap();
        let mut got = vec![0; 10 + 4 + big.len() + 4];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..10], &[0; 10]);
        assert_eq!(&got[10..14], b"head");
        assert!(got[14..14 + big.len()] == big[..]);
        assert_eq!(&got[14 + big.len()..], b"tail");
        write_all_vectored_at(&file, 0, &[]).unwrap();
    }
}
