//! Hints to the fleet: objects this client will read soon. Each URL goes to the slot that owns its
//! chunk 0 (where its read starts), which fetches it in the background, so the read that follows
//! lands on that slot and is a hit. Hints are best effort: they never fail a read, never retry for
//! long, and a slot too old to know `Prefetch` (it answers `BadRequest`: it cannot decode the
//! request) gets none from this client again (counted in [`PrefetchCounters::unsupported`]).

use std::sync::atomic::{AtomicU64, Ordering};
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
        let counters = &self.prefetch_counters;
        let mut queued = 0;
        for (slot, urls) in by_slot.into_iter().enumerate() {
            let slot = slot as u32;
            if urls.is_empty() {
                continue;
            }
            if self.prefetch_unsupported(slot) {
                counters.unsupported.fetch_add(urls.len() as u64, Ordering::Relaxed);
                continue;
            }
            if self.prefetch_paused(slot) {
                counters.failed.fetch_add(urls.len() as u64, Ordering::Relaxed);
                continue;
            }
            for part in urls.chunks(MAX_PREFETCH_URLS) {
                let req = Request::Prefetch(PrefetchRequest { urls: part.to_vec(), chunk_size });
                let n = part.len() as u64;
                counters.sent.fetch_add(n, Ordering::Relaxed);
                let deadline = Instant::now() + HINT_DEADLINE.min(self.cfg.deadline);
                let answer = self.with_slot(slot, deadline, |conn| {
                    let reply = conn.call(&req)?;
                    expect_answer!(reply.response, "Prefetch", Response::Prefetched { queued } => queued)
                });
                match answer {
                    Ok(q) => {
                        counters.queued.fetch_add(q.into(), Ordering::Relaxed);
                        queued += q as usize;
                    }
                    Err(e) if e.is_unknown_request() => {
                        self.set_prefetch_unsupported(slot);
                        counters.unsupported.fetch_add(n, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        if matches!(e, Error::Unavailable(_) | Error::Io(_)) {
                            self.pause_prefetch(slot, HINT_PAUSE);
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
        &self.prefetch_counters
    }

    /// Every slot's prefetch counters (an error for a slot that does not answer within `timeout`,
    /// or does not know `PrefetchStatus`).
    pub fn prefetch_status(&self, timeout: Duration) -> Vec<(u32, Result<PrefetchStatus>)> {
        (0..self.slots())
            .map(|slot| {
                let res = self
                    .call_once(slot, timeout, &Request::PrefetchStatus)
                    .and_then(|r| expect_answer!(r, "PrefetchStatus", Response::PrefetchStatus(s) => s));
                (slot, res)
            })
            .collect()
    }
}
