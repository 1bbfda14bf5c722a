//! Process lifecycle of one slot: the run directory, the pid-file lock, the readiness message to
//! `memarts start_proxy`, and signals (SIGTERM drains, SIGINT exits at once).
//!
//! Each slot holds an exclusive `flock` on `proxy-<slot>.pid` for its whole life. The kernel drops
//! the lock when the process dies, even by `kill -9`, so `stop_proxy` can tell a stale pid file
//! (lockable) from a live slot (locked) without trusting the pid inside it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use memarts_settings::dir_trust::{self, DirRole, Problem};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::StartError;

/// Threads a slot runs file work on at most (its runtime's blocking pool: chunk files and segment
/// appends, a local origin's reads), beyond its one worker. Tokio's default, 512, is reached in a
/// fill of small objects: every request's file work gets a thread, most of them then wait on the
/// segments' lock or the disk, and each holds a stack and its share of malloc's arenas. A fill of
/// 100,000 objects of 4 KiB (2 slots, local origin): 512 threads, 459-545 B of proxy memory an
/// object and 9,400-10,300 objects/s; 16 threads: 406-413 B and 10,600-12,000/s. Sixteen requests
/// at once per slot keep an SSD's queue full (a node runs several slots).
const BLOCKING_THREADS: usize = 16;

/// How long a slot waits for another slot of its fleet (`siblings.rs`) before it does without it.
const SIBLING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The one JSON line a slot writes to its stdout when it is ready (or has failed to become so).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub slot: u32,
    pub pid: u32,
    pub ready: bool,
    /// Why the slot could not start.
    pub error: Option<String>,
    /// The I/O engine in use, and why it is not io_uring when it is not.
    pub io_engine: Option<String>,
    pub warning: Option<String>,
}

/// Creates the run dir 0700, or checks that an existing one is ours and closes it to others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    ensure_run_dir(dir, false)
}

/// [`ensure_private_dir`], except that a fleet serving other uids (`allowed_uids`) keeps its run
/// dir 0711: others may reach the sockets and `fleet.json` by name, but list and change nothing
/// (it is created 0700 all the same, and opened only once it is known to be ours).
pub fn ensure_run_dir(dir: &Path, serves_other_uids: bool) -> io::Result<()> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = owned_by_us(dir)?;
    let wanted = if serves_other_uids { 0o711 } else { 0o700 };
    if meta.mode() & 0o777 != wanted {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(wanted))?;
    }
    Ok(())
}

/// Checks, without changing anything, that the existing run dir `dir` is ours and that nobody else
/// can write into it: what `stop_proxy` and `restart_proxy` need before they signal the pids its
/// pid files name (in a run dir someone else made, those could name any process).
pub fn check_own_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(dir)?;
    dir_trust::check(meta.uid(), meta.mode(), dir_trust::own_uid(), &[]).map_err(|p| refused(dir, p))
}

/// The run dir `dir`'s metadata, if it is ours (its mode is [`ensure_run_dir`]'s to set).
fn owned_by_us(dir: &Path) -> io::Result<std::fs::Metadata> {
    let meta = std::fs::metadata(dir)?;
    match dir_trust::check(meta.uid(), meta.mode(), dir_trust::own_uid(), &[]) {
        Err(problem @ (Problem::Owner { .. } | Problem::NotADirectory)) => Err(refused(dir, problem)),
        _ => Ok(meta),
    }
}

fn refused(dir: &Path, problem: Problem) -> io::Error {
    let untrusted = dir_trust::UntrustedDir { path: dir.to_path_buf(), role: DirRole::Run, problem };
    io::Error::new(io::ErrorKind::PermissionDenied, untrusted)
}

/// Whether the process `pid` still runs: it exists and has not merely exited waiting to be reaped
/// (a slot killed with `kill -9` stays a zombie until its parent, init once `start_proxy` has exited,
/// reaps it, which some container inits do late or never, and it writes nothing any more).
pub(crate) fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists.
    let exists = unsafe { libc::kill(pid, 0) == 0 };
    exists && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    // `/proc/<pid>/stat`: `pid (comm) state ...`; comm may hold spaces and parentheses.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| matches!(state, 'Z' | 'X'))
}

/// The held lock of a slot; dropping it (or dying) releases the slot.
pub struct SlotLock {
    _lock: Flock<File>,
}

/// Locks `proxy-<slot>.pid` and writes our pid into it; fails if a live proxy holds it.
pub fn lock_slot(pid_path: &Path) -> io::Result<SlotLock> {
    let file =
        OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(pid_path)?;
    let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(file, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            let holder = std::fs::read_to_string(pid_path).unwrap_or_default();
            drop(file);
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("slot already running (pid {}) per {}", holder.trim(), pid_path.display()),
            )
        } else {
            io::Error::from(errno)
        }
    })?;
    lock.set_len(0)?;
    writeln!(&mut *lock, "{}", std::process::id())?;
    lock.sync_data()?;
    Ok(SlotLock { _lock: lock })
}

