//! This process's connections to the fleet's slots: a few kept per slot for reuse (a forked child
//! drops the inherited ones and opens its own), and a request retried on its slot while the slot is
//! down, restarting or overloaded, until its deadline; a fleet restarted with fewer slots is
//! followed (any slot can serve any request: they share one cache dir).

use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{Request, Response};

use crate::client::fleet_slots;
use crate::conn::{Conn, Dialer};
use crate::error::{Error, Result};
use crate::per_process::{PerProcess, PerProcessGuard};

/// Connections kept per slot for reuse.
const POOL_PER_SLOT: usize = 64;

#[derive(Default)]
struct Kept {
    per_slot: Vec<Vec<Conn>>,
}

/// The connections of one client (see the module docs).
pub(crate) struct Connections {
    /// The run dir, the slots' uid and the fleet size routing uses.
    dial: Arc<Dialer>,
    /// This process's idle connections, by slot.
    kept: PerProcess<Kept>,
    /// How long a request may wait for its slot (`MEMARTS_TIMEOUT`), for the error that says so.
    timeout: Duration,
}

fn is_transient(e: &Error) -> bool {
    matches!(e, Error::Io(_) | Error::Unavailable(_))
}

impl Connections {
    pub fn new(dial: Arc<Dialer>, timeout: Duration) -> Connections {
        Connections { dial, kept: PerProcess::new(), timeout }
    }

    pub fn dial(&self) -> &Arc<Dialer> {
        &self.dial
    }

    /// The fleet size requests are routed by.
    pub fn slots(&self) -> u32 {
        self.dial.slots()
    }

    fn kept(&self) -> PerProcessGuard<'_, Kept> {
        self.kept.lock()
    }

    /// A kept connection to `slot` (true), else a new one (false).
    fn checkout(&self, slot: u32, timeout: Duration) -> Result<(Conn, bool)> {
        if let Some(conn) = self.kept().per_slot.get_mut(slot as usize).and_then(Vec::pop) {
            return Ok((conn, true));
        }
        Ok((self.dial.connect(slot, timeout)?, false))
    }

    /// `request` on a new connection to `slot`, once, within `timeout` (status requests).
    pub fn call_once(&self, slot: u32, timeout: Duration, request: &Request) -> Result<Response> {
        let mut conn = self.dial.connect_once(slot, timeout)?;
        Ok(conn.call(request)?.response)
    }

    /// Re-reads the fleet size from `fleet.json`; the new size if it changed.
    fn refresh_slots(&self) -> Option<u32> {
        let n = fleet_slots(&self.dial.run_dir).ok()?;
        self.dial.set_slots(n).then_some(n)
    }

    /// Forgets the kept connections to `slot`: one of them failed, so the slot restarted and the
    /// others are dead too.
    fn forget(&self, slot: u32) {
        if let Some(kept) = self.kept().per_slot.get_mut(slot as usize) {
            kept.clear();
        }
    }

    fn checkin(&self, slot: u32, conn: Conn) {
        let mut kept = self.kept();
        let idx = slot as usize;
        if kept.per_slot.len() <= idx {
            kept.per_slot.resize_with(idx + 1, Vec::new);
        }
        if kept.per_slot[idx].len() < POOL_PER_SLOT {
            kept.per_slot[idx].push(conn);
        }
    }

    /// Runs `f` on a connection to `slot`, reconnecting and retrying while the slot is down,
    /// restarting or overloaded, until `deadline`. Typed errors from the proxy return at once.
    pub fn with_slot<T>(
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
                    self.timeout
                )));
            }
            let mut kept = false;
            let attempt = self.checkout(slot, remaining).and_then(|(mut conn, was_kept)| {
                kept = was_kept;
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
                Err(e) if is_transient(&e) && kept => {
                    // A connection from before a restart: reconnect at once, without backoff.
                    self.forget(slot);
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
}
