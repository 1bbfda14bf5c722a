//! Where things go when no setting says: the run dir and the cache dir, after the XDG base
//! directory conventions. Read through the same environment as every other setting.

use std::path::{Path, PathBuf};

/// `$XDG_RUNTIME_DIR/memarts`, else `/tmp/memarts-<uid>`.
pub fn run_dir(get: &impl Fn(&str) -> Option<String>) -> PathBuf {
    match get("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => Path::new(&dir).join("memarts"),
        None => PathBuf::from(format!("/tmp/memarts-{}", nix::unistd::getuid())),
    }
}

/// `$XDG_CACHE_HOME/memarts`, else `~/.cache/memarts`, else `/tmp/memarts-cache-<uid>`. Another
/// user can create that last one first: the proxy then refuses it, naming the fix (the rule of
/// `dir_trust.rs`, checked by the proxy's `cache_root.rs` before it reads or cleans anything there).
pub fn cache_dir(get: &impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = get("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Path::new(&dir).join("memarts");
    }
    if let Some(home) = get("HOME").filter(|d| !d.is_empty()) {
        return Path::new(&home).join(".cache/memarts");
    }
    PathBuf::from(format!("/tmp/memarts-cache-{}", nix::unistd::getuid()))
}
