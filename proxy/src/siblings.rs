//! The other slots of this fleet, as a slot asks them something (`Request::Revalidate`): over
//! their Unix sockets in the run dir, as any client would, through a few pooled connections each.
//! Only sockets served by this process's own uid are used.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use memarts_protocol::{frame, Hello, Limits, Request, Response, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// Connections kept per sibling.
const POOL: usize = 8;

pub struct Siblings {
    run_dir: PathBuf,
    me: u32,
    timeout: Duration,
    pool: Mutex<HashMap<u32, Vec<UnixStream>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SiblingError {
    #[error("slot {slot}: {why}")]
    Failed {
        slot: u32,
        #[source]
        why: Fault,
    },
    #[error("slot {slot} did not answer within {timeout:?}")]
    Timeout { slot: u32, timeout: Duration },
}

/// What went wrong on the way to a sibling.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    #[error("{}: {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("{} is served by uid {uid}, not ours", path.display())]
    Foreign { path: PathBuf, uid: u32 },
    #[error("unexpected answer to Hello: {0}")]
    Unexpected(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] memarts_protocol::FrameError),
}

impl Siblings {
    /// The slots of the fleet whose run dir is `run_dir`, asked by slot `me`, each call within
    /// `timeout`.
    pub fn new(run_dir: PathBuf, me: u32, timeout: Duration) -> Siblings {
        Siblings { run_dir, me, timeout, pool: Mutex::default() }
    }

    /// `request` to slot `slot`, on a pooled connection (or a new one, once, if the pooled one
    /// fails: the slot may have restarted).
    pub async fn call(&self, slot: u32, request: &Request) -> Result<Response, SiblingError> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&slot).and_then(Vec::pop);
        let fresh = pooled.is_none();
        let attempt = |stream: Option<UnixStream>| async move {
            let mut stream = match stream {
                Some(s) => s,
                None => self.connect(slot).await?,
            };
            let response = exchange(&mut stream, request).await?;
            Ok::<_, Fault>((stream, response))
        };
        let timed = |stream| async move {
            match tokio::time::timeout(self.timeout, attempt(stream)).await {
                Ok(r) => r.map_err(|why| SiblingError::Failed { slot, why }),
                Err(_) => Err(SiblingError::Timeout { slot, timeout: self.timeout }),
            }
        };
        let (stream, response) = match timed(pooled).await {
            Err(SiblingError::Failed { .. }) if !fresh => timed(None).await?,
            other => other?,
        };
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let kept = pool.entry(slot).or_default();
        if kept.len() < POOL {
            kept.push(stream);
        }
        Ok(response)
    }

    async fn connect(&self, slot: u32) -> Result<UnixStream, Fault> {
        let path = memarts_disk::layout::socket_path(&self.run_dir, slot);
        let mut stream = match UnixStream::connect(&path).await {
            Ok(stream) => stream,
            Err(source) => return Err(Fault::Connect { path, source }),
        };
        let uid = stream.peer_cred()?.uid();
        if uid != nix::unistd::getuid().as_raw() {
            return Err(Fault::Foreign { path, uid });
        }
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: format!("memarts-proxy/{} slot {}", env!("CARGO_PKG_VERSION"), self.me),
        });
        match exchange(&mut stream, &hello).await? {
            Response::Welcome(_) => Ok(stream),
            other => Err(Fault::Unexpected(format!("{other:?}"))),
        }
    }
}

/// Sends `request`, reads its response (no payload is expected, and any is refused).
async fn exchange(stream: &mut UnixStream, request: &Request) -> Result<Response, Fault> {
    let bytes = frame::encode(request, 0)?;
    stream.write_all(&bytes).await?;
    let limits = Limits { max_message: Limits::RESPONSE.max_message, max_payload: 0 };
    let (_, response) = frame::read_async::<Response, _>(stream, limits).await?;
    Ok(response)
}
