//! Walking a test's directories.

use std::path::{Path, PathBuf};

/// Every entry below `dir` that is not a directory, recursively and sorted (none if `dir` does not
/// exist). Entries that vanish during the walk are skipped.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}
