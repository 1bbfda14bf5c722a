//! The settings and the fleet facts the Python layer reads: parsed by the one settings table
//! (`memarts_settings`) and read from `fleet.json` by the shim's one reader, so that no Python
//! module parses an environment variable or a fleet file of its own.

use std::path::PathBuf;

use memarts_settings::Settings;
use memarts_shim::ShimConfig;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::to_py;

/// Whether a fleet answers in `run_dir` (default: the standard run dir).
#[pyfunction]
#[pyo3(signature = (run_dir=None))]
pub fn fleet_running(py: Python<'_>, run_dir: Option<PathBuf>) -> PyResult<bool> {
    let dir = run_dir_or_env(py, run_dir)?;
    Ok(py.detach(|| memarts_shim::fleet_running(&dir)))
}

/// The settings the `memarts.file` layer uses, parsed from the environment by the one settings
/// table (`memarts_settings`); a malformed variable raises `ConfigError` naming it.
#[pyfunction]
pub fn settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = Settings::from_env().map_err(|e| to_py(py, e.into()))?;
    let d = PyDict::new(py);
    d.set_item("run_dir", s.run_dir_or_default())?;
    d.set_item("timeout", s.timeout.as_secs_f64())?;
    d.set_item("use_memarts", s.use_memarts)?;
    d.set_item("use_memarts_proxy", s.use_memarts_proxy)?;
    d.set_item("parallel", s.parallel)?;
    d.set_item("large_file_acc", s.large_file_acc)?;
    d.set_item("partial_maximum_size", s.partial_maximum_size)?;
    d.set_item("large_file_task_num", s.large_file_task_num)?;
    d.set_item("auto_read_meta_free", s.auto_read_meta_free)?;
    d.set_item("use_metadata_cache", s.use_metadata_cache)?;
    d.set_item("mounts", s.mounts)?;
    d.set_item("fsspec_route", s.fsspec_route)?;
    d.set_item("chunk_size", s.chunk_size)?;
    d.set_item("cache_dir", s.cache_dir.unwrap_or(s.default_cache_dir))?;
    Ok(d)
}

/// What a client reads of the fleet's `fleet.json` (`memarts_shim::FleetFile`): `slots`,
/// `meta_ttl_secs`, `endpoint`, `credentials_file`, `in_cluster`. No fleet started in the run dir
/// raises `UnavailableError`.
#[pyfunction]
#[pyo3(signature = (run_dir=None))]
pub fn fleet_file(py: Python<'_>, run_dir: Option<PathBuf>) -> PyResult<Bound<'_, PyDict>> {
    let dir = run_dir_or_env(py, run_dir)?;
    let f = py.detach(|| memarts_shim::FleetFile::read(&dir)).map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("slots", f.slots)?;
    d.set_item("meta_ttl_secs", f.meta_ttl_secs)?;
    d.set_item("endpoint", f.origin.endpoint)?;
    d.set_item("credentials_file", f.origin.credentials_file)?;
    d.set_item("in_cluster", f.in_cluster)?;
    Ok(d)
}

/// `run_dir` if given, else the one the client's settings name (`MEMARTS_RUN_DIR` or the default).
fn run_dir_or_env(py: Python<'_>, run_dir: Option<PathBuf>) -> PyResult<PathBuf> {
    match run_dir {
        Some(dir) => Ok(dir),
        None => Ok(ShimConfig::from_env().map_err(|e| to_py(py, e))?.run_dir),
    }
}
