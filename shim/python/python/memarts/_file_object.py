"""``mox.file.File``: file objects over objects, in every mode MoXing documents.

Reading (``'r'``, ``'rb'``) streams the object through the fleet with read-ahead, one version pinned
by its ETag at open (a replaced object is a ``StaleError``, never mixed bytes). Every other mode
works on a private spool file: ``'w'``/``'w+'`` start empty, ``'a'``/``'a+'`` and ``'r+'`` start
from the object's current bytes; ``close`` uploads the spool as the new version (checked end to end
like every upload), so nothing half-written is ever visible at the origin, and
leaving a ``with`` block on an exception uploads nothing. ``'r+'`` of a missing object raises
``NotFoundError``; an ``'r+'``/``'a'`` file nothing was written to is not uploaded again.

Modes are the letters of ``open``'s in any order (``'rb'`` and ``'br'``, ``'w+b'`` and ``'bw+'``).
"""

import io
import os
import tempfile

from .errors import BadRequestError, NotFoundError


def parse_mode(mode):
    """``(kind, plus, binary)`` of an ``open``-style mode: kind is ``'r'``, ``'w'``, ``'a'`` or ``'x'``."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str, not {type(mode).__name__}")
    letters = set(mode)
    kinds = letters & set("rwax")
    if len(kinds) != 1 or len(letters) != len(mode) or not letters <= set("rwaxbt+"):
        raise BadRequestError(f"invalid mode {mode!r}: one of r, w, a, x, optionally with b or t and +")
    if "b" in letters and "t" in letters:
        raise BadRequestError(f"invalid mode {mode!r}: b and t together")
    return kinds.pop(), "+" in letters, "b" in letters


class ObjectReader(io.RawIOBase):
    """A seekable, readable raw stream over one object version, pinned at open: every read carries
    that version's ETag, so an object replaced while the file is open raises ``StaleError`` at the
    next read that needs a chunk of the new version, never returns bytes of two versions. Reads come
    from the shim's read-ahead window (chunks fetched ahead of a sequential reader, GIL released);
    ``seek`` drops the window."""

    def __init__(self, fleet, url):
        super().__init__()
        self._stream = fleet.open_stream(url)
        self.size = self._stream.size
        self.name = url

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        view = memoryview(b).cast("B")
        data = self._stream.read(len(view))
        view[: len(data)] = data
        return len(data)

    def read(self, size=-1):
        return self._stream.read(-1 if size is None else size)

    def readall(self):
        return self._stream.read(-1)

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._stream.tell(), io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        return self._stream.seek(base + offset)

    def tell(self):
        return self._stream.tell()

    def close(self):
        stream = getattr(self, "_stream", None)  # absent if the open failed
        if stream is not None:
            stream.close()
        super().close()


class Spool(io.FileIO):
    """A private temp file that becomes the object when closed (uploaded with a checksum; nothing
    is visible at the origin before ``close`` succeeds). ``publish=False`` at close, or
    :meth:`abandon`, uploads nothing."""

    def __init__(self, fleet, url, kind, plus, existed):
        fd, self._tmp = tempfile.mkstemp(prefix="memarts-upload-")
        os.close(fd)
        try:
            if kind in ("a", "r") and existed:
                fleet.download(url, self._tmp, 1, 1 << 62)
            mode = {"w": "w", "x": "w", "a": "a", "r": "r+"}[kind] + ("+" if plus and kind != "r" else "")
            super().__init__(self._tmp, mode)
        except BaseException:
            os.unlink(self._tmp)
            raise
        self._fleet = fleet
        self._url = url
        # A new object must appear even if nothing is written (as open(path, 'w') creates a file);
        # an existing one is uploaded again only if it changed.
        self._dirty = kind in ("w", "x") or not existed
        self.name = url

    def write(self, b):
        self._dirty = True
        return super().write(b)

    def truncate(self, size=None):
        self._dirty = True
        return super().truncate(size)

    @property
    def size(self):
        return os.fstat(self.fileno()).st_size

    def close(self):
        if self.closed:
            return
        try:
            super().close()
            if self._dirty:
                self._fleet.put_file(self._url, self._tmp)
        finally:
            if os.path.exists(self._tmp):
                os.unlink(self._tmp)

    def abandon(self):
        """Closes without uploading."""
        self._dirty = False
        self.close()


_OWN_ATTRS = frozenset({"_stream", "_raw", "_direct_min", "_buffer"})


class MoxFile:
    """What ``File`` returns: the buffered (binary) or text stream, with MoXing's extras ``size()``,
    ``mode`` (as given) and ``name`` (the URL). Iterating gives lines; ``with`` closes it, and for a
    file being written, leaving the block on an exception uploads nothing."""

    def __init__(self, stream, raw, name, mode, direct_min=None):
        self._stream = stream
        self._raw = raw
        self.name = name
        self.mode = mode
        # Binary reads of an object: reads of at least `direct_min` bytes (or of the rest) skip the
        # buffer when it holds nothing, and fill their `bytes` straight from the shim (`read`).
        self._direct_min = direct_min
        # Whether the buffered reader holds nothing: "empty" (and knows where the raw reader is),
        # "behind" (empty, but the raw reader moved on with reads that went around it), or
        # "unknown" (it was used since).
        self._buffer = "empty"

    def __getattr__(self, attr):
        if attr in _OWN_ATTRS:  # not set yet (an object made without __init__): not the stream's
            raise AttributeError(attr)
        self._use_buffer()
        return getattr(self._stream, attr)

    def __iter__(self):
        self._use_buffer()
        return iter(self._stream)

    def __next__(self):
        self._use_buffer()
        return next(self._stream)

    def read(self, size=-1):
        if self._direct_min is not None and (size is None or size < 0 or size >= self._direct_min):
            if self._buffer != "unknown" or self._stream.tell() == self._raw.tell():
                # Nothing buffered: the raw reader fills the `bytes` returned straight from the
                # shim, where the buffered reader would have it read whole chunks into a `bytes` of
                # its own and copy them into another (`readinto`): two copies for a local file's one.
                self._buffer = "behind"
                return self._raw.read(-1 if size is None else size)
        self._use_buffer()
        return self._stream.read(size)

    def _use_buffer(self):
        """Before the buffered reader is used: tells it where the raw reader is, if reads went
        around it (a seek to where it is: its buffer is empty, so that reads nothing)."""
        if self._buffer == "behind" and not self._stream.closed:
            self._stream.seek(self._raw.tell())
        self._buffer = "unknown"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and hasattr(self._raw, "abandon"):
            self._raw.abandon()
            try:
                self._stream.close()
            except (OSError, ValueError):
                pass
        else:
            self._stream.close()
        return False

    def __repr__(self):
        return f"<mox.file.File name={self.name!r} mode={self.mode!r}>"

    def size(self, *_args, **_kwargs):
        """The file's size in bytes (for a file being written: what is written so far, flushed)."""
        if isinstance(self._raw, ObjectReader):
            return self._raw.size
        if not self._stream.closed:
            self._stream.flush()
        if isinstance(self._raw, Spool):
            return self._raw.size
        return os.fstat(self._stream.fileno()).st_size


