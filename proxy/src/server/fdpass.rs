//! Sending a frame with a file descriptor attached (`SCM_RIGHTS`), on a tokio Unix stream.
//!
//! The descriptor rides on the first byte of the frame; the client's first `recvmsg` of the frame
//! head collects it. Linux never merges a stream read across a boundary where ancillary data
//! starts, so the descriptor cannot be picked up by the wrong frame.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

/// Writes all of `frame`, passing `fds` with its first byte.
pub async fn send_with_fds(stream: &mut UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() {
        return stream.write_all(frame).await;
    }
    let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let sock = stream.as_raw_fd();
    let sent = loop {
        stream.writable().await?;
        let attempt = stream.try_io(Interest::WRITABLE, || {
            let cmsg = [ControlMessage::ScmRights(&raw)];
            sendmsg::<()>(sock, &[IoSlice::new(frame)], &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                .map_err(io::Error::from)
        });
        match attempt {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    if sent < frame.len() {
        stream.write_all(&frame[sent..]).await?;
    }
    Ok(())
}
