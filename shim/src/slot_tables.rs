//! The tables a slot publishes in the run dir (its metadata, its packed and resident chunks), mapped by a client once and
//! mapped again when the slot replaced them (it grew a table, or started again).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memarts_disk::meta_table::TableFile;
use memarts_disk::resident_table::ResidentFile;

/// A table file is checked for replacement (a slot that started again) at most this often.
const RECHECK_TABLE: Duration = Duration::from_secs(1);

/// A slot's table as last looked for: mapped, or not there (a fleet without tables: an older build,
/// or a slot that could not make one), and when.
pub(crate) struct Mapped<T> {
    table: Option<Arc<T>>,
    checked: Instant,
}

/// A table file a slot publishes: its metadata, its resident chunks.
pub(crate) trait SlotTable: Sized {
    fn open(path: &Path) -> io::Result<Self>;
    fn superseded(&self) -> bool;
    fn is_current(&self, path: &Path) -> bool;
}

impl SlotTable for TableFile {
    fn open(path: &Path) -> io::Result<Self> {
        TableFile::open(path)
    }
    fn superseded(&self) -> bool {
        self.table().superseded()
    }
    fn is_current(&self, path: &Path) -> bool {
        TableFile::is_current(self, path)
    }
}

impl SlotTable for ResidentFile {
    fn open(path: &Path) -> io::Result<Self> {
        ResidentFile::open(path)
    }
    fn superseded(&self) -> bool {
        self.table().superseded()
    }
    fn is_current(&self, path: &Path) -> bool {
        ResidentFile::is_current(self, path)
    }
}

/// `slot`'s table of kind `T` at `path`, from `tables` (mapped once and mapped again when the slot
/// replaced it: see [`LocalReads::table`]).
pub(crate) fn mapped<T: SlotTable>(
    tables: &Mutex<Vec<Option<Mapped<T>>>>,
    slot: u32,
    path: impl FnOnce() -> PathBuf,
) -> Option<Arc<T>> {
    let mut tables = tables.lock().unwrap_or_else(|p| p.into_inner());
    let index = slot as usize;
    if tables.len() <= index {
        tables.resize_with(index + 1, || None);
    }
    let entry = &mut tables[index];
    let fresh = |m: &&Mapped<T>| {
        m.checked.elapsed() < RECHECK_TABLE && !m.table.as_ref().is_some_and(|t| t.superseded())
    };
    if let Some(m) = entry.as_ref().filter(fresh) {
        return m.table.clone();
    }
    let path = path();
    let current = entry.as_ref().and_then(|m| m.table.clone()).filter(|t| t.is_current(&path));
    let table = current.or_else(|| T::open(&path).ok().map(Arc::new));
    *entry = Some(Mapped { table: table.clone(), checked: Instant::now() });
    table
}

impl SlotTable for memarts_disk::packed_table::PackedFile {
    fn open(path: &Path) -> io::Result<Self> {
        memarts_disk::packed_table::PackedFile::open(path)
    }
    fn superseded(&self) -> bool {
        self.table().superseded()
    }
    fn is_current(&self, path: &Path) -> bool {
        memarts_disk::packed_table::PackedFile::is_current(self, path)
    }
}
