//! The [`IoEngine`] trait (positional file I/O with owned buffers, used as
//! `Arc<dyn IoEngine>`), the [`IoEngineKind`] setting and [`select_io_engine`], which picks
//! io_uring where the kernel allows it and falls back to pread otherwise.

use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use super::pread::PreadEngine;
use super::uring::UringEngine;

/// A boxed, sendable, `'static` future (defined here to avoid the `futures` crate).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Ring size used by [`select_io_engine`].
pub const DEFAULT_URING_ENTRIES: u32 = 256;

/// Asynchronous positional I/O on files, with owned buffers so that an I/O engine can keep them
/// alive for as long as the kernel may touch them. The `Arc<File>` keeps the descriptor open
/// for the duration of the operation.
///
/// Depending on the I/O engine, an operation may be started when the method is called rather
/// than when the future is first polled; dropping the future never cancels a started
/// operation, it only discards the result.
pub trait IoEngine: Send + Sync {
    /// Reads exactly `len` bytes at `offset`. Short reads are continued; reaching end of file
    /// first gives an [`io::ErrorKind::UnexpectedEof`] error, never a short buffer.
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>>;

    /// Writes all of `data` at `offset`, continuing after short writes.
    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>>;

    /// Writes all of `parts`, one after the other, at `offset`, on the calling (blocking) thread:
    /// how a new chunk file is filled, between its create and its rename, in one trip to the
    /// blocking pool (`ChunkStore::put`). Both engines use `pwritev`: a buffered write gains nothing
    /// from io_uring, which hands it to a kernel worker thread (io-wq) anyway, one more thread
    /// hop per chunk. Test engines override it to fail.
    fn write_parts_blocking(&self, file: &File, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        super::pread::write_all_vectored_at(file, offset, parts)
    }

    /// Flushes the file to stable storage: `fdatasync` when `data_only`, else `fsync`.
    fn fsync(&self, file: Arc<File>, data_only: bool) -> BoxFuture<io::Result<()>>;

    /// The I/O engine's name: `"io_uring"` or `"pread"`.
    fn name(&self) -> &'static str;
}

pub use memarts_settings::{IoEngineKind, UnknownIoEngine};

/// Builds the I/O engine for `kind`. The second value is set when `Auto` fell back to pread and
/// says why (log it). `IoUring` fails instead of falling back.
pub fn select_io_engine(kind: IoEngineKind) -> io::Result<(Arc<dyn IoEngine>, Option<String>)> {
    select_io_engine_with(kind, || UringEngine::new(DEFAULT_URING_ENTRIES))
}

/// [`select_io_engine`] with the io_uring constructor injected (tests use it to simulate a
/// kernel or seccomp policy that refuses io_uring). `try_uring` is not called for `Pread`.
pub fn select_io_engine_with(
    kind: IoEngineKind,
    try_uring: impl FnOnce() -> io::Result<UringEngine>,
) -> io::Result<(Arc<dyn IoEngine>, Option<String>)> {
    match kind {
        IoEngineKind::Pread => Ok((Arc::new(PreadEngine::new()), None)),
        IoEngineKind::IoUring => {
            let io = try_uring()
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring engine unavailable: {e}")))?;
            Ok((Arc::new(io), None))
        }
        IoEngineKind::Auto => match try_uring() {
            Ok(io) => Ok((Arc::new(io), None)),
            Err(e) => {
                let reason = format!("io_uring unavailable ({e}); falling back to pread");
                Ok((Arc::new(PreadEngine::new()), Some(reason)))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eperm() -> io::Result<UringEngine> {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }

    #[test]
    fn auto_falls_back_to_pread_with_reason() {
        let (io, reason) = select_io_engine_with(IoEngineKind::Auto, eperm).unwrap();
        assert_eq!(io.name(), "pread");
        let reason = reason.expect("a fallback reason");
        assert!(reason.contains("not permitted"), "{reason}");
    }

    #[test]
    fn io_uring_kind_fails_instead_of_falling_back() {
        let err = select_io_engine_with(IoEngineKind::IoUring, eperm).err().expect("an error");
        assert_eq!(err.raw_os_error(), None);
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("io_uring"), "{err}");
    }

    #[test]
    fn pread_kind_never_tries_uring() {
        let (io, reason) =
            select_io_engine_with(IoEngineKind::Pread, || panic!("must not be called")).unwrap();
        assert_eq!((io.name(), reason), ("pread", None));
    }

    #[test]
    fn auto_uses_uring_when_it_works() {
        let (io, reason) = select_io_engine(IoEngineKind::Auto).unwrap();
        assert_eq!((io.name(), reason), ("io_uring", None));
    }
}
