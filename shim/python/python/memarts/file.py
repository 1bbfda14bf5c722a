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

Writes (``write``, ``append``, ``rename`` and ``copy`` to an object URL, ``File`` in any mode but
``'r'``/``'rb'``, which uploads on close) go to the object store through the fleet, checked end to end
with CRC32C; nothing half-written is ever visible.

Every function and keyword of MoXing's API document is here (``import moxing as mox`` gives this
module); what has no meaning here is accepted and said in the docstring. ``shift('os', 'mox')``
(:mod:`memarts.shift`) makes ``open``, ``os``, ``glob`` and ``shutil`` accept object URLs;
``set_auth`` is in :mod:`memarts.auth`.

``write_memarts`` stores objects in the cache only (durable before it returns True; never evicted;
read back with ``read_meta_free(path, binary=True, memarts_only=True)``).
"""

import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

from . import _memarts
from ._entries import DirEntry, FileStat, ScanDir  # noqa: F401  (the types listings return)
from ._file_object import open_local, open_object
from .auth import set_auth  # noqa: F401  (part of the API)
from .errors import (  # noqa: F401  (MoXing's exception names are part of mox.file's API)
    BadRequestError,
    Error,
    MoxFileNameDuplicateException,
    MoxFileNotExistsException,
    MoxFileReadException,
    MoxFileRespException,
    NoSpaceError,
    NotFoundError,
    StaleError,
    UntrustedFleetError,
)
from .shift import shift  # noqa: F401  (part of the API)
from ._urls import is_remote as _is_remote


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
    would reconnect by itself, but an in-process engine (embedded or origin mode) lives in a thread
    that a child does not inherit."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        with _client_lock:
            if _client is None or _client_pid != os.getpid():
                _client = _memarts.Client()
                _client_pid = os.getpid()
    return _client


def _reset_client():
    """Drops the process's client, so the next call opens one with the current environment
    (``set_auth`` in origin and embedded modes)."""
    global _client, _client_pid
    with _client_lock:
        _client = None
        _client_pid = None


def mode():
    """How this process reaches memarts: ``"proxy"`` (a fleet runs, or ``USE_MEMARTS_PROXY=1``),
    ``"embedded"`` (``USE_MEMARTS=1`` and no fleet: the engine runs in this process, on the shared
    cache dir) or ``"origin"`` (no memarts: objects are read from the origin, nothing is cached)."""
    return _fleet().mode


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


def read(url, client_id=None, binary=False):
    """The whole file or object, as ``bytes`` (``binary=True``) or as a ``str`` (UTF-8).
    ``client_id`` (MoXing's choice of OBS client) is accepted and has no meaning here: every read
    goes through this process's one memarts client."""
    path = url
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


def _object_stat(url):
    """``(size, etag, last_modified_ms)`` of the object `url`, or None when there is none."""
    try:
        return _fleet().stat(url)
    except NotFoundError:
        return None


def exists(url):
    """Whether a file, object or directory (object prefix) exists."""
    local = _local_path(url)
    if local is not None:
        return os.path.exists(local)
    return _object_stat(url) is not None or is_directory(url)


def get_size(url, recursive=False):
    """Size in bytes of a file or object. A directory: with ``recursive``, the total size of every
    file below it; without, 0 for an object prefix. For a local directory the total is always
    given (MoXing's document: ``recursive`` is always True for local paths)."""
    local = _local_path(url)
    if local is not None:
        if not os.path.isdir(local):
            return os.path.getsize(local)
        return sum(os.path.getsize(os.path.join(root, f)) for root, _d, files in os.walk(local) for f in files)
    meta = _object_stat(url)
    if meta is not None:
        return meta[0]
    entries = _fleet().list(url.rstrip("/"), True)
    if not entries:
        raise NotFoundError(f"{url}: no such object or directory")
    return sum(size for _url, is_dir, size in entries if not is_dir) if recursive else 0


def is_directory(url):
    """Whether `url` is a directory (for objects: a prefix with something below it)."""
    local = _local_path(url)
    if local is not None:
        return os.path.isdir(local)
    return bool(_fleet().list(url.rstrip("/"), False))


def _encode(data, binary, what):
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} needs {'bytes' if binary else 'str'} data, not {type(data).__name__}")


