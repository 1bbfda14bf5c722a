//! The read reports of the local source (`local_reads.rs`): reads of the cache's files, told to their
//! slots (`Request::Touched`) so that what is read stays cached and what is not goes, as if the
//! slots had served them. The source notes each read here; they go in batches (every
//! [`TOUCH_BATCH`] reads, or once the oldest has waited [`TOUCH_DELAY`], checked at the next read),
//! and what is left goes when the source goes (`Drop` of [`ReadReports`], with its client) and
//! when the process ends: [`send_all_read_reports`] runs at `exit` (a libc `atexit`, registered
//! with the first source), and the Python extension runs it at interpreter exit and at the end of
//! a multiprocessing child (a DataLoader worker), which ends with `os._exit`. No caller has to.
//!
//! A reader that waited for each report's answer would sleep once per slot per batch and be woken
//! by the slot: on the 2-core VMs measured, those waits cost a loop of warm 64-255 KiB reads from 4
//! slots far more than the requests themselves (0.71x `open().read()` against 0.87x with no
//! reports at all, same run). So each process keeps one connection per slot for its reports: a
//! report is sent and its answer read later, when it has arrived (a slot answers within
//! microseconds, and reports come at most every 256 reads or so), or when the reads must be counted
//! now (`Reports::settle`: before the fleet's counters are asked for, and when the source
//! goes). A slot answers a connection's requests in order, so once the answer to the last report
//! is read the slot has counted them all.
//!
//! A reader is never held up by a slot that does not answer: a slot that leaves
//! [`MAX_UNANSWERED`] reports unanswered gets no more until it catches up, and one that cannot be
//! connected to is not tried again for [`RETRY_AFTER`]. Reports stay best effort, as they always
//! were: the counts a slot misses only make its eviction see those chunks as less recently read.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use memarts_protocol::{Request, Response, Touch, MAX_TOUCHES};

use crate::conn::{Conn, Dialer};
use crate::error::{Error, Result};
use crate::per_process::PerProcess;

/// Reads are reported to the slots once this many are pending...
const TOUCH_BATCH: usize = 256;
/// ... or once the oldest has waited this long (checked at the next read).
const TOUCH_DELAY: Duration = Duration::from_millis(100);

/// Reports a slot may leave unanswered before it gets no more (dropped: it is seconds behind).
const MAX_UNANSWERED: usize = 16;

/// The longest opening a report connection, or waiting for the answers when settling, may take.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a slot that could not be connected to gets no reports.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One slot's report connection and how many of the reports sent on it are not answered yet.
struct TouchLink {
    conn: Conn,
    unanswered: usize,
}

/// This process's report connections, by slot.
#[derive(Default)]
struct TouchLinks {
    per_slot: Vec<Link>,
}

#[derive(Default)]
enum Link {
    /// None yet (or one in use by another thread of this process).
    #[default]
    None,
    Open(TouchLink),
    /// Could not be connected to: no reports until then.
    Down(Instant),
}

impl TouchLinks {
    /// `slot`'s place, made if it was not there yet.
    fn slot(&mut self, slot: u32) -> &mut Link {
        let index = slot as usize;
        if self.per_slot.len() <= index {
            self.per_slot.resize_with(index + 1, Link::default);
        }
        &mut self.per_slot[index]
    }
}

impl TouchLink {
    fn read_answer(&mut self) -> Result<()> {
        let reply = self.conn.receive()?;
        self.unanswered -= 1;
        match reply.response {
            Response::Touched { .. } | Response::Error(_) => Ok(()),
            other => Err(Error::Protocol(format!("a Touched was answered with {other:?}"))),
        }
    }

    /// Sends `request` after reading the answers that have arrived, without waiting for any; false
    /// when the slot is too far behind to be sent more.
    fn send(&mut self, request: &Request) -> Result<bool> {
        while self.unanswered > 0 && self.conn.readable_now() {
            self.read_answer()?;
        }
        if self.unanswered >= MAX_UNANSWERED {
            return Ok(false);
        }
        self.conn.send(request)?;
        self.unanswered += 1;
        Ok(true)
    }

    /// Reads every answer outstanding, waiting for them (up to the connection's timeout).
    fn settle(&mut self) -> Result<()> {
        while self.unanswered > 0 {
            self.read_answer()?;
        }
        Ok(())
    }
}

/// Reads waiting to be reported.
#[derive(Default)]
struct Pending {
    touches: Vec<(u32, Touch)>,
    since: Option<Instant>,
}

/// The reports of one local source, shared with the exit hook ([`send_all_read_reports`]).
struct Reports {
    dial: Arc<Dialer>,
    /// This process's reads to report (a forked child's parent reports what it read before).
    pending: PerProcess<Pending>,
    /// This process's report connections.
    links: PerProcess<TouchLinks>,
}

/// A local source's read reports (see the module docs): sent in batches as reads are noted, the
/// rest when this is dropped or the process ends.
pub(crate) struct ReadReports {
    shared: Arc<Reports>,
}

impl ReadReports {
    pub fn new(dial: Arc<Dialer>) -> ReadReports {
        let shared = Arc::new(Reports { dial, pending: PerProcess::new(), links: PerProcess::new() });
        live_at_exit(&shared);
        ReadReports { shared }
    }

