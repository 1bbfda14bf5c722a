//! `memarts mount` and `memarts unmount`: an object prefix as a POSIX directory through FUSE
//! (`fuser`, pure Rust: mount(2) as root, `fusermount3` otherwise). The mount process is a client
//! of the node's fleet like any worker (`memarts_shim::Client`): chunks, single flight and the SSD
//! cache are the fleet's; with `--embedded` (or `USE_MEMARTS=1`) and no fleet it runs the engine
//! itself on the cache dir.
//!
//! Layout:
//! - `options.rs`: the mount's options, checked, and the attributes they give files and directories.
//! - `inodes.rs`: inode numbers ↔ paths, with what is known of each object.
//! - `dirs.rs`: directory listings kept for the entry timeout; directories made with `mkdir`.
//! - `view.rs`: what a name is (listing, this mount's own changes, or the fleet) and its attributes.
//! - `reader.rs`: files open for reading: the pinned version, read through the shim's read-ahead
//!   (whole chunks, a window ahead of sequential readers, one memory bound over all open files).
//! - `spool.rs`, `writer_exit.rs`: files being written: a private temp file, uploaded at close
//!   unless the writer was killed.
//! - `handles.rs`: open files and directories by handle.
//! - `fs.rs`: the `fuser::Filesystem` that answers the kernel.
//! - `daemon.rs`: running in the background once the mount is live; signals.
//! - `unmount.rs`: `memarts unmount`, stale mounts included.

mod daemon;
mod dirs;
mod errno;
mod files;
mod fs;
mod handles;
mod inodes;
mod options;
mod reader;
mod spool;
mod unmount;
mod view;
mod writer_exit;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use memarts_session::{Mode, Session};
use memarts_settings::Settings;
use memarts_shim::{fleet_running, Client};

use crate::cli::{Common, MountArgs};
use crate::settings::{absolute, resolve, shim_config};

pub use unmount::unmount;

/// What the file system reads through: the fleet (or the engine embedded in this process).
pub struct Fleet {
    session: Session,
}

impl AsRef<Client> for Fleet {
    fn as_ref(&self) -> &Client {
        self.session.client()
    }
}

impl Fleet {
    pub fn client(&self) -> &Client {
        self.session.client()
    }
}

/// The prefix as a URL the shim understands, without a trailing `/` (a local path made absolute).
fn root_url(prefix: &str) -> Result<String> {
    let url = memarts_shim::absolutize(prefix)?;
    let trimmed = url.trim_end_matches('/');
    if trimmed.is_empty() {
        bail!("{prefix}: mounting the root of the local file system is not supported");
    }
    memarts_protocol::ObjectUrl::parse(trimmed)
        .with_context(|| format!("{prefix} is not a URL memarts reads"))?;
    Ok(trimmed.to_string())
}

fn settings_for(args: &MountArgs) -> Result<Settings> {
    let mut settings = Settings::from_env()?;
    if args.embedded {
        settings.use_memarts = true;
    }
    Ok(settings)
}

/// The checks done before anything starts, in the calling process, so mistakes are reported by
/// `memarts mount` itself rather than in the background process's log.
fn precheck(common: &Common, args: &MountArgs) -> Result<()> {
    let settings = settings_for(args)?;
    let cfg = resolve(common)?;
    if !(settings.use_memarts_proxy || settings.use_memarts || fleet_running(&cfg.run_dir)) {
        bail!(
            "no memarts fleet runs in {}: start one with `memarts start_proxy N` (same MEMARTS_RUN_DIR \
             or --run-dir), or mount with --embedded (or USE_MEMARTS=1) to run the cache engine \
             inside the mount process",
            cfg.run_dir.display()
        );
    }
    let meta = std::fs::metadata(&args.mountpoint)
        .with_context(|| format!("mount point {}", args.mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", args.mountpoint.display());
    }
    options::MountOptions::from_args(args, root_url(&args.url_prefix)?)?;
    Ok(())
}

pub fn mount(common: &Common, args: &MountArgs) -> Result<ExitCode> {
    let mut args = args.clone();
    args.mountpoint = absolute(args.mountpoint)?;
    args.url_prefix = root_url(&args.url_prefix)?;
    args.spool_dir = args.spool_dir.map(absolute).transpose()?;
    precheck(common, &args)?;
    if !args.foreground {
        return daemon::spawn(common, &args);
    }
    run(common, &args)
}

/// The mount itself, in this process, until it is unmounted (or a signal unmounts it).
fn run(common: &Common, args: &MountArgs) -> Result<ExitCode> {
    let ready = daemon::ReadyPipe::from_env();
    // Before any thread starts, so that every thread inherits the mask and one thread takes them.
    let signals = daemon::block_signals()?;
    let started = (|| {
        let settings = settings_for(args)?;
        let cfg = resolve(common)?;
        let opts = options::MountOptions::from_args(args, args.url_prefix.clone())?;
        let mut shim = shim_config(&settings, &cfg);
        // The open files' read-ahead: one window per file, all within the memory bound.
        shim.readahead = opts.max_readahead;
        shim.readahead_memory = opts.readahead_memory;
        shim.readahead_workers = 4.min(opts.threads);
        let session = Session::open(&settings, shim, cfg).context("reaching memarts")?;
        if session.mode() == Mode::Origin {
            bail!("no memarts fleet runs and --embedded was not given");
        }
        std::fs::create_dir_all(&opts.spool_dir)
            .with_context(|| format!("spool dir {}", opts.spool_dir.display()))?;
        let fleet = Arc::new(Fleet { session });
        let mode = fleet.session.mode().name();
        let config = daemon::fuse_config(&opts);
        let view = view::View::new(fleet, opts);
        let fs = fs::MemartsFs::new(view);
        let session = fuser::Session::new(fs, &args.mountpoint, &config)
            .with_context(|| format!("mounting on {}", args.mountpoint.display()))?;
        Ok((session, mode))
    })();
    let (mut session, mode) = match started {
        Ok(s) => s,
        Err(e) => {
            if let Some(r) = ready {
                r.failed(&format!("{e:#}"));
            }
            return Err(e);
        }
    };
    eprintln!(
        "memarts mount: {} mounted on {} ({mode} mode, pid {})",
        args.url_prefix,
        args.mountpoint.display(),
        std::process::id()
    );
    daemon::unmount_on_signal(signals, session.unmount_callable(), args.mountpoint.clone());
    if let Some(r) = ready {
        r.ready();
    }
    session.run().context("serving the mount")?;
    eprintln!("memarts mount: {} unmounted", args.mountpoint.display());
    Ok(ExitCode::SUCCESS)
}
