//! Fleet configuration: one serde struct with `validate()`.
//!
//! The `memarts` CLI resolves it (flag > environment > config file > default), writes it to
//! `<run dir>/fleet.json`, and every proxy of the fleet reads that file. Credentials are never part of
//! it: it may name a credentials file (`origin.credentials_file`), which each proxy reads and re-reads
//! itself; otherwise proxies take them from the standard `AWS_*` environment they inherit. Library
//! code receives this typed struct and never reads argv or the environment itself, except through
//! [`FleetConfig::apply_settings`] (the environment's values, parsed by `memarts_settings`). Errors are a [`ConfigError`] naming the setting (`config/error.rs`).

mod error;
mod fleet_file;
mod prefetch;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use error::{ConfigError, ValueError};
pub use memarts_disk::layout::{fleet_file, socket_path};
pub use prefetch::PrefetchConfig;

use crate::chunk_store::IoEngineKind;
use memarts_settings::size::parse_size;
use memarts_settings::Settings;

/// Everything a fleet of proxies shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// Number of proxy slots (processes) in the fleet.
    pub slots: u32,
    /// Directory of sockets, pid files, logs and `fleet.json`; 0700.
    pub run_dir: PathBuf,
    /// Root of the chunk cache, shared by all slots.
    pub cache_dir: PathBuf,
    /// Bytes on disk the whole fleet may use; `None`: 80% of the space that is free or already ours.
    /// In a config file either a number of bytes or a string such as `"50GiB"`.
    #[serde(deserialize_with = "de_size")]
    pub capacity: Option<u64>,
    /// Bytes memarts-only objects (`write_memarts`) may take on disk, fleet-wide; `None`: bounded
    /// by free space only. Like `capacity`, a number or a string such as `"10GiB"`.
    #[serde(deserialize_with = "de_size")]
    pub memarts_only_capacity: Option<u64>,
    /// `auto` (io_uring, pread when unavailable), `io_uring` or `pread`.
    pub io_engine: String,
    /// What a full cache keeps: `tinylfu` (default; a fetched chunk is kept only if it was read
    /// more often lately than what it would push out) or `lru` (every fetched chunk is kept).
    pub eviction: String,
    /// Log every origin request attempt to `<run dir>/origin-<slot>.log` (MoXing's
    /// `MOX_OBS_CLIENT_LOG`, on by default).
    pub origin_log: bool,
    /// Serve from the origin without caching anything (memarts disabled: the client library's
    /// origin mode). Single-flight and the metadata cache still apply.
    pub passthrough: bool,
    /// How long a stat result is trusted before the ETag is revalidated with the origin.
    pub meta_ttl_secs: f64,
    /// Uids allowed to connect besides the proxy's own. When there are any, the run dir is 0711,
    /// the sockets 0666 and `fleet.json` 0644, so that they can; the peer-credential check refuses
    /// every other uid before a byte is read.
    pub allowed_uids: Vec<u32>,
    /// Local directories (plain paths and `file://`) that clients of those other uids may read
    /// through the proxy, which reads with its own rights; outside them such clients get
    /// `PermissionDenied`, and they may never write or delete local paths through it. Clients of
    /// the proxy's own uid are not limited: they could read the files themselves. Default: none.
    pub local_roots: Vec<PathBuf>,
    /// Client side, read by the `memarts` CLI (not by the proxies): uids whose fleets it trusts
    /// besides the caller's own, e.g. `[0]` for a system fleet run by root. `MEMARTS_TRUSTED_UIDS`
    /// takes precedence. A fleet of any other uid is refused before a byte is read or written.
    pub trusted_uids: Vec<u32>,
    /// Connections a slot accepts at once; more are refused with `Unavailable`.
    pub max_connections: u32,
    /// A connection idle this long between requests is closed (the shim reconnects transparently).
    pub idle_timeout_secs: f64,
    /// A client that takes longer than this to send one frame or to take one reply is cut off.
    pub io_timeout_secs: f64,
    /// How long `SIGTERM` waits for in-flight requests before exiting anyway.
    pub drain_timeout_secs: f64,
    /// After a reply, how long a connection polls for the client's next request before it blocks,
    /// in microseconds (`MEMARTS_SPIN_US`; 0 = never). One connection per slot polls at a time, and
    /// a poll that finds nothing backs off; see `memarts_protocol::spin`.
    pub spin_us: u64,
    /// Bytes a slot may hold in memory at once for its clients (upload payloads being written,
    /// chunks fetched from the origin until sent and stored); `None`: 512 MiB. Past it, requests
    /// wait their turn. A number or a string such as `"1GiB"`.
    #[serde(deserialize_with = "de_size")]
    pub memory_budget: Option<u64>,
    /// Bytes of chunks the fleet may hold locked in memory for local reads, which then skip the
    /// CRC32C of what they read (resident chunks, checked once when made resident); `None`: a
    /// sixteenth of the machine's memory; 0: none. Each slot takes its share, within its
    /// `RLIMIT_MEMLOCK` unless it runs as root. A number or a string such as `"2GiB"`
    /// (`pin_memory`, its former name, is read too).
    #[serde(deserialize_with = "de_size", alias = "pin_memory")]
    pub resident_memory: Option<u64>,
    /// Chunks of at most this many bytes (up to 64 KiB) are packed into segment files
    /// (`chunk_store/segments.rs`) instead of a file each; `None`: 32 KiB, 0: none are. A number
    /// or a string such as `"32KiB"`.
    #[serde(deserialize_with = "de_size")]
    pub pack_max: Option<u64>,
    pub origin: OriginConfig,
    /// The cluster this node's fleet is part of (`--cluster FILE --node ID`, `MEMARTS_CLUSTER`,
    /// `MEMARTS_NODE_ID`, or a `[cluster]` table); `None`: a single node, as without the pool.
    pub cluster: Option<crate::cluster::ClusterSettings>,
    /// How a slot fetches the objects clients hint they will read next (`Request::Prefetch`).
    pub prefetch: PrefetchConfig,
    /// `HOST:PORT` where one slot of the fleet serves the node's metrics for Prometheus at
    /// `/metrics` (`--metrics-address`, `MEMARTS_METRICS_ADDRESS`); `None`: not served.
    pub metrics_address: Option<String>,
}

