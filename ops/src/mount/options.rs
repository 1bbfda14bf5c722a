//! What a mount was asked for, checked once: the timeouts, the write mode, the memory bounds, and the
//! attributes every file and directory gets from them.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use fuser::{FileAttr, FileType, INodeNo};
use memarts_settings::size::parse_size;

use crate::cli::MountArgs;

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The mounted prefix as a URL without a trailing `/`; a path below it is appended after one.
    pub root_url: String,
    pub read_only: bool,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    pub negative_timeout: Duration,
    pub kernel_cache: bool,
    pub allow_other: bool,
    pub spool_dir: PathBuf,
    /// Bytes one sequentially read file may read ahead.
    pub max_readahead: u64,
    /// Bytes the chunks held by all open files may take together.
    pub readahead_memory: u64,
    pub threads: usize,
    pub uid: u32,
    pub gid: u32,
    /// Directories' mtime: when the mount started (object stores keep none for them).
    pub started: SystemTime,
}

fn seconds(name: &str, s: f64) -> Result<Duration> {
    if !s.is_finite() || !(0.0..=1e9).contains(&s) {
        bail!("--{name} must be a number of seconds between 0 and 1e9, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

impl MountOptions {
    pub fn from_args(args: &MountArgs, root_url: String) -> Result<MountOptions> {
        let max_readahead = parse_size(&args.max_readahead).context("--max-readahead")?;
        let readahead_memory = parse_size(&args.readahead_memory).context("--readahead-memory")?;
        if args.threads == 0 || args.threads > 1024 {
            bail!("--threads must be between 1 and 1024");
        }
        Ok(MountOptions {
            root_url,
            read_only: args.read_only,
            attr_timeout: seconds("attr-timeout", args.attr_timeout)?,
            entry_timeout: seconds("entry-timeout", args.entry_timeout)?,
            negative_timeout: seconds("negative-timeout", args.negative_timeout)?,
            kernel_cache: args.kernel_cache,
            allow_other: args.allow_other,
            spool_dir: args.spool_dir.clone().unwrap_or_else(std::env::temp_dir),
            max_readahead,
            readahead_memory,
            threads: args.threads,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            started: SystemTime::now(),
        })
    }

    /// The URL of `path` (relative to the mount's root, `""` for the root itself).
    pub fn url_of(&self, path: &str) -> String {
        if path.is_empty() {
            self.root_url.clone()
        } else {
            format!("{}/{path}", self.root_url)
        }
    }

    pub fn dir_attr(&self, ino: u64) -> FileAttr {
        self.attr(ino, FileType::Directory, 0, self.started, if self.read_only { 0o555 } else { 0o755 })
    }

    pub fn file_attr(&self, ino: u64, size: u64, mtime_ms: i64) -> FileAttr {
        let mtime =
            if mtime_ms >= 0 { UNIX_EPOCH + Duration::from_millis(mtime_ms as u64) } else { UNIX_EPOCH };
        self.attr(ino, FileType::RegularFile, size, mtime, if self.read_only { 0o444 } else { 0o644 })
    }

    fn attr(&self, ino: u64, kind: FileType, size: u64, mtime: SystemTime, perm: u16) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 1 << 20,
        }
    }
}
