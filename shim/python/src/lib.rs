//! `memarts._memarts`: the Python face of the shim. The MoXing-style API (`memarts.file`) is a thin
//! Python layer over this module.
//!
//! - I/O runs with the GIL released (`Python::detach`), so DataLoader threads read in parallel.
//! - A whole-object read allocates its `bytes` once, when the size is known, and the shim fills it in
//!   place: no intermediate buffer, no copy.
//! - Errors become the `memarts.errors` hierarchy (which mirrors the wire's error codes; a missing
//!   object is also a `FileNotFoundError`).

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::Arc;

use memarts_session::Session;
use memarts_settings::Settings;
use memarts_shim::{Error, Room, ShimConfig, Sink};
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod at_exit;
mod settings;
mod stream;

/// Maps a shim error to the class of the same name in `memarts.errors`.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let name = match &e {
        Error::NotFound(_) => "NotFoundError",
        Error::Stale(_) => "StaleError",
        Error::PermissionDenied(_) => "PermissionDeniedError",
        Error::Origin(_) => "OriginError",
        Error::Corrupt(_) => "CorruptError",
        Error::NoSpace(_) => "NoSpaceError",
        Error::BadRequest(_) => "BadRequestError",
        Error::Unavailable(_) => "UnavailableError",
        Error::Config(_) => "ConfigError",
        Error::Untrusted(_) => "UntrustedFleetError",
        Error::Io(_) => "IoError",
        Error::Protocol(_) => "ProtocolError",
        _ => "InternalError",
    };
    let msg = e.to_string();
    match py.import("memarts.errors").and_then(|m| m.getattr(name)) {
        Ok(cls) => match cls.call1((msg.clone(),)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(err) => err,
        },
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// A new Python `bytes` of `len` bytes left uninitialised (`PyBytes::new_with` zeroes them first,
/// which costs as much as filling them from the page cache), and the address of its buffer; `None`
/// when it cannot be allocated. Until every byte is written, no Python code may see the object.
pub(crate) fn uninit_bytes(py: Python<'_>, len: isize) -> Option<(Py<PyBytes>, usize)> {
    // SAFETY: PyBytes_FromStringAndSize with a NULL buffer returns a new bytes object of `len`
    // uninitialised bytes (or NULL with an exception set); we own the reference.
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), len) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a new, non-null, owned reference to a bytes object.
    let obj: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, raw) };
    // SAFETY: `obj` is a bytes object; its buffer lives as long as the object.
    let ptr = unsafe { ffi::PyBytes_AsString(obj.as_ptr()) } as usize;
    Some((obj, ptr))
}

/// A Python `bytes` allocated uninitialised once the object's size is known, filled in place.
#[derive(Default)]
struct BytesSink {
    obj: Option<Py<PyBytes>>,
    ptr: usize,
    size: usize,
}

impl Sink for BytesSink {
    fn reserve(&mut self, size: usize) -> memarts_shim::Result<()> {
        let len = isize::try_from(size).map_err(|_| Error::BadRequest("object too large".into()))?;
        let made = Python::attach(|py| uninit_bytes(py, len));
        let (obj, ptr) = made.ok_or_else(|| Error::NoSpace(format!("cannot allocate {size} bytes")))?;
        self.obj = Some(obj);
        self.ptr = ptr;
        self.size = size;
        Ok(())
    }

    fn room(&mut self) -> &mut Room {
        if self.size == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` points at the `size`-byte buffer of the bytes object we hold in `obj`; no
        // Python code has seen that object yet, so nothing else reads or writes it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut MaybeUninit<u8>, self.size) }
    }
}

/// A client of memarts in one of three modes (`memarts_session`). Safe to share between
/// threads; after a `fork`, proxy-mode clients reconnect by themselves, other modes need a new client
/// (the engine's thread does not survive the fork; `memarts.file` makes one per process).
#[pyclass(module = "memarts._memarts", frozen)]
struct Client {
    /// Shared with the read-ahead workers of the streams it opens.
    inner: Arc<Session>,
}

#[pymethods]
impl Client {
    /// Connects lazily to the fleet in `run_dir` (default: `MEMARTS_RUN_DIR`, else the standard run
    /// dir). Settings come from the environment (`MOX_FILE_CHUNK_SIZE`, ...).
    #[new]
    #[pyo3(signature = (run_dir=None))]
    fn new(py: Python<'_>, run_dir: Option<PathBuf>) -> PyResult<Self> {
        let settings = Settings::from_env().map_err(|e| to_py(py, e.into()))?;
        let mut shim = ShimConfig::from_settings(&settings);
        if let Some(dir) = run_dir {
            shim.run_dir = dir;
        }
        let mut fleet = memarts_proxy::config::FleetConfig::default();
        fleet.apply_settings(&settings);
        let inner = py.detach(|| Session::open(&settings, shim, fleet)).map_err(|e| to_py(py, e))?;
        // What its reads of the cache's files leave unreported is sent when the process ends.
        at_exit::register(py)?;
        Ok(Client { inner: Arc::new(inner) })
    }

    /// `"proxy"`, `"embedded"` or `"origin"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.inner.mode().name()
    }

