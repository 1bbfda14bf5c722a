//! Argument parsing and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// memarts: a near-compute cache for training data. A fleet of proxy processes per node turns local
/// SSDs into a shared, persistent cache of an object store (S3, OBS, OSS, MinIO) or a local/NFS tree.
#[derive(Parser, Debug)]
#[command(name = "memarts", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command understands. Precedence: flag > environment > config file > default.
// The field docs are `--help` text, written for a terminal, not rustdoc markup.
#[allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
#[derive(Args, Debug, Clone, Default)]
pub struct Common {
    /// Directory of the fleet's sockets, pid files and logs [env: MEMARTS_RUN_DIR]
    /// [default: $XDG_RUNTIME_DIR/memarts, else /tmp/memarts-<uid>]
    #[arg(long, global = true)]
    pub run_dir: Option<PathBuf>,
    /// TOML config file with any FleetConfig field (cache_dir, capacity, io_engine, meta_ttl_secs,
    /// [origin] endpoint/region/allow_http/credentials_file...) [env: MEMARTS_CONFIG]
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum Command {
    /// Start N proxy processes in the background and wait until every one is ready.
    #[command(alias = "start-proxy")]
    StartProxy(StartArgs),
    /// Stop the fleet (drain, then SIGKILL after a grace period) and clean up what a crashed fleet left.
    #[command(alias = "stop-proxy")]
    StopProxy(StopArgs),
    /// Restart the running fleet one slot at a time (after an upgrade, say): each slot drains, exits
    /// and comes back with the same settings and its cache before the next one goes; clients retry
    /// the slot that is away, so a training job does not notice.
    #[command(alias = "restart-proxy")]
    RestartProxy(RestartArgs),
    /// Show every slot: pid, uptime, connections, hits, misses, bytes, cache use.
    Status(StatusArgs),
    /// Write an object to stdout (through the fleet when one runs, else straight from the origin).
    Cat(UrlArgs),
    /// Show an object's size, ETag and last-modified time.
    Stat(StatArgs),
    /// List the objects (and directories) under a URL.
    Ls(LsArgs),
    /// Copy an object (or with -r every object under a prefix) to a local path, or a local file
    /// (or with -r a directory) to an object URL; through the fleet when one runs.
    Cp(CpArgs),
    /// Store a local file as an object, or with --memarts-only in the cache only (write_memarts).
    Put(PutArgs),
    /// Read every object under a prefix through the fleet, filling the cache; prints the throughput
    /// and how much came from the cache and from the origin.
    Warmup(WarmupArgs),
    /// Mount an object prefix as a POSIX directory (FUSE), read through the node's fleet and its
    /// cache. Files written there are uploaded whole when closed; see docs/MOUNT.md.
    Mount(MountArgs),
    /// Unmount a memarts mount, also one whose mount process died (kill -9) and left it stale.
    Unmount(UnmountArgs),
    /// The cluster pool this node's fleet is part of.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Every member and its state (alive / suspect / down, since when), and per node the bytes
    /// served from its SSD, read from peers and fetched from the origin, peer errors and fallbacks.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// s3://, obs://, oss:// URL, file:// URL or local directory
    pub url: String,
    /// Every object below the URL, not just one level
    #[arg(short, long)]
    pub recursive: bool,
    /// Show sizes and mark directories
    #[arg(short, long)]
    pub long: bool,
}

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Object URL or local path to copy from
    pub src: String,
    /// Local path (an existing directory receives the object under its own name) or object URL
    pub dst: String,
    /// Copy every object below SRC into the directory DST, keeping relative paths (copy_parallel)
    #[arg(short, long)]
    pub recursive: bool,
    /// Objects copied at once [default: MOX_COPY_PARALLEL_THREADS, else 16]
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Args, Debug)]
pub struct PutArgs {
    /// Object URL to write
    pub url: String,
    /// Local file to read
    pub file: std::path::PathBuf,
    /// Keep the object only in the memarts cache (durable, never evicted, never sent to the origin);
    /// needs a running fleet
    #[arg(long)]
    pub memarts_only: bool,
}

