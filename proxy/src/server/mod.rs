//! The socket side of a slot: bind (0600 from creation), accept with a connection limit, one task per
//! connection, and drain on shutdown. A connection (`conn.rs`) opens with the handshake
//! (`handshake.rs`: the peer-credential check, then `Hello`), then reads one request at a time and
//! hands it to its handler (`dispatch.rs`), which maps it to engine calls and the answer to a reply
//! (`reply.rs`, with `fdpass.rs` for passed descriptors). Clients of other uids may read local paths
//! only under `local_roots` (`local_access.rs`). `run` is what both the `memarts-proxy` binary and in-process
//! tests call.

mod conn;
mod dispatch;
mod fdpass;
mod handshake;
mod local_access;
mod reply;

use std::io;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::{frame, ErrorCode, Response, WireError};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use conn::ConnSettings;
pub use local_access::{LocalAccess, LocalUse};

use crate::engine::Engine;

/// Binds a Unix socket that is 0600 from the moment it exists (umask around `bind`). A stale socket
/// file at `path` is removed first: the caller holds the slot's pid-file lock, so no live proxy owns it.
pub fn bind_socket(path: &Path) -> io::Result<StdUnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = StdUnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Binds a Unix socket inside a directory only we can enter (0700), then makes it 0600. Unlike
/// [`bind_socket`] it leaves the process umask alone, so it is safe in a multi-threaded process.
pub fn bind_socket_in_private_dir(path: &Path) -> io::Result<StdUnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let listener = StdUnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves `listener` until `shutdown` is cancelled, then lets in-flight requests finish for up to
/// `drain_timeout`. Never returns an error for anything a client does.
pub async fn run(
    engine: Arc<Engine>,
    settings: ConnSettings,
    listener: UnixListener,
    max_connections: usize,
    drain_timeout: Duration,
    shutdown: CancellationToken,
) {
    let settings = Arc::new(settings);
    let permits = Arc::new(Semaphore::new(max_connections));
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let mut stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning or dying.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracker.spawn(async move {
                let err = WireError::new(ErrorCode::Unavailable, "too many connections to this proxy slot");
                if let Ok(bytes) = frame::encode(&Response::Error(err), 0) {
                    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
                }
            });
            continue;
        };
        let (engine, settings, drain) = (engine.clone(), settings.clone(), shutdown.clone());
        tracker.spawn(async move {
            conn::serve(stream, engine, settings, drain).await;
            drop(permit);
        });
    }
    tracker.close();
    if tokio::time::timeout(drain_timeout, tracker.wait()).await.is_err() {
        tracing::warn!("{} connections still busy after {drain_timeout:?}; exiting anyway", tracker.len());
    }
}
