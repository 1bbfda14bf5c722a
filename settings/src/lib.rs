//! Every environment variable memarts reads, parsed in one place: the MoXing ones of the product
//! documents (`USE_MEMARTS`, `MOX_FILE_CHUNK_SIZE`, ...), our own `MEMARTS_*`, and the standard
//! `AWS_*` and XDG ones we honour. The shim, the proxy's fleet config, the CLI and the Python
//! package all take their values from [`Settings`]; nothing else reads the environment for them.
//!
//! - [`Settings::from_env`] (or [`Settings::from_env_with`] a getter, for tests): an unset or empty
//!   variable is its default (or `None` where a config file may still decide); a malformed one is a
//!   [`SettingsError`] that names it, never a silent default.
//! - [`VARS`]: the table of every variable, who reads it and what it means.
//! - `parse.rs`: one parser per kind of value (the one boolean syntax, whole numbers in a range,
//!   sizes, seconds, uid lists, mount lists); `size.rs`: byte sizes; `defaults.rs`: the run dir and
//!   cache dir when nothing says; `dir_trust.rs`: whether such a directory may be trusted (its
//!   owner, its mode), the one rule of every reader.
//!
//! AWS credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) are not
//! here: only the proxy's origin reads them, so that no other part ever holds them.

pub mod defaults;
pub mod dir_trust;
pub mod parse;
pub mod size;

use std::path::PathBuf;
use std::time::Duration;

use memarts_protocol::{DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};
pub use parse::{Eviction, IoEngineKind, UnknownEviction, UnknownIoEngine};

/// A malformed variable: its name, its value, and what it should have been.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} {expected}")]
pub struct SettingsError {
    pub var: &'static str,
    pub value: String,
    pub expected: String,
}

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Every client: the Rust shim, the Python package, the CLI's data commands.
    Client,
    /// The Python package's `memarts.file` layer.
    Python,
    /// The fleet: `memarts start_proxy` and the proxies (and the engine of embedded mode).
    Fleet,
    /// The `memarts` command line.
    Cli,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    pub name: &'static str,
    pub reader: Reader,
    pub doc: &'static str,
}

macro_rules! vars {
    ($($name:literal, $reader:ident, $doc:literal;)*) => {
        /// Every environment variable memarts reads.
        pub const VARS: &[Var] = &[$(Var { name: $name, reader: Reader::$reader, doc: $doc }),*];
    };
}