/// How to reach the origin and how hard to try.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OriginConfig {
    /// S3-compatible endpoint, e.g. `http://127.0.0.1:9000`; `None`: AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Allow plain `http://` endpoints.
    pub allow_http: bool,
    /// Virtual-hosted-style requests (`bucket.endpoint`); default is path style.
    pub virtual_hosted_style: bool,
    pub connect_timeout_secs: f64,
    /// Allowance for the first byte of a response; a request's deadline adds its size at
    /// `min_throughput` to this.
    pub first_byte_timeout_secs: f64,
    /// Slowest transfer rate tolerated before a request is abandoned and retried, bytes/s.
    pub min_throughput: u64,
    /// Attempts per origin request (first try included) for retryable failures.
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// A JSON credentials file in the OSS connector's format (`AccessKeyId`, `AccessKeySecret`,
    /// optional `SecurityToken` and `Expiration`), re-read when it changes or its credential is about
    /// to expire (`MEMARTS_CREDENTIALS_FILE`). Takes precedence over the `AWS_*` credentials.
    pub credentials_file: Option<PathBuf>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            endpoint: None,
            region: None,
            allow_http: false,
            virtual_hosted_style: false,
            connect_timeout_secs: 5.0,
            first_byte_timeout_secs: 15.0,
            min_throughput: 1 << 20,
            max_attempts: 6,
            backoff_base_ms: 100,
            backoff_max_ms: 5_000,
            credentials_file: None,
        }
    }
}

impl Default for FleetConfig {
    /// Every field's default; the run dir and cache dir follow the XDG variables.
    fn default() -> Self {
        let env = |k: &str| std::env::var(k).ok();
        FleetConfig {
            slots: 1,
            run_dir: memarts_settings::defaults::run_dir(&env),
            cache_dir: memarts_settings::defaults::cache_dir(&env),
            capacity: None,
            memarts_only_capacity: None,
            io_engine: "auto".into(),
            eviction: "tinylfu".into(),
            passthrough: false,
            origin_log: true,
            meta_ttl_secs: 60.0,
            allowed_uids: Vec::new(),
            local_roots: Vec::new(),
            trusted_uids: Vec::new(),
            max_connections: 4096,
            idle_timeout_secs: 600.0,
            io_timeout_secs: 30.0,
            drain_timeout_secs: 10.0,
            spin_us: memarts_protocol::spin::DEFAULT_SPIN.as_micros() as u64,
            memory_budget: None,
            resident_memory: None,
            pack_max: None,
            origin: OriginConfig::default(),
            cluster: None,
            prefetch: PrefetchConfig::default(),
            metrics_address: None,
        }
    }
}