def write(url, data, binary=False):
    """Replaces the file or object with ``data``, like ``open(url, 'w').write(data)``: a ``str`` is
    written as UTF-8, ``bytes`` as they are (whatever ``binary`` says: neither loses data). An
    object is uploaded in one piece; a local file is replaced by rename, so a reader never sees it
    half-written."""
    payload = _encode(data, binary, "write")
    local = _local_path(url)
    if local is None:
        _fleet().put_bytes(url, payload)
        return
    tmp = f"{local}.memarts-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
        if os.path.exists(local):
            shutil.copymode(local, tmp)
        os.replace(tmp, local)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def append(url, data, binary=False):
    """Adds ``data`` at the end of the file or object (created if missing), like
    ``open(url, 'a').write(data)``. An object store cannot append: the object is read and written
    again whole as its new version (atomic for readers; two processes appending to one object at
    once can lose one of the appends, as with any read-modify-write)."""
    payload = _encode(data, binary, "append")
    local = _local_path(url)
    if local is not None:
        with open(local, "ab") as f:
            f.write(payload)
        return
    old = _fleet().read(url) if _object_stat(url) is not None else b""
    _fleet().put_bytes(url, old + payload)


def remove(url, recursive=False):
    """Deletes a file or object; with ``recursive``, a directory (object prefix) and everything
    below. As MoXing documents for objects: a URL ending in ``/`` is a directory, so without
    ``recursive`` nothing is done; a directory without ``recursive`` is left alone (nothing is
    done); with ``recursive``, an object URL that names an object removes only that object. A
    missing object without ``recursive`` raises ``NotFoundError``."""
    local = _local_path(url)
    if local is not None:
        if recursive and os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local)
        else:
            os.remove(local)
        return
    if not url.endswith("/") and _object_stat(url) is not None:
        _fleet().delete(url)
        return
    if not recursive:
        if url.endswith("/") or is_directory(url):
            return
        raise NotFoundError(f"{url}: no such object")
    base = url.rstrip("/")
    names = list_directory(base, recursive=True)
    with ThreadPoolExecutor(max_workers=PARALLEL_THREADS) as pool:
        list(pool.map(lambda n: _fleet().delete(f"{base}/{n}"), names))


def rename(src_url, dst_url):
    """Moves a file or directory, in any direction (local or object to local or object). Between
    local paths it is ``os.rename`` (or a copy across file systems). Object stores cannot rename:
    everything is copied first and the source is removed only once every copy succeeded, so an
    interrupted rename leaves both, never neither."""
    src, dst = _local_path(src_url), _local_path(dst_url)
    if src is not None and dst is not None:
        shutil.move(src, dst)
        return
    if is_directory(src_url):
        copy_parallel(src_url, dst_url)
        remove(src_url.rstrip("/"), recursive=True)
        return
    if src is None and _object_stat(src_url) is None:
        raise NotFoundError(f"{src_url}: no such object")
    copy(src_url, dst_url)
    remove(src_url)


def make_dirs(url):
    """Creates a directory and its parents. Object stores have no directories (a prefix exists
    once an object is written below it), so for object URLs there is nothing to do."""
    local = _local_path(url)
    if local is not None:
        os.makedirs(local, exist_ok=True)


def mk_dir(url):
    """Creates one directory; its parent must exist (else ``FileNotFoundError``, an ``OSError``, as
    MoXing documents). For an object URL nothing is created (see :func:`make_dirs`); the parent
    must be the bucket or an existing prefix, else ``NotFoundError`` (a ``FileNotFoundError``)."""
    local = _local_path(url)
    if local is not None:
        os.mkdir(local)
        return
    scheme, _, rest = url.rstrip("/").partition("://")
    parts = rest.split("/")
    if len(parts) > 2 and not is_directory(f"{scheme}://" + "/".join(parts[:-1])):
        raise NotFoundError(f"{url}: the parent directory does not exist")


def File(name, mode="r", encoding=None, errors=None, newline=None, buffering=-1):
    """A file object, MoXing's ``File(name, mode)``: any of ``r w a r+ w+ a+`` with ``b`` (written
    before or after: ``'rb'`` or ``'br'``), with ``read readline readlines write writelines seek tell
    size flush close readable writable seekable``, iteration, ``.mode`` and ``.name``. On an object,
    ``'r'``/``'rb'`` stream by ranges; the other modes work on a private spool that ``close`` uploads
    (nothing is visible before; leaving a ``with`` block on an exception uploads nothing).
    ``encoding`` (UTF-8 for objects by default), ``errors``, ``newline`` are ``open``'s; ``buffering``
    applies to local files only."""
    local = _local_path(name)
    if local is not None:
        return open_local(local, mode, encoding, errors, newline, buffering)
    return open_object(_fleet(), name, mode, encoding, errors, newline)


from ._copy import copy, copy_parallel  # noqa: E402  (they use this module's helpers)
from ._listing import (  # noqa: E402, F401  (part of the API; they use this module's helpers)
    _canonical,
    _object_files,
    _parents,
    _relative,
    glob,
    list_directory,
    scan_dir,
    stat,
    walk,
)
