//! The module's process-exit hook: the reads of the cache's files that this process's clients have
//! not reported to their slots yet are sent when the process ends
//! (`memarts_shim::send_all_read_reports`), so that the slots count them for eviction.
//!
//! A client sends them itself when it is dropped, and the shim at C `exit`; neither is enough for
//! Python: the interpreter need not drop module globals (`memarts.file`'s client) at exit, and a
//! multiprocessing child such as a DataLoader worker ends with `os._exit` (no `exit` at all), after
//! running multiprocessing's finalizers. So the hook is one multiprocessing finalizer, which
//! multiprocessing runs at interpreter exit (its own `atexit` function) and at the end of such a
//! child; it is registered once in each process a client is made in (a multiprocessing child
//! starts with none of its parent's finalizers, and ignores any inherited from a plain `fork`).

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;
use pyo3::types::IntoPyDict;

/// The process the hook was last registered in.
static REGISTERED_IN: AtomicU32 = AtomicU32::new(0);

/// Registers the hook in this process, unless it was already.
pub(crate) fn register(py: Python<'_>) -> PyResult<()> {
    let pid = std::process::id();
    if REGISTERED_IN.swap(pid, Ordering::Relaxed) == pid {
        return Ok(());
    }
    let hook = wrap_pyfunction!(send_read_reports_at_exit, py)?;
    let finalize = py.import("multiprocessing.util")?.getattr("Finalize")?;
    finalize.call((py.None(), hook), Some(&[("exitpriority", 0)].into_py_dict(py)?))?;
    Ok(())
}

/// Sends the reads not reported yet of every client of this process (best effort: a slot that is
/// down only loses its eviction's view of them).
#[pyfunction]
fn send_read_reports_at_exit(py: Python<'_>) {
    py.detach(memarts_shim::send_all_read_reports);
}