impl FleetConfig {
    /// Applies what the environment sets (it takes precedence over the config file and the
    /// defaults; flags on the command line are applied after).
    pub fn apply_settings(&mut self, env: &Settings) {
        set(&mut self.run_dir, &env.run_dir);
        set(&mut self.cache_dir, &env.cache_dir);
        if env.cache_capacity.is_some() {
            self.capacity = env.cache_capacity;
        }
        if env.only_capacity.is_some() {
            self.memarts_only_capacity = env.only_capacity;
        }
        if let Some(spin) = env.spin {
            self.spin_us = spin.as_micros() as u64;
        }
        set(&mut self.origin_log, &env.origin_log);
        if let Some(kind) = env.io_engine {
            self.io_engine = kind.to_string();
        }
        if let Some(bytes) = env.resident_memory {
            self.resident_memory = Some(bytes);
        }
        if env.pack_max.is_some() {
            self.pack_max = env.pack_max;
        }
        if let Some(policy) = env.eviction {
            self.eviction = policy.to_string();
        }
        if env.endpoint.is_some() {
            self.origin.endpoint = env.endpoint.clone();
        }
        if env.region.is_some() {
            self.origin.region = env.region.clone();
        }
        if env.credentials_file.is_some() {
            self.origin.credentials_file = env.credentials_file.clone();
        }
        set(&mut self.origin.allow_http, &env.allow_http);
        if env.metrics_address.is_some() {
            self.metrics_address = env.metrics_address.clone();
        }
        if env.cluster.is_some()
            || env.node_id.is_some()
            || env.peer_address.is_some()
            || env.peer_listen.is_some()
        {
            let cluster = self.cluster.get_or_insert_default();
            set(&mut cluster.file, &env.cluster);
            set(&mut cluster.node, &env.node_id);
            if env.peer_address.is_some() {
                cluster.peer_address = env.peer_address.clone();
            }
            if env.peer_listen.is_some() {
                cluster.peer_listen = env.peer_listen.clone();
            }
        }
    }

    /// Checks every field; the error names the field and says what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.slots == 0 || self.slots > 256 {
            return Err(ConfigError::invalid("slots", "between 1 and 256", self.slots));
        }
        if !self.run_dir.is_absolute() {
            return Err(ConfigError::invalid("run_dir", "an absolute path", self.run_dir.display()));
        }
        if !self.cache_dir.is_absolute() {
            return Err(ConfigError::invalid("cache_dir", "an absolute path", self.cache_dir.display()));
        }
        if let Some(max) = self.pack_max.filter(|&m| m > crate::chunk_store::PACK_MAX) {
            return Err(ConfigError::invalid("pack_max", "at most 64KiB", format!("{max} bytes")));
        }
        if let Some(cap) = self.capacity {
            if cap < (64 << 20) {
                return Err(ConfigError::invalid("capacity", "at least 64MiB", format!("{cap} bytes")));
            }
        }
        if let Some(c) = &self.cluster {
            if !c.file.is_absolute() {
                return Err(ConfigError::invalid("cluster.file", "an absolute path", c.file.display()));
            }
            if c.node.is_empty() {
                return Err(ConfigError::Invalid {
                    setting: "cluster.node",
                    value: None,
                    expected: "this node's id (--node, MEMARTS_NODE_ID)",
                });
            }
        }
        if let Some(addr) = &self.metrics_address {
            if std::net::ToSocketAddrs::to_socket_addrs(addr.as_str()).is_err() {
                return Err(ConfigError::invalid("metrics_address", "HOST:PORT, e.g. 127.0.0.1:9464", addr));
            }
        }
        if let Some(root) = self.local_roots.iter().find(|r| !r.is_absolute()) {
            return Err(ConfigError::invalid("local_roots", "absolute paths", root.display()));
        }
        self.io_engine_kind()?;
        self.eviction()?;
        for (name, v) in [
            ("meta_ttl_secs", self.meta_ttl_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("io_timeout_secs", self.io_timeout_secs),
            ("drain_timeout_secs", self.drain_timeout_secs),
            ("origin.connect_timeout_secs", self.origin.connect_timeout_secs),
            ("origin.first_byte_timeout_secs", self.origin.first_byte_timeout_secs),
        ] {
            if !(0.0..=1e7).contains(&v) {
                return Err(ConfigError::invalid(name, "a number of seconds >= 0", v));
            }
        }
        if self.spin_us > 10_000 {
            return Err(ConfigError::invalid("spin_us", "between 0 and 10000 microseconds", self.spin_us));
        }
        let at_least = |setting, expected| ConfigError::Invalid { setting, value: None, expected };
        if self.max_connections == 0 {
            return Err(at_least("max_connections", "at least 1"));
        }
        if self.origin.max_attempts == 0 {
            return Err(at_least("origin.max_attempts", "at least 1"));
        }
        if self.origin.min_throughput == 0 {
            return Err(at_least("origin.min_throughput", "at least 1 byte/s"));
        }
        if self.origin.credentials_file.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(ConfigError::invalid("origin.credentials_file", "a path", "an empty string"));
        }
        self.prefetch.validate()
    }

    /// Whether clients of other uids may use the fleet (`allowed_uids`): then its run dir is 0711,
    /// its sockets 0666 and `fleet.json` 0644 (the peer-credential check decides who gets in),
    /// else they are 0700, 0600 and 0600.
    pub fn serves_other_uids(&self) -> bool {
        self.allowed_uids.iter().any(|&uid| uid != nix::unistd::getuid().as_raw())
    }

    pub fn io_engine_kind(&self) -> Result<IoEngineKind, ConfigError> {
        self.io_engine.parse::<IoEngineKind>().map_err(|e| ConfigError::malformed("io_engine", e))
    }

    pub fn eviction(&self) -> Result<memarts_settings::Eviction, ConfigError> {
        self.eviction.parse().map_err(|e| ConfigError::malformed("eviction", e))
    }

    pub fn meta_ttl(&self) -> Duration {
        Duration::from_secs_f64(self.meta_ttl_secs)
    }

    pub fn socket_path(&self, slot: u32) -> PathBuf {
        socket_path(&self.run_dir, slot)
    }

    pub fn pid_path(&self, slot: u32) -> PathBuf {
        self.run_dir.join(format!("proxy-{slot}.pid"))
    }

    pub fn log_path(&self, slot: u32) -> PathBuf {
        self.run_dir.join(format!("proxy-{slot}.log"))
    }
}

