//! Protocol faults (S1, S2, S3, R2, I6 over the wire): a raw-socket fuzzer, 10,000 connections at
//! once, slow and stuck clients, another uid and hostile keys. Each row attacks slot 0 of a one-slot
//! fleet while well-behaved readers verify every byte they get from that same slot, and ends by
//! checking that the proxy is alive, serves a brand-new client, logged no panic and grew its
//! resident memory by less than [`RSS_GROWTH_CAP_MIB`].
//!
//! Layout: this file holds the fleet under test and what every row checks of it; one file per row
//! under `protocol/`.

mod flood;
mod fuzz;
mod security;
mod slow;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{frame, FrameError, Limits, Response};

use crate::common::raw::{proc_kib, rss_kib};
use crate::common::Fleet;
use crate::report::Row;
use crate::workload::{self, readers, stop_readers, wrong_bytes, Dataset, Tally};
use crate::Scale;

const CS: u64 = 256 << 10;
/// Readers of every row, each its own client.
const READERS: usize = 8;
/// How much the proxy's resident memory may grow over a row (R2). Its baseline, serving the
/// readers, is about 22 MiB; 4,000 idle connections held at once cost about 30 MiB of it.
const RSS_GROWTH_CAP_MIB: u64 = 64;

pub fn run(scale: Scale) -> Vec<Row> {
    let data = Arc::new(Dataset::put("protocol", 16, 1 << 20, 41));
    vec![
        fuzz::run(scale, &data),
        flood::run(scale, &data),
        slow::run(scale, &data),
        security::run(scale, &data),
    ]
}

/// A one-slot fleet under readers: the target of one row.
pub struct Subject {
    pub fleet: Fleet,
    /// Holds the config file the fleet was started with.
    _config: tempfile::TempDir,
    pub data: Arc<Dataset>,
    pub sock: PathBuf,
    pub pid: u32,
    stop: Arc<AtomicBool>,
    pub tally: Arc<Tally>,
    handles: Vec<std::thread::JoinHandle<()>>,
    rss_before: u64,
}

impl Subject {
    /// Starts the fleet with `config` (TOML; empty: defaults) and the readers, and takes the memory
    /// baseline once they have been served for a second (so it includes what serving them costs).
    pub fn start(data: &Arc<Dataset>, config: &str) -> Subject {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        std::fs::write(&path, config).unwrap();
        let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", path.to_str().unwrap())]);
        let pid = fleet.pid(0) as u32;
        let stop = Arc::new(AtomicBool::new(false));
        let (tally, handles) = readers(&fleet, data, READERS, CS, &stop);
        std::thread::sleep(Duration::from_secs(1));
        Subject {
            sock: fleet.run_dir.join("proxy-0.sock"),
            fleet,
            _config: dir,
            data: data.clone(),
            pid,
            stop,
            tally,
            handles,
            rss_before: rss_kib(pid),
        }
    }

    pub fn alive(&self) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), None).is_ok()
    }

    /// Reads completed by the readers so far.
    pub fn reads(&self) -> u64 {
        Tally::get(&self.tally.calls)
    }

    /// After the row's abuse: stops the readers (any failure breaks the row), then checks that the
    /// proxy is alive, serves a new client byte-exact, logged no panic, and that its resident memory
    /// grew by less than [`RSS_GROWTH_CAP_MIB`]. Adds the readers' figures and the memory to `row`.
    pub fn finish(mut self, row: &mut Row) {
        let cap_mib = RSS_GROWTH_CAP_MIB;
        stop_readers(&self.stop, std::mem::take(&mut self.handles));
        row.bytes_verified += Tally::get(&self.tally.bytes_verified);
        row.wrong_bytes += Tally::get(&self.tally.wrong_bytes);
        let failed = Tally::get(&self.tally.failed);
        row.failed_calls += failed;
        if failed > 0 {
            row.violate(format!(
                "{failed} reads of the well-behaved readers failed: {}",
                self.tally.first_errors()
            ));
        }
        let reads = Tally::get(&self.tally.calls);
        if !self.alive() {
            row.violate("the proxy died");
            row.note.push_str(&format!(" {reads} reads verified; the proxy died."));
            return;
        }
        let client = workload::client(&self.fleet, CS, Duration::from_secs(30));
        let (url, want) = (self.data.url(0), &self.data.objects[0].1);
        match client.read(&url) {
            Ok(got) => {
                row.bytes_verified += want.len() as u64;
                row.wrong_bytes += wrong_bytes(&got, want);
            }
            Err(e) => row.violate(format!("a new client after the abuse was not served: {e}")),
        }
        let log = std::fs::read_to_string(self.fleet.run_dir.join("proxy-0.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        if let Some(at) = lines.iter().position(|l| l.contains("panicked")) {
            let what = lines[at..(at + 2).min(lines.len())].join(" ");
            let n = lines.iter().filter(|l| l.contains("panicked")).count();
            row.violate(format!("the proxy logged {n} panics, the first: {what}"));
        }
        let (after, peak) = (rss_kib(self.pid), proc_kib(self.pid, "VmHWM:"));
        let grew = after.saturating_sub(self.rss_before);
        row.note.push_str(&format!(
            " {reads} reads verified by {READERS} readers; proxy RSS {} MiB before, {} MiB after (peak {} MiB), \
             cap on growth {cap_mib} MiB.",
            self.rss_before >> 10,
            after >> 10,
            peak >> 10
        ));
        if grew > cap_mib << 10 {
            row.violate(format!(
                "proxy memory grew by {} MiB (from {} to {} MiB), over the {cap_mib} MiB cap",
                grew >> 10,
                self.rss_before >> 10,
                after >> 10
            ));
        }
    }
}

impl Drop for Subject {
    /// A row that panicked midway leaves no readers running against the next row.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How a connection ended, as a raw client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The proxy closed it (EOF or reset).
    Closed,
    /// Nothing more arrived before the deadline: the connection is still open.
    TimedOut,
    /// The proxy sent bytes that are not a response frame.
    Garbled,
}

/// Reads responses (skipping their payloads) until the connection ends or `deadline` passes.
pub fn responses_until(s: &mut UnixStream, deadline: Instant) -> (Vec<Response>, End) {
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (got, End::TimedOut);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match frame::read_sync::<Response, _>(s, Limits::RESPONSE) {
            Ok((head, r)) => {
                got.push(r);
                let mut payload = (&mut *s).take(head.payload_len.into());
                match std::io::copy(&mut payload, &mut std::io::sink()) {
                    Ok(n) if n == u64::from(head.payload_len) => {}
                    Ok(_) => return (got, End::Closed),
                    Err(e) => return (got, io_end(&e)),
                }
            }
            Err(FrameError::Closed) => return (got, End::Closed),
            Err(FrameError::Io(e)) => return (got, io_end(&e)),
            Err(_) => return (got, End::Garbled),
        }
    }
}

fn io_end(e: &std::io::Error) -> End {
    use std::io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => End::TimedOut,
        ConnectionReset | BrokenPipe | UnexpectedEof => End::Closed,
        _ => End::Garbled,
    }
}
