//! The chunk tree's file operations that need care: publishing a finished temp file by rename
//! (creating the fan-out directory, with the fsyncs that make it durable), telling the temp files
//! of live writers from those of dead ones (a slot killed with `kill -9`, even one not reaped yet),
//! and removing whatever occupies a chunk's path.

use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::cache_root::DIR_MODE;

/// What a non-regular file is, for a log line.
pub(super) fn describe(t: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device node"
    } else {
        "something other than a regular file"
    }
}

/// Removes the entry `path` itself (a symlink, not its target; a directory with what it holds).
pub(super) fn remove_entry(path: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Whether the process that named temp file `name` (`<id>.<pid>.<serial>.tmp`) still runs. Names
/// of another form count as dead (foreign or from an older layout).
pub(super) fn writer_alive(name: &str) -> bool {
    let mut parts = name.split('.');
    let pid = parts.nth(1).and_then(|p| p.parse::<i32>().ok());
    match pid {
        Some(pid) if pid as u32 != std::process::id() => crate::lifecycle::process_alive(pid),
        _ => false,
    }
}

/// Renames the finished temp file into place, creating its fan-out directory; with `durable`,
/// fsyncs the destination directory, and the chunks directory if the fan-out one was created.
///
/// The rename is tried first: once the cache has filled its fan-out, the directory exists.
pub(super) fn publish(tmp: &Path, dest: &Path, chunks: &Path, durable: bool) -> io::Result<()> {
    let created = rename_into(tmp, dest, chunks)?;
    if durable {
        File::open(dest.parent().unwrap_or(chunks))?.sync_all()?;
        if created {
            File::open(chunks)?.sync_all()?;
        }
    }
    Ok(())
}

/// Renames `from` to the chunk path `dest`, creating its fan-out directory under `chunks` if
/// needed (then returns true). A directory at `dest` (foreign, or left by a bug) would refuse
/// every fill of this chunk for good: it goes, and the rename is tried once more. (A symlink or a
/// pipe is replaced by the rename itself.)
pub(super) fn rename_into(from: &Path, dest: &Path, chunks: &Path) -> io::Result<bool> {
    let mut created = false;
    let mut renamed = fs::rename(from, dest);
    if renamed.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::NotFound) && from.exists() {
        created = create_dir(dest.parent().unwrap_or(chunks))?;
        renamed = fs::rename(from, dest);
    }
    if let Err(e) = renamed {
        if !fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
            return Err(e);
        }
        tracing::warn!(path = %dest.display(), "removing a directory where a chunk file goes");
        remove_entry(dest)?;
        fs::rename(from, dest)?;
    }
    Ok(created)
}

/// Creates one directory (0700); `Ok(false)` if it already existed.
fn create_dir(dir: &Path) -> io::Result<bool> {
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}
