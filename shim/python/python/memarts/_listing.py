"""Listing ``mox.file``'s files and objects: ``list_directory``, ``walk``, ``stat``, ``scan_dir``
and ``glob``, for local paths and object prefixes alike (one LIST of a prefix, at most, per call).
Re-exported by :mod:`memarts.file`, whose client they use."""

import os

from . import file as _file
from ._entries import DirEntry, FileStat, ScanDir, matches, split_pattern
from .errors import NotFoundError


def _relative(base, url):
    base = base.rstrip("/") + "/"
    return url[len(base):] if url.startswith(base) else url.rsplit("/", 1)[-1]


def _canonical(path):
    # The fleet names every cloud scheme s3://; answer in the caller's scheme.
    scheme, sep, rest = path.partition("://")
    return "s3://" + rest if sep else path


def _object_files(url):
    """``(name, size)`` of every object below the prefix `url`, names relative to it, sorted: one
    recursive LIST."""
    base = _canonical(url)
    return sorted((_relative(base, u), size) for u, is_dir, size in _file._fleet().list(url.rstrip("/"), True) if not is_dir)


def _parents(names):
    """Every directory that the relative file names in `names` imply (``a/b/c`` -> ``a``, ``a/b``)."""
    dirs = set()
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            dirs.add("/".join(parts[:depth]))
    return dirs


def list_directory(url, recursive=False, remove_sep=False, skip_file=False, skip_dir=False):
    """Names under `url`: one level (files and directories), or with ``recursive`` every file below
    it (relative paths). ``skip_file`` leaves files out (with ``recursive``: every directory below,
    instead of the files), ``skip_dir`` leaves directories out. Names never end with a separator, so
    ``remove_sep`` (MoXing: strip the trailing ``/`` of directory names) is always in effect."""
    local = _file._local_path(url)
    if local is not None:
        if not recursive:
            names = os.listdir(local)
            if skip_file or skip_dir:
                names = [n for n in names if os.path.isdir(os.path.join(local, n)) != bool(skip_dir)]
            return sorted(names) if not (skip_file and skip_dir) else []
        files, dirs = [], []
        for root, dirnames, filenames in os.walk(local):
            dirs.extend(os.path.relpath(os.path.join(root, d), local) for d in dirnames)
            files.extend(os.path.relpath(os.path.join(root, f), local) for f in filenames)
    else:
        if not recursive:
            base = _canonical(url)
            entries = _file._fleet().list(url.rstrip("/"), False)
            return sorted(
                _relative(base, u) for u, is_dir, _size in entries if not (skip_dir if is_dir else skip_file)
            )
        files = [name for name, _size in _object_files(url)]
        dirs = _parents(files)
    if skip_file:
        return [] if skip_dir else sorted(dirs)
    return sorted(files)


def walk(url, topdown=True, onerror=None, followlinks=False):
    """Like ``os.walk``: yields ``(dirpath, dirnames, filenames)``, top-down unless ``topdown`` is
    False. For local paths all three options are ``os.walk``'s; for objects ``onerror`` and
    ``followlinks`` have no meaning (no listing error is swallowed; there are no links), and the
    tree is listed once, so changing ``dirnames`` in place does not prune it."""
    local = _file._local_path(url)
    if local is not None:
        yield from os.walk(local, topdown=topdown, onerror=onerror, followlinks=followlinks)
        return
    top = url.rstrip("/")
    tree = {"": (set(), [])}
    for name in list_directory(top, recursive=True):
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[: depth - 1])
            tree.setdefault(parent, (set(), []))[0].add(parts[depth - 1])
            tree.setdefault("/".join(parts[:depth]), (set(), []))
        tree.setdefault("/".join(parts[:-1]), (set(), []))[1].append(parts[-1])
    # Sorted relative paths put every directory before what is below it; reversed, after.
    for rel in sorted(tree, reverse=not topdown):
        dirs, files = tree[rel]
        yield (top + "/" + rel if rel else top), sorted(dirs), sorted(files)


def stat(url):
    """A :class:`FileStat` of a file, object or directory: ``length``, ``mtime_nsec``,
    ``is_directory`` (and ``st_size``, ``st_mtime``, ``st_mode`` as ``os.stat`` has). A missing one
    raises ``NotFoundError``, which is also ``MoxFileNotExistsException`` and ``FileNotFoundError``."""
    local = _file._local_path(url)
    if local is not None:
        try:
            st = os.stat(local)
        except FileNotFoundError as e:
            raise NotFoundError(f"{url}: no such file or directory") from e
        return FileStat(st.st_size, st.st_mtime_ns, os.path.isdir(local))
    meta = _file._object_stat(url) if not url.endswith("/") else None
    if meta is not None:
        return FileStat(meta[0], meta[2] * 1_000_000, False)
    if _file.is_directory(url):
        return FileStat(0, 0, True)
    raise NotFoundError(f"{url}: no such object or directory")


def scan_dir(url):
    """Like ``os.scandir``: the entries directly under `url` (``.name``, ``.path``, ``.is_dir()``,
    ``.is_file()``, ``.stat()``), as an iterator that also works in a ``with`` block."""
    local = _file._local_path(url)
    if local is not None:
        return os.scandir(local)
    top = url.rstrip("/")
    base = _canonical(top)
    entries = []
    for u, is_dir, size in sorted(_file._fleet().list(top, False)):
        name = _relative(base, u).rstrip("/")
        entries.append(DirEntry(name, f"{top}/{name}", is_dir, size, stat))
    return ScanDir(entries)


def glob(url):
    """The absolute paths or URLs matching the pattern `url` (``*``, ``?``, ``[...]`` in any
    component but the bucket), sorted, as ``glob.glob`` does for local paths."""
    local = _file._local_path(url)
    if local is not None:
        import glob as _glob

        if url.startswith("file://"):
            return sorted("file://" + p for p in _glob.glob(local))
        return sorted(_glob.glob(local))
    base, parts = split_pattern(url)
    if not parts:
        return [url] if _file.exists(url) else []
    files = list_directory(base, recursive=True)
    candidates = set(files) | _parents(files)
    return sorted(f"{base}/{rel}" for rel in candidates if matches(parts, rel))
