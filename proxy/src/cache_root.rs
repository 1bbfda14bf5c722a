//! The cache dir as a slot finds it at start-up (S9). A cache dir is only a name: another local user
//! who made it first (the default without `HOME` is `/tmp/memarts-cache-<uid>`) could plant chunk
//! files and metadata snapshots there that check out (a CRC32C is no MAC), or a symlink that has
//! start-up's cleaning delete files elsewhere. So before anything in it is read or removed, the
//! cache root, `v1` and every directory of `v1` a slot opens or cleans ([`SUBDIRS`]) must pass the
//! run dir's rule (`memarts_settings::dir_trust`): ours or root's, no group or world write bit, no
//! symlink. A refusal is a [`CacheDirError::Untrusted`] naming the directory, what is wrong and the
//! fix; nothing under a refused directory is touched.
//!
//! The cache root may be a symlink of ours (or root's), followed once to the directory checked; any
//! other is refused. Each directory is opened with `O_NOFOLLOW | O_DIRECTORY` relative to its checked parent and
//! checked by `fstat` of what was opened, and start-up cleans `v1/tmp` through that descriptor
//! ([`remove_files_where`]: `unlinkat`), so a directory swapped for a symlink after its check
//! cleans nothing elsewhere. Directories are created 0700, as they always were: caches of earlier
//! versions pass as they are.

use std::fs::DirBuilder;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use memarts_settings::dir_trust::{self, DirRole, Problem, UntrustedDir};
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use nix::NixPath;

/// The directories of `v1` that slots open or clean at start-up: chunk files, temp files,
/// memarts-only objects, metadata snapshots, the cluster's last roster.
pub const SUBDIRS: [&str; 5] = ["chunks", "tmp", "memarts", "meta", "cluster"];

/// Uids besides our own whose cache directories we use: root's (a directory an administrator made).
const TRUSTED: &[u32] = &[0];

/// Mode of every directory created in the cache dir.
pub const DIR_MODE: u32 = 0o700;

/// Why the cache dir cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheDirError {
    /// The cache root or one of its directories fails the rule: another user's, writable by
    /// others, or a symlink.
    #[error("refusing the cache dir: {0}")]
    Untrusted(#[source] UntrustedDir),
    #[error("cache dir {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl From<CacheDirError> for io::Error {
    fn from(e: CacheDirError) -> io::Error {
        match e {
            CacheDirError::Untrusted(_) => io::Error::new(io::ErrorKind::PermissionDenied, e),
            CacheDirError::Io { source, .. } => source,
        }
    }
}

/// The cache root, checked, with its `v1` open.
#[derive(Debug)]
pub struct CacheRoot {
    path: PathBuf,
    v1: OwnedFd,
}

impl CacheRoot {
    /// Creates the cache root, `v1` and every directory of [`SUBDIRS`] where missing (0700: made
    /// here, not later by whoever writes there first with the process's umask), and checks them
    /// all. Blocking.
    pub fn open(path: &Path) -> Result<CacheRoot, CacheDirError> {
        // Without a trailing `/`, which would have the open follow a symlink after all.
        let path: &Path = &path.components().collect::<PathBuf>();
        let path: &Path = &follow_own_link(path)?;
        match DirBuilder::new().recursive(true).mode(DIR_MODE).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CacheDirError::Io { path: path.to_path_buf(), source }),
        }
        let root = open_checked(AT_FDCWD, path, path)?;
        let v1_path = path.join("v1");
        create_dir_at(root.as_fd(), "v1", &v1_path)?;
        let tree = CacheRoot { path: path.to_path_buf(), v1: open_checked(root.as_fd(), "v1", &v1_path)? };
        for name in SUBDIRS {
            tree.subdir(name)?;
        }
        Ok(tree)
    }

    /// The cache root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where `v1/<name>` is.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.path.join("v1").join(name)
    }

    /// `v1/<name>`, created (0700) if missing, opened and checked. Blocking.
    pub fn subdir(&self, name: &str) -> Result<OwnedFd, CacheDirError> {
        let path = self.path_of(name);
        create_dir_at(self.v1.as_fd(), name, &path)?;
        open_checked(self.v1.as_fd(), name, &path)
    }
}

/// Where `path` leads if it is a symlink of ours (or root's): a cache root linked to a disk
/// elsewhere (`~/.cache/memarts -> /ssd/memarts`) is the user's own choice, and the directory it
/// leads to is checked as any. A symlink of anyone else is refused: it names a place of theirs.
/// Only the root: the directories of `v1` are never followed.
fn follow_own_link(path: &Path) -> Result<PathBuf, CacheDirError> {
    use std::os::unix::fs::MetadataExt;
    let io = |source| CacheDirError::Io { path: path.to_path_buf(), source };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            let me = dir_trust::own_uid();
            if m.uid() != me && !TRUSTED.contains(&m.uid()) {
                let problem = Problem::Owner { owner: m.uid(), me };
                return Err(CacheDirError::Untrusted(UntrustedDir {
                    path: path.to_path_buf(),
                    role: DirRole::Cache,
                    problem,
                }));
            }
            std::fs::canonicalize(path).map_err(io)
        }
        _ => Ok(path.to_path_buf()),
    }
}

/// Creates `name` (0700) in `parent` (at `path`) unless it exists.
fn create_dir_at(parent: BorrowedFd<'_>, name: &str, path: &Path) -> Result<(), CacheDirError> {
    match mkdirat(parent, name, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(CacheDirError::Io { path: path.to_path_buf(), source: e.into() }),
    }
}

/// `name` relative to `parent` (at `path`), opened as a directory without following a symlink, then
/// checked by what `fstat` says of the directory opened. A symlink, which cannot be opened so, is
/// refused by what `lstat` says of it.
fn open_checked<P: ?Sized + NixPath>(
    parent: BorrowedFd<'_>,
    name: &P,
    path: &Path,
) -> Result<OwnedFd, CacheDirError> {
    let io = |e: Errno| CacheDirError::Io { path: path.to_path_buf(), source: e.into() };
    let refuse = |problem| {
        CacheDirError::Untrusted(UntrustedDir { path: path.to_path_buf(), role: DirRole::Cache, problem })
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => {
            // A symlink is refused (the rule's `Symlink`); anything else that is no directory
            // (a file) is the I/O error it always was.
            let st = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io)?;
            return Err(match dir_trust::check(st.st_uid, st.st_mode, dir_trust::own_uid(), TRUSTED) {
                Err(Problem::NotADirectory) | Ok(()) => io(e),
                Err(problem) => refuse(problem),
            });
        }
        Err(e) => return Err(io(e)),
    };
    let st = fstat(&fd).map_err(io)?;
    dir_trust::check(st.st_uid, st.st_mode, dir_trust::own_uid(), TRUSTED).map_err(refuse)?;
    Ok(fd)
}

/// Removes the regular files directly in the directory `dir` (a descriptor from
/// [`CacheRoot::subdir`]) whose names `stale` picks, relative to that descriptor; symlinks and
/// directories stay. Returns how many it removed. Blocking.
pub fn remove_files_where(dir: &OwnedFd, stale: impl Fn(&str) -> bool) -> io::Result<u64> {
    let mut listing = Dir::from_fd(dir.try_clone()?)?;
    let mut removed = 0;
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || !stale(&name.to_string_lossy()) {
            continue;
        }
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => removed += 1,
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(removed)
}

#[cfg(test)]
#[path = "cache_root_tests.rs"]
mod tests;
