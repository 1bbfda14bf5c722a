//! `memarts-link-relay`: the emulated remote link of the benchmarks, in Rust.
//!
//! The same relay as `tests/bench/relay.py` (same arguments, same `READY <url>` line, same counters on
//! SIGUSR1), for the benchmarks that push a thousand requests a second through it: there, the asyncio
//! relay became the link's real limit on this 2-core machine (curl `--parallel 64` got 0.82x the
//! configured rate through it, 0.88-0.93x through this one, which takes about 0.16 ms of CPU per
//! request).
//!
//! - latency: every HTTP request waits `--latency-ms` before it is forwarded. A request start is client
//!   bytes arriving after the server has sent response bytes (or the first bytes of a connection).
//! - bandwidth: bytes in either direction go through a token bucket per connection and one shared by
//!   all connections; a bucket may run into debt, and the sender then sleeps until it is paid, so each
//!   bucket's long-run rate is exact.
//! - `--count-signers`: counts the SigV4 access key id (`Credential=<id>/`) of every request.
//! - `--timeline-ms N`: bytes sent to clients and request starts per bin of N ms, on the monotonic
//!   clock (Python's `time.monotonic()`), so that a run can be split into its start-up, its steady
//!   state and its tail. Each SIGUSR1 print holds the bins since the previous one (`timeline`).
//!
//! Stops on SIGTERM or SIGINT, or when the process that started it is gone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};

/// Bytes per read: the granularity of throttling (as in relay.py).
const READ_SIZE: usize = 64 << 10;
/// A bucket's burst, in bytes (as in relay.py).
const BURST: f64 = (256 << 10) as f64;

#[derive(Parser)]
#[command(about = "TCP relay emulating a remote link (latency per request, bandwidth caps)")]
struct Args {
    /// The server to relay to.
    host: String,
    port: u16,
    /// Delay added to every HTTP request, in ms.
    #[arg(long, default_value_t = 20.0)]
    latency_ms: f64,
    /// Bandwidth of one connection, MB/s (10^6 bytes); 0 or less: unlimited.
    #[arg(long, default_value_t = 50.0)]
    mbps_per_conn: f64,
    /// Bandwidth shared by all connections, MB/s; 0 or less: unlimited.
    #[arg(long, default_value_t = 200.0)]
    mbps_total: f64,
    /// Address to listen on (the port is picked by the system).
    #[arg(long, default_value = "127.0.0.1")]
    listen: String,
    /// Count requests per SigV4 access key id.
    #[arg(long)]
    count_signers: bool,
    /// Record bytes down and request starts per bin of this many ms (0: no timeline).
    #[arg(long, default_value_t = 0)]
    timeline_ms: u64,
}

/// `rate` bytes/s with a burst; `reserve(n)` takes n bytes (possibly into debt) and says how long the
/// caller must wait before sending them.
struct TokenBucket {
    rate: f64,
    tokens: f64,
    stamp: Instant,
}

impl TokenBucket {
    fn new(mbps: f64) -> TokenBucket {
        TokenBucket { rate: mbps * 1e6, tokens: BURST, stamp: Instant::now() }
    }

    fn reserve(&mut self, n: usize) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let refill = now.duration_since(self.stamp).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(BURST) - n as f64;
        self.stamp = now;
        Duration::from_secs_f64((-self.tokens / self.rate).max(0.0))
    }
}

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    requests: AtomicU64,
    bytes_down: AtomicU64,
    signers: Option<Mutex<BTreeMap<String, u64>>>,
    timeline: Option<Mutex<Timeline>>,
}

/// Bytes down and request starts per bin of `bin_ms`, since the last print.
struct Timeline {
    bin_ms: u64,
    /// The bin of `bins[0]` (monotonic ms / bin_ms).
    first: u64,
    /// (bytes down, request starts) per bin.
    bins: Vec<(u64, u64)>,
}

/// The monotonic clock in ms, the clock of Python's `time.monotonic()` (std's `Instant` has no epoch
/// to share with another process).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

impl Timeline {
    fn add(&mut self, bytes: u64, requests: u64) {
        let bin = monotonic_ms() / self.bin_ms;
        if self.bins.is_empty() {
            self.first = bin;
        }
        let at = bin.saturating_sub(self.first) as usize;
        if at >= self.bins.len() {
            self.bins.resize(at + 1, (0, 0));
        }
        self.bins[at].0 += bytes;
        self.bins[at].1 += requests;
    }

    /// The bins so far as JSON, emptied.
    fn take(&mut self) -> serde_json::Value {
        let bins = std::mem::take(&mut self.bins);
        serde_json::json!({
            "bin_ms": self.bin_ms,
            "start_ms": self.first * self.bin_ms,
            "bytes": bins.iter().map(|b| b.0).collect::<Vec<_>>(),
            "requests": bins.iter().map(|b| b.1).collect::<Vec<_>>(),
        })
    }
}

