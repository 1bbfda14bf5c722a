//! `start_proxy`, `restart_proxy` and `stop_proxy`: the fleet's lifecycle (the slots of a run dir,
//! their pid files and locks, are `slots.rs`).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use memarts_proxy::cache_root::{CacheDirError, CacheRoot};
use memarts_proxy::config::FleetConfig;
use memarts_proxy::lifecycle::{check_own_dir, ensure_run_dir, Readiness};
use memarts_proxy::origin::FileCredentialProvider;
use memarts_settings::size::{format_size, parse_size};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cli::{Common, RestartArgs, StartArgs, StopArgs};
use crate::settings::resolve;
use crate::slots::{
    clean_stale, kill_survivors, live_slots, orphan_proxies, pid_files, probe, wait_pid_gone, Probe,
};

pub fn start(common: &Common, args: &StartArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let mut cfg = resolve(common)?;
    cfg.slots = args.n;
    if let Some(dir) = &args.cache_dir {
        cfg.cache_dir = crate::settings::absolute(dir.clone())?;
    }
    if let Some(cap) = &args.capacity {
        cfg.capacity = Some(parse_size(cap).context("--capacity")?);
    }
    if let Some(io_engine) = &args.io_engine {
        cfg.io_engine = io_engine.clone();
    }
    if let Some(bytes) = &args.resident_memory {
        cfg.resident_memory = Some(parse_size(bytes).context("--resident-memory")?);
    }
    if let Some(policy) = &args.eviction {
        cfg.eviction = policy.clone();
    }
    if args.metrics_address.is_some() {
        cfg.metrics_address = args.metrics_address.clone();
    }
    if let Some(ttl) = args.meta_ttl {
        cfg.meta_ttl_secs = ttl;
    }
    if let Some(endpoint) = &args.endpoint {
        cfg.origin.endpoint = Some(endpoint.clone());
    }
    if let Some(path) = &args.credentials_file {
        cfg.origin.credentials_file = Some(crate::settings::absolute(path.clone())?);
    }
    if args.cluster.is_some()
        || args.node.is_some()
        || args.peer_address.is_some()
        || args.peer_listen.is_some()
    {
        let cluster = cfg.cluster.get_or_insert_default();
        if let Some(file) = &args.cluster {
            cluster.file = file.clone();
        }
        if let Some(node) = &args.node {
            cluster.node = node.clone();
        }
        if args.peer_address.is_some() {
            cluster.peer_address = args.peer_address.clone();
        }
        if args.peer_listen.is_some() {
            cluster.peer_listen = args.peer_listen.clone();
        }
    }
    if let Some(cluster) = &mut cfg.cluster {
        cluster.file = crate::settings::absolute(cluster.file.clone())?;
    }
    cfg.validate()?;
    if let Some(cluster) = &cfg.cluster {
        // One clear error naming the file or setting rather than one per slot (each slot checks
        // again when it joins).
        cluster.resolve(cfg.slots)?;
    }
    if let Some(path) = &cfg.origin.credentials_file {
        // One clear error naming the file rather than one per slot; each slot reads it again anyway.
        FileCredentialProvider::open(path)?;
    }
    // Before anything is made on disk: a missing binary leaves nothing behind.
    let proxy_bin = proxy_binary()?;
    ensure_run_dir(&cfg.run_dir, cfg.serves_other_uids())
        .with_context(|| format!("run dir {}", cfg.run_dir.display()))?;
    // A cache dir that may not be trusted (S9): one clear error naming it (or the directory in it
    // at fault) and the fix, rather than one per slot; each slot checks it again before it reads
    // or removes anything there. Other failures (a file in its place) each slot reports.
    if let Err(e @ CacheDirError::Untrusted(_)) = CacheRoot::open(&cfg.cache_dir) {
        bail!("{e}");
    }

    let slots = pid_files(&cfg.run_dir)?;
    let live: Vec<String> = slots
        .iter()
        .filter_map(|(slot, path)| match probe(path) {
            Probe::Live(pid) => Some(format!("slot {slot} (pid {pid})")),
            _ => None,
        })
        .collect();
    if !live.is_empty() {
        bail!(
            "a fleet is already running in {}: {}; stop it first with `memarts stop_proxy`",
            cfg.run_dir.display(),
            live.join(", ")
        );
    }
    clean_stale(&cfg.run_dir)?;
    cfg.write_fleet_file().with_context(|| format!("writing {}", cfg.fleet_file().display()))?;

    let (tx, rx) = mpsc::channel::<(u32, Result<Readiness>)>();
    let mut pids = Vec::new();
    for slot in 0..cfg.slots {
        pids.push(spawn_slot(&cfg, &proxy_bin, slot, tx.clone())?);
    }
    drop(tx);

    let deadline = started + Duration::from_secs_f64(args.ready_timeout);
    let mut ready = Vec::new();
    let mut failures = Vec::new();
    while ready.len() + failures.len() < cfg.slots as usize {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((_, Ok(r))) if r.ready => ready.push(r),
            Ok((slot, Ok(r))) => failures.push(format!("slot {slot}: {}", r.error.unwrap_or_default())),
            Ok((slot, Err(e))) => {
                failures.push(format!("slot {slot}: {e} (see {})", cfg.log_path(slot).display()))
            }
            Err(_) => {
                failures.push(format!("not every slot was ready within {}s", args.ready_timeout));
                break;
            }
        }
    }
    if !failures.is_empty() {
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
        }
        // Wait until the slots that started have exited (their pid locks are free), so that "were
        // stopped" is true when we return and a retry does not find them still running.
        kill_survivors(&live_slots(&cfg.run_dir).unwrap_or_default(), Duration::from_secs(10));
        let _ = clean_stale(&cfg.run_dir);
        let _ = std::fs::remove_file(cfg.fleet_file());
        bail!("the fleet did not start:\n  {}\n(the slots that started were stopped)", failures.join("\n  "));
    }
    ready.sort_by_key(|r| r.slot);
    for w in ready.iter().filter_map(|r| r.warning.as_ref()) {
        eprintln!("memarts: warning: {w}");
    }
    let io_engine = ready.first().and_then(|r| r.io_engine.clone()).unwrap_or_default();
    println!(
        "memarts: {} {} ready in {:.2}s (run dir {}, cache {}, capacity {}, io engine {io_engine})",
        cfg.slots,
        if cfg.slots == 1 { "proxy" } else { "proxies" },
        started.elapsed().as_secs_f64(),
        cfg.run_dir.display(),
        cfg.cache_dir.display(),
        cfg.capacity.map_or_else(|| "80% of free space".to_string(), format_size),
    );
    if let Some(address) = &cfg.metrics_address {
        println!("memarts: metrics for Prometheus at http://{address}/metrics");
    }
    if args.foreground {
        let ready_timeout = Duration::from_secs_f64(args.ready_timeout);
        return crate::supervise::run(&cfg, &proxy_bin, ready_timeout, Duration::from_secs_f64(args.grace));
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts slot `slot` of `cfg`'s fleet and waits until it is ready (stopping it if it is not
/// within `ready_timeout`). Returns its pid.
pub(crate) fn start_slot(
    cfg: &FleetConfig,
    proxy_bin: &Path,
    slot: u32,
    ready_timeout: Duration,
) -> Result<u32> {
    let (tx, rx) = mpsc::channel();
    let pid = spawn_slot(cfg, proxy_bin, slot, tx)?;
    match rx.recv_timeout(ready_timeout) {
        Ok((_, Ok(r))) if r.ready => Ok(pid),
        Ok((_, Ok(r))) => bail!("{}", r.error.unwrap_or_default()),
        Ok((_, Err(e))) => bail!("{e} (see {})", cfg.log_path(slot).display()),
        Err(_) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            bail!("not ready within {ready_timeout:?} (see {})", cfg.log_path(slot).display())
        }
    }
}