def open_object(fleet, url, mode, encoding=None, errors=None, newline=None):
    """A :class:`MoxFile` over the object `url` opened in `mode` (any of ``open``'s)."""
    kind, plus, binary = parse_mode(mode)
    if binary and (encoding is not None or errors is not None or newline is not None):
        raise BadRequestError("binary mode takes no encoding, errors or newline")
    if kind == "r" and not plus:
        raw = ObjectReader(fleet, url)
        stream = io.BufferedReader(raw, buffer_size=fleet.chunk_size)
        direct_min = min(64 << 10, fleet.chunk_size) if binary else None
    else:
        direct_min = None
        try:
            fleet.stat(url)
            existed = True
        except NotFoundError:
            existed = False
        if kind == "r" and not existed:
            raise NotFoundError(f"{url}: no such object (mode {mode!r} needs an existing one)")
        if kind == "x" and existed:
            raise FileExistsError(f"{url}: the object exists (mode {mode!r})")
        raw = Spool(fleet, url, kind, plus, existed)
        if plus:
            stream = io.BufferedRandom(raw, buffer_size=8 << 20)
        else:
            stream = io.BufferedWriter(raw, buffer_size=8 << 20)
    if not binary:
        stream = io.TextIOWrapper(stream, encoding=encoding or "utf-8", errors=errors, newline=newline)
    return MoxFile(stream, raw, url, mode, direct_min)


def open_local(path, mode, encoding=None, errors=None, newline=None, buffering=-1):
    """A :class:`MoxFile` over a local file: ``open`` with the mode's letters in any order."""
    kind, plus, binary = parse_mode(mode)
    canonical = kind + ("+" if plus else "") + ("b" if binary else "")
    stream = open(path, canonical, buffering, encoding, errors, newline)
    return MoxFile(stream, stream, path, mode)