vars! {
    "USE_MEMARTS", Client, "1: use memarts; with no fleet running, the engine runs in the process (embedded mode)";
    "USE_MEMARTS_PROXY", Client, "1: use the fleet's proxies (on by itself when a fleet runs)";
    "MEMARTS_RUN_DIR", Client, "the fleet's run dir (sockets, pid files, logs, fleet.json)";
    "MOX_FILE_CHUNK_SIZE", Client, "chunk size of reads, bytes, 4 KiB to 64 MiB (default 1 MiB)";
    "MOX_COPY_PARALLEL_THREADS", Client, "chunks of one read (objects of one copy) fetched at once, 1 to 1024 (default 16)";
    "MEMARTS_TIMEOUT", Client, "seconds a call retries a slot that is down or restarting (default 30)";
    "MEMARTS_SPIN_US", Client, "microseconds a client and a proxy poll their socket before blocking, 0 to 10000 (default 100)";
    "MEMARTS_TRUSTED_UIDS", Client, "uids or user names whose fleets a client trusts besides its own (e.g. root)";
    "MEMARTS_LOCAL_READS", Client, "0: never read the cache's chunk files locally, every read asks a proxy (default 1: warm reads of the fleet's own uid need no round trip)";
    "MEMARTS_DIRECT_READS", Client, "the former name of MEMARTS_LOCAL_READS, read when that is unset";
    "MOX_OBS_TO_MOUNT_PATH", Python, "object prefixes read from local mounts: obs://a=/cache/a;obs://b=/cache/b";
    "MOX_AUTO_READ_META_FREE", Python, "1: read behaves as read_meta_free";
    "USE_METADATA_CACHE", Python, "1: a persistent metadata cache for read, copy and copy_parallel";
    "MOX_MEMARTS_LARGE_FILE_ACC", Python, "1: copy large objects as parallel ranges";
    "MOX_FILE_PARTIAL_MAXIMUM_SIZE", Python, "bytes from which an object counts as large (default 5 GiB)";
    "MOX_FILE_LARGE_FILE_TASK_NUM", Python, "ranges of a large object copied at once, 1 to 256 (default 8)";
    "MEMARTS_FSSPEC_ROUTE", Python, "1: memarts.fsspec reads fsspec's s3://, obs:// and oss:// URLs through memarts (or a list: s3,obs)";
    "MEMARTS_CACHE_DIR", Fleet, "the cache dir, shared by every slot (default $XDG_CACHE_HOME/memarts)";
    "MEMARTS_CACHE_CAPACITY", Fleet, "bytes on disk the cache may use, e.g. 50GiB (default 80% of the free space)";
    "MEMARTS_ONLY_CAPACITY", Fleet, "bytes memarts-only objects may use, fleet-wide, e.g. 10GiB";
    "MEMARTS_IO_ENGINE", Fleet, "SSD I/O engine: auto, io_uring or pread (default auto)";
    "MEMARTS_RESIDENT_MEMORY", Fleet, "bytes of locally read chunks the fleet keeps resident (locked in memory, checked once), e.g. 2GiB (default: a sixteenth of the memory; 0: none)";
    "MEMARTS_PIN_MEMORY", Fleet, "the former name of MEMARTS_RESIDENT_MEMORY, read when that is unset";
    "MEMARTS_EVICTION", Fleet, "what a full cache keeps: tinylfu (default: chunks read more often win) or lru";
    "MEMARTS_PACK_MAX", Fleet, "chunks of at most this many bytes (up to 64KiB) are packed into segment files, not a file each, 0 packs none (default 32KiB)";
    "MOX_OBS_CLIENT_LOG", Fleet, "1: log every origin request to <run dir>/origin-<slot>.log (default 1)";
    "MEMARTS_CREDENTIALS_FILE", Fleet, "a JSON credentials file re-read as it rotates (the OSS connector's format)";
    "MEMARTS_LOG", Fleet, "proxy log filter: info, debug, memarts_proxy=debug... (default info)";
    "AWS_ENDPOINT_URL", Fleet, "the S3-compatible endpoint (AWS_ENDPOINT too)";
    "AWS_ENDPOINT", Fleet, "the same as AWS_ENDPOINT_URL, when that is unset";
    "AWS_REGION", Fleet, "the endpoint's region (AWS_DEFAULT_REGION too; default us-east-1)";
    "AWS_DEFAULT_REGION", Fleet, "the same as AWS_REGION, when that is unset";
    "AWS_ALLOW_HTTP", Fleet, "1 or true: allow a plain http:// endpoint";
    "MEMARTS_CLUSTER", Fleet, "the cluster file: this node's fleet is part of a cluster pool";
    "MEMARTS_NODE_ID", Fleet, "this node's id in the cluster file (or in etcd)";
    "MEMARTS_PEER_ADDRESS", Fleet, "this node's peer address HOST:PORT (etcd membership; slot k listens on PORT+k)";
    "MEMARTS_PEER_LISTEN", Fleet, "where this node's slots bind HOST:PORT, when peers dial another address (NAT, 0.0.0.0)";
    "MEMARTS_METRICS_ADDRESS", Fleet, "HOST:PORT where one slot serves the node's Prometheus metrics at /metrics";
    "MEMARTS_CONFIG", Cli, "a TOML config file with any fleet setting";
    "MEMARTS_PROXY_BIN", Cli, "the memarts-proxy binary start_proxy runs (default: next to memarts, else on PATH)";
    "XDG_RUNTIME_DIR", Client, "where the default run dir goes ($XDG_RUNTIME_DIR/memarts, else /tmp/memarts-<uid>)";
    "XDG_CACHE_HOME", Fleet, "where the default cache dir goes ($XDG_CACHE_HOME/memarts, else ~/.cache/memarts, else /tmp/memarts-cache-<uid>)";
    "HOME", Fleet, "for the default cache dir when XDG_CACHE_HOME is unset";
}