/// Starts slot `slot` of `cfg`'s fleet, detached; its readiness line (or why it has none) arrives on
/// `tx`. Returns its pid.
fn spawn_slot(
    cfg: &FleetConfig,
    proxy_bin: &Path,
    slot: u32,
    tx: mpsc::Sender<(u32, Result<Readiness>)>,
) -> Result<u32> {
    let log = OpenOptions::new().create(true).append(true).mode(0o600).open(cfg.log_path(slot))?;
    let mut cmd = Command::new(proxy_bin);
    cmd.arg("--fleet").arg(cfg.fleet_file()).arg("--slot").arg(slot.to_string());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent; it detaches the
    // proxy from our session so it outlives this command and the terminal.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", proxy_bin.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        let mut line = String::new();
        let res = match BufReader::new(stdout).read_line(&mut line) {
            Ok(0) => Err(anyhow!("exited before reporting ready")),
            Ok(_) => serde_json::from_str::<Readiness>(&line)
                .with_context(|| format!("bad readiness line {line:?}")),
            Err(e) => Err(anyhow::Error::new(e).context("reading its readiness line")),
        };
        let _ = tx.send((slot, res));
        // Reap it if it exits while we still run (a failed start); detached proxies outlive us.
        let _ = child.try_wait();
    });
    Ok(pid)
}

