//! `GET /metrics` for the whole node, served by whichever slot binds the address first; the others
//! try again every [`RETRY`], so the endpoint moves to another slot when the one serving it goes.

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use memarts_protocol::{frame, Hello, Limits, MetricsSnapshot, Request, Response, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use crate::config::FleetConfig;
use crate::engine::Engine;

/// How often a slot that could not bind the address tries again.
const RETRY: Duration = Duration::from_secs(3);

/// How long the serving slot waits for another slot's metrics before reporting it down.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the node's metrics on `address` whenever this slot holds it, until `shutdown`.
pub async fn serve(
    cfg: Arc<FleetConfig>,
    slot: u32,
    engine: Arc<Engine>,
    address: String,
    shutdown: CancellationToken,
) {
    let mut warned = false;
    loop {
        let bound = tokio::select! {
            _ = shutdown.cancelled() => return,
            b = tokio::net::TcpListener::bind(&address) => b,
        };
        match bound {
            Ok(listener) => {
                tracing::info!("slot {slot} serves the node's metrics on http://{address}/metrics");
                let (cfg, engine) = (cfg.clone(), engine.clone());
                let app = axum::Router::new().route(
                    "/metrics",
                    get(move || {
                        let (cfg, engine) = (cfg.clone(), engine.clone());
                        async move {
                            ([(CONTENT_TYPE, OPENMETRICS)], scrape(&cfg, slot, &engine).await).into_response()
                        }
                    }),
                );
                let stop = shutdown.clone();
                if let Err(e) =
                    axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await
                {
                    tracing::warn!("metrics endpoint on {address}: {e}");
                }
                return;
            }
            // Another slot of the fleet serves it (or another program holds it): quietly, again later.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot serve metrics on {address}: {e}; trying again every {RETRY:?}");
                    warned = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Every slot's metrics, this one's from its engine and the others' over their sockets, at once.
async fn scrape(cfg: &FleetConfig, me: u32, engine: &Engine) -> String {
    let asks = (0..cfg.slots).map(|slot| async move {
        if slot == me {
            return (slot, Some(engine.metrics()));
        }
        let asked = tokio::time::timeout(ASK_TIMEOUT, ask(cfg, slot)).await;
        (slot, asked.ok().flatten())
    });
    super::encode(futures::future::join_all(asks).await)
}

/// Slot `slot`'s metrics over its socket, if it answers with them.
async fn ask(cfg: &FleetConfig, slot: u32) -> Option<MetricsSnapshot> {
    let mut stream = UnixStream::connect(cfg.socket_path(slot)).await.ok()?;
    let client = format!("memarts-proxy metrics pid={}", std::process::id());
    let hello = Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client });
    stream.write_all(&frame::encode(&hello, 0).ok()?).await.ok()?;
    let (_, Response::Welcome(_)) =
        frame::read_async::<Response, _>(&mut stream, Limits::RESPONSE).await.ok()?
    else {
        return None;
    };
    stream.write_all(&frame::encode(&Request::Metrics, 0).ok()?).await.ok()?;
    match frame::read_async::<Response, _>(&mut stream, Limits::RESPONSE).await.ok()? {
        (_, Response::Metrics(m)) => Some(m),
        _ => None,
    }
}