    /// Notes a read of `slot`'s chunk; sends the reads pending when a batch is full or its oldest
    /// read has waited long enough.
    pub fn note(&self, slot: u32, touch: Touch) {
        let due = {
            let mut pending = self.shared.pending.lock();
            pending.touches.push((slot, touch));
            let since = *pending.since.get_or_insert_with(Instant::now);
            if pending.touches.len() >= TOUCH_BATCH || since.elapsed() >= TOUCH_DELAY {
                pending.since = None;
                Some(std::mem::take(&mut pending.touches))
            } else {
                None
            }
        };
        if let Some(touches) = due {
            self.shared.send(by_slot(touches), false);
        }
    }

    /// Every read not reported yet, sent now; returns once the slots have counted them.
    pub fn send_all(&self) {
        self.shared.send_all();
    }
}

impl Drop for ReadReports {
    /// The reads not reported yet, so that their chunks count as read.
    fn drop(&mut self) {
        self.shared.send_all();
    }
}

/// The report state of every local source alive in this process, for the exit hook.
static LIVE: Mutex<Vec<Weak<Reports>>> = Mutex::new(Vec::new());

/// Keeps `reports` where the exit hook finds them; registers the hook with the first.
fn live_at_exit(reports: &Arc<Reports>) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C"` function of no arguments that never unwinds (it
        // catches panics); it lives as long as this code (in a shared library, such as the Python
        // extension, glibc runs it when the library is unloaded instead).
        unsafe { libc::atexit(at_exit) };
    });
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|r| r.strong_count() > 0);
    live.push(Arc::downgrade(reports));
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(send_all_read_reports);
}

/// Sends the reads of the cache's files that every client of this process has not reported yet,
/// and waits until their slots counted them: what runs when the process ends (see the module
/// docs). Does not wait for the list of live sources when another thread holds it (or a forked
/// child inherited it held): their reports are then left unsent, as reports are best effort.
pub fn send_all_read_reports() {
    let live: Vec<Arc<Reports>> = match LIVE.try_lock() {
        Ok(live) => live.iter().filter_map(Weak::upgrade).collect(),
        Err(std::sync::TryLockError::Poisoned(p)) => {
            p.into_inner().iter().filter_map(Weak::upgrade).collect()
        }
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for reports in live {
        reports.send_all();
    }
}

fn by_slot(touches: Vec<(u32, Touch)>) -> Vec<(u32, Vec<Touch>)> {
    let mut out: std::collections::BTreeMap<u32, Vec<Touch>> = Default::default();
    for (slot, t) in touches {
        out.entry(slot).or_default().push(t);
    }
    out.into_iter().collect()
}

impl Reports {
    /// Every read of this process not reported yet, sent, and counted by the slots (waited for).
    fn send_all(&self) {
        let mut pending = self.pending.lock();
        pending.since = None;
        let touches = std::mem::take(&mut pending.touches);
        drop(pending);
        self.send(by_slot(touches), true);
    }

    /// Reports reads to their slots; with `settle`, also waits until the slots have counted every
    /// report this process sent so far.
    fn send(&self, batches: Vec<(u32, Vec<Touch>)>, settle: bool) {
        for (slot, touches) in batches {
            for part in touches.chunks(MAX_TOUCHES) {
                self.send_touches(slot, &Request::Touched(part.to_vec()));
            }
        }
        if settle {
            self.settle_touches();
        }
    }

    /// Sends one report to `slot` on its report connection, opening one (or, when the slot
    /// restarted or closed an idle one, a fresh one) as needed.
    fn send_touches(&self, slot: u32, request: &Request) {
        let link = match self.take_link(slot) {
            Link::Down(_) => return,
            Link::Open(mut link) => match link.send(request) {
                Ok(_) => Ok(link),
                Err(_) => self.open_and_send(slot, request),
            },
            Link::None => self.open_and_send(slot, request),
        };
        match link {
            Ok(link) => self.put_link(slot, link),
            Err(_) => *self.links.lock().slot(slot) = Link::Down(Instant::now() + RETRY_AFTER),
        }
    }

    /// Waits until every slot has answered (so counted) every report sent to it so far.
    fn settle_touches(&self) {
        let slots = self.links.lock().per_slot.len() as u32;
        for slot in 0..slots {
            if let Link::Open(mut link) = self.take_link(slot) {
                if link.settle().is_ok() {
                    self.put_link(slot, link);
                }
            }
        }
    }

    /// `request` sent on a new report connection to `slot` (not a pooled connection, which may be
    /// from before the slot restarted).
    fn open_and_send(&self, slot: u32, request: &Request) -> Result<TouchLink> {
        let conn = self.dial.connect(slot, REPORT_TIMEOUT)?;
        conn.set_timeout(REPORT_TIMEOUT)?;
        let mut link = TouchLink { conn, unanswered: 0 };
        link.send(request)?;
        Ok(link)
    }

    /// `slot`'s report connection, taken for this thread's use: `Open`, `None` (none open), or
    /// `Down` while the slot gets no reports (which stays in place).
    fn take_link(&self, slot: u32) -> Link {
        let mut links = self.links.lock();
        let link = links.slot(slot);
        match std::mem::take(link) {
            Link::Down(until) if Instant::now() < until => {
                *link = Link::Down(until);
                Link::Down(until)
            }
            Link::Down(_) => Link::None,
            other => other,
        }
    }

    /// Keeps `link` as `slot`'s report connection; if another thread put one there meanwhile, this
    /// one's reports are waited for (so that a settle sees them counted) and it is closed.
    fn put_link(&self, slot: u32, link: TouchLink) {
        let spare = {
            let mut links = self.links.lock();
            let place = links.slot(slot);
            match place {
                Link::Open(_) => Some(link),
                _ => {
                    *place = Link::Open(link);
                    None
                }
            }
        };
        if let Some(mut spare) = spare {
            let _ = spare.settle();
        }
    }
}
