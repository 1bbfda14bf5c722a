//! Writing a local file so that it appears whole or not at all: the bytes go to a temp file beside
//! it, which is renamed into place once written. Shared by [`crate::Client::download`] and the
//! `memarts cp` command.

use std::io;
use std::path::{Path, PathBuf};

/// Writes the file at `path` through a temp file beside it (`.{name}.memarts-{pid}-{thread}.tmp`,
/// so concurrent writers of one path never share a temp file): `write` creates and fills the file
/// at the temp path it is given, then the temp file is renamed to `path`. If `write` or the rename
/// fails, the temp file is removed and the error returned; `path` is left as it was.
///
/// `write` creates the file itself, so that each caller keeps its own error for a failed create.
///
/// Nothing here calls fsync: not on the file (a caller that wants the bytes on disk before the
/// rename syncs them in `write`, as `memarts cp` does) and not on the directory after the rename.
/// So readers, and a process that crashes, see either the old `path` or the whole new file; after
/// a power loss `path` may still name the old file, or, unless `write` synced, a new file whose
/// bytes did not all reach the disk.
pub fn write_atomically<T, E: From<io::Error>>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, E> {
    let tmp = temp_path(path);
    let result = write(&tmp).and_then(|value| {
        std::fs::rename(&tmp, path)?;
        Ok(value)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.memarts-{}-{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_appears_whole_and_a_failure_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let seen = write_atomically(&path, |tmp| -> io::Result<PathBuf> {
            std::fs::write(tmp, b"whole")?;
            assert!(!path.exists(), "the file appeared before it was written");
            Ok(tmp.to_path_buf())
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        assert!(!seen.exists(), "the temp file is renamed away");
        assert!(seen.file_name().unwrap().to_string_lossy().starts_with(".out.bin.memarts-"));

        let err = write_atomically(&path, |tmp| -> io::Result<()> {
            std::fs::write(tmp, b"half")?;
            Err(io::Error::other("cut short"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "cut short");
        assert_eq!(std::fs::read(&path).unwrap(), b"whole", "a failed write leaves the old file");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.bin")], "the temp file is removed");
    }
}