    /// The whole object as `bytes`.
    fn read<'py>(&self, py: Python<'py>, url: &str) -> PyResult<Bound<'py, PyBytes>> {
        let mut sink = BytesSink::default();
        py.detach(|| self.inner.read_to(url, &mut sink)).map_err(|e| to_py(py, e))?;
        match sink.obj {
            Some(obj) => Ok(obj.into_bound(py)),
            None => Ok(PyBytes::new(py, b"")),
        }
    }

    /// The whole object and the metadata of the version read: `(data, size, etag)`.
    fn read_and_meta<'py>(
        &self,
        py: Python<'py>,
        url: &str,
    ) -> PyResult<(Bound<'py, PyBytes>, u64, Option<String>)> {
        let mut sink = BytesSink::default();
        let meta = py.detach(|| self.inner.read_to(url, &mut sink)).map_err(|e| to_py(py, e))?;
        let data = match sink.obj {
            Some(obj) => obj.into_bound(py),
            None => PyBytes::new(py, b""),
        };
        Ok((data, meta.size, meta.etag))
    }

    /// The whole version `etag` (of `size` bytes) of the object, without asking for its metadata;
    /// a changed object is a `StaleError`.
    fn read_at_version<'py>(
        &self,
        py: Python<'py>,
        url: &str,
        size: u64,
        etag: String,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let meta =
            memarts_protocol::ObjectMeta { size, etag: Some(etag), version: None, last_modified_ms: 0 };
        let len =
            usize::try_from(size).map_err(|_| to_py(py, Error::BadRequest("object too large".into())))?;
        let mut sink = BytesSink::default();
        py.detach(|| -> memarts_shim::Result<()> {
            sink.reserve(len)?;
            let n = self.inner.read_at(url, &meta, 0, sink.room())?;
            if n != len {
                return Err(Error::Stale(format!(
                    "{url}: changed during the read ({n} bytes where {len} were cached)"
                )));
            }
            Ok(())
        })
        .map_err(|e| to_py(py, e))?;
        match sink.obj {
            Some(obj) => Ok(obj.into_bound(py)),
            None => Ok(PyBytes::new(py, b"")),
        }
    }

    /// Up to `length` bytes from `offset` of the version `etag` (of `size` bytes), without asking
    /// for its metadata: the chunks covering the range, each read at that version, so a changed
    /// object is a `StaleError`, never bytes of another version. What an fsspec file opened on one
    /// version reads through.
    fn read_range_at_version<'py>(
        &self,
        py: Python<'py>,
        url: &str,
        size: u64,
        etag: String,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let meta =
            memarts_protocol::ObjectMeta { size, etag: Some(etag), version: None, last_modified_ms: 0 };
        let len = length.min(usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX));
        PyBytes::new_with(py, len, |buf| {
            let n = py.detach(|| self.inner.read_at(url, &meta, offset, buf)).map_err(|e| to_py(py, e))?;
            if n != len {
                return Err(to_py(py, Error::Internal(format!("{url}: short read ({n} of {len} bytes)"))));
            }
            Ok(())
        })
    }

    /// `download` of a version `(size, etag)` known from a metadata cache.
    fn download_at_version(
        &self,
        py: Python<'_>,
        url: &str,
        version: (u64, String),
        path: PathBuf,
        large_tasks: usize,
        large_threshold: u64,
    ) -> PyResult<u64> {
        let meta = memarts_protocol::ObjectMeta {
            size: version.0,
            etag: Some(version.1),
            version: None,
            last_modified_ms: 0,
        };
        py.detach(|| self.download_meta(url, &meta, &path, large_tasks, large_threshold))
            .map_err(|e| to_py(py, e))
    }

    /// A sequential reader of the current version of `url` (pinned now, by one stat), with
    /// read-ahead: what `File(url, 'rb')` reads through.
    fn open_stream(&self, py: Python<'_>, url: &str) -> PyResult<stream::Stream> {
        stream::Stream::open(py, &self.inner, url)
    }

    /// A sequential reader of the version `etag` (of `size` bytes) of `url`, known already (nothing
    /// is asked), with read-ahead: what an fsspec file opened on one version reads through.
    fn open_stream_at_version(&self, url: &str, size: u64, etag: String) -> PyResult<stream::Stream> {
        let meta =
            memarts_protocol::ObjectMeta { size, etag: Some(etag), version: None, last_modified_ms: 0 };
        stream::Stream::at_version(&self.inner, url, meta)
    }

    /// Up to `length` bytes from `offset`.
    fn read_range<'py>(
        &self,
        py: Python<'py>,
        url: &str,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let data = py.detach(|| self.inner.read_range(url, offset, length)).map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// `(size, etag, last_modified_ms)`.
    #[pyo3(signature = (url, refresh=false))]
    fn stat(&self, py: Python<'_>, url: &str, refresh: bool) -> PyResult<(u64, Option<String>, i64)> {
        let m = py.detach(|| self.inner.stat_opts(url, refresh)).map_err(|e| to_py(py, e))?;
        Ok((m.size, m.etag, m.last_modified_ms))
    }

    /// `[(url, is_dir, size), ...]` under `url`: one level, or everything below with `recursive`.
    #[pyo3(signature = (url, recursive=false))]
    fn list(&self, py: Python<'_>, url: &str, recursive: bool) -> PyResult<Vec<(String, bool, u64)>> {
        let entries = py.detach(|| self.inner.list(url, recursive)).map_err(|e| to_py(py, e))?;
        Ok(entries.into_iter().map(|e| (e.url, e.is_dir, e.size)).collect())
    }

    /// Writes `data` as the new version of `url`; returns `(size, etag)`.
    fn put_bytes(&self, py: Python<'_>, url: &str, data: &[u8]) -> PyResult<(u64, Option<String>)> {
        let meta = py.detach(|| self.inner.put_bytes(url, data)).map_err(|e| to_py(py, e))?;
        Ok((meta.size, meta.etag))
    }

    /// Writes the local file `path` as the new version of `url`; returns `(size, etag)`.
    fn put_file(&self, py: Python<'_>, url: &str, path: PathBuf) -> PyResult<(u64, Option<String>)> {
        let meta = py.detach(|| self.inner.put_file(url, &path)).map_err(|e| to_py(py, e))?;
        Ok((meta.size, meta.etag))
    }

    /// Stores `data` as the memarts-only object `url`; returns once it is durable.
    fn put_memarts(&self, py: Python<'_>, url: &str, data: &[u8]) -> PyResult<u64> {
        let meta = py.detach(|| self.inner.put_memarts_bytes(url, data)).map_err(|e| to_py(py, e))?;
        Ok(meta.size)
    }

    /// A memarts-only object as `bytes`.
    fn read_memarts<'py>(&self, py: Python<'py>, url: &str) -> PyResult<Bound<'py, PyBytes>> {
        let mut sink = BytesSink::default();
        py.detach(|| self.inner.read_memarts_to(url, &mut sink)).map_err(|e| to_py(py, e))?;
        match sink.obj {
            Some(obj) => Ok(obj.into_bound(py)),
            None => Ok(PyBytes::new(py, b"")),
        }
    }

    /// Copies the object `url` to the local file `path` in bounded memory; objects of at least
    /// `large_threshold` bytes are copied as `large_tasks` ranges at once. Returns the size.
    fn download(
        &self,
        py: Python<'_>,
        url: &str,
        path: PathBuf,
        large_tasks: usize,
        large_threshold: u64,
    ) -> PyResult<u64> {
        py.detach(|| match self.inner.download_head(url, &path)? {
            Ok(size) => Ok(size),
            Err(meta) => self.download_meta(url, &meta, &path, large_tasks, large_threshold),
        })
        .map_err(|e| to_py(py, e))
    }

    /// Deletes `url` at the origin (an absent object is not an error).
    fn delete(&self, py: Python<'_>, url: &str) -> PyResult<()> {
        py.detach(|| self.inner.delete(url)).map_err(|e| to_py(py, e))
    }

    /// Counters summed over the slots this client reaches (the fleet's, or the in-process engine's):
    /// `hits`, `misses`, `bytes_from_cache`, `bytes_from_origin`, `origin_requests`,
    /// `cached_chunks`, `cache_bytes_used`, and `slots_down` (slots that did not answer); the
    /// prefetchers' `prefetch_hinted`, `prefetched` (objects), `prefetched_chunks`,
    /// `prefetch_skipped_cached`, `prefetch_dropped`, `prefetch_throttled`, `prefetch_failed`,
    /// `prefetch_queued`, `prefetch_inflight`, `prefetch_limit` (objects the slots may fetch at once
    /// now), and this client's `prefetch_unsupported`; and this client's local reads (warm chunks
    /// read straight from their files, no request to a proxy): `local_hits`, `local_bytes`,
    /// `local_fallbacks` (looked for directly, read through a proxy), `local_corrupt` (files
    /// that failed their checks: never served, refetched by their slot) and `local_resident` (hits on
    /// chunks their slot held locked in memory and checked when made resident: no CRC32C computed again).
    fn stats(&self, py: Python<'_>) -> std::collections::BTreeMap<&'static str, u64> {
        // `status` reports this process's local reads first: the slots' counters include them.
        let statuses = py.detach(|| self.inner.status(std::time::Duration::from_secs(5)));
        let mut sums = std::collections::BTreeMap::new();
        for (_slot, status) in statuses {
            let Ok(s) = status else {
                *sums.entry("slots_down").or_insert(0) += 1;
                continue;
            };
            for (name, v) in [
                ("hits", s.hits),
                ("misses", s.misses),
                ("bytes_from_cache", s.bytes_from_cache),
                ("bytes_from_origin", s.bytes_from_origin),
                ("origin_requests", s.origin_requests),
                ("cached_chunks", s.cached_chunks),
                ("cache_bytes_used", s.cache_bytes_used),
            ] {
                *sums.entry(name).or_insert(0) += v;
            }
        }
        sums.entry("slots_down").or_insert(0);
        // Slots too old to report prefetch counters add nothing to them.
        let prefetch = py.detach(|| self.inner.prefetch_status(std::time::Duration::from_secs(5)));
        for p in prefetch.into_iter().filter_map(|(_, r)| r.ok()) {
            for (name, v) in [
                ("prefetch_hinted", p.hinted),
                ("prefetch_queued", p.queued),
                ("prefetch_inflight", p.inflight),
                ("prefetch_limit", p.limit),
                ("prefetched", p.objects),
                ("prefetched_chunks", p.chunks),
                ("prefetch_skipped_cached", p.skipped_cached),
                ("prefetch_dropped", p.dropped),
                ("prefetch_throttled", p.throttled),
                ("prefetch_failed", p.failed),
            ] {
                *sums.entry(name).or_insert(0) += v;
            }
        }
        let own = self.inner.prefetch_counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        sums.insert("prefetch_unsupported", load(&own.unsupported));
        let local = self.inner.client().local_counters();
        for (name, v) in [
            ("local_hits", local.map(|d| load(&d.hits))),
            ("local_bytes", local.map(|d| load(&d.bytes))),
            ("local_fallbacks", local.map(|d| load(&d.fallbacks))),
            ("local_corrupt", local.map(|d| load(&d.corrupt))),
            ("local_resident", local.map(|d| load(&d.resident))),
        ] {
            sums.insert(name, v.unwrap_or(0));
        }
        sums
    }

    /// Reports this client's local reads (warm chunks read straight from their files) to their
    /// slots now, and waits until they are counted. Never needed for the counts to get there: they
    /// go in batches, and the rest when the client goes or the process ends (a DataLoader worker
    /// included, `at_exit.rs`); for a caller that wants the slots' eviction to see them now.
    fn send_read_reports(&self, py: Python<'_>) {
        py.detach(|| self.inner.send_read_reports());
    }

    /// Hints that `urls` will be read soon: the fleet fetches them ahead (each on the slot its read
    /// starts at). Returns how many the slots queued; never fails for a slot that is down or too
    /// old to take hints (those hints are lost, counted).
    fn prefetch(&self, py: Python<'_>, urls: Vec<String>) -> PyResult<usize> {
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        py.detach(|| self.inner.prefetch(&refs)).map_err(|e| to_py(py, e))
    }

    /// Chunk size of this client's reads (`MOX_FILE_CHUNK_SIZE`).
    #[getter]
    fn chunk_size(&self) -> u64 {
        self.inner.config().chunk_size
    }
}

impl Client {
    /// An object copied as one range streams (its next chunks in flight while one is written);
    /// one of at least `large_threshold` bytes with `large_tasks` > 1 goes as that many ranges.
    fn download_meta(
        &self,
        url: &str,
        meta: &memarts_protocol::ObjectMeta,
        path: &std::path::Path,
        large_tasks: usize,
        large_threshold: u64,
    ) -> memarts_shim::Result<u64> {
        if large_tasks > 1 && meta.size >= large_threshold {
            return self.inner.download_at_meta(url, meta, path, large_tasks, large_threshold);
        }
        memarts_shim::download_streamed(self.inner.clone(), url, meta, path)
    }
}

#[pymodule]
fn _memarts(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<stream::Stream>()?;
    m.add_function(wrap_pyfunction!(settings::fleet_running, m)?)?;
    m.add_function(wrap_pyfunction!(settings::settings, m)?)?;
    m.add_function(wrap_pyfunction!(settings::fleet_file, m)?)?;
    Ok(())
}
