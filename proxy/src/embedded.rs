//! A slot run inside the calling process: the engine of the client library's embedded mode
//! (`USE_MEMARTS=1` with no fleet) and origin mode (no memarts: a pass-through slot that caches
//! nothing). It serves a private Unix socket from its own thread and runtime, so the client talks to
//! it exactly as to a fleet, with every guarantee of the fleet's read path.
//!
//! A forked child does not inherit the thread: it must start its own (the Python layer does, keyed
//! by pid).
//!
//! The private run dir, `$TMPDIR/memarts-embedded-<pid>-<n>`, is always a new directory: a process
//! that ended without dropping its engine (a DataLoader worker leaves by `os._exit`) leaves its dir
//! behind, and a later process may get the same pid. Each start removes the dirs of processes of
//! ours that no longer run.

use std::path::{Path, PathBuf};
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
    pub fn start(cfg: FleetConfig) -> Result<Embedded, StartError> {
        Embedded::start_in(&std::env::temp_dir(), cfg)
    }

    /// [`Embedded::start`] with the private run dir under `base`.
    pub fn start_in(base: &Path, mut cfg: FleetConfig) -> Result<Embedded, StartError> {
        cfg.slots = 1;
        // A worker's own engine is no member of the node's cluster (only fleets are).
        cfg.cluster = None;
        // Every worker may run an engine of its own: none locks memory unless told to.
        cfg.resident_memory = Some(cfg.resident_memory.unwrap_or(0));
        remove_leftovers(base);
        let run_dir = new_private_dir(base)
            .map_err(|source| StartError::PrivateRunDir { path: base.join(PREFIX), source })?;
        cfg.run_dir = run_dir.clone();
        if cfg.passthrough {
            // Nothing is ever written there; keep it out of the user's cache dir.
            cfg.cache_dir = run_dir.join("cache");
        }
        let cleanup = |e: StartError| {
            let _ = std::fs::remove_dir_all(&run_dir);
            e
        };
        cfg.validate().map_err(|e| cleanup(e.into()))?;
        let failed = |step| move |source| cleanup(StartError::Embedded { step, source });
        cfg.write_fleet_file().map_err(failed(EmbeddedStep::WriteFleetFile))?;
        let listener = crate::server::bind_socket_in_private_dir(&cfg.socket_path(0))
            .map_err(failed(EmbeddedStep::Bind))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("memarts-embedded")
            .enable_all()
            .build()
            .map_err(failed(EmbeddedStep::Runtime))?;
        let (engine, _warning) = runtime.block_on(async { crate::build_engine(&cfg, 0) }).map_err(cleanup)?;
        {
            let _on_runtime = runtime.enter(); // what the engine spawns runs there
            crate::publish_metadata(&cfg, 0, &engine);
        }
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
            .map_err(failed(EmbeddedStep::Thread))?;
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

/// The start of every private run dir's name.
const PREFIX: &str = "memarts-embedded-";

/// Creates `<base>/memarts-embedded-<pid>-<n>` (0700) with the first `n` whose directory does not
/// exist yet: never one a dead process of the same pid left.
fn new_private_dir(base: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    loop {
        let dir = base.join(format!("{PREFIX}{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes the private run dirs under `base` of processes of our uid that no longer run. Best
/// effort: whatever cannot be read or removed stays.
fn remove_leftovers(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else { return };
    let me = nix::unistd::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        if ours && pid as u32 != std::process::id() && !crate::lifecycle::process_alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> FleetConfig {
        FleetConfig {
            cache_dir: dir.join("cache"),
            io_engine: "pread".into(),
            origin_log: false,
            ..FleetConfig::default()
        }
    }

    /// Found by the benchmark: a spawned Python worker whose pid an earlier worker had had (that one
    /// left by `os._exit`, its engine never dropped) failed with "Address already in use": it reused
    /// the earlier worker's run dir, stale socket and all.
    #[test]
    fn a_run_dir_left_by_a_dead_process_of_the_same_pid_is_never_reused_and_dead_ones_go() {
        let base = tempfile::tempdir().unwrap();
        let me = std::process::id();
        for n in 0..3 {
            let dir = base.path().join(format!("{PREFIX}{me}-{n}"));
            std::fs::create_dir(&dir).unwrap();
            drop(std::os::unix::net::UnixListener::bind(dir.join("proxy-0.sock")).unwrap());
        }
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        let left = base.path().join(format!("{PREFIX}{dead_pid}-0"));
        std::fs::create_dir(&left).unwrap();
        std::fs::write(left.join("fleet.json"), b"{}").unwrap();
        let alive = base.path().join(format!("{PREFIX}1-0"));
        std::fs::create_dir(&alive).unwrap();
        let other = base.path().join("memarts-embedded-notapid");
        std::fs::create_dir(&other).unwrap();

        let engine = Embedded::start_in(base.path(), config(base.path())).expect("a fresh run dir");
        assert!(engine.run_dir().join("proxy-0.sock").exists());
        for n in 0..3 {
            assert_ne!(engine.run_dir(), base.path().join(format!("{PREFIX}{me}-{n}")));
        }
        assert!(!left.exists(), "the run dir of a dead process stayed");
        assert!(alive.exists() && other.exists(), "a live process's dir, or a foreign one, went");
        let run_dir = engine.run_dir().to_path_buf();
        drop(engine);
        assert!(!run_dir.exists(), "dropping the engine removes its run dir");
    }
}
