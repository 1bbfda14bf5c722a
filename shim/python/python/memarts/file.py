"""``memarts.file``: the MoXing file API (``mox.file.read``, ``copy``, ``File``...) over a memarts fleet.

Paths are object URLs (``s3://``, ``obs://``, ``oss://`` name buckets on the configured endpoint) or
local paths (plain or ``file://``), which work everywhere. Object reads go through the node's proxy
fleet: the first read of a chunk fetches it from the object store, every later read comes from the
local SSD cache.

Environment (read when this module is imported; a malformed value raises ``ConfigError`` naming it):
``MOX_COPY_PARALLEL_THREADS`` (16), ``MOX_OBS_TO_MOUNT_PATH`` (``obs://a=/cache/a;obs://b=/cache/b``),
``MOX_AUTO_READ_META_FREE`` (0), ``USE_METADATA_CACHE`` (0: a persistent metadata cache for
``read``, ``copy`` and ``copy_parallel``, see ``_metadata_cache``), ``MOX_MEMARTS_LARGE_FILE_ACC`` (0) with
``MOX_FILE_PARTIAL_MAXIMUM_SIZE`` (5 GiB) and ``MOX_FILE_LARGE_FILE_TASK_NUM`` (8); ``MOX_FILE_CHUNK_SIZE``, ``MEMARTS_RUN_DIR``,
``MEMARTS_TIMEOUT`` and ``MEMARTS_TRUSTED_UIDS`` are read by the client when it first connects.

A fleet is used only if its run dir belongs to this user (or to a uid in ``MEMARTS_TRUSTED_UIDS``,
e.g. ``root`` for a system fleet) and every proxy runs as that owner; any other fleet raises
``UntrustedFleetError`` (a ``PermissionError``) before a byte is read or written, in every function
including ``write_memarts``.

Modes, resolved as MoXing does: a running fleet (or ``USE_MEMARTS_PROXY=1``) is used through its
sockets; with ``USE_MEMARTS=1`` and no fleet the engine runs inside this process on the same cache
dir; without memarts, objects are read straight from the origin. See :func:`mode`.

Writes (``copy`` to an object URL, ``File`` in ``'w'``/``'wb'`` mode, which uploads on close) go
to the object store through the fleet, checked end to end with CRC32C.

``write_memarts`` stores objects in the cache only (durable before it returns True; never evicted;
read back with ``read_meta_free(path, binary=True, memarts_only=True)``).
"""

import io
import logging
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

from . import _memarts
from .errors import (
    BadRequestError,
    Error,
    NoSpaceError,
    NotFoundError,
    StaleError,
    UntrustedFleetError,
)

_REMOTE = ("s3://", "obs://", "oss://", "s3a://")


# Parsed by the extension, from the one table of settings every part of memarts shares
# (``memarts_settings``); a malformed variable raises ConfigError naming it, here at import.
_settings = _memarts.settings()
PARALLEL_THREADS = _settings["parallel"]
LARGE_FILE_ACC = _settings["large_file_acc"]
PARTIAL_MAXIMUM_SIZE = _settings["partial_maximum_size"]
LARGE_FILE_TASK_NUM = _settings["large_file_task_num"]
AUTO_READ_META_FREE = _settings["auto_read_meta_free"]
# (prefix, local dir) pairs, longest prefix first, so obs://b/dir/sub wins over obs://b/dir.
MOUNTS = [tuple(m) for m in _settings["mounts"]]
USE_METADATA_CACHE = _settings["use_metadata_cache"]
_metadata = None


def _metadata_cache():
    global _metadata
    if _metadata is None:
        from ._metadata_cache import MetadataCache

        _metadata = MetadataCache()
    return _metadata

_client = None
_client_pid = None
_client_lock = threading.Lock()


def _fleet():
    """The process's client, created on first use and again in a forked child: a fleet client
    would reconnect by itself, but an in-process engine (embedded or direct mode) lives in a thread
    that a child does not inherit."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        with _client_lock:
            if _client is None or _client_pid != os.getpid():
                _client = _memarts.Client()
                _client_pid = os.getpid()
    return _client


def mode():
    """How this process reaches memarts: ``"proxy"`` (a fleet runs, or ``USE_MEMARTS_PROXY=1``),
    ``"embedded"`` (``USE_MEMARTS=1`` and no fleet: the engine runs in this process, on the shared
    cache dir) or ``"direct"`` (no memarts: objects are read from the origin, nothing is cached)."""
    return _fleet().mode


def _is_remote(path):
    return isinstance(path, str) and path.lower().startswith(_REMOTE)


def _local_path(path):
    """The local path `path` names: itself, a ``file://`` URL, or a mounted object prefix; else None."""
    path = os.fspath(path)
    if path.startswith("file://"):
        return path[len("file://"):]
    if not _is_remote(path):
        if "://" in path:
            raise BadRequestError(f"unsupported URL scheme in {path!r} (use s3://, obs://, oss://, file:// or a path)")
        return path
    for prefix, local in MOUNTS:
        if path == prefix or path.startswith(prefix + "/"):
            return local + path[len(prefix):]
    return None