/// A size given as a number of bytes or as a string like `"50GiB"`.
fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Bytes(n)) => Ok(Some(n)),
        Some(Size::Text(t)) => parse_size(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

/// `*field = value`, when the environment sets one.
fn set<T: Clone>(field: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *field = v.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_environment_overrides_the_config_file() {
        let env: HashMap<&str, &str> = [
            ("MEMARTS_CACHE_DIR", "/cache/m"),
            ("MEMARTS_CACHE_CAPACITY", "2GiB"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_ALLOW_HTTP", "true"),
            ("MEMARTS_IO_ENGINE", "pread"),
            ("MEMARTS_CREDENTIALS_FILE", "/etc/memarts/credentials.json"),
            ("MOX_OBS_CLIENT_LOG", "0"),
            ("MEMARTS_SPIN_US", "0"),
        ]
        .into();
        let settings = Settings::from_env_with(|k| env.get(k).map(|v| v.to_string())).unwrap();
        let mut cfg: FleetConfig =
            toml::from_str("cache_dir = \"/from/file\"\nmeta_ttl_secs = 5.0\n").unwrap();
        cfg.apply_settings(&settings);
        assert_eq!(cfg.cache_dir, PathBuf::from("/cache/m"));
        assert_eq!(cfg.meta_ttl_secs, 5.0, "a setting the environment does not touch stays");
        assert_eq!(cfg.capacity, Some(2 << 30));
        assert!(cfg.origin.allow_http && !cfg.origin_log);
        assert_eq!(cfg.spin_us, 0);
        assert_eq!(cfg.origin.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(cfg.io_engine_kind().unwrap(), IoEngineKind::Pread);
        assert_eq!(cfg.origin.credentials_file, Some(PathBuf::from("/etc/memarts/credentials.json")));
        cfg.validate().unwrap();
        let untouched = {
            let mut c = FleetConfig::default();
            c.apply_settings(&Settings::from_env_with(|_| None).unwrap());
            c
        };
        assert_eq!(untouched.io_engine, "auto");
        assert!(untouched.origin_log);
    }

    #[test]
    fn validate_rejects_nonsense() {
        let cfg = FleetConfig { slots: 0, ..FleetConfig::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("slots"));
        let cfg = FleetConfig { io_engine: "fast".into(), ..FleetConfig::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("io_engine"));
        let cfg = FleetConfig { eviction: "lfu".into(), ..FleetConfig::default() };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("eviction") && err.contains("tinylfu or lru"), "{err}");
        let cfg = FleetConfig { eviction: "LRU".into(), ..FleetConfig::default() };
        assert_eq!(cfg.eviction().unwrap(), memarts_settings::Eviction::Lru);
        assert_eq!(FleetConfig::default().eviction().unwrap(), memarts_settings::Eviction::TinyLfu);
        let cfg = FleetConfig { cache_dir: "rel".into(), ..FleetConfig::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("cache_dir"));
        let cfg = FleetConfig { local_roots: vec!["data".into()], ..FleetConfig::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("local_roots"));
    }

    #[test]
    fn round_trips_through_json() {
        let mut cfg = FleetConfig { slots: 4, capacity: Some(1 << 30), ..FleetConfig::default() };
        cfg.origin.credentials_file = Some("/run/secrets/oss.json".into());
        let back: FleetConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
    }
}
