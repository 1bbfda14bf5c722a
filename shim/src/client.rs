//! The fleet client: finds the fleet, keeps a small pool of connections per slot (dropped after a
//! `fork`), routes each request to its owning slot and retries a slot that is down until the deadline.
//! Where a chunk's bytes come from (the cache's files read locally, else the slots) is the client's
//! list of chunk sources (`sources.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memarts_disk::layout::socket_path;
use memarts_protocol::peer::ClusterStatus;
use memarts_protocol::{
    meta_owner_slot, AdmissionStatus, ListEntry, ListPage, ListRequest, ObjectMeta, ObjectUrl, Request,
    Response, SlotStatus,
};

use crate::answer::expect_answer;
use crate::config::ShimConfig;
use crate::conn::{Conn, Dialer};
use crate::error::{Error, Result};
use crate::per_process::{PerProcess, PerProcessGuard};

/// Connections kept per slot for reuse.
const POOL_PER_SLOT: usize = 64;

#[derive(Default)]
struct Pools {
    per_slot: Vec<Vec<Conn>>,
}

/// A handle on the node's proxy fleet. Cheap to share between threads; safe to keep across `fork`
/// (the child drops the inherited connections and opens its own).
pub struct Client {
    pub(crate) cfg: ShimConfig,
    /// The run dir, the slots' uid and the fleet size routing uses.
    dial: Arc<Dialer>,
    /// This process's connections (a forked child drops the inherited ones and opens its own).
    pools: PerProcess<Pools>,
    pub(crate) prefetch_counters: crate::prefetch::PrefetchCounters,
    /// Slots that answered a `Prefetch` as an unknown request (an older proxy).
    prefetch_unsupported: Mutex<std::collections::HashSet<u32>>,
    /// Slots that failed to take hints, and until when they get none.
    prefetch_paused: Mutex<std::collections::HashMap<u32, Instant>>,
    /// Where chunks are read from, in order: the cache's files read locally (`local_reads.rs`, for a
    /// fleet of our own uid), then the slots.
    pub(crate) sources: crate::sources::Sources,
    /// The read-ahead budget and fetch threads of every stream this client opens (`readahead/`).
    pub(crate) readaheads: crate::readahead::Readaheads,
}

/// Reads the fleet size from `<run dir>/fleet.json`.
pub fn fleet_slots(run_dir: &Path) -> Result<u32> {
    Ok(crate::FleetFile::read(run_dir)?.slots.max(1))
}

/// Whether a fleet answers in `run_dir` (a `fleet.json` and at least one connectable socket).
/// Nothing is sent, and whether the fleet is trusted is not asked: a client of a fleet that runs
/// but is not trusted fails with [`Error::Untrusted`] instead of quietly going without it.
pub fn fleet_running(run_dir: &Path) -> bool {
    let Ok(slots) = fleet_slots(run_dir) else { return false };
    (0..slots).any(|s| std::os::unix::net::UnixStream::connect(socket_path(run_dir, s)).is_ok())
}

/// Absolute form of a local path (relative to the working directory); URLs pass through.
pub fn absolutize(url: &str) -> Result<String> {
    if url.contains("://") || url.starts_with('/') {
        return Ok(url.to_string());
    }
    let cwd = std::env::current_dir()?;
    Ok(cwd.join(url).to_string_lossy().into_owned())
}

pub(crate) fn parse(url: &str) -> Result<ObjectUrl> {
    ObjectUrl::parse(&absolutize(url)?).map_err(|e| Error::BadRequest(e.to_string()))
}

fn is_transient(e: &Error) -> bool {
    matches!(e, Error::Io(_) | Error::Unavailable(_))
}

impl Client {
    /// A client for the fleet in `cfg.run_dir`. Fails if no fleet was ever started there, and with
    /// [`Error::Untrusted`] if the run dir is not one this client trusts (see [`crate::trust`]).
    pub fn new(cfg: ShimConfig) -> Result<Client> {
        let owner = crate::trust::check_run_dir(&cfg.run_dir, &cfg.trusted_uids)?;
        let slots = fleet_slots(&cfg.run_dir)?;
        let dial = Arc::new(Dialer::new(cfg.run_dir.clone(), owner, cfg.spin, slots));
        let readaheads = crate::readahead::Readaheads::new(cfg.readahead_memory, cfg.readahead_workers);
        Ok(Client {
            readaheads,
            sources: crate::sources::Sources::new(&cfg, &dial),
            cfg,
            dial,
            pools: PerProcess::new(),
            prefetch_counters: Default::default(),
            prefetch_unsupported: Mutex::default(),
            prefetch_paused: Mutex::default(),
        })
    }

    pub fn from_env() -> Result<Client> {
        Client::new(ShimConfig::from_env()?)
    }

    pub fn config(&self) -> &ShimConfig {
        &self.cfg
    }

    pub fn slots(&self) -> u32 {
        self.dial.slots()
    }