def read(path, binary=False):
    """The whole file or object, as ``bytes`` (``binary=True``) or as a ``str`` (UTF-8)."""
    local = _local_path(path)
    if local is not None:
        with open(local, "rb") as f:
            data = f.read()
    elif USE_METADATA_CACHE:
        data = _read_with_metadata_cache(path)
    else:
        data = _fleet().read(path)
    return data if binary else data.decode("utf-8")


def _read_with_metadata_cache(url):
    cache = _metadata_cache()
    known = cache.get(url)
    if known is not None:
        try:
            return _fleet().read_at_version(url, known[0], known[1])
        except (StaleError, NotFoundError):
            cache.drop(url)
    data, size, etag = _fleet().read_and_meta(url)
    cache.put(url, size, etag)
    return data


def read_meta_free(path, binary=False, memarts_only=False):
    """Like :func:`read`, for very large datasets: no metadata is fetched ahead of the data (the
    fleet returns the size with the first chunk, in one round trip). With ``memarts_only``, reads an
    object stored by :func:`write_memarts`."""
    if memarts_only:
        data = _fleet().read_memarts(path)
        return data if binary else data.decode("utf-8")
    return read(path, binary=binary)


_log = logging.getLogger("memarts")


def write_memarts(path, data, retry=3):
    """Stores ``data`` (bytes) in the memarts cache only: the cache holds the only copy, which is
    never evicted and survives restarts. Returns True once the data is durable, False (with the
    reason logged on the ``memarts`` logger) when it cannot be stored: no room, memarts disabled, or
    ``retry`` attempts failed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("write_memarts needs bytes; encode text first")
    last = None
    for _attempt in range(max(1, int(retry))):
        try:
            _fleet().put_memarts(path, bytes(data))
            return True
        except (NoSpaceError, BadRequestError) as e:
            _log.warning("write_memarts(%s) failed: %s", path, e)
            return False
        except UntrustedFleetError:
            # Not a failure to store: the data must not go to that fleet at all, and a False would
            # read as "no room" to a caller that falls back on something else.
            raise
        except Error as e:
            last = e
    _log.warning("write_memarts(%s) failed after %d attempts: %s", path, max(1, int(retry)), last)
    return False


def exists(path):
    """Whether a file, object or directory (object prefix) exists."""
    local = _local_path(path)
    if local is not None:
        return os.path.exists(local)
    try:
        _fleet().stat(path)
        return True
    except NotFoundError:
        return is_directory(path)


def get_size(path):
    """Size in bytes of a file or object."""
    local = _local_path(path)
    if local is not None:
        return os.path.getsize(local)
    return _fleet().stat(path)[0]


def is_directory(path):
    """Whether `path` is a directory (for objects: a prefix with something below it)."""
    local = _local_path(path)
    if local is not None:
        return os.path.isdir(local)
    return bool(_fleet().list(path.rstrip("/"), False))


def _relative(base, url):
    base = base.rstrip("/") + "/"
    return url[len(base):] if url.startswith(base) else url.rsplit("/", 1)[-1]


def _canonical(path):
    # The fleet names every cloud scheme s3://; answer in the caller's scheme.
    scheme, sep, rest = path.partition("://")
    return "s3://" + rest if sep else path


def list_directory(path, recursive=False):
    """Names under `path`: one level (files and directories), or every file below it."""
    local = _local_path(path)
    if local is not None:
        if not recursive:
            return sorted(os.listdir(local))
        out = []
        for root, _dirs, files in os.walk(local):
            out.extend(os.path.relpath(os.path.join(root, f), local) for f in files)
        return sorted(out)
    base = _canonical(path)
    return sorted(_relative(base, url) for url, _is_dir, _size in _fleet().list(path.rstrip("/"), recursive))


def walk(top):
    """Like ``os.walk``: yields ``(dirpath, dirnames, filenames)`` top-down."""
    local = _local_path(top)
    if local is not None:
        yield from os.walk(local)
        return
    top = top.rstrip("/")
    tree = {"": (set(), [])}
    for name in list_directory(top, recursive=True):
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[: depth - 1])
            tree.setdefault(parent, (set(), []))[0].add(parts[depth - 1])
            tree.setdefault("/".join(parts[:depth]), (set(), []))
        tree.setdefault("/".join(parts[:-1]), (set(), []))[1].append(parts[-1])
    for rel in sorted(tree):
        dirs, files = tree[rel]
        yield (top + "/" + rel if rel else top), sorted(dirs), sorted(files)


def copy(src_url, dst_url):
    """Copies one file or object: object to local, local to object, object to object, local to local."""
    dst = _local_path(dst_url)
    src = _local_path(src_url)
    if dst is None:
        if src is not None:
            _fleet().put_file(dst_url, src)
        else:
            _fleet().put_bytes(dst_url, _fleet().read(src_url))
        return
    parent = os.path.dirname(dst)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if src is None:
        # Streams in bounded memory; large objects go as several ranges at once when
        # MOX_MEMARTS_LARGE_FILE_ACC=1 (MOX_FILE_PARTIAL_MAXIMUM_SIZE, MOX_FILE_LARGE_FILE_TASK_NUM).
        tasks = LARGE_FILE_TASK_NUM if LARGE_FILE_ACC else 1
        if USE_METADATA_CACHE:
            known = _metadata_cache().get(src_url)
            if known is not None:
                try:
                    _fleet().download_at_version(src_url, (known[0], known[1]), dst, tasks, PARTIAL_MAXIMUM_SIZE)
                    return
                except (StaleError, NotFoundError):
                    _metadata_cache().drop(src_url)
            size, etag, _mtime = _fleet().stat(src_url)
            _metadata_cache().put(src_url, size, etag)
            _fleet().download_at_version(src_url, (size, etag), dst, tasks, PARTIAL_MAXIMUM_SIZE)
            return
        _fleet().download(src_url, dst, tasks, PARTIAL_MAXIMUM_SIZE)
        return
    tmp = f"{dst}.memarts-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as out, open(src, "rb") as f:
            while True:
                block = f.read(8 << 20)
                if not block:
                    break
                out.write(block)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def copy_parallel(src_url, dst_url):
    """Copies a directory tree, ``MOX_COPY_PARALLEL_THREADS`` files at a time."""
    names = list_directory(src_url, recursive=True)
    src = src_url.rstrip("/")
    dst = dst_url.rstrip("/")
    with ThreadPoolExecutor(max_workers=PARALLEL_THREADS) as pool:
        for done in pool.map(lambda n: copy(f"{src}/{n}", f"{dst}/{n}"), names):
            del done


def remove(path, recursive=False):
    """Deletes a file or object; with ``recursive``, a directory (object prefix) and everything below."""
    local = _local_path(path)
    if local is not None:
        if recursive and os.path.isdir(local):
            import shutil

            shutil.rmtree(local)
        else:
            os.remove(local)
        return
    if recursive:
        base = path.rstrip("/")
        names = list_directory(base, recursive=True)
        with ThreadPoolExecutor(max_workers=PARALLEL_THREADS) as pool:
            list(pool.map(lambda n: _fleet().delete(f"{base}/{n}"), names))
        return
    if not exists(path):
        raise NotFoundError(f"{path}: no such object")
    _fleet().delete(path)


def make_dirs(path):
    """Creates a directory and its parents. Object stores have no directories (a prefix exists
    once an object is written below it), so for object URLs there is nothing to do."""
    local = _local_path(path)
    if local is not None:
        os.makedirs(local, exist_ok=True)


class _ObjectRaw(io.RawIOBase):
    """A seekable, readable raw stream over one object version (reads by range through the fleet)."""

    def __init__(self, url):
        super().__init__()
        self._url = url
        self._size = _fleet().stat(url)[0]
        self._pos = 0
        self.name = url

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        view = memoryview(b).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        data = _fleet().read_range(self._url, self._pos, n)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self):
        return self._pos


class _Upload(io.FileIO):
    """A write-only file that becomes the object when closed (spooled in a private temp file, then
    uploaded with a checksum; nothing is visible at the origin before ``close`` succeeds)."""

    def __init__(self, url):
        fd, self._tmp = tempfile.mkstemp(prefix="memarts-upload-")
        super().__init__(fd, "wb", closefd=True)
        self._url = url
        self.name = url

    def close(self):
        if self.closed:
            return
        try:
            super().close()
            _fleet().put_file(self._url, self._tmp)
        finally:
            if os.path.exists(self._tmp):
                os.unlink(self._tmp)

    def abandon(self):
        """Closes without uploading."""
        super().close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


class _Writer:
    """A file open for writing to an object: ``close`` (or leaving a ``with`` block normally)
    uploads it; leaving a ``with`` block on an exception uploads nothing."""

    def __init__(self, stream, raw):
        self._stream = stream
        self._raw = raw

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __iter__(self):
        return iter(self._stream)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._stream.close()
        else:
            self._raw.abandon()
        return False


def File(path, mode="r"):
    """A file object: ``'r'`` (text) or ``'rb'`` with read, readline, iteration, seek, tell and
    readinto; ``'w'`` (text) or ``'wb'``, uploaded when closed; local paths accept every mode of
    ``open``."""
    local = _local_path(path)
    if local is not None:
        return open(local, mode)
    if mode in ("w", "wb"):
        raw = _Upload(path)
        buffered = io.BufferedWriter(raw, buffer_size=8 << 20)
        return _Writer(buffered if mode == "wb" else io.TextIOWrapper(buffered, encoding="utf-8"), raw)
    if mode not in ("r", "rb"):
        raise BadRequestError(f"mode {mode!r} on an object URL: use 'r', 'rb', 'w' or 'wb'")
    raw = _ObjectRaw(path)
    buffered = io.BufferedReader(raw, buffer_size=_fleet().chunk_size)
    return buffered if mode == "rb" else io.TextIOWrapper(buffered, encoding="utf-8")
