//! Hints to the fleet: objects this client will read soon. Each URL goes to the slot that owns its
//! chunk 0 (where its read starts), which fetches it in the background, so the read that follows
//! lands on that slot and is a hit. Hints are best effort: they never fail a read, never retry for
//! long, and a slot too old to know `Prefetch` (it answers `BadRequest`: it cannot decode the
//! request) gets none from this client again (counted in [`PrefetchCounters::unsupported`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memarts_protocol::{chunk_owner, PrefetchRequest, PrefetchStatus, Request, Response, MAX_PREFETCH_URLS};

use crate::answer::expect_answer;
use crate::client::{parse, Client};
use crate::error::{Error, Result};

/// Longest a hint waits for a slot (a slot that is down or restarting): hints are worth less than
/// the time a sampler would lose waiting.
const HINT_DEADLINE: Duration = Duration::from_secs(2);

/// After a slot failed to take hints, how long it gets none (they are counted as failed): a slot
/// that stays down must not cost the sampler [`HINT_DEADLINE`] at every call.
const HINT_PAUSE: Duration = Duration::from_secs(10);

/// What this client's hints did.
#[derive(Debug, Default)]
pub struct PrefetchCounters {
    /// URLs sent to slots.
    pub sent: AtomicU64,
    /// URLs the slots queued (the others were cached already, or duplicates).
    pub queued: AtomicU64,
    /// Hints not sent: their slot does not know `Prefetch` (an older proxy).
    pub unsupported: AtomicU64,
    /// Hints lost to a slot that failed or did not answer in time.
    pub failed: AtomicU64,
}

/// What became of a client's hints, and the slots that get none.
#[derive(Default)]
pub(crate) struct Hints {
    pub counters: PrefetchCounters,
    /// Slots that answered a `Prefetch` as an unknown request (an older proxy).
    unsupported: Mutex<HashSet<u32>>,
    /// Slots that failed to take hints, and until when they get none.
    paused: Mutex<HashMap<u32, Instant>>,
}

impl Hints {
    fn unsupported(&self, slot: u32) -> bool {
        self.unsupported.lock().unwrap_or_else(|p| p.into_inner()).contains(&slot)
    }

    fn set_unsupported(&self, slot: u32) {
        self.unsupported.lock().unwrap_or_else(|p| p.into_inner()).insert(slot);
    }

    fn paused(&self, slot: u32) -> bool {
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        match paused.get(&slot) {
            Some(&until) if Instant::now() < until => true,
            Some(_) => {
                paused.remove(&slot);
                false
            }
            None => false,
        }
    }

    fn pause(&self, slot: u32, pause: Duration) {
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused.insert(slot, Instant::now() + pause);
    }
}

impl Client {
    /// Hints that `urls` will be read soon: each slot fetches the ones whose reads start there.
    /// Returns how many were queued. Local paths are hinted like objects (the fleet reads them).
    /// Errors only for a malformed URL; a slot that is down, refuses or is too old costs its hints
    /// only.
    pub fn prefetch(&self, urls: &[&str]) -> Result<usize> {
        let slots = self.slots();
        let chunk_size = self.cfg.chunk_size;
        let mut by_slot: Vec<Vec<String>> = vec![Vec::new(); slots as usize];
        for url in urls {
            let parsed = parse(url)?;
            let slot = chunk_owner(&parsed, chunk_size, 0, slots);
            by_slot[slot as usize].push(parsed.to_string());
        }
        let (hints, counters) = (&self.hints, &self.hints.counters);
        let mut queued = 0;
        for (slot, urls) in by_slot.into_iter().enumerate() {
            let slot = slot as u32;
            if urls.is_empty() {
                continue;
            }
            if hints.unsupported(slot) {
                counters.unsupported.fetch_add(urls.len() as u64, Ordering::Relaxed);
                continue;
            }
            if hints.paused(slot) {
                counters.failed.fetch_add(urls.len() as u64, Ordering::Relaxed);
                continue;
            }
            for part in urls.chunks(MAX_PREFETCH_URLS) {
                let req = Request::Prefetch(PrefetchRequest { urls: part.to_vec(), chunk_size });
                let n = part.len() as u64;
                counters.sent.fetch_add(n, Ordering::Relaxed);
                let deadline = Instant::now() + HINT_DEADLINE.min(self.cfg.deadline);
                let answer = self.conns.with_slot(slot, deadline, |conn| {
                    let reply = conn.call(&req)?;
                    expect_answer!(reply.response, "Prefetch", Response::Prefetched { queued } => queued)
                });
                match answer {
                    Ok(q) => {
                        counters.queued.fetch_add(q.into(), Ordering::Relaxed);
                        queued += q as usize;
                    }
                    Err(e) if e.is_unknown_request() => {
                        hints.set_unsupported(slot);
                        counters.unsupported.fetch_add(n, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        if matches!(e, Error::Unavailable(_) | Error::Io(_)) {
                            hints.pause(slot, HINT_PAUSE);
                        }
                        counters.failed.fetch_add(n, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
        Ok(queued)
    }

    /// What this client's hints did so far.
    pub fn prefetch_counters(&self) -> &PrefetchCounters {
        &self.hints.counters
    }

    /// Every slot's prefetch counters (an error for a slot that does not answer within `timeout`,
    /// or does not know `PrefetchStatus`).
    pub fn prefetch_status(&self, timeout: Duration) -> Vec<(u32, Result<PrefetchStatus>)> {
        self.ask_each_slot(
            timeout,
            &Request::PrefetchStatus,
            |r| expect_answer!(r, "PrefetchStatus", Response::PrefetchStatus(s) => s),
        )
    }
}
