//! `<run dir>/fleet.json`, the fleet's config as its slots read it: written in one place (by
//! `memarts start_proxy` and by an in-process engine), read here by the slots and the CLI. Clients
//! read the part they need through `memarts_shim::FleetFile`, whose fields a test keeps in step
//! with this type's (`tests/src/lib.rs`).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{ConfigError, FleetConfig};

impl FleetConfig {
    pub fn fleet_file(&self) -> PathBuf {
        memarts_disk::layout::fleet_file(&self.run_dir)
    }

    /// Reads `fleet.json` as [`FleetConfig::write_fleet_file`] wrote it.
    pub fn load(path: &Path) -> Result<FleetConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Unreadable { path: path.to_path_buf(), source })?;
        let cfg: FleetConfig = serde_json::from_str(&text)
            .map_err(|source| ConfigError::NotAFleetConfig { path: path.to_path_buf(), source })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Writes `<run dir>/fleet.json` whole (a temp file renamed over it): readable by the allowed
    /// uids' clients when the fleet serves others (they route by its slot count; it holds no
    /// secret), by the fleet's uid only otherwise.
    pub fn write_fleet_file(&self) -> std::io::Result<()> {
        let path = self.fleet_file();
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mode = if self.serves_other_uids() { 0o644 } else { 0o600 };
        let mut file = std::fs::File::create(&tmp)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(&json)?;
        drop(file);
        std::fs::rename(&tmp, &path)
    }
}
