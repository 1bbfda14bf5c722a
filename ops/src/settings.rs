//! Resolving the fleet config: flag > environment > config file > default.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memarts_proxy::config::FleetConfig;
use memarts_shim::trust::TRUSTED_UIDS_VAR;
use memarts_shim::ShimConfig;

use crate::cli::Common;

/// Defaults, then the config file (`--config` or `MEMARTS_CONFIG`), then the environment, then `--run-dir`.
pub fn resolve(common: &Common) -> Result<FleetConfig> {
    let file = common
        .config
        .clone()
        .or_else(|| std::env::var_os("MEMARTS_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from));
    let mut cfg = match &file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("config file {}", path.display()))?;
            toml::from_str::<FleetConfig>(&text).with_context(|| format!("config file {}", path.display()))?
        }
        None => FleetConfig::default(),
    };
    cfg.apply_env(|k| std::env::var(k).ok())?;
    if let Some(dir) = &common.run_dir {
        cfg.run_dir = dir.clone();
    }
    cfg.run_dir = absolute(cfg.run_dir)?;
    cfg.cache_dir = absolute(cfg.cache_dir)?;
    // Proxies read it from fleet.json, whatever their working directory.
    cfg.origin.credentials_file = cfg.origin.credentials_file.map(absolute).transpose()?;
    Ok(cfg)
}

/// The shim settings of the commands that talk to the fleet: the environment's, with `cfg`'s run
/// dir, and its `trusted_uids` unless `MEMARTS_TRUSTED_UIDS` is set (environment over config file).
pub fn shim_config(cfg: &FleetConfig) -> Result<ShimConfig> {
    let mut shim = ShimConfig::from_env()?;
    shim.run_dir = cfg.run_dir.clone();
    if std::env::var_os(TRUSTED_UIDS_VAR).is_none_or(|v| v.is_empty()) {
        shim.trusted_uids = cfg.trusted_uids.clone();
    }
    Ok(shim)
}

pub fn absolute(p: PathBuf) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p);
    }
    Ok(std::env::current_dir()?.join(p))
}
