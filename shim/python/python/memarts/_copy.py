"""``mox.file.copy`` and ``copy_parallel``: one file or object, and a tree of them, with the fleet
fetching the next objects of a long copy ahead of the copying threads. Re-exported by
:mod:`memarts.file`, whose settings and client they use."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import file as _file
from ._progress import Progress
from .errors import Error, MoxFileNameDuplicateException, NotFoundError, StaleError


def copy(src_url, dst_url, client_id=None):
    """Copies one file or object: object to local, local to object, object to object, local to
    local. ``client_id`` (MoXing's choice of OBS client) is accepted and has no meaning here."""
    dst = _file._local_path(dst_url)
    src = _file._local_path(src_url)
    if dst is None:
        if src is not None:
            _file._fleet().put_file(dst_url, src)
        else:
            _file._fleet().put_bytes(dst_url, _file._fleet().read(src_url))
        return
    parent = os.path.dirname(dst)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if src is None:
        # Streams in bounded memory; large objects go as several ranges at once when
        # MOX_MEMARTS_LARGE_FILE_ACC=1 (MOX_FILE_PARTIAL_MAXIMUM_SIZE, MOX_FILE_LARGE_FILE_TASK_NUM).
        tasks = _file.LARGE_FILE_TASK_NUM if _file.LARGE_FILE_ACC else 1
        if _file.USE_METADATA_CACHE:
            known = _file._metadata_cache().get(src_url)
            if known is not None:
                try:
                    _file._fleet().download_at_version(src_url, (known[0], known[1]), dst, tasks, _file.PARTIAL_MAXIMUM_SIZE)
                    return
                except (StaleError, NotFoundError):
                    _file._metadata_cache().drop(src_url)
            size, etag, _mtime = _file._fleet().stat(src_url)
            _file._metadata_cache().put(src_url, size, etag)
            _file._fleet().download_at_version(src_url, (size, etag), dst, tasks, _file.PARTIAL_MAXIMUM_SIZE)
            return
        _file._fleet().download(src_url, dst, tasks, _file.PARTIAL_MAXIMUM_SIZE)
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


class _HintWindow:
    """Keeps the fleet fetching the next objects of a long copy ahead of the copying threads
    (``memarts.prefetch``): the first ``AHEAD`` are hinted at once, then the next ``STEP`` each time
    the copies get within ``AHEAD - STEP`` of the last one hinted. The threads' reads are then hits,
    or join a fetch already under way: nothing is fetched twice, and the origin sees as many
    requests in flight as the fleet's adaptive limit allows, not one per thread."""

    AHEAD, STEP = 256, 64

    def __init__(self, urls):
        self.urls, self.done, self.hinted = urls, 0, 0
        self.lock = threading.Lock()
        self._hint(self.AHEAD)

    def _hint(self, n):
        batch = self.urls[self.hinted:self.hinted + n]
        self.hinted += len(batch)
        if batch:
            try:
                _file._fleet().prefetch(batch)
            except Error:  # hints are best effort: the copies read anyway
                pass

    def advance(self):
        with self.lock:
            self.done += 1
            if self.hinted < len(self.urls) and self.hinted - self.done <= self.AHEAD - self.STEP:
                self._hint(self.STEP)


def copy_parallel(src_url, dst_url, file_list=None, threads=None, is_processing=False, use_queue=False):
    """Copies a directory tree (or, with ``file_list``, those names relative to `src_url`),
    ``threads`` files at a time (None or 0: ``MOX_COPY_PARALLEL_THREADS``, 16 by default).

    Copies are I/O that runs without the GIL, so threads are used whatever ``is_processing`` says
    (MoXing's choice of a process pool), and the pool is the work queue whatever ``use_queue``
    says. Copying objects to a local directory where one name is both an object and a prefix
    (``a`` and ``a/b``) raises ``MoxFileNameDuplicateException`` before anything is copied."""
    del is_processing, use_queue
    src = src_url.rstrip("/")
    dst = dst_url.rstrip("/")
    total = None
    if file_list is not None:
        names = [os.fspath(n).lstrip("/") for n in file_list]
    elif _file._local_path(src) is None:
        # One LIST, which also gives the sizes (for the progress report's ETA).
        listed = _file._object_files(src)
        names = [n for n, _ in listed]
        total = sum(size for _, size in listed)
    else:
        names = _file.list_directory(src, recursive=True)
    if _file._local_path(dst) is not None:
        clash = sorted(set(names) & _file._parents(names))
        if clash:
            raise MoxFileNameDuplicateException(
                f"{src}: {clash[0]!r} is both a file and a directory; a local file system cannot hold both"
            )
    workers = _file.PARALLEL_THREADS if not threads or threads < 0 else int(threads)
    progress = Progress("copy_parallel", len(names), total)
    ahead = _HintWindow([f"{src}/{n}" for n in names]) if _file._local_path(src) is None else None

    def one(name):
        copy(f"{src}/{name}", f"{dst}/{name}")
        local = _file._local_path(f"{dst}/{name}") or _file._local_path(f"{src}/{name}") if progress.on else None
        progress.done(os.path.getsize(local) if local is not None else 0)
        if ahead is not None:
            ahead.advance()

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for done in pool.map(one, names):
                del done
    finally:
        progress.close()