    /// What local reads did in this process (`None`: this client reads through the proxies only:
    /// a fleet of another uid, or `MEMARTS_LOCAL_READS=0`).
    pub fn local_counters(&self) -> Option<&crate::local_reads::LocalCounters> {
        self.sources.local().map(|d| &d.counters)
    }

    /// Sends this client's reads of the cache's files not reported yet to their slots now, and
    /// waits until the slots have counted them. Not needed for the counts to get there: the reads
    /// go in batches (at the latest 100 ms after a read, at the next read), the rest when the client
    /// goes or the process ends, and [`Client::status`] sends them first. For a caller that asks
    /// the fleet's counters another way (a test's `memarts status`), or wants the slots' eviction
    /// to see the reads now.
    pub fn send_read_reports(&self) {
        if let Some(local) = self.sources.local() {
            local.reports.send_all();
        }
    }

    fn pools(&self) -> PerProcessGuard<'_, Pools> {
        self.pools.lock()
    }

    /// A pooled connection to `slot` (true), else a new one (false).
    fn checkout(&self, slot: u32, timeout: Duration) -> Result<(Conn, bool)> {
        if let Some(conn) = self.pools().per_slot.get_mut(slot as usize).and_then(Vec::pop) {
            return Ok((conn, true));
        }
        Ok((self.connect(slot, timeout)?, false))
    }

    /// A new connection to `slot`.
    pub(crate) fn connect(&self, slot: u32, timeout: Duration) -> Result<Conn> {
        self.dial.connect(slot, timeout)
    }

    /// Re-reads the fleet size from `fleet.json`; the new size if it changed.
    fn refresh_slots(&self) -> Option<u32> {
        let n = fleet_slots(&self.cfg.run_dir).ok()?;
        self.dial.set_slots(n).then_some(n)
    }

    /// Forgets the pooled connections to `slot`: one of them failed, so the slot restarted and the
    /// others are dead too.
    fn drop_pool(&self, slot: u32) {
        if let Some(pool) = self.pools().per_slot.get_mut(slot as usize) {
            pool.clear();
        }
    }

    fn checkin(&self, slot: u32, conn: Conn) {
        let mut pools = self.pools();
        let idx = slot as usize;
        if pools.per_slot.len() <= idx {
            pools.per_slot.resize_with(idx + 1, Vec::new);
        }
        if pools.per_slot[idx].len() < POOL_PER_SLOT {
            pools.per_slot[idx].push(conn);
        }
    }

    /// Runs `f` on a connection to `slot`, reconnecting and retrying while the slot is down,
    /// restarting or overloaded, until `deadline`. Typed errors from the proxy return at once.
    pub(crate) fn with_slot<T>(
        &self,
        mut slot: u32,
        deadline: Instant,
        mut f: impl FnMut(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let mut backoff = Duration::from_millis(10);
        let mut last: Option<Error> = None;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                let why = last.map_or_else(|| "deadline passed".to_string(), |e| e.to_string());
                return Err(Error::Unavailable(format!(
                    "proxy slot {slot} did not answer within {:?}: {why}",
                    self.cfg.deadline
                )));
            }
            let mut pooled = false;
            let attempt = self.checkout(slot, remaining).and_then(|(mut conn, was_pooled)| {
                pooled = was_pooled;
                conn.set_timeout(remaining)?;
                match f(&mut conn) {
                    Ok(v) => {
                        self.checkin(slot, conn);
                        Ok(v)
                    }
                    // A typed answer leaves the connection in step; anything else may not.
                    Err(e) if e.code().is_some() && !matches!(e, Error::Unavailable(_)) => {
                        self.checkin(slot, conn);
                        Err(e)
                    }
                    Err(e) => Err(e),
                }
            });
            match attempt {
                Ok(v) => return Ok(v),
                Err(e) if is_transient(&e) && pooled => {
                    // A connection from before a restart: reconnect at once, without backoff.
                    self.drop_pool(slot);
                    last = Some(e);
                    continue;
                }
                Err(e) if is_transient(&e) => {
                    if let Some(n) = self.refresh_slots().filter(|&n| slot >= n) {
                        // The fleet restarted smaller and this slot is gone: any slot can serve
                        // any request (they share one cache dir); later calls route by the new size.
                        slot %= n;
                        last = Some(e);
                        continue;
                    }
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    pub(crate) fn prefetch_unsupported(&self, slot: u32) -> bool {
        self.prefetch_unsupported.lock().unwrap_or_else(|p| p.into_inner()).contains(&slot)
    }

    pub(crate) fn set_prefetch_unsupported(&self, slot: u32) {
        self.prefetch_unsupported.lock().unwrap_or_else(|p| p.into_inner()).insert(slot);
    }

    pub(crate) fn prefetch_paused(&self, slot: u32) -> bool {
        let mut paused = self.prefetch_paused.lock().unwrap_or_else(|p| p.into_inner());
        match paused.get(&slot) {
            Some(&until) if Instant::now() < until => true,
            Some(_) => {
                paused.remove(&slot);
                false
            }
            None => false,
        }
    }

    pub(crate) fn pause_prefetch(&self, slot: u32, pause: Duration) {
        let mut paused = self.prefetch_paused.lock().unwrap_or_else(|p| p.into_inner());
        paused.insert(slot, Instant::now() + pause);
    }

    /// `request` on a new connection to `slot`, once, within `timeout` (status requests).
    pub(crate) fn call_once(&self, slot: u32, timeout: Duration, request: &Request) -> Result<Response> {
        let mut conn = self.dial.connect_once(slot, timeout)?;
        Ok(conn.call(request)?.response)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.cfg.deadline
    }

    /// Metadata of an object (size, ETag, last modified), from the owning slot's metadata cache.
    pub fn stat(&self, url: &str) -> Result<ObjectMeta> {
        self.stat_opts(url, false)
    }

    /// [`Client::stat`]; `refresh` bypasses the metadata cache and revalidates with the origin.
    pub fn stat_opts(&self, url: &str, refresh: bool) -> Result<ObjectMeta> {
        let parsed = parse(url)?;
        let url = parsed.to_string();
        // The slot reads of this object start at (the owner of its chunk 0): one slot holds the
        // object's metadata, so a ranged read after a whole read costs no second HEAD, and the version
        // that slot last verified is there to fall back on when the origin is down.
        let slot = memarts_protocol::chunk_owner(&parsed, self.cfg.chunk_size, 0, self.slots());
        self.with_slot(slot, self.deadline(), |conn| {
            let reply = conn.call(&Request::Stat { url: url.clone(), refresh })?;
            expect_answer!(reply.response, "Stat", Response::Stat(meta) => meta)
        })
    }

    /// Every entry under `url`: one level (directories reported as such) or, with `recursive`, every
    /// object below it. Pages are fetched until the listing ends.
    pub fn list(&self, url: &str, recursive: bool) -> Result<Vec<ListEntry>> {
        let url = parse(url)?.to_string();
        let slot = meta_owner_slot(&url, self.slots());
        let mut out = Vec::new();
        let mut start_after = None;
        loop {
            let req = ListRequest {
                url: url.clone(),
                recursive,
                start_after: start_after.take(),
                max_entries: 1000,
            };
            let page = self.with_slot(slot, self.deadline(), |conn| {
                let reply = conn.call(&Request::List(req.clone()))?;
                expect_answer!(reply.response, "List", Response::List(page) => page)
            })?;
            out.extend(page.entries);
            match page.next {
                Some(next) => start_after = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// One page of the listing of `url` (see [`Client::list`]): at most `max_entries` entries after
    /// `start_after`, and where the next page starts (`None` on the last one). For callers that page
    /// themselves, or only ask whether anything is below a prefix (`memarts mount`'s lookups).
    pub fn list_page(
        &self,
        url: &str,
        recursive: bool,
        start_after: Option<String>,
        max_entries: u32,
    ) -> Result<ListPage> {
        let url = parse(url)?.to_string();
        let slot = meta_owner_slot(&url, self.slots());
        let req = ListRequest { url, recursive, start_after, max_entries: max_entries.clamp(1, 1000) };
        self.with_slot(slot, self.deadline(), |conn| {
            let reply = conn.call(&Request::List(req.clone()))?;
            expect_answer!(reply.response, "List", Response::List(page) => page)
        })
    }

    /// Every slot's part of the cluster pool (empty outside one; an error for a slot that does not
    /// answer within `timeout`).
    pub fn cluster_status(&self, timeout: Duration) -> Vec<(u32, Result<ClusterStatus>)> {
        (0..self.slots())
            .map(|slot| {
                let res = self.dial.connect_once(slot, timeout)
                    .and_then(|mut c| expect_answer!(c.call(&Request::ClusterStatus)?.response, "ClusterStatus", Response::ClusterStatus(s) => s));
                (slot, res)
            })
            .collect()
    }

    /// What every slot's eviction policy did (an error for a slot that does not answer within
    /// `timeout`, or whose proxy is of a build before `AdmissionStatus`: it answers `BadRequest`).
    pub fn admission_status(&self, timeout: Duration) -> Vec<(u32, Result<AdmissionStatus>)> {
        (0..self.slots())
            .map(|slot| {
                let res = self.dial.connect_once(slot, timeout).and_then(|mut c| {
                    let reply = c.call(&Request::AdmissionStatus)?;
                    expect_answer!(reply.response, "AdmissionStatus", Response::AdmissionStatus(s) => s)
                });
                (slot, res)
            })
            .collect()
    }

    /// Status of every slot (an error for a slot that does not answer within `timeout`). This
    /// client's reads of the cache's files are reported first ([`Client::send_read_reports`]), so
    /// that the slots' counters include them.
    pub fn status(&self, timeout: Duration) -> Vec<(u32, Result<SlotStatus>)> {
        self.send_read_reports();
        (0..self.slots())
            .map(|slot| {
                let res = self.dial.connect_once(slot, timeout).and_then(|mut c| {
                    let reply = c.call(&Request::Status)?;
                    expect_answer!(reply.response, "Status", Response::Status(s) => s)
                });
                (slot, res)
            })
            .collect()
    }
}
