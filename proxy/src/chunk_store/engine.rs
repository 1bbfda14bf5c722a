//! The [`IoEngine`] trait (positional file I/O with owned buffers, used as
//! `Arc<dyn IoEngine>`), the [`EngineKind`] setting and [`select_engine`], which picks
//! io_uring where the kernel allows it and falls back to pread otherwise.

use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;

use super::pread::PreadEngine;
use super::uring::UringEngine;

/// A boxed, sendable, `'static` future (defined here to avoid the `futures` crate).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Ring size used by [`select_engine`].
pub const DEFAULT_URING_ENTRIES: u32 = 256;

/// Asynchronous positional I/O on files, with owned buffers so that an engine can keep them
/// alive for as long as the kernel may touch them. The `Arc<File>` keeps the descriptor open
/// for the duration of the operation.
///
/// Depending on the engine, an operation may be started when the method is called rather
/// than when the future is first polled; dropping the future never cancels a started
/// operation, it only discards the result.
pub trait IoEngine: Send + Sync {
    /// Reads exactly `len` bytes at `offset`. Short reads are continued; reaching end of file
    /// first gives an [`io::ErrorKind::UnexpectedEof`] error, never a short buffer.
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>>;

    /// Writes all of `data` at `offset`, continuing after short writes.
    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>>;

    /// Flushes the file to stable storage: `fdatasync` when `data_only`, else `fsync`.
    fn fsync(&self, file: Arc<File>, data_only: bool) -> BoxFuture<io::Result<()>>;

    /// The engine's name: `"io_uring"` or `"pread"`.
    fn name(&self) -> &'static str;
}

/// Which engine to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring when available, otherwise pread.
    #[default]
    Auto,
    /// io_uring, or an error when the kernel refuses it.
    IoUring,
    /// Blocking pread/pwrite on tokio's blocking pool.
    Pread,
}

/// A name that is none of the [`EngineKind`]s; the message lists those that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown I/O engine {text:?}: expected one of auto, io_uring (or uring), pread")]
pub struct UnknownEngine {
    /// The name as it was given.
    pub text: String,
}

impl FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(EngineKind::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(EngineKind::IoUring),
            "pread" => Ok(EngineKind::Pread),
            _ => Err(UnknownEngine { text: text.to_string() }),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Auto => "auto",
            EngineKind::IoUring => "io_uring",
            EngineKind::Pread => "pread",
        })
    }
}

/// Builds the engine for `kind`. The second value is set when `Auto` fell back to pread and
/// says why (log it). `IoUring` fails instead of falling back.
pub fn select_engine(kind: EngineKind) -> io::Result<(Arc<dyn IoEngine>, Option<String>)> {
    select_engine_with(kind, || UringEngine::new(DEFAULT_URING_ENTRIES))
}

/// [`select_engine`] with the io_uring constructor injected (tests use it to simulate a
/// kernel or seccomp policy that refuses io_uring). `try_uring` is not called for `Pread`.
pub fn select_engine_with(
    kind: EngineKind,
    try_uring: impl FnOnce() -> io::Result<UringEngine>,
) -> io::Result<(Arc<dyn IoEngine>, Option<String>)> {
    match kind {
        EngineKind::Pread => Ok((Arc::new(PreadEngine::new()), None)),
        EngineKind::IoUring => {
            let engine = try_uring()
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring engine unavailable: {e}")))?;
            Ok((Arc::new(engine), None))
        }
        EngineKind::Auto => match try_uring() {
            Ok(engine) => Ok((Arc::new(engine), None)),
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
        let (engine, reason) = select_engine_with(EngineKind::Auto, eperm).unwrap();
        assert_eq!(engine.name(), "pread");
        let reason = reason.expect("a fallback reason");
        assert!(reason.contains("not permitted"), "{reason}");
    }

    #[test]
    fn io_uring_kind_fails_instead_of_falling_back() {
        let err = select_engine_with(EngineKind::IoUring, eperm).err().expect("an error");
        assert_eq!(err.raw_os_error(), None);
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("io_uring"), "{err}");
    }

    #[test]
    fn pread_kind_never_tries_uring() {
        let (engine, reason) =
            select_engine_with(EngineKind::Pread, || panic!("must not be called")).unwrap();
        assert_eq!((engine.name(), reason), ("pread", None));
    }

    #[test]
    fn auto_uses_uring_when_it_works() {
        let (engine, reason) = select_engine(EngineKind::Auto).unwrap();
        assert_eq!((engine.name(), reason), ("io_uring", None));
    }

    #[test]
    fn kind_parses() {
        assert_eq!("auto".parse(), Ok(EngineKind::Auto));
        assert_eq!("io_uring".parse(), Ok(EngineKind::IoUring));
        assert_eq!("URING".parse(), Ok(EngineKind::IoUring));
        assert_eq!("pread".parse(), Ok(EngineKind::Pread));
        let err = "mmap".parse::<EngineKind>().unwrap_err();
        assert_eq!(err, UnknownEngine { text: "mmap".into() });
        let err = err.to_string();
        assert!(err.contains("mmap") && err.contains("pread"), "{err}");
        for kind in [EngineKind::Auto, EngineKind::IoUring, EngineKind::Pread] {
            assert_eq!(kind.to_string().parse(), Ok(kind));
        }
    }
}
