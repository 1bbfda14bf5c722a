//! A slot run inside the calling process: the engine of the client library's embedded mode
//! (`USE_MEMARTS=1` with no fleet) and direct mode (no memarts: a pass-through slot that caches
//! nothing). It serves a private Unix socket from its own thread and runtime, so the client talks to
//! it exactly as to a fleet, with every guarantee of the fleet's read path.
//!
//! A forked child does not inherit the thread: it must start its own (the Python layer does, keyed
//! by pid).

use std::path::PathBuf;
use std::thread::JoinHandle;

use tokio_util::sync::CancellationToken;

use crate::config::FleetConfig;
use crate::{EmbeddedStep, StartError};

/// A running in-process slot; dropping it stops it and removes its private run dir.
pub struct Embedded {
    /// The process that started the slot: in a forked child, dropping must not touch the parent's
    /// thread (which the child does not have) or its run dir.
    owner: u32,
    run_dir: PathBuf,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Embedded {
    /// Starts one slot with `cfg` (its `slots` is forced to 1) in a private run dir under
    /// `$TMPDIR`. Returns once the socket is bound and the engine built.
    pub fn start(mut cfg: FleetConfig) -> Result<Embedded, StartError> {
        cfg.slots = 1;
        let base = std::env::temp_dir();
        let run_dir = base.join(format!("memarts-embedded-{}-{}", std::process::id(), unique()));
        crate::lifecycle::ensure_private_dir(&run_dir)
            .map_err(|source| StartError::PrivateRunDir { path: run_dir.clone(), source })?;
        cfg.run_dir = run_dir.clone();
        if cfg.passthrough {
            // Nothing is ever written there; keep it out of the user's cache dir.
            cfg.cache_dir = run_dir.join("cache");
        }
        cfg.validate()?;
        let cleanup = |e: StartError| {
            let _ = std::fs::remove_dir_all(&run_dir);
            e
        };
        let failed = |step| move |source| cleanup(StartError::Embedded { step, source });
        let json = serde_json::to_vec(&cfg).map_err(|e| cleanup(StartError::EncodeFleet(e)))?;
        std::fs::write(cfg.fleet_file(), json).map_err(failed(EmbeddedStep::WriteFleetFile))?;
        let listener = crate::server::bind_socket_in_private_dir(&cfg.socket_path(0))
            .map_err(failed(EmbeddedStep::Bind))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("memarts-embedded")
            .enable_all()
            .build()
            .map_err(failed(EmbeddedStep::Runtime))?;
        let (engine, _warning) = runtime.block_on(async { crate::build_engine(&cfg, 0) }).map_err(cleanup)?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name("memarts-embedded".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::UnixListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("embedded memarts: {e}");
                            return;
                        }
                    };
                    crate::serve(&cfg, 0, engine, listener, stop).await;
                });
            })
            .map_err(|source| StartError::Embedded { step: EmbeddedStep::Thread, source })?;
        Ok(Embedded { owner: std::process::id(), run_dir, shutdown, thread: Some(thread) })
    }

    /// The private run dir, to point a client at.
    pub fn run_dir(&self) -> &std::path::Path {
        &self.run_dir
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            // A forked copy: the thread and the run dir belong to the parent.
            std::mem::forget(self.thread.take());
            return;
        }
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
