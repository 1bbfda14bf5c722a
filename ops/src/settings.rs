//! Resolving the fleet config: flag > environment (parsed by `memarts_settings`) > config file >
//! default; and the client settings of the commands that talk to a fleet.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memarts_proxy::config::FleetConfig;
use memarts_settings::Settings;
use memarts_shim::ShimConfig;

use crate::cli::Common;

/// Defaults, then the config file (`--config` or `MEMARTS_CONFIG`), then the environment, then `--run-dir`.
pub fn resolve(common: &Common) -> Result<FleetConfig> {
    let settings = Settings::from_env()?;
    let file = common.config.clone().or_else(|| settings.config.clone());
    let mut cfg = match &file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("config file {}", path.display()))?;
            toml::from_str::<FleetConfig>(&text).with_context(|| format!("config file {}", path.display()))?
        }
        None => FleetConfig::default(),
    };
    cfg.apply_settings(&settings);
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
pub fn shim_config(settings: &Settings, cfg: &FleetConfig) -> ShimConfig {
    let mut shim = ShimConfig::from_settings(settings);
    shim.run_dir = cfg.run_dir.clone();
    shim.trusted_uids = settings.trusted_uids.clone().unwrap_or_else(|| cfg.trusted_uids.clone());
    shim
}

pub fn absolute(p: PathBuf) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p);
    }
    Ok(std::env::current_dir()?.join(p))
}