/// A rolling restart: slot by slot, drain and stop it, start it again from the fleet file (the
/// settings the fleet was started with; the proxy binary found now, so this is also how an upgrade
/// goes in), and wait until it is ready before the next slot goes. A slot that does not come back
/// stops the roll with the reason; the slots not yet restarted keep running.
pub fn restart(common: &Common, args: &RestartArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let run_dir = resolve(common)?.run_dir;
    if run_dir.exists() {
        check_own_dir(&run_dir).with_context(|| format!("run dir {}", run_dir.display()))?;
    }
    let fleet_file = memarts_proxy::config::fleet_file(&run_dir);
    if !fleet_file.exists() {
        bail!("no running fleet in {} (start one with `memarts start_proxy N`)", run_dir.display());
    }
    let cfg = FleetConfig::load(&fleet_file)?;
    let proxy_bin = proxy_binary()?;
    let grace = Duration::from_secs_f64(args.grace);
    // A supervisor (`start_proxy --foreground`) leaves the slots alone while this is held.
    let lock_path = crate::supervise::restart_lock_path(&run_dir);
    let _rolling = memarts_proxy::lifecycle::lock_slot(&lock_path)
        .with_context(|| format!("another restart_proxy runs ({})", lock_path.display()))?;
    let pid_files: std::collections::HashMap<u32, PathBuf> = pid_files(&run_dir)?.into_iter().collect();
    for slot in 0..cfg.slots {
        let slot_started = Instant::now();
        if let Some(path) = pid_files.get(&slot) {
            if let Probe::Live(pid) = probe(path) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                kill_survivors(&[(slot, pid, path.clone())], grace);
            }
        }
        clean_stale(&run_dir)?;
        let pid = start_slot(&cfg, &proxy_bin, slot, Duration::from_secs_f64(args.ready_timeout))
            .with_context(|| format!("slot {slot} did not come back"))?;
        println!(
            "memarts: slot {slot} restarted in {:.2}s (pid {pid})",
            slot_started.elapsed().as_secs_f64()
        );
    }
    println!(
        "memarts: {} proxies restarted one by one in {:.2}s",
        cfg.slots,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn stop(common: &Common, args: &StopArgs) -> Result<ExitCode> {
    let cfg = resolve(common)?;
    let run_dir = &cfg.run_dir;
    if !run_dir.exists() {
        println!("memarts: no fleet in {} (nothing to stop)", run_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    check_own_dir(run_dir).with_context(|| format!("run dir {}", run_dir.display()))?;
    let grace = Duration::from_secs_f64(args.grace);
    // A supervisor would start again the slots stopped under it: it stops them itself.
    let supervisor = crate::supervise::supervisor_pid_path(run_dir);
    if let Probe::Live(pid) = probe(&supervisor) {
        println!("memarts: asking the supervisor (pid {pid}) to stop the fleet");
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        if !wait_pid_gone(pid, grace + Duration::from_secs(10)) {
            eprintln!("memarts: the supervisor (pid {pid}) did not exit; stopping the slots");
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    println!("memarts: {}", stop_fleet(&cfg, grace)?);
    Ok(ExitCode::SUCCESS)
}

/// Stops every slot of the fleet in `cfg.run_dir` (SIGTERM; SIGKILL for those still draining after
/// `grace`) and removes what they leave; says what it did.
pub(crate) fn stop_fleet(cfg: &FleetConfig, grace: Duration) -> Result<String> {
    let run_dir = &cfg.run_dir;
    let cleaned = clean_stale(run_dir)?;
    let live = live_slots(run_dir)?;
    for (_, pid, _) in &live {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    let orphans = orphan_proxies(run_dir);
    for pid in &orphans {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    kill_survivors(&live, grace);
    for pid in &orphans {
        if wait_pid_gone(*pid, grace) {
            continue;
        }
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    clean_stale(run_dir)?;
    let _ = std::fs::remove_file(cfg.fleet_file());
    Ok(format!(
        "stopped {} {}{}{}",
        live.len(),
        if live.len() == 1 { "proxy" } else { "proxies" },
        if orphans.is_empty() { String::new() } else { format!(", {} orphaned", orphans.len()) },
        if cleaned == 0 { String::new() } else { format!(", cleaned {cleaned} stale files of dead proxies") },
    ))
}

/// `MEMARTS_PROXY_BIN`, else `memarts-proxy` next to this executable, else on `PATH`; when it is
/// in none of them, an error that says where it looked and what to do.
fn proxy_binary() -> Result<PathBuf> {
    if let Some(p) = memarts_settings::Settings::from_env()?.proxy_bin {
        if is_executable(&p) {
            return Ok(p);
        }
        bail!("MEMARTS_PROXY_BIN is {}, which is not an executable file", p.display());
    }
    let sibling = std::env::current_exe().ok().map(|me| me.with_file_name("memarts-proxy"));
    if let Some(sibling) = sibling.as_ref().filter(|p| is_executable(p)) {
        return Ok(sibling.clone());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) =
        std::env::split_paths(&path).map(|d| d.join("memarts-proxy")).find(|p| is_executable(p))
    {
        return Ok(found);
    }
    let next_to = sibling.map_or_else(|| "next to memarts".to_string(), |p| p.display().to_string());
    bail!(
        "cannot find memarts-proxy: not at {next_to}, not on PATH ({}), and MEMARTS_PROXY_BIN is not \
         set. Install both binaries with `make install` (into PREFIX/bin, PREFIX=/usr/local by \
         default), put memarts-proxy next to memarts, or set MEMARTS_PROXY_BIN=/path/to/memarts-proxy",
        path.to_string_lossy()
    )
}

fn is_executable(path: &Path) -> bool {
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