impl Stats {
    fn json(&self) -> serde_json::Value {
        let mut out = serde_json::json!({
            "connections": self.connections.load(Ordering::Relaxed),
            "requests": self.requests.load(Ordering::Relaxed),
            "bytes_down": self.bytes_down.load(Ordering::Relaxed),
        });
        if let Some(signers) = &self.signers {
            let signers = signers.lock().unwrap_or_else(|e| e.into_inner());
            out["signers"] = serde_json::json!(*signers);
        }
        if let Some(timeline) = &self.timeline {
            out["timeline"] = timeline.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        out
    }

    fn record(&self, bytes: u64, requests: u64) {
        if let Some(timeline) = &self.timeline {
            timeline.lock().unwrap_or_else(|e| e.into_inner()).add(bytes, requests);
        }
    }

    fn count_signers(&self, data: &[u8]) {
        let Some(signers) = &self.signers else { return };
        const MARK: &[u8] = b"Credential=";
        let mut rest = data;
        while let Some(at) = rest.windows(MARK.len()).position(|w| w == MARK) {
            rest = &rest[at + MARK.len()..];
            let len = rest
                .iter()
                .position(|b| !(b.is_ascii_alphanumeric() || b"._-".contains(b)))
                .unwrap_or(rest.len());
            if len > 0 && rest.get(len) == Some(&b'/') {
                let key = String::from_utf8_lossy(&rest[..len]).into_owned();
                *signers.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default() += 1;
            }
        }
    }
}

/// What all connections share.
struct Link {
    target: (String, u16),
    latency: Duration,
    mbps_per_conn: f64,
    total: Mutex<TokenBucket>,
    stats: Stats,
}

/// One connection's state, shared by its two pumps.
struct Conn {
    bucket: Mutex<TokenBucket>,
    /// True when the next client bytes start a new request.
    request_start: AtomicBool,
}

impl Link {
    async fn throttle(&self, conn: &Conn, n: usize) {
        let own = conn.bucket.lock().unwrap_or_else(|e| e.into_inner()).reserve(n);
        let shared = self.total.lock().unwrap_or_else(|e| e.into_inner()).reserve(n);
        let delay = own.max(shared);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    async fn upstream(&self, conn: &Conn, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let mut buf = vec![0u8; READ_SIZE];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if conn.request_start.swap(false, Ordering::Relaxed) {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                self.stats.record(0, 1);
                tokio::time::sleep(self.latency).await;
            }
            self.stats.count_signers(&buf[..n]);
            self.throttle(conn, n).await;
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await; // half-close: the server sees EOF
    }

    async fn downstream(&self, conn: &Conn, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let mut buf = vec![0u8; READ_SIZE];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            quick_ack(&from);
            conn.request_start.store(true, Ordering::Relaxed);
            self.stats.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
            self.throttle(conn, n).await;
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
            self.stats.record(n as u64, 0);
        }
        let _ = to.shutdown().await;
    }

    async fn relay(self: Arc<Self>, client: TcpStream) {
        let Ok(server) = TcpStream::connect((self.target.0.as_str(), self.target.1)).await else {
            return; // dropping the client closes it
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let conn = Conn {
            bucket: Mutex::new(TokenBucket::new(self.mbps_per_conn)),
            request_start: AtomicBool::new(true),
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::join!(
            self.upstream(&conn, client_read, server_write),
            self.downstream(&conn, server_read, client_write)
        );
    }
}

/// Acknowledges what the server sent at once rather than after the receiver's delayed-ACK timer
/// (up to 40 ms on Linux). A server that writes its response in small pieces without TCP_NODELAY
/// (s3s-fs streams a body in 4 KiB writes) otherwise waits, by Nagle's rule, for the ACK of its
/// previous piece: 40 ms stalls in the middle of a body, a delay no real link has (curl straight to
/// s3s-fs: 3 GETs of 160 KiB in 4 took 44 ms instead of 2). Quick-ack mode ends by itself, so it
/// is set again after each read.
fn quick_ack(socket: &OwnedReadHalf) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: the descriptor is an open TCP socket borrowed for the call, and the option value is a
    // c_int that lives across the call, with its size passed.
    unsafe {
        libc::setsockopt(
            socket.as_ref().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    // One thread: a relay is a network device, it should not take the cores the benchmark measures.
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> std::io::Result<()> {
    let link = Arc::new(Link {
        target: (args.host, args.port),
        latency: Duration::from_secs_f64(args.latency_ms.max(0.0) / 1000.0),
        mbps_per_conn: args.mbps_per_conn,
        total: Mutex::new(TokenBucket::new(args.mbps_total)),
        stats: Stats {
            signers: args.count_signers.then(Mutex::default),
            timeline: (args.timeline_ms > 0)
                .then(|| Mutex::new(Timeline { bin_ms: args.timeline_ms, first: 0, bins: Vec::new() })),
            ..Stats::default()
        },
    });
    let listener = TcpListener::bind((args.listen.as_str(), 0)).await?;
    println!("READY http://{}:{}", args.listen, listener.local_addr()?.port());
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let parent = std::os::unix::process::parent_id();
    let mut watch = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    tokio::spawn(link.clone().relay(client));
                }
            }
            _ = usr1.recv() => println!("{}", link.stats.json()),
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = watch.tick() => {
                if std::os::unix::process::parent_id() != parent {
                    return Ok(()); // the process that started us is gone: do not outlive it
                }
            }
        }
    }
}
