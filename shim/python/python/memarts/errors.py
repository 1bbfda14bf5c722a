"""Exceptions raised by memarts, one per error code of the wire protocol.

Every class derives from :class:`Error`; the ones with an obvious Python counterpart also derive from
it, so ``except FileNotFoundError`` works for a missing object just as it does for a missing file.
They also derive from MoXing's documented exception classes (defined here, re-exported as
``mox.file.MoxFileNotExistsException``...), so a script's ``except`` clauses written for MoXing catch
the same failures: a missing object is a :class:`MoxFileNotExistsException`, a
:class:`MoxFileRespException` and a ``FileNotFoundError`` at once.
"""


class MoxFileNotExistsException(Exception):
    """MoXing's: the file or object does not exist (e.g. ``mox.file.stat`` of a missing object)."""


class MoxFileNameDuplicateException(Exception):
    """MoXing's: ``copy_parallel`` to a local directory met a name that is both an object and a
    prefix (``a`` and ``a/b``), which an object store allows and a file system does not. Raised
    before anything is copied."""


class _MoxFileBaseRespException(Exception):
    """MoXing's base of the exceptions about an origin response. ``resp`` is None here: memarts
    answers with a typed error and a message, not the HTTP response."""

    resp = None


class MoxFileReadException(_MoxFileBaseRespException):
    """MoXing's: reading a response that had started well failed (here: the object changed while
    it was read, or cached data is corrupt with no origin copy)."""


class MoxFileRespException(_MoxFileBaseRespException):
    """MoXing's: the object store answered with an error (HTTP status >= 300)."""


class Error(Exception):
    """Base class of every memarts error."""


class NotFoundError(Error, MoxFileNotExistsException, MoxFileRespException, FileNotFoundError):
    """The object (or prefix) does not exist."""


class StaleError(Error, MoxFileReadException):
    """The object changed at the origin while it was being read; read it again."""


class PermissionDeniedError(Error, MoxFileRespException, PermissionError):
    """The origin refused the credentials, or this user may not use the fleet."""


class UntrustedFleetError(PermissionDeniedError):
    """The fleet in the run dir is not one this user trusts: its run dir or a proxy belongs to
    another user (who could serve this job their own bytes), or others can write to its run dir.
    Nothing was read from it or sent to it. The message names the run dir, its owner and the fix
    (your own ``MEMARTS_RUN_DIR``, or ``MEMARTS_TRUSTED_UIDS`` for a system fleet you trust)."""


class OriginError(Error, MoxFileRespException, OSError):
    """The object store failed after every retry."""


class CorruptError(Error, MoxFileReadException):
    """Cached data failed its checksum and there is no origin copy to replace it."""


class NoSpaceError(Error, OSError):
    """The cache has no room for the data."""


class BadRequestError(Error, ValueError):
    """A malformed URL, chunk size or range."""


class UnavailableError(Error, ConnectionError):
    """No fleet answered before the deadline (``MEMARTS_TIMEOUT``)."""


class InternalError(Error):
    """A bug or unexpected failure inside a proxy."""


class ProtocolError(Error):
    """A proxy answered something this client cannot understand (version mismatch?)."""


class ConfigError(Error, ValueError):
    """An environment variable or argument is malformed."""


class IoError(Error, OSError):
    """A local I/O failure."""