#[derive(Args, Debug)]
pub struct WarmupArgs {
    /// Prefix (directory) to read, e.g. s3://bucket/dataset/ or /mnt/data/train
    pub url_prefix: String,
    /// Objects read at once (requests in flight to the origin when cold: about 30 fill a link of
    /// 20 ms per request and 200 MB/s with 160 KiB files)
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Read the objects a manifest file names instead of listing the prefix (no LIST request): one
    /// per line, its first field a URL or a key relative to URL_PREFIX; `#` starts a comment
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Cap on the read rate, e.g. 200MiB (per second), so a warmup does not starve training jobs
    /// of origin bandwidth
    #[arg(long)]
    pub max_rate: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// Object prefix to mount: s3://bucket/prefix (obs://, oss:// alike), s3://bucket, or a local
    /// or file:// directory
    pub url_prefix: String,
    /// Existing empty directory to mount it on
    pub mountpoint: PathBuf,
    /// Read-only mount (files 0444, directories 0555): the seed's read-only mode; pair it with long
    /// timeouts and --kernel-cache for datasets that do not change
    #[arg(long)]
    pub read_only: bool,
    /// Seconds the size, mtime and ETag of a file are trusted, by the kernel and by the mount,
    /// before the origin is asked again (one HEAD); a file opened later than this after the
    /// last check pins the origin's current version. 0 = ask at every open (consistent mode)
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    pub attr_timeout: f64,
    /// Seconds a directory listing and a name found in it are trusted before the origin is
    /// listed again: new objects written by others appear after at most this long
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    pub entry_timeout: f64,
    /// Seconds a missing name stays missing (ENOENT without asking the origin again); 0 = every
    /// lookup of a missing name asks the origin, so objects others create appear at once
    #[arg(long, default_value_t = 0.0, value_name = "S")]
    pub negative_timeout: f64,
    /// Keep the kernel's page cache of a file across opens even when the mount cannot tell that
    /// the file is unchanged (without it the cache is kept only while the ETag stays the same,
    /// like FUSE's auto_cache); for data that never changes
    #[arg(long)]
    pub kernel_cache: bool,
    /// Let other users (and root) use the mount; needs user_allow_other in /etc/fuse.conf when
    /// not mounting as root. Permission bits are checked by the kernel either way
    #[arg(long)]
    pub allow_other: bool,
    /// Stay in the foreground (logs on stderr) instead of returning once the mount is live
    #[arg(long)]
    pub foreground: bool,
    /// Run the cache engine inside the mount process (on the cache dir) when no fleet runs,
    /// like USE_MEMARTS=1 does for the Python package; without it and without a fleet the mount
    /// refuses to start
    #[arg(long)]
    pub embedded: bool,
    /// Directory of the private temp files that hold a file being written until its close
    /// uploads it (unnamed: nothing is left behind by a crash); default: $TMPDIR, else /tmp
    #[arg(long)]
    pub spool_dir: Option<PathBuf>,
    /// Read-ahead of one file read sequentially: the window grows from one chunk up to this
    #[arg(long, default_value = "8MiB", value_name = "SIZE")]
    pub max_readahead: String,
    /// Memory that read chunks and read-ahead of all open files may hold at once; past it reads
    /// go straight to the fleet without read-ahead
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub readahead_memory: String,
    /// Kernel requests served at once (threads)
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// Log file of the background mount process; default: a mount-HASH.log file in the run dir
    #[arg(long)]
    pub log_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct UnmountArgs {
    /// Where the mount is
    pub mountpoint: PathBuf,
    /// Detach the mount now even if files on it are open (umount -l); it goes away when they close
    #[arg(long)]
    pub lazy: bool,
}

#[derive(Args, Debug)]
pub struct StartArgs {
    /// Number of proxy processes (slots); 8 is a good start for a training node.
    pub n: u32,
    /// Root of the chunk cache, shared by all slots [env: MEMARTS_CACHE_DIR] [default: ~/.cache/memarts]
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Disk the cache may use, e.g. 50GiB [env: MEMARTS_CACHE_CAPACITY] [default: 80% of free space]
    #[arg(long)]
    pub capacity: Option<String>,
    /// SSD I/O engine: auto (io_uring, pread if unavailable), io_uring or pread
    /// [env: MEMARTS_IO_ENGINE] [default: auto]
    #[arg(long)]
    pub io_engine: Option<String>,
    /// What a full cache keeps: tinylfu (a fetched chunk only if it was read more often lately than
    /// what it would push out) or lru [env: MEMARTS_EVICTION] [default: tinylfu]
    #[arg(long)]
    pub eviction: Option<String>,
    /// Bytes of locally read chunks the fleet keeps resident (locked in memory, checked once), so
    /// that their readers skip the CRC32C, e.g. 2GiB; 0: none [env: MEMARTS_RESIDENT_MEMORY]
    /// [config: resident_memory] [default: a sixteenth of the machine's memory]
    #[arg(long, value_name = "SIZE", alias = "pin-memory")]
    pub resident_memory: Option<String>,
    /// Serve the node's metrics for Prometheus at http://HOST:PORT/metrics (one slot serves them
    /// for the whole fleet, each labelled with its slot) [env: MEMARTS_METRICS_ADDRESS]
    /// [config: metrics_address] [default: not served]
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_address: Option<String>,
    /// Seconds a stat result is trusted before the ETag is revalidated [config: meta_ttl_secs]
    /// [default: 60]
    #[arg(long)]
    pub meta_ttl: Option<f64>,
    /// S3-compatible endpoint URL [env: AWS_ENDPOINT_URL]
    #[arg(long)]
    pub endpoint: Option<String>,
    /// JSON file of S3 credentials, re-read without a restart when it changes or its credential
    /// expires [env: MEMARTS_CREDENTIALS_FILE] [config: origin.credentials_file]
    ///
    /// The OSS connector's format: {"AccessKeyId": "...", "AccessKeySecret": "...",
    /// "SecurityToken": "..." (optional), "Expiration": "2024-08-20T00:00:00Z" (optional, RFC 3339;
    /// without it the credential never expires)}. Each proxy looks at the file at most once a second
    /// and re-reads it when it changed or when its credential expires within 5 minutes (or half its
    /// remaining lifetime); while a re-read fails it keeps the last good credential until that one
    /// expires. Takes precedence over AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
    /// A missing or invalid file fails the start.
    #[arg(long)]
    pub credentials_file: Option<PathBuf>,
    /// Join the cluster pool this TOML file describes (secret_file, then nodes id/address/weight,
    /// or etcd = [...] and name) [env: MEMARTS_CLUSTER] [config: cluster.file]
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// This node's id in the cluster file or etcd [env: MEMARTS_NODE_ID] [config: cluster.node]
    #[arg(long)]
    pub node: Option<String>,
    /// This node's peer address HOST:PORT, registered in etcd (slot k listens on PORT+k)
    /// [env: MEMARTS_PEER_ADDRESS] [config: cluster.peer_address]
    #[arg(long)]
    pub peer_address: Option<String>,
    /// Where this node's slots bind HOST:PORT (slot k on PORT+k) when peers dial another address
    /// (NAT, a container's port mapping, 0.0.0.0:PORT) [env: MEMARTS_PEER_LISTEN]
    /// [config: cluster.peer_listen] [default: the node's peer address]
    #[arg(long)]
    pub peer_listen: Option<String>,
    /// Seconds to wait for every slot to report ready
    #[arg(long, default_value_t = 30.0)]
    pub ready_timeout: f64,
    /// Stay in the foreground and supervise the fleet (for systemd and containers): tell systemd
    /// when it is ready (Type=notify), start again a slot that dies, stop every slot on SIGTERM or
    /// `memarts stop_proxy`, and exit with failure if a slot keeps dying
    #[arg(long)]
    pub foreground: bool,
    /// With --foreground: seconds slots drain when the fleet stops, before SIGKILL
    #[arg(long, default_value_t = 15.0)]
    pub grace: f64,
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// Seconds to let slots drain after SIGTERM before SIGKILL
    #[arg(long, default_value_t = 15.0)]
    pub grace: f64,
}

#[derive(Args, Debug)]
pub struct RestartArgs {
    /// Seconds to let each slot drain after SIGTERM before SIGKILL
    #[arg(long, default_value_t = 15.0)]
    pub grace: f64,
    /// Seconds to wait for each restarted slot to report ready
    #[arg(long, default_value_t = 30.0)]
    pub ready_timeout: f64,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Machine-readable output: {"slots": [{"slot": 0, "pid": 123, "alive": true, ...}], ...}
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UrlArgs {
    /// s3://, obs://, oss:// URL, file:// URL or local path
    pub url: String,
}

#[derive(Args, Debug)]
pub struct StatArgs {
    /// s3://, obs://, oss:// URL, file:// URL or local path
    pub url: String,
    #[arg(long)]
    pub json: bool,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::StartProxy(a) => crate::fleet::start(&cli.common, a),
        Command::StopProxy(a) => crate::fleet::stop(&cli.common, a),
        Command::RestartProxy(a) => crate::fleet::restart(&cli.common, a),
        Command::Status(a) => crate::status::status(&cli.common, a),
        Command::Cat(a) => crate::data::cat(&cli.common, a),
        Command::Stat(a) => crate::data::stat(&cli.common, a),
        Command::Warmup(a) => crate::warmup::warmup(&cli.common, a),
        Command::Ls(a) => crate::transfer::ls(&cli.common, a),
        Command::Cp(a) => crate::transfer::cp(&cli.common, a),
        Command::Put(a) => crate::transfer::put(&cli.common, a),
        Command::Mount(a) => crate::mount::mount(&cli.common, a),
        Command::Unmount(a) => crate::mount::unmount(a),
        Command::Cluster(ClusterCommand::Status(a)) => crate::cluster::status(&cli.common, a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("memarts: {e:#}");
            ExitCode::FAILURE
        }
    }
}
