//! Why a fleet configuration cannot be used: [`ConfigError`], and [`ValueError`] for a value that
//! does not parse as what its setting holds.
//!
//! A *setting* is a field of `fleet.json` and of the config file (`slots`, `origin.max_attempts`);
//! the environment variables that set some of them are parsed (and their errors named) by
//! `memarts_settings`. Every message names the setting and
//! says what it accepts; the CLI prints them, proxies report them in their readiness line and the
//! Python package raises them as `memarts.errors.ConfigError`, so their wording is kept as it is.

use std::path::PathBuf;

use memarts_settings::size::SizeError;
use memarts_settings::UnknownIoEngine;

/// A configuration that cannot be used, naming the setting at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value the setting does not accept: `slots must be between 1 and 256, got 0`.
    #[error("{setting} must be {expected}{}", got(.value))]
    Invalid {
        setting: &'static str,
        /// What it got, as the message shows it; `None` where the message does not repeat it
        /// (`max_connections must be at least 1`).
        value: Option<String>,
        expected: &'static str,
    },
    /// A value that does not parse as what the setting holds:
    /// `MEMARTS_CACHE_CAPACITY: "lots" is not a size (use e.g. 50GiB, 512MiB)`. The reason is part
    /// of this error's message (what is wrong with the value), not a separate cause.
    #[error("{setting}: {reason}")]
    Malformed { setting: &'static str, reason: ValueError },
    /// `fleet.json` could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `fleet.json` is not JSON of a [`FleetConfig`](super::FleetConfig).
    #[error("{} is not a fleet config: {source}", path.display())]
    NotAFleetConfig {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Why a value does not parse as what its setting holds; [`ConfigError::Malformed`] names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error(transparent)]
    Engine(#[from] UnknownIoEngine),
    #[error(transparent)]
    Eviction(#[from] memarts_settings::UnknownEviction),
}

impl ConfigError {
    /// `setting`'s text did not parse.
    pub fn malformed(setting: &'static str, reason: impl Into<ValueError>) -> ConfigError {
        ConfigError::Malformed { setting, reason: reason.into() }
    }

    /// `setting` must be `expected` and got `value` (as the message should show it).
    pub fn invalid(setting: &'static str, expected: &'static str, value: impl ToString) -> ConfigError {
        ConfigError::Invalid { setting, value: Some(value.to_string()), expected }
    }

    /// The setting the error names, when it names one (not for an unreadable `fleet.json`).
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            ConfigError::Invalid { setting, .. } | ConfigError::Malformed { setting, .. } => Some(setting),
            ConfigError::Unreadable { .. } | ConfigError::NotAFleetConfig { .. } => None,
        }
    }
}

fn got(value: &Option<String>) -> String {
    value.as_ref().map(|v| format!(", got {v}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FleetConfig;

    /// The messages users see (CLI, readiness line, Python's `ConfigError`), word for word: every
    /// environment variable's in one form, `VAR="value" what it should be`.
    #[test]
    fn error_messages_are_worded_as_before() {
        let env_err = |var: &str, value: &str| {
            memarts_settings::Settings::from_env_with(|k| (k == var).then(|| value.to_string()))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            env_err("MEMARTS_IO_ENGINE", " mmap "),
            r#"MEMARTS_IO_ENGINE="mmap" is not an I/O engine: use auto, io_uring (or uring) or pread"#
        );
        assert_eq!(
            env_err("MEMARTS_ONLY_CAPACITY", "lots"),
            r#"MEMARTS_ONLY_CAPACITY="lots" is not a size (use e.g. 50GiB, 512MiB, 1TB)"#
        );
        assert_eq!(env_err("MOX_OBS_CLIENT_LOG", " 2 "), r#"MOX_OBS_CLIENT_LOG="2" must be 0 or 1"#);
        assert_eq!(env_err("AWS_ALLOW_HTTP", "maybe"), r#"AWS_ALLOW_HTTP="maybe" must be 0 or 1"#);
        assert_eq!(
            env_err("MEMARTS_SPIN_US", "fast"),
            r#"MEMARTS_SPIN_US="fast" is not a number of microseconds between 0 and 10000"#
        );

        let invalid = |cfg: FleetConfig| cfg.validate().unwrap_err().to_string();
        let d = FleetConfig::default;
        assert_eq!(invalid(FleetConfig { slots: 300, ..d() }), "slots must be between 1 and 256, got 300");
        assert_eq!(
            invalid(FleetConfig { run_dir: "r".into(), ..d() }),
            "run_dir must be an absolute path, got r"
        );
        assert_eq!(
            invalid(FleetConfig { capacity: Some(1 << 20), ..d() }),
            "capacity must be at least 64MiB, got 1048576 bytes"
        );
        assert_eq!(
            invalid(FleetConfig { io_engine: "fast".into(), ..d() }),
            r#"io_engine: unknown I/O engine "fast": expected one of auto, io_uring (or uring), pread"#
        );
        assert_eq!(
            invalid(FleetConfig { drain_timeout_secs: -1.5, ..d() }),
            "drain_timeout_secs must be a number of seconds >= 0, got -1.5"
        );
        assert_eq!(
            invalid(FleetConfig { spin_us: 20_000, ..d() }),
            "spin_us must be between 0 and 10000 microseconds, got 20000"
        );
        assert_eq!(invalid(FleetConfig { max_connections: 0, ..d() }), "max_connections must be at least 1");
        let mut cfg = d();
        cfg.origin.min_throughput = 0;
        assert_eq!(invalid(cfg), "origin.min_throughput must be at least 1 byte/s");
        let mut cfg = d();
        cfg.origin.credentials_file = Some("".into());
        assert_eq!(invalid(cfg), "origin.credentials_file must be a path, got an empty string");

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("fleet.json");
        let err = FleetConfig::load(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Unreadable { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("cannot read {}: No such file or directory (os error 2)", missing.display())
        );
        std::fs::write(&missing, "{").unwrap();
        let err = FleetConfig::load(&missing).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{} is not a fleet config: EOF while", missing.display())), "{err}");
    }
}
