//! `memarts._memarts.Stream`: the shim's [`memarts_shim::Stream`] for Python, what `File(url, 'rb')`
//! reads through. The version is pinned at open (a replaced object is a `StaleError` at the next
//! read that needs a chunk of it, never mixed bytes); reads are served from the read-ahead window
//! with the GIL released while they wait; a `seek` further than the window reaches drops it.

use std::mem::MaybeUninit;
use std::sync::Arc;

use memarts_session::Session;
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{to_py, uninit_bytes};

#[pyclass(module = "memarts._memarts")]
pub struct Stream {
    /// `None` once closed: the workers are told to stop and the window is freed.
    inner: Option<memarts_shim::Stream>,
}

impl Stream {
    pub fn open(py: Python<'_>, session: &Arc<Session>, url: &str) -> PyResult<Stream> {
        let source: memarts_shim::stream::Source = session.clone();
        let inner = py.detach(|| memarts_shim::Stream::open(source, url)).map_err(|e| to_py(py, e))?;
        Ok(Stream { inner: Some(inner) })
    }

    /// A stream over the version `meta` of `url`, known already (nothing is asked).
    pub fn at_version(session: &Arc<Session>, url: &str, meta: memarts_shim::ObjectMeta) -> PyResult<Stream> {
        let source: memarts_shim::stream::Source = session.clone();
        let inner = memarts_shim::Stream::at_version(source, url, meta)
            .map_err(|e| Python::attach(|py| to_py(py, e)))?;
        Ok(Stream { inner: Some(inner) })
    }

    fn open_inner(&mut self) -> PyResult<&mut memarts_shim::Stream> {
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err("I/O operation on a closed stream"))
    }
}

#[pymethods]
impl Stream {
    /// Up to `n` bytes from the current position (all the rest if `n` is negative); empty at the
    /// end. The `bytes` is allocated once, not zeroed, and filled in place with the GIL released.
    #[pyo3(signature = (n=-1))]
    fn read<'py>(&mut self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        let stream = self.open_inner()?;
        let left = stream.size().saturating_sub(stream.position());
        let too_large = |_| PyValueError::new_err("read too large for this platform");
        let len = usize::try_from(if n < 0 { left } else { left.min(n as u64) }).map_err(too_large)?;
        if len == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let (obj, ptr) = uninit_bytes(py, isize::try_from(len).map_err(too_large)?)
            .ok_or_else(|| PyMemoryError::new_err(format!("cannot allocate {len} bytes")))?;
        // SAFETY: `ptr` is the `len`-byte buffer of `obj`, which we hold and no Python code has seen
        // yet, so nothing else reads or writes it while the GIL is released.
        let room = unsafe { std::slice::from_raw_parts_mut(ptr as *mut MaybeUninit<u8>, len) };
        let got = py.detach(|| stream.read(room)).map_err(|e| to_py(py, e))?;
        if got != len {
            // Stream::read fills all it is asked up to the end of the pinned version.
            return Err(to_py(py, memarts_shim::Error::Internal(format!("short read: {got} of {len}"))));
        }
        // Every byte of the buffer was written (Stream::read returned Ok(len)).
        Ok(obj.into_bound(py))
    }

    /// Moves to `pos` (past the end is allowed: reads there are empty); returns it.
    fn seek(&mut self, pos: u64) -> PyResult<u64> {
        self.open_inner()?.seek_to(pos);
        Ok(pos)
    }

    fn tell(&mut self) -> PyResult<u64> {
        Ok(self.open_inner()?.position())
    }

    /// Size of the pinned version.
    #[getter]
    fn size(&mut self) -> PyResult<u64> {
        Ok(self.open_inner()?.size())
    }

    /// ETag of the pinned version.
    #[getter]
    fn etag(&mut self) -> PyResult<Option<String>> {
        Ok(self.open_inner()?.meta().etag.clone())
    }

    /// Caps the read-ahead at `max_bytes` (whole chunks; 0 turns it off).
    fn set_readahead(&mut self, max_bytes: u64) -> PyResult<()> {
        self.open_inner()?.set_readahead(max_bytes);
        Ok(())
    }

    /// Stops the read-ahead and frees the window; later calls raise `ValueError`.
    fn close(&mut self) {
        self.inner = None;
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }
}