/// Every setting the environment gives, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub use_memarts: bool,
    pub use_memarts_proxy: bool,
    /// `MEMARTS_RUN_DIR`; see [`Settings::run_dir_or_default`].
    pub run_dir: Option<PathBuf>,
    pub chunk_size: u64,
    pub parallel: usize,
    pub timeout: Duration,
    /// `MEMARTS_SPIN_US`; `None`: the default (a config file may set the proxies').
    pub spin: Option<Duration>,
    /// `None` when unset: the CLI's config file may still list some.
    pub trusted_uids: Option<Vec<u32>>,
    /// `MEMARTS_LOCAL_READS` (default true): warm reads straight from the chunk files.
    pub local_reads: bool,
    pub mounts: Vec<(String, String)>,
    pub auto_read_meta_free: bool,
    pub use_metadata_cache: bool,
    pub large_file_acc: bool,
    pub partial_maximum_size: u64,
    pub large_file_task_num: usize,
    /// `MEMARTS_FSSPEC_ROUTE`: the fsspec protocols `memarts.fsspec` takes over (none by default).
    pub fsspec_route: Vec<String>,
    // The fleet's: `None` when unset, so that a config file may decide.
    pub cache_dir: Option<PathBuf>,
    pub cache_capacity: Option<u64>,
    pub only_capacity: Option<u64>,
    pub io_engine: Option<IoEngineKind>,
    pub eviction: Option<Eviction>,
    pub resident_memory: Option<u64>,
    pub pack_max: Option<u64>,
    pub origin_log: Option<bool>,
    pub credentials_file: Option<PathBuf>,
    pub log: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
    pub cluster: Option<PathBuf>,
    pub node_id: Option<String>,
    pub peer_address: Option<String>,
    pub peer_listen: Option<String>,
    pub metrics_address: Option<String>,
    pub config: Option<PathBuf>,
    pub proxy_bin: Option<PathBuf>,
    /// The run dir and cache dir when nothing else says (from the XDG variables).
    pub default_run_dir: PathBuf,
    pub default_cache_dir: PathBuf,
}

