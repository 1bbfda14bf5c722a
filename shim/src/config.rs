//! Shim settings: the client's part of the environment (`memarts_settings`), as one typed struct.

use std::path::PathBuf;
use std::time::Duration;

use memarts_settings::Settings;

use crate::error::Result;

/// [`ShimConfig::readahead`] by default: 64 chunks of the default size, enough to keep a link of a
/// few GB/s busy across round trips of tens of milliseconds.
pub const DEFAULT_READAHEAD: u64 = 64 << 20;

/// [`ShimConfig::readahead_memory`] by default: four windows of the default size.
pub const DEFAULT_READAHEAD_MEMORY: u64 = 256 << 20;

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
    /// The most bytes a sequential [`Stream`](crate::Stream) keeps fetched or in flight ahead of
    /// its reader (default 64 MiB, at least one chunk). The window starts at one chunk and doubles
    /// with each chunk read in order up to this bound.
    pub readahead: u64,
    /// The most bytes all the read-ahead windows of a process (its streams, the files open in a
    /// mount) hold at once (default 256 MiB); past it, chunks are fetched for their read alone.
    pub readahead_memory: u64,
    /// Threads of a process that fetch chunks ahead of its readers (default: `parallel`).
    pub readahead_workers: usize,
    /// Read warm objects straight from the fleet's chunk files, with no round trip to a proxy
    /// (`MEMARTS_LOCAL_READS`, default on; only for a fleet of the client's own uid). See
    /// [`crate::local_reads`].
    pub local_reads: bool,
}

impl Default for ShimConfig {
    /// The defaults of every setting (the run dir after `XDG_RUNTIME_DIR`), whatever else the
    /// environment says.
    fn default() -> Self {
        let mut cfg =
            ShimConfig::from_settings(&Settings::from_env_with(|_| None).expect("no variable is set"));
        cfg.run_dir = memarts_settings::defaults::run_dir(&|k| std::env::var(k).ok());
        cfg
    }
}

impl ShimConfig {
    /// The client's settings from the parsed environment.
    pub fn from_settings(s: &Settings) -> ShimConfig {
        ShimConfig {
            run_dir: s.run_dir_or_default(),
            chunk_size: s.chunk_size,
            parallel: s.parallel,
            deadline: s.timeout,
            spin: s.spin.unwrap_or(memarts_protocol::spin::DEFAULT_SPIN),
            trusted_uids: s.trusted_uids.clone().unwrap_or_default(),
            readahead: DEFAULT_READAHEAD,
            readahead_memory: DEFAULT_READAHEAD_MEMORY,
            readahead_workers: s.parallel,
            local_reads: s.local_reads,
        }
    }

    /// The process's environment; a malformed variable is an error naming it.
    pub fn from_env() -> Result<ShimConfig> {
        Ok(ShimConfig::from_settings(&Settings::from_env()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<ShimConfig> {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(ShimConfig::from_settings(&Settings::from_env_with(|k| env.get(k).cloned())?))
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
        assert_eq!(with(&[("MEMARTS_RUN_DIR", "/run/m")]).unwrap().run_dir, PathBuf::from("/run/m"));
    }

    /// Every malformed value of every variable is `memarts_settings`' test; here, that the shim
    /// hands the error on as its typed `Config`, naming the variable.
    #[test]
    fn malformed_values_name_the_variable() {
        for (k, v) in [("MOX_FILE_CHUNK_SIZE", "1MB"), ("MEMARTS_TRUSTED_UIDS", "0,-1")] {
            let err = with(&[(k, v)]).unwrap_err();
            assert!(matches!(err, crate::Error::Config(_)), "{err}");
            assert!(err.to_string().contains(k), "{err}");
        }
    }
}
