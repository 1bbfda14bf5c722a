//! Running a mount in the background: `memarts mount` starts itself again with `--foreground` in a
//! new session (no terminal, logs to a file) and returns once that process reports the mount live,
//! or with the error it reports. The report travels over a pipe whose descriptor the child finds
//! in `MEMARTS_MOUNT_READY_FD`. SIGTERM, SIGINT and SIGHUP unmount (and so end) a mount process.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use fuser::{Config, MountOption, SessionACL, SessionUnmounter};
use nix::sys::signal::{SigSet, Signal};

use super::options::MountOptions;
use crate::cli::{Common, MountArgs};
use crate::settings::resolve;

const READY_FD: &str = "MEMARTS_MOUNT_READY_FD";

pub fn fuse_config(opts: &MountOptions) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.root_url.clone()),
        MountOption::Subtype("memarts".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        if opts.read_only { MountOption::RO } else { MountOption::RW },
    ];
    config.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(opts.threads);
    config
}

/// The log of a background mount: `--log-file`, else one per mount point in the run dir.
fn log_path(common: &Common, args: &MountArgs) -> Result<PathBuf> {
    if let Some(p) = &args.log_file {
        return crate::settings::absolute(p.clone());
    }
    let run_dir = resolve(common)?.run_dir;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&run_dir)
        .with_context(|| format!("run dir {}", run_dir.display()))?;
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    args.mountpoint.hash(&mut h);
    Ok(run_dir.join(format!("mount-{:016x}.log", h.finish())))
}

use std::os::unix::fs::DirBuilderExt;

/// The arguments of the foreground process: the same mount, every path absolute.
fn child_args(common: &Common, args: &MountArgs) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = Vec::new();
    if let Some(d) = &common.run_dir {
        v.extend(["--run-dir".into(), crate::settings::absolute(d.clone()).unwrap_or(d.clone()).into()]);
    }
    if let Some(c) = &common.config {
        v.extend(["--config".into(), crate::settings::absolute(c.clone()).unwrap_or(c.clone()).into()]);
    }
    v.extend(["mount".into(), args.url_prefix.clone().into(), args.mountpoint.clone().into_os_string()]);
    let flags = [
        (args.read_only, "--read-only"),
        (args.kernel_cache, "--kernel-cache"),
        (args.allow_other, "--allow-other"),
        (args.embedded, "--embedded"),
    ];
    v.extend(flags.iter().filter(|(on, _)| *on).map(|(_, f)| (*f).into()));
    v.extend([
        "--attr-timeout".into(),
        args.attr_timeout.to_string().into(),
        "--entry-timeout".into(),
        args.entry_timeout.to_string().into(),
        "--negative-timeout".into(),
        args.negative_timeout.to_string().into(),
        "--max-readahead".into(),
        args.max_readahead.clone().into(),
        "--readahead-memory".into(),
        args.readahead_memory.clone().into(),
        "--threads".into(),
        args.threads.to_string().into(),
    ]);
    if let Some(s) = &args.spool_dir {
        v.extend(["--spool-dir".into(), s.clone().into_os_string()]);
    }
    v.push("--foreground".into());
    v
}

pub fn spawn(common: &Common, args: &MountArgs) -> Result<ExitCode> {
    let log = log_path(common, args)?;
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)
        .with_context(|| format!("mount log {}", log.display()))?;
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    let fd = write_end.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().context("the memarts binary")?);
    cmd.args(child_args(common, args))
        .env(READY_FD, fd.to_string())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    // SAFETY: setsid and fcntl are async-signal-safe, touch only the child being set up, and `fd`
    // is open in the parent (so in the child) until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the mount process")?;
    drop(write_end);
    let mut line = String::new();
    let _ = BufReader::new(File::from(read_end)).read_line(&mut line);
    match line.trim_end().split_once(' ') {
        Some(("ready", pid)) => {
            println!(
                "memarts: {} mounted on {} (pid {pid}, log {})",
                args.url_prefix,
                args.mountpoint.display(),
                log.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(("error", why)) => {
            let _ = child.wait();
            bail!("{why} (log: {})", log.display())
        }
        _ => {
            let status = child.wait()?;
            bail!("the mount process exited ({status}) before the mount was live; see {}", log.display())
        }
    }
}

/// The readiness pipe of a foreground process started by [`spawn`], if it was.
pub struct ReadyPipe(File);

impl ReadyPipe {
    pub fn from_env() -> Option<ReadyPipe> {
        let fd: i32 = std::env::var(READY_FD).ok()?.parse().ok()?;
        std::env::remove_var(READY_FD);
        // The descriptor must be open and a pipe's; anything else is not ours to take.
        // SAFETY: fstat only reads the descriptor's metadata.
        let mut st = unsafe { std::mem::zeroed::<libc::stat>() };
        // SAFETY: `st` is a valid, writable stat buffer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
            return None;
        }
        // SAFETY: the parent opened `fd` for this process alone, and nothing else here owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
        Some(ReadyPipe(File::from(owned)))
    }

    pub fn ready(mut self) {
        let _ = writeln!(self.0, "ready {}", std::process::id());
    }

    pub fn failed(mut self, why: &str) {
        let _ = writeln!(self.0, "error {}", why.replace('\n', " "));
    }
}

/// Blocks the signals that end a mount in this thread (and so in every thread started after).
pub fn block_signals() -> Result<SigSet> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().context("blocking signals")?;
    Ok(set)
}

/// A thread that waits for one of `set` and unmounts, which ends the session.
pub fn unmount_on_signal(set: SigSet, mut unmounter: SessionUnmounter, mountpoint: PathBuf) {
    let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || loop {
        let Ok(sig) = set.wait() else { continue };
        eprintln!("memarts mount: {sig}: unmounting {}", mountpoint.display());
        match unmounter.unmount() {
            Ok(()) => return,
            Err(e) => {
                eprintln!("memarts mount: unmount of {} failed: {e} (busy?)", mountpoint.display());
                lazy_unmount(&mountpoint);
                return;
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("memarts mount: no signal thread ({e}): stop this mount with `memarts unmount`");
    }
}

/// The last resort of a mount told to end while busy: detach it (it goes when its files close).
fn lazy_unmount(mountpoint: &Path) {
    let _ = super::unmount::detach(mountpoint);
}