impl Settings {
    /// The process's environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Settings::from_env_with(|k| std::env::var(k).ok())
    }

    /// The environment `get` gives (tests pass a map).
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let env = Env(|name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()));
        Ok(Settings {
            use_memarts: env.flag("USE_MEMARTS")?,
            use_memarts_proxy: env.flag("USE_MEMARTS_PROXY")?,
            run_dir: env.opt("MEMARTS_RUN_DIR", parse::path)?,
            chunk_size: env
                .opt("MOX_FILE_CHUNK_SIZE", |t| parse::bytes(t, MIN_CHUNK_SIZE, MAX_CHUNK_SIZE))?
                .unwrap_or(DEFAULT_CHUNK_SIZE),
            parallel: env.opt("MOX_COPY_PARALLEL_THREADS", |t| parse::whole(t, 1usize, 1024))?.unwrap_or(16),
            timeout: env.opt("MEMARTS_TIMEOUT", parse::seconds)?.unwrap_or(Duration::from_secs(30)),
            spin: env.opt("MEMARTS_SPIN_US", parse::spin_us)?,
            trusted_uids: env.opt("MEMARTS_TRUSTED_UIDS", parse::uids)?,
            local_reads: env
                .opt("MEMARTS_LOCAL_READS", parse::flag)?
                .or(env.opt("MEMARTS_DIRECT_READS", parse::flag)?)
                .unwrap_or(true),
            mounts: env.opt("MOX_OBS_TO_MOUNT_PATH", parse::mounts)?.unwrap_or_default(),
            auto_read_meta_free: env.flag("MOX_AUTO_READ_META_FREE")?,
            use_metadata_cache: env.flag("USE_METADATA_CACHE")?,
            large_file_acc: env.flag("MOX_MEMARTS_LARGE_FILE_ACC")?,
            partial_maximum_size: env
                .opt("MOX_FILE_PARTIAL_MAXIMUM_SIZE", |t| parse::whole(t, 1u64, 1 << 62))?
                .unwrap_or(5 << 30),
            large_file_task_num: env
                .opt("MOX_FILE_LARGE_FILE_TASK_NUM", |t| parse::whole(t, 1usize, 256))?
                .unwrap_or(8),
            fsspec_route: env.opt("MEMARTS_FSSPEC_ROUTE", parse::fsspec_protocols)?.unwrap_or_default(),
            cache_dir: env.opt("MEMARTS_CACHE_DIR", parse::path)?,
            cache_capacity: env.opt("MEMARTS_CACHE_CAPACITY", parse::size)?,
            only_capacity: env.opt("MEMARTS_ONLY_CAPACITY", parse::size)?,
            io_engine: env.opt("MEMARTS_IO_ENGINE", parse::io_engine)?,
            eviction: env.opt("MEMARTS_EVICTION", parse::eviction)?,
            resident_memory: env
                .opt("MEMARTS_RESIDENT_MEMORY", parse::size)?
                .or(env.opt("MEMARTS_PIN_MEMORY", parse::size)?),
            pack_max: env.opt("MEMARTS_PACK_MAX", parse::size)?,
            origin_log: env.opt("MOX_OBS_CLIENT_LOG", parse::flag)?,
            credentials_file: env.opt("MEMARTS_CREDENTIALS_FILE", parse::path)?,
            log: env.opt("MEMARTS_LOG", parse::text)?,
            endpoint: env.opt("AWS_ENDPOINT_URL", parse::text)?.or(env.opt("AWS_ENDPOINT", parse::text)?),
            region: env.opt("AWS_REGION", parse::text)?.or(env.opt("AWS_DEFAULT_REGION", parse::text)?),
            allow_http: env.opt("AWS_ALLOW_HTTP", parse::flag)?,
            cluster: env.opt("MEMARTS_CLUSTER", parse::path)?,
            node_id: env.opt("MEMARTS_NODE_ID", parse::text)?,
            peer_address: env.opt("MEMARTS_PEER_ADDRESS", parse::text)?,
            peer_listen: env.opt("MEMARTS_PEER_LISTEN", parse::text)?,
            metrics_address: env.opt("MEMARTS_METRICS_ADDRESS", parse::text)?,
            config: env.opt("MEMARTS_CONFIG", parse::path)?,
            proxy_bin: env.opt("MEMARTS_PROXY_BIN", parse::path)?,
            default_run_dir: defaults::run_dir(&env.0),
            default_cache_dir: defaults::cache_dir(&env.0),
        })
    }

    /// `MEMARTS_RUN_DIR`, else the default run dir.
    pub fn run_dir_or_default(&self) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(|| self.default_run_dir.clone())
    }
}

/// The environment, trimmed, with empty values as unset.
struct Env<G>(G);

impl<G: Fn(&str) -> Option<String>> Env<G> {
    fn opt<T>(
        &self,
        var: &'static str,
        parse: impl Fn(&str) -> Result<T, parse::Expected>,
    ) -> Result<Option<T>, SettingsError> {
        let Some(value) = (self.0)(var) else { return Ok(None) };
        parse(&value).map(Some).map_err(|e| SettingsError { var, value, expected: e.0 })
    }

