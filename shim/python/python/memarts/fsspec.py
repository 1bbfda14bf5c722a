"""``memarts.fsspec``: memarts as an fsspec file system, so pandas, pyarrow, dask... read through the
cache::

    import pandas as pd
    df = pd.read_parquet("memarts://bucket/train/part-0.parquet")

``memarts://bucket/key`` is the object ``key`` of ``bucket`` on the origin the fleet reads: the object
``mox.file`` calls ``s3://bucket/key``. ``obs://bucket/key`` and ``oss://bucket/key`` are that same
object too (memarts reads every cloud scheme as ``s3://`` on the configured endpoint), so this class
accepts all of them and names paths ``bucket/key``. fsspec finds it by the package's entry point:
``fsspec.open("memarts://...")`` needs no import. It reaches memarts as ``mox.file`` does (a fleet,
the embedded engine with ``USE_MEMARTS=1``, or the origin directly: :func:`memarts.file.mode`), and
takes no storage options: the endpoint and credentials are the fleet's (or the process's, for the
in-process engine); options given for another file system (``anon``, ``key``...) are ignored.

Reading: a file opened ``"rb"`` pins the version (ETag) it finds at open and reads that version's
chunks through memarts' read-ahead, the one ``mox.file.File`` and ``memarts mount`` read through: a
window of chunks in flight ahead of a reader that reads in order, from one chunk up to 64 MiB, within
the process's read-ahead memory; a seek away drops it (a small range of a large object fetches
those chunks only, and they are hits the next time). An object replaced while the file is open
raises :class:`~memarts.errors.StaleError` at the next read that reaches the origin, never bytes of
two versions; the file opened again reads the new version. No fsspec cache sits on top by default
(``cache_type`` of ``open`` adds one).

Writing: ``"wb"`` (and ``"xb"``, ``"ab"``) files spool to a private temp file uploaded at close,
checked end to end, nothing if the ``with`` block fails (``mox.file.File``'s); ``pipe_file``
uploads bytes, ``rm`` deletes; ``mkdir`` creates nothing, as object stores have no directories.

Routing: :func:`route` makes fsspec read ``s3://``, ``obs://``, ``oss://`` (and ``s3a://``) URLs
through memarts as well, in place of s3fs & co. ``MEMARTS_FSSPEC_ROUTE=1`` (or a list, ``s3,obs``)
does it in every process where memarts is imported (``import memarts``, ``import moxing``, or fsspec
opening a ``memarts://`` URL); fsspec alone does not import memarts for an ``s3://`` URL.
"""

import contextlib
from datetime import datetime, timezone

try:
    import fsspec
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
    from fsspec.utils import stringify_path
except ImportError as e:  # memarts itself does not need fsspec
    raise ImportError("memarts.fsspec needs fsspec: pip install 'memarts[fsspec]' (or fsspec)") from e

from . import file as _file
from ._file_object import open_object
from ._urls import REMOTE_PREFIXES
from .errors import Error, NotFoundError, StaleError

ROUTABLE = ("s3", "s3a", "obs", "oss")
_SCHEMES = ("memarts://",) + REMOTE_PREFIXES


def _url(path):
    """The URL the client reads for an fsspec path ``bucket/key``."""
    return "s3://" + path


def _client():
    return _file._fleet()


