//! The io_uring thread: [`RingDriver`] owns the `IoUring`, the in-flight operations and
//! their buffers.
//!
//! - A read of the wake eventfd is always in flight on the ring, so the thread sleeps in
//!   `submit_and_wait(1)` until either an I/O completes or a submitter wakes it; it never
//!   spins while idle.
//! - In-flight operations live in a fixed slab of `sq_entries - 2` slots (the user data of
//!   an SQE is its slot index); the two spare entries are for the eventfd read and its
//!   cancellation at shutdown. So the SQ can never overflow and the CQ (twice the SQ) never
//!   fills; extra operations wait in a queue. Nothing is allocated per operation here
//!   beyond the operation's own buffer (the slab, queue and CQE scratch vector are reused).
//! - Each completion is checked against the requested length: short reads and writes are
//!   resubmitted for the remainder at the advanced offset, a 0-byte read is
//!   `UnexpectedEof`, a 0-byte write is `WriteZero`, `-EINTR`/`-EAGAIN` are retried and
//!   other negative results become `io::Error::from_raw_os_error(-res)`.
//! - A buffer (and the file it targets) is only released after its completion is reaped.
//!   If the thread ever stops with operations still in flight (fatal ring error or panic),
//!   their buffers and files are leaked rather than freed under the kernel's feet.

use std::collections::VecDeque;
use std::io;
use std::mem;
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};

use io_uring::{opcode, squeue, types, IoUring};

use super::uring::{Msg, Op, OpKind, Wake};

/// User data of the eventfd read.
const WAKE: u64 = u64::MAX;
/// User data of the cancellation of the eventfd read at shutdown.
const CANCEL: u64 = u64::MAX - 1;
/// Largest byte count put in one SQE; longer transfers continue as "short" ones.
const MAX_IO: usize = 1 << 30;

pub(super) struct RingDriver {
    ring: IoUring,
    rx: mpsc::Receiver<Msg>,
    wake: Arc<Wake>,
    /// Target of the in-flight eventfd read; boxed so its address is stable.
    wake_buf: Box<[u8; 8]>,
    wake_armed: bool,
    cancel_sent: bool,
    shutting_down: bool,
    slots: Vec<Option<Op>>,
    free: Vec<usize>,
    pending: VecDeque<Op>,
    cqes: Vec<(u64, i32)>,
}

impl RingDriver {
    pub(super) fn new(ring: IoUring, rx: mpsc::Receiver<Msg>, wake: Arc<Wake>) -> Self {
        let sq = ring.params().sq_entries() as usize;
        let capacity = sq.saturating_sub(2).max(1);
        RingDriver {
            ring,
            rx,
            wake,
            wake_buf: Box::new([0; 8]),
            wake_armed: false,
            cancel_sent: false,
            shutting_down: false,
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
            pending: VecDeque::with_capacity(capacity),
            cqes: Vec::with_capacity(2 * sq + 2),
        }
    }

    pub(super) fn run(mut self) {
        if let Err(e) = self.arm_wake() {
            return self.fatal(e);
        }
        loop {
            self.drain_channel();
            self.start_pending();
            if self.shutting_down && self.pending.is_empty() && self.free.len() == self.slots.len() {
                if !self.wake_armed {
                    return;
                }
                if !self.cancel_sent {
                    self.cancel_sent = true;
                    let cancel = opcode::AsyncCancel::new(WAKE).build().user_data(CANCEL);
                    if let Err(e) = self.push(&cancel) {
                        return self.fatal(e);
                    }
                }
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => return self.fatal(e),
            }
            if let Err(e) = self.reap() {
                return self.fatal(e);
            }
        }
    }

