//! `memarts start_proxy N --foreground`: the fleet under a supervisor that stays in the foreground,
//! for systemd (`Type=notify`, `ops/systemd/memarts.service`) and containers, where it is PID 1
//! (`ops/kubernetes/memarts-daemonset.yaml`).
//!
//! Once every slot is ready (as `start_proxy` starts them), it tells systemd (`READY=1` on
//! `$NOTIFY_SOCKET`, when set), then checks the slots every [`CHECK_EVERY`]: a slot that died is
//! started again, from the same settings, and waited for. More than [`CRASHES_ALLOWED`] restarts of
//! one slot within [`CRASH_WINDOW`] is a fault a restart does not fix: the supervisor stops the
//! fleet and exits with failure, for systemd (`Restart=on-failure`) or the kubelet to start
//! everything again after its delay. SIGTERM or SIGINT stops the fleet (each slot drains) and exits.
//! It reaps every child, orphans included (it is their subreaper), as PID 1 must.
//!
//! It holds `<run dir>/supervisor.pid` while it runs, so that `memarts stop_proxy` asks it to stop
//! (rather than stopping the slots under it, which it would start again), and it leaves the slots
//! alone while `memarts restart_proxy` holds `<run dir>/restart.lock`.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use memarts_proxy::config::FleetConfig;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::fleet::{start_slot, stop_fleet};
use crate::slots::{clean_stale, probe, Probe};

/// How often the supervisor looks at its slots.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Restarts of one slot within [`CRASH_WINDOW`] past which the supervisor gives up.
const CRASHES_ALLOWED: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);

/// The supervisor's pid file in a run dir (held locked while it runs).
pub(crate) fn supervisor_pid_path(run_dir: &Path) -> PathBuf {
    run_dir.join("supervisor.pid")
}

/// Held by `restart_proxy` while it restarts slots one by one.
pub(crate) fn restart_lock_path(run_dir: &Path) -> PathBuf {
    run_dir.join("restart.lock")
}

/// Supervises `cfg`'s fleet, whose slots are all ready, until it is stopped.
pub(crate) fn run(
    cfg: &FleetConfig,
    proxy_bin: &Path,
    ready_timeout: Duration,
    grace: Duration,
) -> Result<ExitCode> {
    let pid_path = supervisor_pid_path(&cfg.run_dir);
    let _held = memarts_proxy::lifecycle::lock_slot(&pid_path)
        .with_context(|| format!("supervisor pid file {}", pid_path.display()))?;
    // Orphans of our slots' children (and, as PID 1, of anything) become ours to reap.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = runtime.block_on(supervise(cfg, proxy_bin, ready_timeout, grace));
    let _ = std::fs::remove_file(&pid_path);
    code
}

async fn supervise(
    cfg: &FleetConfig,
    proxy_bin: &Path,
    ready_timeout: Duration,
    grace: Duration,
) -> Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    notify(&format!("READY=1\nSTATUS={} proxies ready\nMAINPID={}", cfg.slots, std::process::id()));
    println!(
        "memarts: supervising {} proxies (pid {}); SIGTERM or `memarts stop_proxy` stops them",
        cfg.slots,
        std::process::id()
    );
    let mut crashes: Vec<Vec<Instant>> = vec![Vec::new(); cfg.slots as usize];
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(stop(cfg, grace, "SIGTERM")),
            _ = int.recv() => return Ok(stop(cfg, grace, "SIGINT")),
            _ = tick.tick() => {}
        }
        reap();
        if !cfg.fleet_file().exists() {
            println!("memarts: the fleet was stopped; the supervisor exits");
            return Ok(ExitCode::SUCCESS);
        }
        if matches!(probe(&restart_lock_path(&cfg.run_dir)), Probe::Live(_)) {
            continue; // restart_proxy is at work
        }
        for slot in 0..cfg.slots {
            if matches!(probe(&cfg.pid_path(slot)), Probe::Live(_)) {
                continue;
            }
            let recent = &mut crashes[slot as usize];
            recent.retain(|at| at.elapsed() < CRASH_WINDOW);
            recent.push(Instant::now());
            if recent.len() > CRASHES_ALLOWED {
                eprintln!(
                    "memarts: slot {slot} died {} times within {CRASH_WINDOW:?} (see {}); stopping the fleet",
                    recent.len(),
                    cfg.log_path(slot).display()
                );
                stop(cfg, grace, "a slot that keeps dying");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!(
                "memarts: slot {slot} is not running (see {}); starting it again",
                cfg.log_path(slot).display()
            );
            let _ = clean_stale(&cfg.run_dir);
            match start_slot(cfg, proxy_bin, slot, ready_timeout) {
                Ok(pid) => {
                    println!("memarts: slot {slot} started again (pid {pid})");
                    notify(&format!("STATUS=slot {slot} started again (pid {pid})"));
                }
                Err(e) => eprintln!("memarts: slot {slot} did not start: {e:#}"),
            }
        }
    }
}

/// Stops the fleet (each slot drains for up to `grace`) because of `why`.
fn stop(cfg: &FleetConfig, grace: Duration, why: &str) -> ExitCode {
    notify("STOPPING=1");
    println!("memarts: {why}: stopping the fleet");
    match stop_fleet(cfg, grace) {
        Ok(summary) => {
            println!("memarts: {summary}");
            reap();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("memarts: stopping the fleet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Waits for every child that has exited.
fn reap() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Tells the service manager `state` (sd_notify(3): one datagram to `$NOTIFY_SOCKET`, a path or,
/// with a leading `@`, an abstract socket name); nothing when it is unset.
fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let addr = match target.as_encoded_bytes().strip_prefix(b"@") {
        Some(name) => <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name),
        None => SocketAddr::from_pathname(&target),
    };
    let sent = addr.and_then(|addr| UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr));
    if let Err(e) = sent {
        eprintln!("memarts: cannot notify the service manager on $NOTIFY_SOCKET: {e}");
    }
}
