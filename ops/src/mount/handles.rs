//! Open files and directories, by the handle number the kernel passes back with each request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fuser::FileType;

use super::reader::Reader;
use super::spool::Spool;

/// One entry of an open directory's snapshot.
pub struct DirItem {
    pub ino: u64,
    pub kind: FileType,
    pub name: String,
}

#[derive(Clone)]
pub enum Handle {
    Read(Arc<Reader>),
    Write(Arc<Mutex<Spool>>),
    /// The directory as listed at `opendir`, so offsets stay valid across `readdir` calls.
    Dir(Arc<Vec<DirItem>>),
}

#[derive(Default)]
pub struct Handles {
    open: Mutex<HashMap<u64, Handle>>,
    next: AtomicU64,
}

impl Handles {
    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(fh, h);
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Handle> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Handle> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&fh)
    }
}
