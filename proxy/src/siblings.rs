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
    Failed { slot: u32, why: String },
    #[error("slot {slot} did not answer within {timeout:?}")]
    Timeout { slot: u32, timeout: Duration },
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
            Ok::<_, String>((stream, response))
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

    async fn connect(&self, slot: u32) -> Result<UnixStream, String> {
        let path = memarts_protocol::layout::socket_path(&self.run_dir, slot);
        let mut stream = UnixStream::connect(&path).await.map_err(|e| format!("{}: {e}", path.display()))?;
        let uid = stream.peer_cred().map_err(|e| e.to_string())?.uid();
        if uid != nix::unistd::getuid().as_raw() {
            return Err(format!("{} is served by uid {uid}, not ours", path.display()));
        }
        let hello = Request::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: format!("memarts-proxy/{} slot {}", env!("CARGO_PKG_VERSION"), self.me),
        });
        match exchange(&mut stream, &hello).await? {
            Response::Welcome(_) => Ok(stream),
            other => Err(format!("unexpected answer to Hello: {other:?}")),
        }
    }
}

/// Sends `request`, reads its response (no payload is expected, and any is refused).
async fn exchange(stream: &mut UnixStream, request: &Request) -> Result<Response, String> {
    let bytes = frame::encode(request, 0).map_err(|e| e.to_string())?;
    stream.write_all(&bytes).await.map_err(|e| e.to_string())?;
    let limits = Limits { max_message: Limits::RESPONSE.max_message, max_payload: 0 };
    let (_, response) = frame::read_async::<Response, _>(stream, limits).await.map_err(|e| e.to_string())?;
    Ok(response)
}
