//! `UringEngine`: the io_uring [`IoEngine`]. One dedicated OS thread (`memarts-uring`) owns
//! the ring (see `uring_ring.rs`); this file holds the submitting side.
//!
//! A submitter packs the operation — its owned buffer, the `Arc<File>` that keeps the fd
//! open and a oneshot reply sender — into an [`Op`], sends it over a std mpsc channel and
//! wakes the ring thread through an eventfd. Wakes are coalesced: only the submitter that
//! turns the `pending` flag from false to true writes the eventfd, so a burst of submissions
//! costs one `write(2)`. Operations start when the method is called (not when the future is
//! polled); dropping the future only discards the result.
//!
//! Dropping the I/O engine sends a shutdown message; the ring thread finishes every operation
//! already sent, then exits and is joined (so drop blocks until in-flight I/O completes).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use bytes::Bytes;
use io_uring::{opcode, IoUring, Probe};
use tokio::sync::oneshot;

use super::io_engine::{BoxFuture, IoEngine};
use super::uring_ring::RingDriver;

/// Largest ring the kernel accepts (IORING_MAX_ENTRIES).
const MAX_ENTRIES: u32 = 32768;

/// One operation on its way to, or inside, the ring.
pub(super) struct Op {
    pub(super) file: Arc<File>,
    pub(super) offset: u64,
    pub(super) kind: OpKind,
}

pub(super) enum OpKind {
    /// `buf` has capacity `len`; its length is the number of bytes read so far.
    Read {
        buf: Vec<u8>,
        len: usize,
        reply: oneshot::Sender<io::Result<Vec<u8>>>,
    },
    /// `done` bytes of `data` are written so far.
    Write {
        data: Bytes,
        done: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Fsync {
        data_only: bool,
        reply: oneshot::Sender<io::Result<()>>,
    },
}

pub(super) enum Msg {
    Op(Op),
    Shutdown,
}

/// The eventfd that wakes the ring thread, and the flag that coalesces wakes.
pub(super) struct Wake {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl Wake {
    fn new() -> io::Result<Wake> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(Wake { fd: unsafe { OwnedFd::from_raw_fd(fd) }, pending: AtomicBool::new(false) })
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Wakes the ring thread unless a wake is already on its way. The swap is AcqRel so the
    /// ring thread's `clear_pending` synchronizes with it and then sees the message sent
    /// before it.
    fn notify(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.signal();
        }
    }

    /// Called by the ring thread on each eventfd completion, before draining the channel.
    pub(super) fn clear_pending(&self) {
        self.pending.swap(false, Ordering::AcqRel);
    }

    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        loop {
            // SAFETY: writes 8 bytes from a live local array to an eventfd we own.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}

/// The io_uring engine; see the module docs.
pub struct UringEngine {
    tx: mpsc::Sender<Msg>,
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
    entries: u32,
}

impl UringEngine {
    /// Creates a ring of `entries` submission entries (clamped to 4..=32768, rounded up to a
    /// power of two by the kernel) and starts its thread. At most `entries - 2` operations
    /// are in flight; more are queued. Fails with the kernel's error (e.g. EPERM or ENOSYS
    /// under seccomp) when io_uring is unavailable.
    pub fn new(entries: u32) -> io::Result<Self> {
        let ring = IoUring::new(entries.clamp(4, MAX_ENTRIES))?;
        check_opcodes(&ring)?;
        let entries = ring.params().sq_entries();
        let wake = Arc::new(Wake::new()?);
        let (tx, rx) = mpsc::channel();
        let driver = RingDriver::new(ring, rx, Arc::clone(&wake));
        let thread = std::thread::Builder::new().name("memarts-uring".into()).spawn(move || driver.run())?;
        Ok(UringEngine { tx, wake, thread: Some(thread), entries })
    }

    /// The ring's submission queue size.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    fn submit<T: Send + 'static>(
        &self,
        op: Op,
        rx: oneshot::Receiver<io::Result<T>>,
    ) -> BoxFuture<io::Result<T>> {
        let sent = self.tx.send(Msg::Op(op)).map_err(|_| stopped());
        if sent.is_ok() {
            self.wake.notify();
        }
        Box::pin(async move {
            sent?;
            rx.await.map_err(|_| stopped())?
        })
    }
}

/// Kernels 5.1–5.5 create rings but lack IORING_OP_READ/WRITE (and the probe itself):
/// refuse them here, so that `Auto` falls back to pread instead of failing every op.
fn check_opcodes(ring: &IoUring) -> io::Result<()> {
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("io_uring opcode probe failed ({e}); kernel too old"),
        )
    })?;
    let needed = [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE, opcode::AsyncCancel::CODE];
    if needed.iter().all(|&code| probe.is_supported(code)) {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring lacks read/write/fsync/cancel opcodes"))
    }
}

