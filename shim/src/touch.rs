//! Reporting direct reads to their slots (`Request::Touched`) without waiting for the answers.
//!
//! A reader that waited for each report's answer would sleep once per slot per batch and be woken
//! by the slot: on the 2-core VMs measured, those waits cost a loop of warm 64-255 KiB reads from 4
//! slots far more than the requests themselves (0.71x `open().read()` against 0.87x with no
//! reports at all, same run). So each process keeps one connection per slot for its reports: a
//! report is sent and its answer read later, when it has arrived (a slot answers within
//! microseconds, and reports come at most every 256 reads or so), or when the reads must be counted
//! now ([`Client::settle_touches`]: before the fleet's counters are asked for, and when the client
//! goes). A slot answers a connection's requests in order, so once the answer to the last report
//! is read the slot has counted them all.
//!
//! A reader is never held up by a slot that does not answer: a slot that leaves
//! [`MAX_UNANSWERED`] reports unanswered gets no more until it catches up, and one that cannot be
//! connected to is not tried again for [`RETRY_AFTER`]. Reports stay best effort, as they always
//! were: the counts a slot misses only make its eviction see those chunks as less recently read.

use std::time::{Duration, Instant};

use memarts_protocol::{Request, Response, Touch, MAX_TOUCHES};

use crate::client::Client;
use crate::conn::Conn;
use crate::error::{Error, Result};

/// Reports a slot may leave unanswered before it gets no more (dropped: it is seconds behind).
const MAX_UNANSWERED: usize = 16;

/// The longest opening a report connection, or waiting for the answers when settling, may take.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a slot that could not be connected to gets no reports.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One slot's report connection and how many of the reports sent on it are not answered yet.
pub(crate) struct TouchLink {
    conn: Conn,
    unanswered: usize,
}

/// This process's report connections, by slot.
#[derive(Default)]
pub(crate) struct TouchLinks {
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

impl Client {
    /// Reports direct reads to their slots; with `settle`, also waits until the slots have counted
    /// every report this process sent so far.
    pub(crate) fn report_touches(&self, batches: Vec<(u32, Vec<Touch>)>, settle: bool) {
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
            Err(_) => *self.touch_links().slot(slot) = Link::Down(Instant::now() + RETRY_AFTER),
        }
    }

    /// Waits until every slot has answered (so counted) every report sent to it so far.
    pub(crate) fn settle_touches(&self) {
        let slots = self.touch_links().per_slot.len() as u32;
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
        let conn = self.connect(slot, REPORT_TIMEOUT)?;
        conn.set_timeout(REPORT_TIMEOUT)?;
        let mut link = TouchLink { conn, unanswered: 0 };
        link.send(request)?;
        Ok(link)
    }

    /// `slot`'s report connection, taken for this thread's use: `Open`, `None` (none open), or
    /// `Down` while the slot gets no reports (which stays in place).
    fn take_link(&self, slot: u32) -> Link {
        let mut links = self.touch_links();
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
            let mut links = self.touch_links();
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
