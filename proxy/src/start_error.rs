//! [`StartError`]: why a slot could not be built or started, as a proxy process
//! ([`lifecycle::main`](crate::lifecycle::main)) or in-process ([`Embedded`](crate::embedded::Embedded)).
//!
//! Each variant names the step that failed and keeps the underlying error as its `source()`. The
//! message repeats that error too, as the proxies' other errors do: it travels as one string (the
//! readiness line `memarts start_proxy` prints, Python's `UnavailableError`), so it is worded exactly
//! as these strings always were. A caller printing the whole `source()` chain (anyhow's `{:#}`)
//! would see the cause twice; print it with `{}`.

use std::io;
use std::path::PathBuf;

use crate::cache_root::CacheDirError;
use crate::config::ConfigError;
use crate::origin::OriginError;

/// Why a slot did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The fleet config is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster file, the secret or the membership would not let the slot join.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::JoinError),
    /// The slot's peer listener (`host:port + slot`) cannot be bound.
    #[error("peer listener {address}: {source}")]
    PeerListener {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("slot {slot} is out of range for a fleet of {slots}")]
    SlotOutOfRange { slot: u32, slots: u32 },
    /// The origin could not be set up (e.g. an unusable credentials file).
    #[error(transparent)]
    Origin(#[from] OriginError),
    /// `origin_log` is on and `<run dir>/origin-<slot>.log` cannot be opened.
    #[error("origin request log {}: {source}", path.display())]
    RequestLog {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The I/O engine the config asks for (`io_engine`) is unavailable.
    #[error("I/O engine {io_engine}: {source}")]
    IoEngine {
        io_engine: String,
        #[source]
        source: io::Error,
    },
    /// The cache dir, or a directory in it, is another user's, writable by others or a symlink
    /// (S9): refused, with the directory, what is wrong and the fix named; nothing in it is touched.
    #[error("refusing the cache dir: {0}")]
    UntrustedCacheDir(#[source] memarts_settings::dir_trust::UntrustedDir),
    /// The chunk store or the memarts-only store cannot be opened in the cache dir.
    #[error("cache dir {}: {source}", path.display())]
    CacheDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The run dir cannot be created, or is not ours.
    #[error("run dir {}: {source}", path.display())]
    RunDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The pid file cannot be locked: most often another live proxy holds the slot (the message,
    /// made by [`lock_slot`](crate::lifecycle::lock_slot), says which).
    #[error("{source}")]
    SlotLock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("bind {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The socket cannot be opened to the fleet's `allowed_uids` (chmod 0666).
    #[error("opening {} to allowed_uids: {source}", path.display())]
    ShareSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tokio runtime: {0}")]
    Runtime(#[source] io::Error),
    /// The bound socket cannot be handed to the runtime.
    #[error("listener: {0}")]
    Listener(#[source] io::Error),
    #[error("signal handlers: {0}")]
    Signals(#[source] io::Error),
    /// An in-process slot: a step of setting up its private run dir, fleet file, socket, runtime
    /// or thread failed. Its message is the cause's alone, as it always was.
    #[error("{source}")]
    Embedded {
        step: EmbeddedStep,
        #[source]
        source: io::Error,
    },
    /// An in-process slot's private run dir cannot be made.
    #[error("{}: {source}", path.display())]
    PrivateRunDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl From<CacheDirError> for StartError {
    fn from(e: CacheDirError) -> StartError {
        match e {
            CacheDirError::Untrusted(untrusted) => StartError::UntrustedCacheDir(untrusted),
            CacheDirError::Io { path, source } => StartError::CacheDir { path, source },
        }
    }
}

/// The step of starting an in-process slot that [`StartError::Embedded`] failed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EmbeddedStep {
    /// Writing `fleet.json` into the private run dir.
    WriteFleetFile,
    /// Binding the socket in the private run dir.
    Bind,
    /// Building the slot's tokio runtime.
    Runtime,
    /// Spawning the thread that serves the socket.
    Thread,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FleetConfig;
    use crate::origin::Origin;

    fn build(cfg: &FleetConfig) -> StartError {
        let origin = Origin::new(cfg.origin.clone(), None);
        crate::build_engine_with(cfg, 0, origin).err().expect("an error")
    }

    #[test]
    fn building_a_slot_names_the_step_that_failed_and_keeps_its_cause() {
        use std::error::Error;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let cfg = FleetConfig {
            run_dir: dir.path().join("run"),
            cache_dir: file.clone(),
            io_engine: "pread".into(),
            origin_log: false,
            ..FleetConfig::default()
        };

        let err = build(&cfg);
        assert!(matches!(&err, StartError::CacheDir { path, .. } if *path == file), "{err:?}");
        let cause = err.source().expect("the io error").to_string();
        assert_eq!(err.to_string(), format!("cache dir {}: {cause}", file.display()));
        // A cache dir others can write into: refused, naming it, what is wrong and the fix.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let err = build(&FleetConfig { cache_dir: open.clone(), ..cfg.clone() });
        assert!(matches!(&err, StartError::UntrustedCacheDir(u) if u.path == open), "{err:?}");
        let cause = err.source().expect("what is wrong").to_string();
        assert_eq!(err.to_string(), format!("refusing the cache dir: {cause}"));
        assert!(cause.contains("mode 0777") && cause.contains("chmod go-w"), "{cause}");

        // The run dir does not exist, so the request log cannot be opened in it.
        let err =
            build(&FleetConfig { origin_log: true, cache_dir: dir.path().join("cache"), ..cfg.clone() });
        let log = dir.path().join("run/origin-0.log");
        assert!(matches!(&err, StartError::RequestLog { path, .. } if *path == log), "{err:?}");
        assert!(err.to_string().starts_with(&format!("origin request log {}: ", log.display())), "{err}");

        let err = build(&FleetConfig { io_engine: "mmap".into(), ..cfg });
        assert!(
            matches!(&err, StartError::Config(ConfigError::Malformed { setting: "io_engine", .. })),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("io_engine: unknown I/O engine \"mmap\""), "{err}");
    }
}