    fn drain_channel(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Op(op)) => self.pending.push_back(op),
                Ok(Msg::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => {
                    self.shutting_down = true;
                    return;
                }
                Err(mpsc::TryRecvError::Empty) => return,
            }
        }
    }

    fn start_pending(&mut self) {
        while let Some(&slot) = self.free.last() {
            let Some(op) = self.pending.pop_front() else { return };
            self.free.pop();
            self.start(slot, op);
        }
    }

    /// Puts `op` in `slot` and queues its (next) SQE; fails the op if that is impossible.
    fn start(&mut self, slot: usize, mut op: Op) {
        let entry = sqe_for(&mut op, slot);
        self.slots[slot] = Some(op);
        if let Err(e) = self.push(&entry) {
            // The SQE never reached the ring, so the buffer can be handed back.
            if let Some(op) = self.slots[slot].take() {
                self.free.push(slot);
                finish(op, Err(e));
            }
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let fd = types::Fd(self.wake.raw_fd());
        let read = opcode::Read::new(fd, self.wake_buf.as_mut_ptr(), 8).build().user_data(WAKE);
        self.push(&read)?;
        self.wake_armed = true;
        Ok(())
    }

    /// Queues one SQE, submitting first if the SQ is full.
    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every pointer in `entry` targets memory owned by this driver that stays
            // put until the matching CQE is reaped: an op's heap buffer (`Vec` data or `Bytes`
            // storage, never reallocated while in flight) in `self.slots`, or `wake_buf`. The
            // op's `Arc<File>` in the same slot keeps the fd open; the eventfd is kept open
            // by `self.wake`. Ops still in flight when the driver stops are leaked (`Drop`).
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn reap(&mut self) -> io::Result<()> {
        let mut cqes = mem::take(&mut self.cqes);
        cqes.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        let mut outcome = Ok(());
        for &(user_data, res) in &cqes {
            match user_data {
                WAKE => {
                    self.wake_armed = false;
                    if res < 0 && ![libc::EINTR, libc::EAGAIN, libc::ECANCELED].contains(&-res) {
                        // Re-arming a read that keeps failing would spin: give up instead.
                        outcome = Err(io::Error::from_raw_os_error(-res));
                    } else if !self.shutting_down {
                        self.wake.clear_pending();
                        if let Err(e) = self.arm_wake() {
                            outcome = Err(e);
                        }
                    }
                }
                CANCEL => {}
                slot => self.complete(slot as usize, res),
            }
        }
        cqes.clear();
        self.cqes = cqes;
        outcome
    }

    fn complete(&mut self, slot: usize, res: i32) {
        let Some(mut op) = self.slots.get_mut(slot).and_then(Option::take) else {
            tracing::error!(slot, res, "io_uring completion for an empty slot");
            return;
        };
        let done = match &mut op.kind {
            OpKind::Read { buf, len, .. } => match res {
                1.. => {
                    let n = (res as usize).min(*len - buf.len());
                    // SAFETY: the kernel wrote `res` bytes into the spare capacity starting at
                    // `buf.len()` (the SQE asked for at most `len - buf.len()`, and `n` is
                    // capped at that too), so the first `buf.len() + n` bytes are initialized
                    // and within capacity `len`.
                    unsafe { buf.set_len(buf.len() + n) };
                    (buf.len() == *len).then_some(Ok(()))
                }
                0 => Some(Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past end of file"))),
                _ => errno(res),
            },
            OpKind::Write { data, done, .. } => match res {
                1.. => {
                    *done = (*done + res as usize).min(data.len());
                    (*done == data.len()).then_some(Ok(()))
                }
                0 => Some(Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0 bytes"))),
                _ => errno(res),
            },
            OpKind::Fsync { .. } => {
                if res >= 0 {
                    Some(Ok(()))
                } else {
                    errno(res)
                }
            }
        };
        match done {
            Some(result) => {
                self.free.push(slot);
                finish(op, result);
            }
            None => self.start(slot, op),
        }
    }

    /// The ring itself failed: fail queued ops; `Drop` deals with those in flight.
    fn fatal(mut self, error: io::Error) {
        tracing::error!(%error, "io_uring thread stopping after a ring error");
        self.drain_channel();
        for op in self.pending.drain(..) {
            finish(op, Err(io::Error::new(error.kind(), format!("io_uring ring failed: {error}"))));
        }
    }
}

impl Drop for RingDriver {
    fn drop(&mut self) {
        // Normally nothing is in flight here. If something is (fatal error or panic), the
        // kernel may still write to those buffers: leak them, and keep their fds open.
        for op in self.slots.iter_mut().filter_map(Option::take) {
            let Op { file, kind, .. } = op;
            mem::forget(file);
            let error = || io::Error::other("io_uring thread stopped with the op in flight");
            match kind {
                OpKind::Read { buf, reply, .. } => {
                    mem::forget(buf);
                    let _ = reply.send(Err(error()));
                }
                OpKind::Write { data, reply, .. } => {
                    mem::forget(data);
                    let _ = reply.send(Err(error()));
                }
                OpKind::Fsync { reply, .. } => {
                    let _ = reply.send(Err(error()));
                }
            }
        }
        if self.wake_armed {
            mem::forget(mem::take(&mut self.wake_buf));
        }
    }
}

/// The SQE for the rest of `op`, tagged with its slot.
fn sqe_for(op: &mut Op, slot: usize) -> squeue::Entry {
    let fd = types::Fd(op.file.as_raw_fd());
    let entry = match &mut op.kind {
        OpKind::Read { buf, len, .. } => {
            let done = buf.len();
            let chunk = (*len - done).min(MAX_IO) as u32;
            let target = buf.spare_capacity_mut().as_mut_ptr().cast::<u8>();
            opcode::Read::new(fd, target, chunk).offset(op.offset + done as u64).build()
        }
        OpKind::Write { data, done, .. } => {
            let rest = &data[*done..];
            let chunk = rest.len().min(MAX_IO) as u32;
            opcode::Write::new(fd, rest.as_ptr(), chunk).offset(op.offset + *done as u64).build()
        }
        OpKind::Fsync { data_only, .. } => {
            let flags = if *data_only { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
            opcode::Fsync::new(fd).flags(flags).build()
        }
    };
    entry.user_data(slot as u64)
}

/// `None` (retry) for -EINTR/-EAGAIN, else the error.
fn errno(res: i32) -> Option<io::Result<()>> {
    let code = -res;
    (code != libc::EINTR && code != libc::EAGAIN).then(|| Err(io::Error::from_raw_os_error(code)))
}

fn retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

/// Sends the op's result to its waiter (who may have gone away: that is fine).
fn finish(op: Op, result: io::Result<()>) {
    match op.kind {
        OpKind::Read { buf, reply, .. } => {
            let _ = reply.send(result.map(|()| buf));
        }
        OpKind::Write { reply, .. } | OpKind::Fsync { reply, .. } => {
            let _ = reply.send(result);
        }
    }
}
