//! The run directory layout: where a fleet's sockets and `fleet.json` live. Both the proxies (which
//! create them) and the shims (which find them) name these paths through this module only.

use std::path::{Path, PathBuf};

/// `$XDG_RUNTIME_DIR/memarts`, else `/tmp/memarts-<uid>`.
pub fn default_run_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Path::new(&dir).join("memarts"),
        // SAFETY: getuid has no preconditions and cannot fail.
        _ => PathBuf::from(format!("/tmp/memarts-{}", unsafe { libc::getuid() })),
    }
}

/// The socket of `slot`: `<run dir>/proxy-<slot>.sock`.
pub fn socket_path(run_dir: &Path, slot: u32) -> PathBuf {
    run_dir.join(format!("proxy-{slot}.sock"))
}

/// The fleet description written by `memarts start_proxy`: `<run dir>/fleet.json`.
pub fn fleet_file(run_dir: &Path) -> PathBuf {
    run_dir.join("fleet.json")
}
