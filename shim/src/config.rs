//! Shim settings, read once from the environment by [`ShimConfig::from_env`].

use std::path::PathBuf;
use std::time::Duration;

use memarts_protocol::layout::default_run_dir;
use memarts_protocol::{DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct ShimConfig {
    /// Where the fleet's sockets and `fleet.json` are (`MEMARTS_RUN_DIR`).
    pub run_dir: PathBuf,
    /// Chunk size of reads (`MOX_FILE_CHUNK_SIZE`, bytes, default 1 MiB).
    pub chunk_size: u64,
    /// Chunks of one read fetched at once (`MOX_COPY_PARALLEL_THREADS`, default 16).
    pub parallel: usize,
    /// How long a call keeps retrying a slot that is down or restarting (`MEMARTS_TIMEOUT`, seconds,
    /// default 30). No call outlives it.
    pub deadline: Duration,
    /// How long a call polls the socket for its reply before blocking (`MEMARTS_SPIN_US`, default
    /// 100 µs, 0 = never poll). See `memarts_protocol::spin`.
    pub spin: Duration,
    /// Uids whose fleets this client trusts besides its own (`MEMARTS_TRUSTED_UIDS`: uids or user
    /// names, e.g. `root` for a system-wide fleet). See [`crate::trust`].
    pub trusted_uids: Vec<u32>,
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            run_dir: default_run_dir(),
            chunk_size: DEFAULT_CHUNK_SIZE,
            parallel: 16,
            deadline: Duration::from_secs(30),
            spin: memarts_protocol::spin::DEFAULT_SPIN,
            trusted_uids: Vec::new(),
        }
    }
}

fn parse_env<T: std::str::FromStr>(name: &str, value: &str, what: &str) -> Result<T> {
    value.trim().parse().map_err(|_| Error::Config(format!("{name}={value:?} is not {what}")))
}

impl ShimConfig {
    /// Reads the environment through `get` (tests pass a map). Malformed values are errors that name
    /// the variable, never silent defaults.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<ShimConfig> {
        let mut cfg = ShimConfig::default();
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = get("MEMARTS_RUN_DIR") {
            cfg.run_dir = v.into();
        }
        if let Some(v) = get("MOX_FILE_CHUNK_SIZE") {
            let size: u64 = parse_env("MOX_FILE_CHUNK_SIZE", &v, "a number of bytes")?;
            if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&size) {
                return Err(Error::Config(format!(
                    "MOX_FILE_CHUNK_SIZE={size} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE} bytes"
                )));
            }
            cfg.chunk_size = size;
        }
        if let Some(v) = get("MOX_COPY_PARALLEL_THREADS") {
            let n: usize = parse_env("MOX_COPY_PARALLEL_THREADS", &v, "a whole number")?;
            if !(1..=1024).contains(&n) {
                return Err(Error::Config(format!("MOX_COPY_PARALLEL_THREADS={n} is outside 1..=1024")));
            }
            cfg.parallel = n;
        }
        if let Some(v) = get("MEMARTS_TIMEOUT") {
            let secs: f64 = parse_env("MEMARTS_TIMEOUT", &v, "a number of seconds")?;
            if !(secs.is_finite() && secs > 0.0 && secs < 1e6) {
                return Err(Error::Config(format!(
                    "MEMARTS_TIMEOUT={v} must be a positive number of seconds"
                )));
            }
            cfg.deadline = Duration::from_secs_f64(secs);
        }
        if let Some(v) = get("MEMARTS_SPIN_US") {
            cfg.spin = memarts_protocol::spin::parse_spin_us(&v).map_err(|e| Error::Config(e.to_string()))?;
        }
        if let Some(v) = get(crate::trust::TRUSTED_UIDS_VAR) {
            cfg.trusted_uids = crate::trust::parse_uids(&v)
                .map_err(|e| Error::Config(format!("{}={v:?}: {e}", crate::trust::TRUSTED_UIDS_VAR)))?;
        }
        Ok(cfg)
    }

    pub fn from_env() -> Result<ShimConfig> {
        Self::from_env_with(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<ShimConfig> {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ShimConfig::from_env_with(|k| env.get(k).cloned())
    }

    #[test]
    fn defaults_and_overrides() {
        let cfg = with(&[]).unwrap();
        assert_eq!((cfg.chunk_size, cfg.parallel, cfg.deadline), (1 << 20, 16, Duration::from_secs(30)));
        let cfg = with(&[("MOX_FILE_CHUNK_SIZE", "65536"), ("MOX_COPY_PARALLEL_THREADS", "4")]).unwrap();
        assert_eq!((cfg.chunk_size, cfg.parallel), (65536, 4));
        assert_eq!(cfg.spin, memarts_protocol::spin::DEFAULT_SPIN);
        assert_eq!(with(&[("MEMARTS_SPIN_US", "0")]).unwrap().spin, Duration::ZERO);
        assert_eq!(with(&[("MEMARTS_TRUSTED_UIDS", "0,1000")]).unwrap().trusted_uids, vec![0, 1000]);
    }

    #[test]
    fn malformed_values_name_the_variable() {
        for (k, v) in [
            ("MOX_FILE_CHUNK_SIZE", "1MB"),
            ("MOX_FILE_CHUNK_SIZE", "1"),
            ("MOX_COPY_PARALLEL_THREADS", "many"),
            ("MOX_COPY_PARALLEL_THREADS", "0"),
            ("MEMARTS_TIMEOUT", "-3"),
            ("MEMARTS_SPIN_US", "soon"),
            ("MEMARTS_TRUSTED_UIDS", "0,-1"),
        ] {
            let err = with(&[(k, v)]).unwrap_err().to_string();
            assert!(err.contains(k), "{err}");
        }
    }
}
