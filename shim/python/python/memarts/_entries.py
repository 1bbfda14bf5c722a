"""What ``stat``, ``scan_dir`` and ``glob`` return or match for objects, shaped like ``os``'s.

Object stores have files (objects) and, implicitly, directories (prefixes with something below
them); these classes give both the attributes MoXing documents (``length``, ``mtime_nsec``,
``is_directory``) and the ``os`` ones (``st_size``, ``st_mtime``, ``st_mode``...), so code written
for either works.
"""

import fnmatch
import stat as _stat

_GLOB_CHARS = set("*?[")


class FileStat:
    """``mox.file.stat`` of an object or prefix, also usable where ``os.stat_result`` is read by
    attribute. Prefixes have size 0 and mtime 0 (an object store keeps no times for them)."""

    def __init__(self, length, mtime_nsec, is_directory):
        self.length = length
        self.mtime_nsec = mtime_nsec
        self.is_directory = is_directory

    @property
    def st_size(self):
        return self.length

    @property
    def st_mtime(self):
        return self.mtime_nsec / 1e9

    @property
    def st_mtime_ns(self):
        return self.mtime_nsec

    st_atime = st_ctime = st_mtime
    st_atime_ns = st_ctime_ns = st_mtime_ns

    @property
    def st_mode(self):
        return (_stat.S_IFDIR | 0o755) if self.is_directory else (_stat.S_IFREG | 0o644)

    st_ino = st_dev = st_uid = st_gid = 0
    st_nlink = 1

    def __repr__(self):
        return f"FileStat(length={self.length}, mtime_nsec={self.mtime_nsec}, is_directory={self.is_directory})"

    def __eq__(self, other):
        return isinstance(other, FileStat) and (self.length, self.mtime_nsec, self.is_directory) == (
            other.length,
            other.mtime_nsec,
            other.is_directory,
        )


class DirEntry:
    """One entry of ``scan_dir`` over an object prefix, like ``os.DirEntry``."""

    def __init__(self, name, path, is_dir, size, stat_of):
        self.name = name
        self.path = path
        self._is_dir = is_dir
        self._size = size
        self._stat_of = stat_of

    def is_dir(self, *, follow_symlinks=True):
        return self._is_dir

    def is_file(self, *, follow_symlinks=True):
        return not self._is_dir

    def is_symlink(self):
        return False

    def stat(self, *, follow_symlinks=True):
        """The entry's :class:`FileStat` (for an object, fetched once: the listing has no mtime)."""
        if self._is_dir:
            return FileStat(0, 0, True)
        return self._stat_of(self.path)

    def inode(self):
        return 0

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return f"<DirEntry {self.name!r}>"


class ScanDir:
    """The iterator ``scan_dir`` returns: entries, usable in a ``with`` block like ``os.scandir``'s."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()
        return False

    def close(self):
        self._it = iter(())


def has_magic(part):
    """Whether a path component holds a glob wildcard."""
    return bool(_GLOB_CHARS & set(part))


def split_pattern(pattern):
    """``(base, parts)``: the longest wildcard-free leading directory of an object URL pattern and
    the components after it (``obs://b/d/*/x?.jpg`` -> ``('obs://b/d', ['*', 'x?.jpg'])``)."""
    scheme, _, rest = pattern.partition("://")
    parts = rest.split("/")
    # The bucket is never a pattern: an object URL names one bucket.
    fixed = 1
    while fixed < len(parts) and not has_magic(parts[fixed]):
        fixed += 1
    return f"{scheme}://" + "/".join(parts[:fixed]), parts[fixed:]


def matches(parts, rel):
    """Whether the relative path `rel` matches the pattern components `parts`, one component for
    one, as ``glob.glob`` does: a ``*`` never crosses a ``/``, and a name starting with ``.`` is
    matched only by a component starting with ``.``."""
    names = rel.split("/")
    if len(names) != len(parts):
        return False
    return all(
        fnmatch.fnmatchcase(n, p) and (not n.startswith(".") or p.startswith("."))
        for n, p in zip(names, parts)
    )