    fn flag(&self, var: &'static str) -> Result<bool, SettingsError> {
        Ok(self.opt(var, parse::flag)?.unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Mutex;

    fn with(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_env_with(|k| env.get(k).cloned())
    }

    #[test]
    fn the_table_lists_exactly_the_variables_that_are_read() {
        let asked = Mutex::new(BTreeSet::new());
        Settings::from_env_with(|k| {
            asked.lock().unwrap().insert(k.to_string());
            None
        })
        .unwrap();
        let listed: BTreeSet<String> = VARS.iter().map(|v| v.name.to_string()).collect();
        assert_eq!(asked.into_inner().unwrap(), listed);
        assert_eq!(listed.len(), VARS.len(), "a variable is listed twice");
    }

    #[test]
    fn defaults_and_values() {
        let s = with(&[]).unwrap();
        assert_eq!((s.chunk_size, s.parallel, s.timeout), (1 << 20, 16, Duration::from_secs(30)));
        assert!(!s.use_memarts && s.trusted_uids.is_none() && s.io_engine.is_none() && s.mounts.is_empty());
        assert_eq!((s.partial_maximum_size, s.large_file_task_num), (5 << 30, 8));
        assert!(s.fsspec_route.is_empty());
        let s = with(&[
            ("USE_MEMARTS", "1"),
            ("MOX_FILE_CHUNK_SIZE", " 65536 "),
            ("MEMARTS_TRUSTED_UIDS", "0,1000"),
            ("MEMARTS_CACHE_CAPACITY", "2GiB"),
            ("AWS_ENDPOINT", "http://old"),
            ("AWS_ALLOW_HTTP", "true"),
            ("MEMARTS_IO_ENGINE", "pread"),
            ("MOX_MEMARTS_LARGE_FILE_ACC", ""),
            ("XDG_RUNTIME_DIR", "/run/user/7"),
            ("MEMARTS_FSSPEC_ROUTE", "obs"),
        ])
        .unwrap();
        assert_eq!(s.fsspec_route, ["obs"]);
        assert!(s.use_memarts && !s.large_file_acc);
        assert_eq!((s.chunk_size, s.cache_capacity), (65536, Some(2 << 30)));
        assert_eq!(s.trusted_uids, Some(vec![0, 1000]));
        assert_eq!((s.endpoint.as_deref(), s.allow_http), (Some("http://old"), Some(true)));
        assert_eq!(s.io_engine, Some(IoEngineKind::Pread));
        assert_eq!(s.run_dir_or_default(), PathBuf::from("/run/user/7/memarts"));
    }

    #[test]
    fn the_former_names_of_renamed_variables_are_read_when_the_new_ones_are_unset() {
        let old = with(&[("MEMARTS_DIRECT_READS", "0"), ("MEMARTS_PIN_MEMORY", "1GiB")]).unwrap();
        assert_eq!((old.local_reads, old.resident_memory), (false, Some(1 << 30)));
        let both = with(&[
            ("MEMARTS_DIRECT_READS", "0"),
            ("MEMARTS_LOCAL_READS", "1"),
            ("MEMARTS_PIN_MEMORY", "1GiB"),
            ("MEMARTS_RESIDENT_MEMORY", "2GiB"),
        ])
        .unwrap();
        assert_eq!((both.local_reads, both.resident_memory), (true, Some(2 << 30)), "the new names win");
    }

    #[test]
    fn a_malformed_value_is_an_error_naming_the_variable() {
        for (var, value) in [
            ("USE_MEMARTS", "yes"),
            ("MOX_FILE_CHUNK_SIZE", "1MB"),
            ("MOX_FILE_CHUNK_SIZE", "1"),
            ("MOX_COPY_PARALLEL_THREADS", "many"),
            ("MOX_COPY_PARALLEL_THREADS", "0"),
            ("MEMARTS_TIMEOUT", "-3"),
            ("MEMARTS_SPIN_US", "soon"),
            ("MEMARTS_TRUSTED_UIDS", "0,-1"),
            ("MOX_AUTO_READ_META_FREE", "yes"),
            ("MOX_OBS_TO_MOUNT_PATH", "obs://b/a:/cache/a"),
            ("MOX_MEMARTS_LARGE_FILE_ACC", "2"),
            ("MOX_FILE_PARTIAL_MAXIMUM_SIZE", "5GB"),
            ("MOX_FILE_LARGE_FILE_TASK_NUM", "-1"),
            ("MEMARTS_FSSPEC_ROUTE", "gcs"),
            ("MEMARTS_CACHE_CAPACITY", "lots"),
            ("MEMARTS_IO_ENGINE", "mmap"),
            ("MOX_OBS_CLIENT_LOG", "maybe"),
            ("AWS_ALLOW_HTTP", "sure"),
        ] {
            let err = with(&[(var, value)]).unwrap_err();
            assert_eq!((err.var, err.value.as_str()), (var, value));
            assert!(err.to_string().starts_with(var), "{err}");
        }
    }
}
