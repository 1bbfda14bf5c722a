//! The run directory layout: where a fleet's sockets, `fleet.json` and the tables its slots publish
//! live. Both the proxies (which create them) and the shims (which find them) name these paths
//! through this module only. (Which run dir, by default, is a setting: `memarts_settings`.)

use std::path::{Path, PathBuf};

/// The socket of `slot`: `<run dir>/proxy-<slot>.sock`.
pub fn socket_path(run_dir: &Path, slot: u32) -> PathBuf {
    run_dir.join(format!("proxy-{slot}.sock"))
}

/// The fleet description written by `memarts start_proxy`: `<run dir>/fleet.json`.
pub fn fleet_file(run_dir: &Path) -> PathBuf {
    run_dir.join("fleet.json")
}

/// The metadata table `slot` publishes for local hits: `<run dir>/meta-<slot>.table`
/// (`crate::meta_table`).
pub fn meta_table_path(run_dir: &Path, slot: u32) -> PathBuf {
    run_dir.join(format!("meta-{slot}.table"))
}

/// The resident table `slot` publishes for local hits: `<run dir>/pins-<slot>.table` (the
/// file keeps the name it had when resident chunks were called pinned ones)
/// (`crate::resident_table`).
pub fn resident_table_path(run_dir: &Path, slot: u32) -> PathBuf {
    run_dir.join(format!("pins-{slot}.table"))
}

/// The table of packed records `slot` publishes for local hits: `<run dir>/packed-<slot>.table`
/// (`crate::packed_table`).
pub fn packed_table_path(run_dir: &Path, slot: u32) -> PathBuf {
    run_dir.join(format!("packed-{slot}.table"))
}