fn stopped() -> io::Error {
    io::Error::other("the io_uring thread has stopped")
}

/// io_uring reads an offset of `u64::MAX` as "use the file position", and the kernel
/// rejects offsets past `i64::MAX`: refuse such ranges up front.
fn check_range(offset: u64, len: usize) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= i64::MAX as u64 => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "file range past i64::MAX")),
    }
}

impl IoEngine for UringEngine {
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> BoxFuture<io::Result<Vec<u8>>> {
        if let Err(e) = check_range(offset, len) {
            return Box::pin(async move { Err(e) });
        }
        if len == 0 {
            return Box::pin(async { Ok(Vec::new()) });
        }
        let (reply, rx) = oneshot::channel();
        let buf = Vec::with_capacity(len);
        self.submit(Op { file, offset, kind: OpKind::Read { buf, len, reply } }, rx)
    }

    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> BoxFuture<io::Result<()>> {
        if let Err(e) = check_range(offset, data.len()) {
            return Box::pin(async move { Err(e) });
        }
        if data.is_empty() {
            return Box::pin(async { Ok(()) });
        }
        let (reply, rx) = oneshot::channel();
        self.submit(Op { file, offset, kind: OpKind::Write { data, done: 0, reply } }, rx)
    }

    fn fsync(&self, file: Arc<File>, data_only: bool) -> BoxFuture<io::Result<()>> {
        let (reply, rx) = oneshot::channel();
        self.submit(Op { file, offset: 0, kind: OpKind::Fsync { data_only, reply } }, rx)
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The ring thread drains every op sent before this message, then exits.
        let _ = self.tx.send(Msg::Shutdown);
        self.wake.signal();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the io_uring thread panicked");
            }
        }
    }
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine").field("entries", &self.entries).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::thread::JoinHandleExt;
    use std::time::Duration;

    use super::*;

    impl UringEngine {
        /// CPU time consumed so far by the ring thread.
        fn thread_cpu_time(&self) -> Duration {
            let thread = self.thread.as_ref().expect("running").as_pthread_t();
            let mut clock: libc::clockid_t = 0;
            // SAFETY: `thread` is a live (not yet joined) thread; `clock` is a valid out-pointer.
            assert_eq!(unsafe { libc::pthread_getcpuclockid(thread, &mut clock) }, 0);
            let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `now` is a valid out-pointer and `clock` a valid clock id.
            assert_eq!(unsafe { libc::clock_gettime(clock, &mut now) }, 0);
            Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
        }
    }

    fn file_with(len: usize) -> (tempfile::TempDir, Arc<File>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; len]).unwrap();
        (dir, Arc::new(File::open(path).unwrap()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_ring_thread_does_not_spin() {
        let io = UringEngine::new(8).unwrap();
        let (_dir, file) = file_with(4096);
        for _ in 0..100 {
            io.read_at(Arc::clone(&file), 0, 4096).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = io.thread_cpu_time();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let spent = io.thread_cpu_time() - before;
        assert!(spent < Duration::from_millis(10), "idle ring thread used {spent:?} of CPU in 300 ms");
    }

    /// Submit-then-await loops from several threads depend on every wake being delivered
    /// (the coalescing flag must never swallow one): a lost wake shows up as a timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sequential_ops_from_many_tasks_never_stall() {
        let io = Arc::new(UringEngine::new(4).unwrap());
        let (_dir, file) = file_with(64 * 1024);
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let (io, file) = (Arc::clone(&io), Arc::clone(&file));
                tokio::spawn(async move {
                    for i in 0..2000u64 {
                        let offset = (t * 7919 + i * 4099) % (60 * 1024);
                        assert_eq!(io.read_at(Arc::clone(&file), offset, 512).await.unwrap().len(), 512);
                    }
                })
            })
            .collect();
        let all = async {
            for task in tasks {
                task.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(60), all).await.expect("an op stalled");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drop_drains_in_flight_ops() {
        let io = UringEngine::new(4).unwrap();
        let (_dir, file) = file_with(1 << 20);
        let reads: Vec<_> = (0..64).map(|i| io.read_at(Arc::clone(&file), i * 1024, 4096)).collect();
        drop(io);
        for read in reads {
            assert_eq!(read.await.unwrap(), vec![7u8; 4096]);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn offsets_past_i64_max_are_refused() {
        let io = UringEngine::new(4).unwrap();
        let (_dir, file) = file_with(1);
        for offset in [u64::MAX, i64::MAX as u64] {
            let err = io.read_at(Arc::clone(&file), offset, 1).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            let err = io.write_at(Arc::clone(&file), offset, Bytes::from_static(b"x")).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
    }
}
