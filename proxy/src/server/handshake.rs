//! The opening of a connection: the peer's uid, checked (`SO_PEERCRED`) before a single byte of it
//! is read (S1), then `Hello`, answered by `Welcome` or, for another protocol version,
//! `Incompatible`.

use memarts_protocol::{ErrorCode, FrameError, Request, Response, Welcome, WireError, PROTOCOL_VERSION};
use tokio::net::UnixStream;

use super::conn::{linger_close, read_request, refuse, ConnError, ConnSettings};
use super::reply::send;
use crate::budget::MemoryBudget;

/// Lets the client in; returns its uid.
pub(super) async fn handshake(
    stream: &mut UnixStream,
    settings: &ConnSettings,
    budget: &MemoryBudget,
) -> Result<u32, ConnError> {
    let uid = stream.peer_cred().map_err(FrameError::Io)?.uid();
    if uid != nix::unistd::getuid().as_raw() && !settings.allowed_uids.contains(&uid) {
        let err = WireError::new(ErrorCode::PermissionDenied, format!("uid {uid} may not use this proxy"));
        let _ = send(stream, &Response::Error(err), settings).await;
        linger_close(stream).await;
        return Err(ConnError::Refused(format!("uid {uid}")));
    }
    match read_request(stream, settings, budget).await?.0 {
        Request::Hello(h) if h.protocol_version == PROTOCOL_VERSION => {
            let welcome = Welcome {
                protocol_version: PROTOCOL_VERSION,
                slot: settings.slot,
                slots: settings.slots,
                server: concat!("memarts-proxy/", env!("CARGO_PKG_VERSION")).into(),
            };
            send(stream, &Response::Welcome(welcome), settings).await?;
            Ok(uid)
        }
        Request::Hello(h) => {
            let message = format!(
                "client speaks protocol {}, this proxy speaks {PROTOCOL_VERSION}; upgrade the older side",
                h.protocol_version
            );
            let _ = send(stream, &Response::Incompatible { supported: PROTOCOL_VERSION, message }, settings)
                .await;
            Err(ConnError::Refused("incompatible protocol".into()))
        }
        _ => refuse(stream, settings, "the first frame must be Hello").await,
    }
}
