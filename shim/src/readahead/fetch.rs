//! How a window's chunks are fetched: by the reader that needs one (a chunk not queued, or queued
//! and not started yet: it does not wait behind the chunks ahead), or by a fetch thread (`pool.rs`)
//! for a chunk queued ahead; each into a buffer leased from the budget when there is room, the
//! result kept only while the window still wants it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{Buffer, Inner, State, Window};
use crate::client::Client;
use crate::error::{Error, Result};

impl Inner {
    /// A buffer the window may keep: one left behind, or a new one leased from the budget.
    pub(super) fn leased_buffer(&self, w: &mut Window) -> Option<Buffer> {
        if let Some(buf) = w.free.pop() {
            return Some(buf);
        }
        let lease = self.process.budget.take(self.chunk_size)?;
        Some(Buffer { data: Vec::new(), lease: Some(lease) })
    }

    /// Chunk `index` for a reader: ready, or on its way (wait for it), or fetched now by the
    /// caller (kept in the window if the budget has room).
    pub(super) fn chunk(&self, index: u64) -> Result<Arc<Buffer>> {
        let mut w = self.lock();
        let buf = loop {
            match w.chunks.get_mut(&index) {
                Some(State::Ready(data)) => return Ok(data.clone()),
                Some(State::Failed(_)) => {
                    let Some(State::Failed(e)) = w.chunks.remove(&index) else { unreachable!() };
                    return Err(e);
                }
                Some(state @ State::Queued(_)) => {
                    // Not started yet: fetch it here rather than wait behind the chunks ahead.
                    let State::Queued(buf) = std::mem::replace(state, State::Fetching) else {
                        unreachable!()
                    };
                    break buf;
                }
                Some(State::Fetching) => w = self.changed.wait(w).unwrap_or_else(|p| p.into_inner()),
                None => match self.leased_buffer(&mut w) {
                    Some(buf) => {
                        w.chunks.insert(index, State::Fetching);
                        break buf;
                    }
                    None => break Buffer { data: Vec::new(), lease: None },
                },
            }
        };
        drop(w);
        let kept = buf.lease.is_some();
        let result = self.timed(|| self.fetch(index, buf)).map(Arc::new);
        if kept {
            let mut w = self.lock();
            if matches!(w.chunks.get(&index), Some(State::Fetching)) {
                match &result {
                    Ok(data) => drop(w.chunks.insert(index, State::Ready(data.clone()))),
                    Err(_) => drop(w.chunks.remove(&index)),
                }
            }
            drop(w);
            self.changed.notify_all();
        }
        result
    }

    /// A fetch thread's part: chunk `index`, if it is still queued.
    pub(super) fn fetch_ahead(&self, index: u64) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.lock();
        let Some(state @ State::Queued(_)) = w.chunks.get_mut(&index) else { return };
        let State::Queued(buf) = std::mem::replace(state, State::Fetching) else { unreachable!() };
        drop(w);
        let result = self.timed(|| self.fetch(index, buf));
        let mut w = self.lock();
        // Only a chunk still wanted is kept (a seek may have dropped it meanwhile).
        if matches!(w.chunks.get(&index), Some(State::Fetching)) {
            let state = match result {
                Ok(data) => State::Ready(Arc::new(data)),
                Err(e) => State::Failed(e),
            };
            w.chunks.insert(index, state);
        }
        drop(w);
        self.changed.notify_all();
    }

    /// Runs a fetch and folds its time into the average.
    fn timed<T>(&self, fetch: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = fetch();
        let took = started.elapsed().as_micros().max(1) as u64;
        let old = self.fetch_us.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old * 7 + took) / 8 };
        self.fetch_us.store(new, Ordering::Relaxed);
        out
    }

    /// Chunk `index` of the version, whole, in `buf` (written into its spare capacity, never
    /// zeroed first).
    fn fetch(&self, index: u64, mut buf: Buffer) -> Result<Buffer> {
        let len = self.chunk_len(index);
        buf.data.clear();
        buf.data.reserve_exact(len);
        let client: &Client = (*self.source).as_ref();
        let room = &mut buf.data.spare_capacity_mut()[..len];
        let n = client.read_at(&self.url, &self.meta, index * self.chunk_size, &mut *room)?;
        if n != len {
            return Err(Error::Stale(format!(
                "{}: changed during the read (chunk {index} ended after {n} of {len} bytes)",
                self.url
            )));
        }
        // SAFETY: read_at returned Ok(len): it wrote the first `len` bytes of the spare capacity.
        unsafe { buf.data.set_len(len) };
        Ok(buf)
    }
}