class MemartsFileSystem(AbstractFileSystem):
    """Objects through memarts; see the module docs. Paths are ``bucket/key``, with or without
    ``memarts://`` (or ``s3://``, ``obs://``, ``oss://``, ``s3a://``) in front. Buckets are not
    listed: paths start with one."""

    protocol = ("memarts",)
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for scheme in _SCHEMES:
            if path.lower().startswith(scheme):
                path = path[len(scheme):]
                break
        return path.rstrip("/")

    def info(self, path, **kwargs):
        """``name``, ``size``, ``type`` (``"file"`` or ``"directory"``, a prefix with something
        below it, or a bucket), and for a file its ``etag`` and ``mtime`` (seconds). Nothing there
        raises ``FileNotFoundError``."""
        path = self._strip_protocol(path)
        bucket, _, key = path.partition("/")
        if not bucket:
            raise ValueError("a memarts path starts with a bucket (memarts does not list buckets): memarts://bucket/...")
        if key:
            try:
                size, etag, mtime_ms = _client().stat(_url(path))
                return {"name": path, "size": size, "type": "file", "etag": etag, "mtime": mtime_ms / 1000}
            except NotFoundError:
                pass
        # A bucket is a directory if it can be listed (a missing one raises); a prefix, if it is
        # not empty (object stores have no empty directories).
        if _client().list(_url(path), False) or not key:
            return {"name": path, "size": 0, "type": "directory"}
        raise NotFoundError(f"memarts://{path}: no such object or directory")

    def ls(self, path, detail=True, **kwargs):
        """The entries directly below ``path`` (a file lists as itself), sorted by name."""
        path = self._strip_protocol(path)
        entries = [_entry(*e) for e in _client().list(_url(path), False)] if path else []
        if not entries:
            info = self.info(path)  # a file, an empty bucket, or FileNotFoundError
            entries = [info] if info["type"] == "file" else []
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        """Every file below ``path`` (with ``withdirs``, the directories too), from one recursive
        LIST rather than one per directory; with ``maxdepth``, fsspec's walk."""
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        path = self._strip_protocol(path)
        out = {}
        for url, is_dir, size in _client().list(_url(path), True):
            if not is_dir:
                entry = _entry(url, False, size)
                out[entry["name"]] = entry
        if withdirs and out:
            for name in list(out):
                parent = name.rsplit("/", 1)[0]
                while len(parent) >= len(path) and parent not in out:
                    out[parent] = {"name": parent, "size": 0, "type": "directory"}
                    parent = parent.rsplit("/", 1)[0]
        if not out and self.isfile(path):
            out[path] = self.info(path)
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def modified(self, path):
        """The object's last modification time (UTC)."""
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=timezone.utc)

    def cat_file(self, path, start=None, end=None, **kwargs):
        """Bytes ``[start, end)`` of the object (negative: from the end, like a slice), of one
        version: the whole object in one read, or the chunks under the range."""
        url = _url(self._strip_protocol(path))
        if start is None and end is None:
            return _client().read(url)
        size, etag, _mtime = _client().stat(url)
        start, end, _step = slice(start, end).indices(size)
        return _client().read_range_at_version(url, size, etag or "", start, max(0, end - start))

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        """Uploads ``value`` as the object (``mode="create"``: only if there is none)."""
        if mode == "create" and self.exists(path):
            raise FileExistsError(path)
        _client().put_bytes(_url(self._strip_protocol(path)), bytes(value))

    def rm_file(self, path):
        _client().delete(_url(self._strip_protocol(path)))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if not autocommit:
            raise ValueError("memarts files have no transactions (autocommit=False): a written file is uploaded at close")
        if mode == "rb":
            return MemartsFile(self, path, block_size=block_size, cache_options=cache_options, **kwargs)
        return open_object(_client(), _url(path), mode)


def _entry(url, is_dir, size):
    """An fsspec entry of a listing's ``(url, is_dir, size)``."""
    name = url.partition("://")[2].rstrip("/")
    return {"name": name, "size": 0 if is_dir else size, "type": "directory" if is_dir else "file"}


class MemartsFile(AbstractBufferedFile):
    """A file opened for reading: one version, pinned by its ETag at open (or by ``size`` and
    ``etag`` given, as when fsspec reopens a pickled file), read by ranges of that version."""

    def __init__(self, fs, path, block_size=None, cache_options=None, size=None, etag=None, **kwargs):
        if size is None or etag is None:
            info = fs.info(path)
            if info["type"] != "file":
                raise IsADirectoryError(f"memarts://{path} is a directory")
            size, etag = info["size"], info["etag"] or ""
        self.etag = etag
        self._stream = None
        # memarts' read-ahead does what fsspec's caches would: none on top of it unless asked.
        kwargs.setdefault("cache_type", "none")
        super().__init__(
            fs,
            path,
            "rb",
            block_size=block_size or _client().chunk_size,
            cache_options=cache_options,
            size=size,
            etag=etag,
            **kwargs,
        )

    def _fetch_range(self, start, end):
        url = _url(self.path)
        try:
            if self._stream is None:
                self._stream = _client().open_stream_at_version(url, self.size, self.etag)
            self._stream.seek(start)
            return self._stream.read(max(0, end - start))
        except StaleError as e:
            # Revalidated now, so that the file opened again pins the new version, not the one the
            # fleet's metadata cache would still give until its TTL ends.
            with contextlib.suppress(Error):
                _client().stat(url, refresh=True)
            raise StaleError(
                f"memarts://{self.path} changed since it was opened (ETag {self.etag}): open it again "
                f"to read the new version ({e})"
            ) from None

    def close(self):
        """Closes the file and ends its read-ahead."""
        stream, self._stream = getattr(self, "_stream", None), None
        if stream is not None:
            stream.close()
        super().close()


def route(protocols=("s3", "obs", "oss")):
    """Makes fsspec read URLs of ``protocols`` (some of ``s3``, ``s3a``, ``obs``, ``oss``) through
    memarts, replacing what fsspec had for them (s3fs for ``s3://``): after it,
    ``fsspec.open("s3://bucket/key")`` reads the object ``memarts://bucket/key``. Returns the
    protocols routed. ``MEMARTS_FSSPEC_ROUTE`` does this when memarts is imported.

    pandas' ``read_parquet("s3://...")`` asks pyarrow's own S3 client first, not fsspec; give it
    ``storage_options={}`` (or read ``memarts://`` URLs) to read through memarts."""
    protocols = [p.lower() for p in ([protocols] if isinstance(protocols, str) else protocols)]
    unknown = [p for p in protocols if p not in ROUTABLE]
    if unknown:
        raise ValueError(f"cannot route {unknown}: memarts reads {', '.join(ROUTABLE)} URLs")
    for p in protocols:
        fsspec.register_implementation(p, MemartsFileSystem, clobber=True)
    return protocols


route(_file._settings["fsspec_route"])
