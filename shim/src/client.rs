//! The fleet client: finds the fleet and routes each request to its owning slot. Its connections,
//! kept per slot and retried while a slot is down (`connections.rs`), where a chunk's bytes come
//! from (the cache's files read locally, else the slots: `sources.rs`), its hints (`prefetch.rs`)
//! and its read-ahead (`readahead/`) each have their own home; this file holds the client and its
//! metadata, listing and status requests.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_disk::layout::socket_path;
use memarts_protocol::peer::ClusterStatus;
use memarts_protocol::{
    meta_owner_slot, AdmissionStatus, ListEntry, ListPage, ListRequest, ObjectMeta, ObjectUrl, Request,
    Response, SlotStatus,
};

use crate::answer::expect_answer;
use crate::config::ShimConfig;
use crate::conn::Dialer;
use crate::connections::Connections;
use crate::error::{Error, Result};

/// A handle on the node's proxy fleet. Cheap to share between threads; safe to keep across `fork`
/// (the child drops the inherited connections and opens its own).
pub struct Client {
    pub(crate) cfg: ShimConfig,
    /// This process's connections to the slots (a forked child drops the inherited ones).
    pub(crate) conns: Arc<Connections>,
    /// What became of this client's hints, and the slots that get none.
    pub(crate) hints: crate::prefetch::Hints,
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

impl Client {
    /// A client for the fleet in `cfg.run_dir`. Fails if no fleet was ever started there, and with
    /// [`Error::Untrusted`] if the run dir is not one this client trusts (see [`crate::trust`]).
    pub fn new(cfg: ShimConfig) -> Result<Client> {
        let owner = crate::trust::check_run_dir(&cfg.run_dir, &cfg.trusted_uids)?;
        let slots = fleet_slots(&cfg.run_dir)?;
        let dial = Arc::new(Dialer::new(cfg.run_dir.clone(), owner, cfg.spin, slots));
        let conns = Arc::new(Connections::new(dial, cfg.deadline));
        let readaheads = crate::readahead::Readaheads::new(cfg.readahead_memory, cfg.readahead_workers);
        Ok(Client {
            readaheads,
            sources: crate::sources::Sources::new(&cfg, &conns),
            cfg,
            conns,
            hints: Default::default(),
        })
    }

    pub fn from_env() -> Result<Client> {
        Client::new(ShimConfig::from_env()?)
    }

    pub fn config(&self) -> &ShimConfig {
        &self.cfg
    }

    pub fn slots(&self) -> u32 {
        self.conns.slots()
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
        self.conns.with_slot(slot, self.deadline(), |conn| {
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
            let page = self.conns.with_slot(slot, self.deadline(), |conn| {
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
        self.conns.with_slot(slot, self.deadline(), |conn| {
            let reply = conn.call(&Request::List(req.clone()))?;
            expect_answer!(reply.response, "List", Response::List(page) => page)
        })
    }

    /// Every slot's part of the cluster pool (empty outside one; an error for a slot that does not
    /// answer within `timeout`).
    pub fn cluster_status(&self, timeout: Duration) -> Vec<(u32, Result<ClusterStatus>)> {
        self.ask_each_slot(
            timeout,
            &Request::ClusterStatus,
            |r| expect_answer!(r, "ClusterStatus", Response::ClusterStatus(s) => s),
        )
    }

    /// What every slot's eviction policy did (an error for a slot that does not answer within
    /// `timeout`, or whose proxy is of a build before `AdmissionStatus`: it answers `BadRequest`).
    pub fn admission_status(&self, timeout: Duration) -> Vec<(u32, Result<AdmissionStatus>)> {
        self.ask_each_slot(
            timeout,
            &Request::AdmissionStatus,
            |r| expect_answer!(r, "AdmissionStatus", Response::AdmissionStatus(s) => s),
        )
    }

    /// Status of every slot (an error for a slot that does not answer within `timeout`). This
    /// client's reads of the cache's files are reported first ([`Client::send_read_reports`]), so
    /// that the slots' counters include them.
    pub fn status(&self, timeout: Duration) -> Vec<(u32, Result<SlotStatus>)> {
        self.send_read_reports();
        self.ask_each_slot(
            timeout,
            &Request::Status,
            |r| expect_answer!(r, "Status", Response::Status(s) => s),
        )
    }

    /// `request` to every slot, once each, on a new connection, within `timeout`; each answer as
    /// `answer` takes it.
    pub(crate) fn ask_each_slot<T>(
        &self,
        timeout: Duration,
        request: &Request,
        answer: impl Fn(Response) -> Result<T>,
    ) -> Vec<(u32, Result<T>)> {
        (0..self.slots())
            .map(|slot| (slot, self.conns.call_once(slot, timeout, request).and_then(&answer)))
            .collect()
    }
}
