//! One synchronous connection to one proxy slot: connect (to a peer of the trusted uid only),
//! handshake, request/response in lockstep, and the receiving half of descriptor passing; and the
//! [`Dialer`] that opens them for a client and for its local source's read reports.

use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use memarts_disk::layout::socket_path;
use memarts_protocol::spin::Spinner;
use memarts_protocol::{
    frame, FrameHead, Hello, Limits, Request, Response, Welcome, FRAME_HEAD_LEN, MAX_BATCH, PROTOCOL_VERSION,
};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use crate::answer::expect_answer;
use crate::error::{Error, Result};

pub struct Conn {
    stream: UnixStream,
    spinner: Spinner,
    pub welcome: Welcome,
}

/// A response, the descriptors that came with it (in order), and the payload length still to be read.
pub struct Reply {
    pub response: Response,
    pub fds: Vec<OwnedFd>,
    pub payload_len: u32,
}

impl Conn {
    /// Connects and shakes hands; replies are polled for up to `spin` before blocking. The process
    /// on the other end must run as `owner` (the run dir's owner), checked before a byte is sent.
    pub fn connect(path: &Path, owner: u32, timeout: Duration, spin: Duration) -> Result<Conn> {
        let stream = UnixStream::connect(path)?;
        crate::trust::check_peer(&stream, path, owner)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = Conn { stream, spinner: Spinner::new(spin), welcome: placeholder_welcome() };
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            client: format!("memarts-shim/{} pid={}", env!("CARGO_PKG_VERSION"), std::process::id()),
        };
        let reply = conn.call(&Request::Hello(hello))?;
        conn.welcome = match reply.response {
            Response::Incompatible { message, .. } => return Err(Error::Protocol(message)),
            other => expect_answer!(other, "Hello", Response::Welcome(w) => w)?,
        };
        Ok(conn)
    }

    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        let t = Some(timeout.max(Duration::from_millis(10)));
        self.stream.set_read_timeout(t)?;
        self.stream.set_write_timeout(t)?;
        Ok(())
    }

    /// Sends a request and reads the response head and message; the payload stays on the socket.
    pub fn call(&mut self, request: &Request) -> Result<Reply> {
        self.call_with_payload(request, &[])
    }

    /// [`Conn::call`] for a request that carries `payload` bytes after its message.
    pub fn call_with_payload(&mut self, request: &Request, payload: &[u8]) -> Result<Reply> {
        self.send_with_payload(request, payload)?;
        self.receive()
    }

    /// Sends a request without waiting for its response, which [`Conn::receive`] reads later
    /// (responses come in the order of the requests).
    pub fn send(&mut self, request: &Request) -> Result<()> {
        self.send_with_payload(request, &[])
    }

    fn send_with_payload(&mut self, request: &Request, payload: &[u8]) -> Result<()> {
        let bytes = frame::encode(request, payload.len())?;
        self.stream.write_all(&bytes)?;
        if !payload.is_empty() {
            self.stream.write_all(payload)?;
        }
        Ok(())
    }

    /// Whether a read would not block: a response (or the end of the connection) has arrived.
    pub fn readable_now(&self) -> bool {
        memarts_protocol::spin::readable_now(self.stream.as_raw_fd())
    }

    /// Reads the response head and message of the oldest request not answered yet.
    pub fn receive(&mut self) -> Result<Reply> {
        let mut head = [0u8; FRAME_HEAD_LEN];
        let (filled, fds) = self.recv_head_with_fds(&mut head)?;
        frame::read_head_sync(&mut self.stream, &mut head, filled)?;
        let (FrameHead { payload_len, .. }, response) =
            frame::finish_read_sync(&mut self.stream, head, Limits::RESPONSE)?;
        Ok(Reply { response, fds, payload_len })
    }

    /// Reads `dst.len()` payload bytes straight into `dst`.
    pub fn read_payload(&mut self, dst: &mut crate::room::Room) -> Result<()> {
        crate::room::read_exact(&self.stream, dst)?;
        Ok(())
    }

    /// The first read of a frame, with room for the descriptors of a whole batch.
    fn recv_head_with_fds(&mut self, head: &mut [u8; FRAME_HEAD_LEN]) -> Result<(usize, Vec<OwnedFd>)> {
        let sock = self.stream.as_raw_fd();
        // A warm reply comes within microseconds: catch it before paying for a wake-up.
        self.spinner.wait_readable(sock);
        loop {
            let mut cmsg = nix::cmsg_space!([RawFd; MAX_BATCH]);
            let mut iov = [IoSliceMut::new(&mut head[..])];
            let msg = match recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(msg) => msg,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(std::io::Error::from(e).into()),
            };
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(|e| Error::Protocol(format!("control message: {e}")))? {
                if let ControlMessageOwned::ScmRights(raws) = c {
                    for raw in raws {
                        // SAFETY: the kernel just installed `raw` in our table for this message;
                        // nothing else owns it, so wrapping it makes us its only owner.
                        fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                    }
                }
            }
            if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
                return Err(Error::Protocol("more descriptors than a reply may carry".into()));
            }
            if msg.bytes == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            return Ok((msg.bytes, fds));
        }
    }
}

/// How a client reaches its fleet's slots: the run dir, the uid every slot's peer must run as, the
/// reply spin, and the fleet size that routing uses (a slot that welcomes a connection with another
/// size changes it). Shared by the client and its local source's read reports.
pub(crate) struct Dialer {
    pub run_dir: PathBuf,
    /// The uid the fleet's run dir belongs to, which every proxy socket's peer must run as.
    pub owner: u32,
    pub spin: Duration,
    slots: AtomicU32,
}

impl Dialer {
    pub fn new(run_dir: PathBuf, owner: u32, spin: Duration, slots: u32) -> Dialer {
        Dialer { run_dir, owner, spin, slots: AtomicU32::new(slots) }
    }

    /// The fleet size requests are routed by.
    pub fn slots(&self) -> u32 {
        self.slots.load(Ordering::Relaxed)
    }

    /// Routes by `n` slots from now on; whether that changed the size.
    pub fn set_slots(&self, n: u32) -> bool {
        self.slots.swap(n, Ordering::Relaxed) != n
    }

    /// A new connection to `slot`; a welcome with another fleet size changes the routing's.
    pub fn connect(&self, slot: u32, timeout: Duration) -> Result<Conn> {
        let conn = self.connect_once(slot, timeout)?;
        if conn.welcome.slots != 0 && conn.welcome.slots != self.slots() {
            // The fleet restarted with another size: route by the new one from now on.
            self.slots.store(conn.welcome.slots, Ordering::Relaxed);
        }
        Ok(conn)
    }

    /// A new connection to `slot`, its welcome not looked at (status requests).
    pub fn connect_once(&self, slot: u32, timeout: Duration) -> Result<Conn> {
        Conn::connect(&socket_path(&self.run_dir, slot), self.owner, timeout, self.spin)
    }
}

fn placeholder_welcome() -> Welcome {
    Welcome { protocol_version: 0, slot: 0, slots: 0, server: String::new() }
}