/// Writes the readiness line to stdout, then points stdout at /dev/null so that a parent that has
/// gone away can never make a later write fail.
pub fn announce(readiness: &Readiness) {
    let line = serde_json::to_string(readiness).unwrap_or_else(|_| "{}".into());
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    drop(out);
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
}

/// The whole life of a slot process: set up, announce readiness, serve, drain, exit. Logs through
/// whatever `tracing` subscriber the binary installed.
pub fn main(fleet: &Path, slot: u32) -> std::process::ExitCode {
    use std::process::ExitCode;
    let pid = std::process::id();
    let fail = |error: StartError| {
        tracing::error!("slot {slot} failed to start: {error}");
        let error = Some(error.to_string());
        announce(&Readiness { slot, pid, ready: false, error, io_engine: None, warning: None });
        ExitCode::FAILURE
    };
    let cfg = match crate::config::FleetConfig::load(fleet) {
        Ok(cfg) => cfg,
        Err(e) => return fail(e.into()),
    };
    if slot >= cfg.slots {
        return fail(StartError::SlotOutOfRange { slot, slots: cfg.slots });
    }
    if let Err(source) = ensure_run_dir(&cfg.run_dir, cfg.serves_other_uids()) {
        return fail(StartError::RunDir { path: cfg.run_dir.clone(), source });
    }
    let pid_path = cfg.pid_path(slot);
    let _lock = match lock_slot(&pid_path) {
        Ok(lock) => lock,
        Err(source) => return fail(StartError::SlotLock { path: pid_path, source }),
    };
    let socket = cfg.socket_path(slot);
    // Bound before any runtime thread exists: the umask dance in bind_socket is process-wide.
    let listener = match crate::server::bind_socket(&socket) {
        Ok(l) => l,
        Err(source) => return fail(StartError::Bind { path: socket, source }),
    };
    if cfg.serves_other_uids() {
        // Other uids need to connect; who gets past the connect is the peer-credential check's call.
        if let Err(source) = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)) {
            return fail(StartError::ShareSocket { path: socket, source });
        }
    }
    // One worker thread per slot: a node's parallelism is its N slots (and each slot's blocking
    // pool for file work). A second worker only added wake-ups between the two: in a cold warmup
    // of 1,500 small files over the emulated link (2 cores, 4 slots), 0.67x the link with one
    // worker against 0.57x with two (medians of 4 interleaved runs), and less CPU per chunk.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(StartError::Runtime(e)),
    };
    let code = runtime.block_on(async {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return fail(StartError::Listener(e)),
        };
        let (engine, warning) = match crate::build_engine(&cfg, slot) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        if let Some(w) = &warning {
            tracing::warn!("{w}");
        }
        crate::publish_metadata(&cfg, slot, &engine);
        if cfg.slots > 1 {
            let siblings = crate::siblings::Siblings::new(cfg.run_dir.clone(), slot, SIBLING_TIMEOUT);
            engine.metadata().know_siblings(std::sync::Arc::new(siblings));
        }
        let io_engine = Some(engine.status().io_engine);
        let shutdown = tokio_util::sync::CancellationToken::new();
        if let Some(settings) = &cfg.cluster {
            // Joined and listening before the slot says it is ready: a bad cluster file or a peer
            // port in use fails the start, with the reason.
            let (cluster, peer_listener) =
                match crate::cluster::start(settings, slot, cfg.slots, &cfg.cache_dir).await {
                    Ok(started) => started,
                    Err(e) => return fail(e),
                };
            engine.join_cluster(cluster.clone());
            tokio::spawn(crate::cluster::peer_server::serve(
                peer_listener,
                engine.clone(),
                cluster,
                shutdown.clone(),
            ));
        }
        if let Some(address) = cfg.metrics_address.clone() {
            let cfg = std::sync::Arc::new(cfg.clone());
            tokio::spawn(crate::metrics::serve(cfg, slot, engine.clone(), address, shutdown.clone()));
        }
        if let Err(e) = watch_signals(shutdown.clone(), socket.clone()) {
            return fail(StartError::Signals(e));
        }
        tracing::info!("slot {slot}/{} ready on {} (pid {pid})", cfg.slots, socket.display());
        announce(&Readiness { slot, pid, ready: true, error: None, io_engine, warning });
        crate::serve(&cfg, slot, engine, listener, shutdown).await;
        ExitCode::SUCCESS
    });
    let _ = std::fs::remove_file(&socket);
    tracing::info!("slot {slot} stopped");
    code
}

/// SIGTERM: stop accepting, drain in-flight requests, exit. SIGINT: remove the socket and exit now.
fn watch_signals(
    shutdown: tokio_util::sync::CancellationToken,
    socket: std::path::PathBuf,
) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM: draining");
                shutdown.cancel();
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: exiting now");
                let _ = std::fs::remove_file(&socket);
                std::process::exit(130);
            }
        }
    });
    Ok(())
}
