"""``mox.file.shift('os', 'mox')``: the standard library's file functions accept object URLs.

After ``shift('os', 'mox')``, built-in ``open``, ``os.path.exists/isdir/isfile/getsize``,
``os.listdir``, ``os.makedirs``, ``os.mkdir``, ``os.remove``, ``os.unlink``, ``os.rename``,
``os.walk``, ``os.scandir``, ``os.stat``, ``glob.glob`` and ``shutil.copyfile/copy/copytree/rmtree``
send a ``str`` (or path-like) argument starting with ``obs://``, ``s3://``, ``oss://`` or ``s3a://``
to the matching ``mox.file`` function. Every other argument (local paths, ``bytes`` paths, file
descriptors) goes to the original function unchanged, with the same results and exceptions.

The patch is idempotent, lives in the modules themselves (so a forked child has it, and its client
reconnects by itself), and ``shift('mox', 'os')`` puts every original back.
"""

import builtins
import glob
import os
import os.path
import shutil

from ._urls import is_remote

# (module, attribute) -> the original, while shifted.
_originals = {}

# Code asks these sets what a function supports (``os.stat in os.supports_dir_fd``); a wrapper is
# in a set when its original is, so the answers do not change with the shift.
_SUPPORT_SETS = ("supports_dir_fd", "supports_fd", "supports_follow_symlinks", "supports_effective_ids")


def _remote(path):
    """The URL `path` names if it is an object URL, else None (without raising on odd arguments)."""
    if isinstance(path, str):
        url = path
    elif isinstance(path, os.PathLike):
        try:
            url = os.fspath(path)
        except TypeError:
            return None
        if not isinstance(url, str):
            return None
    else:
        return None
    return url if is_remote(url) else None


def _file():
    from . import file

    return file


def _is_object(url):
    return not url.endswith("/") and _file()._object_stat(url) is not None


def _open(original):
    def open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):
        url = _remote(file)
        if url is None:
            return original(file, mode, buffering, encoding, errors, newline, closefd, opener)
        return _file().File(url, mode, encoding=encoding, errors=errors, newline=newline)

    return open


def _one_path(original, on_object):
    """A wrapper sending a first argument that is an object URL to ``on_object(url, *args, **kwargs)``."""

    def wrapper(path, *args, **kwargs):
        url = _remote(path)
        if url is None:
            return original(path, *args, **kwargs)
        return on_object(url, *args, **kwargs)

    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


def _two_paths(original, on_object):
    """A wrapper sending a call where either of the first two arguments is an object URL to
    ``on_object(src, dst, *args, **kwargs)``."""

    def wrapper(src, dst, *args, **kwargs):
        if _remote(src) is None and _remote(dst) is None:
            return original(src, dst, *args, **kwargs)
        return on_object(os.fspath(src), os.fspath(dst), *args, **kwargs)

    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


def _listdir(url):
    if not _file().is_directory(url):
        if _is_object(url):
            raise NotADirectoryError(f"{url}: not a directory")
        raise _not_found(url)
    return _file().list_directory(url)


def _not_found(url):
    from .errors import NotFoundError

    return NotFoundError(f"{url}: no such object or directory")


def _makedirs(url, mode=0o777, exist_ok=False):
    if not exist_ok and _file().exists(url):
        raise FileExistsError(f"{url}: exists")
    _file().make_dirs(url)


def _mkdir(url, mode=0o777, *, dir_fd=None):
    if _file().exists(url):
        raise FileExistsError(f"{url}: exists")
    _file().mk_dir(url)


def _remove(url, *, dir_fd=None):
    if not _is_object(url):
        if _file().is_directory(url):
            raise IsADirectoryError(f"{url}: is a directory")
        raise _not_found(url)
    _file().remove(url)


def _rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
    _file().rename(src, dst)


def _walk(url, topdown=True, onerror=None, followlinks=False):
    return _file().walk(url, topdown=topdown, onerror=onerror, followlinks=followlinks)


def _stat(url, *, dir_fd=None, follow_symlinks=True):
    return _file().stat(url)


def _glob(pattern, *args, **kwargs):
    return _file().glob(pattern)


def _copyfile(src, dst, *, follow_symlinks=True):
    if _file().is_directory(src) and not _is_object(src):
        raise IsADirectoryError(f"{src}: is a directory")
    _file().copy(src, dst)
    return dst


def _copy(src, dst, *, follow_symlinks=True):
    if _file().is_directory(dst):
        dst = dst.rstrip("/") + "/" + src.rstrip("/").rsplit("/", 1)[-1]
    return _copyfile(src, dst)


def _copytree(src, dst, *args, dirs_exist_ok=False, **kwargs):
    if not dirs_exist_ok and _file().exists(dst):
        raise FileExistsError(f"{dst}: exists")
    _file().copy_parallel(src, dst)
    return dst


def _rmtree(url, *args, **kwargs):
    _file().remove(url, recursive=True)


def _isfile(url):
    return _is_object(url)


def _targets():
    """``(module, attribute, make_wrapper)`` for everything the shift replaces."""
    f = _file
    return [
        (builtins, "open", _open),
        (os.path, "exists", lambda o: _one_path(o, lambda u: f().exists(u))),
        (os.path, "isdir", lambda o: _one_path(o, lambda u: f().is_directory(u))),
        (os.path, "isfile", lambda o: _one_path(o, _isfile)),
        (os.path, "getsize", lambda o: _one_path(o, lambda u: f().get_size(u))),
        (os, "listdir", lambda o: _one_path(o, _listdir)),
        (os, "makedirs", lambda o: _one_path(o, _makedirs)),
        (os, "mkdir", lambda o: _one_path(o, _mkdir)),
        (os, "remove", lambda o: _one_path(o, _remove)),
        (os, "unlink", lambda o: _one_path(o, _remove)),
        (os, "rename", lambda o: _two_paths(o, _rename)),
        (os, "walk", lambda o: _one_path(o, _walk)),
        (os, "scandir", lambda o: _one_path(o, lambda u: f().scan_dir(u))),
        (os, "stat", lambda o: _one_path(o, _stat)),
        (glob, "glob", lambda o: _one_path(o, _glob)),
        (shutil, "copyfile", lambda o: _two_paths(o, _copyfile)),
        (shutil, "copy", lambda o: _two_paths(o, _copy)),
        (shutil, "copytree", lambda o: _two_paths(o, _copytree)),
        (shutil, "rmtree", lambda o: _one_path(o, _rmtree)),
    ]


def _supports():
    return [getattr(os, name) for name in _SUPPORT_SETS if isinstance(getattr(os, name, None), set)]


def shift(src="os", dst="mox"):
    """``shift('os', 'mox')`` makes the standard library's file functions accept object URLs (see
    the module); ``shift('mox', 'os')`` undoes it. Both are idempotent. Other pairs raise
    ``ValueError``."""
    if (src, dst) == ("os", "mox"):
        if _originals:
            return
        for module, name, make in _targets():
            original = getattr(module, name)
            wrapper = make(original)
            _originals[(module, name)] = original
            setattr(module, name, wrapper)
            for support in _supports():
                if original in support:
                    support.add(wrapper)
    elif (src, dst) == ("mox", "os"):
        for (module, name), original in _originals.items():
            wrapper = getattr(module, name)
            setattr(module, name, original)
            for support in _supports():
                if wrapper is not original:
                    support.discard(wrapper)
        _originals.clear()
    else:
        raise ValueError(f"shift({src!r}, {dst!r}): use shift('os', 'mox') or shift('mox', 'os')")


def is_shifted():
    """Whether ``shift('os', 'mox')`` is in effect."""
    return bool(_originals)
