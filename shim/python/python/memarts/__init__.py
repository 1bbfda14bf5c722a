"""memarts: a near-compute cache for training data, with the MoXing file API.

Existing MoXing scripts run unchanged: ``import moxing as mox`` (the ``moxing`` package in the same
wheel) and ``import memarts as mox`` give the same ``mox.file``::

    import memarts as mox
    data = mox.file.read('obs://bucket/dir/a.jpg', binary=True)

The heavy work happens in the node's proxy fleet (``memarts start_proxy N``); this package is the
light client every worker loads.
"""

from . import errors, file
from .errors import Error

__all__ = ["Error", "errors", "file", "stats"]


def stats():
    """Cache counters of the memarts this process uses (the fleet's slots, or the in-process engine),
    summed: ``hits``, ``misses``, ``bytes_from_cache``, ``bytes_from_origin``, ``origin_requests``,
    ``cached_chunks``, ``cache_bytes_used``, ``slots_down``."""
    return file._fleet().stats()
