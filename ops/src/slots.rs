//! The slots of a run dir, as the lifecycle commands see them. Every slot holds an exclusive
//! `flock` on `<run dir>/proxy-<slot>.pid` while it lives. A pid file we can lock belongs to a dead
//! slot (stale: safe to remove); one we cannot belongs to a live slot, and waiting for that lock is
//! waiting for the slot to exit: no polling, and no trusting a stale pid. Also here: stopping slots
//! after a grace period, and finding proxies of the run dir that no pid file accounts for.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use memarts_disk::layout::{meta_table_path, packed_table_path, resident_table_path};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// What a pid file says of its slot.
pub(crate) enum Probe {
    /// No live slot holds it (the lock was free).
    Stale,
    Live(i32),
    Gone,
}

/// Whether the pid file at `path` is held by a live slot, without disturbing it.
pub(crate) fn probe(path: &Path) -> Probe {
    let Ok(file) = OpenOptions::new().read(true).open(path) else { return Probe::Gone };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => Probe::Stale,
        Err(_) => {
            let pid = std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
            Probe::Live(pid)
        }
    }
}

/// `proxy-<slot>.pid` files in `run_dir`.
pub(crate) fn pid_files(run_dir: &Path) -> Result<Vec<(u32, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(run_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", run_dir.display())),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(slot) =
            name.strip_prefix("proxy-").and_then(|s| s.strip_suffix(".pid")).and_then(|s| s.parse().ok())
        {
            out.push((slot, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Removes pid files and sockets of slots that are not alive: each pid file is removed only while we
/// hold its lock, so a live slot's files are never touched. Returns how many files went.
pub(crate) fn clean_stale(run_dir: &Path) -> Result<usize> {
    let mut removed = 0;
    for (slot, path) in pid_files(run_dir)? {
        let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else { continue };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else { continue };
        let socket = memarts_proxy::config::socket_path(run_dir, slot);
        removed += usize::from(std::fs::remove_file(&socket).is_ok());
        // Its metadata table too: clients must not read by the ownership of a slot that is gone.
        removed += usize::from(std::fs::remove_file(meta_table_path(run_dir, slot)).is_ok());
        // And its resident table (dead with it already: its owner lock says so).
        removed += usize::from(std::fs::remove_file(resident_table_path(run_dir, slot)).is_ok());
        // And its packed table, marked superseded first: a shim that still maps it takes nothing
        // more from it (a slot that starts again may number its segments anew).
        let packed = packed_table_path(run_dir, slot);
        if let Ok(table) = memarts_disk::packed_table::PackedFile::open_writable(&packed) {
            table.table().mark_superseded();
        }
        removed += usize::from(std::fs::remove_file(&packed).is_ok());
        removed += usize::from(std::fs::remove_file(&path).is_ok());
        drop(lock);
    }
    // Sockets with no pid file at all (a slot killed before it wrote one, or a deleted pid file).
    for entry in std::fs::read_dir(run_dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(slot) = name.strip_prefix("proxy-").and_then(|s| s.strip_suffix(".sock")) {
            let pid = run_dir.join(format!("proxy-{slot}.pid"));
            if !pid.exists() && std::os::unix::net::UnixStream::connect(entry.path()).is_err() {
                removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
            }
        }
        // Metadata tables of slots with no pid file (a fleet that shrank, a slot killed before it
        // wrote one).
        if let Some(slot) = name.strip_prefix("meta-").and_then(|s| s.strip_suffix(".table")) {
            if !run_dir.join(format!("proxy-{slot}.pid")).exists() {
                removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
            }
        }
    }
    Ok(removed)
}

/// Slots whose pid file is held by a live process: (slot, pid, pid file).
pub(crate) fn live_slots(run_dir: &Path) -> Result<Vec<(u32, i32, PathBuf)>> {
    Ok(pid_files(run_dir)?
        .into_iter()
        .filter_map(|(slot, path)| match probe(&path) {
            Probe::Live(pid) => Some((slot, pid, path)),
            _ => None,
        })
        .collect())
}

/// Waits up to `grace` for `live` slots (already sent SIGTERM) to exit, then SIGKILLs the rest and
/// waits for them a little longer.
pub(crate) fn kill_survivors(live: &[(u32, i32, PathBuf)], grace: Duration) {
    for (slot, pid, path) in wait_for_exit(live, grace) {
        eprintln!("memarts: slot {slot} (pid {pid}) did not drain within {grace:?}; killing it");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        let _ = wait_for_exit(&[(slot, pid, path)], Duration::from_secs(5));
    }
}

/// Waits (blocking on each pid file's lock, in a thread per slot) until the slots exit or `grace`
/// passes; returns the ones still alive.
fn wait_for_exit(live: &[(u32, i32, PathBuf)], grace: Duration) -> Vec<(u32, i32, PathBuf)> {
    let (tx, rx) = mpsc::channel();
    for (slot, _, path) in live {
        let (tx, slot, path) = (tx.clone(), *slot, path.clone());
        std::thread::spawn(move || {
            if let Ok(file) = OpenOptions::new().read(true).open(&path) {
                let _ = Flock::lock(file, FlockArg::LockShared);
            }
            let _ = tx.send(slot);
        });
    }
    drop(tx);
    let deadline = Instant::now() + grace;
    let mut done = Vec::new();
    while done.len() < live.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(slot) => done.push(slot),
            Err(_) => break,
        }
    }
    live.iter().filter(|(slot, ..)| !done.contains(slot)).cloned().collect()
}

/// Proxies of this run dir that no pid file accounts for (same uid, `memarts-proxy --fleet <run dir>/fleet.json`).
pub(crate) fn orphan_proxies(run_dir: &Path) -> Vec<i32> {
    let fleet = memarts_proxy::config::fleet_file(run_dir);
    let known: Vec<i32> = pid_files(run_dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, p)| std::fs::read_to_string(p).ok()?.trim().parse().ok())
        .collect();
    let me = nix::unistd::getuid().as_raw();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        use std::os::unix::fs::MetadataExt;
        if entry.metadata().map(|m| m.uid()).ok() != Some(me) || known.contains(&pid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_proxy = args.first().is_some_and(|a| a.ends_with(b"memarts-proxy"));
        let ours =
            args.windows(2).any(|w| w[0] == b"--fleet" && w[1] == fleet.as_os_str().as_encoded_bytes());
        if is_proxy && ours {
            out.push(pid);
        }
    }
    out
}

/// Waits for a process without a pid file to go away (checked with signal 0; orphans are rare).
pub(crate) fn wait_pid_gone(pid: i32, grace: Duration) -> bool {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if kill(Pid::from_raw(pid), None).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
