"""memarts: a near-compute cache for training data, with the MoXing file API.

Existing MoXing scripts run unchanged: ``import moxing as mox`` (the ``moxing`` package in the same
wheel) and ``import memarts as mox`` give the same ``mox.file``::

    import memarts as mox
    data = mox.file.read('obs://bucket/dir/a.jpg', binary=True)

The heavy work happens in the node's proxy fleet (``memarts start_proxy N``); this package is the
light client every worker loads. pandas, pyarrow and other fsspec users read ``memarts://`` URLs
through :mod:`memarts.fsspec` (which ``MEMARTS_FSSPEC_ROUTE`` imports here, to route ``s3://``...).
"""

from . import errors, file
from .errors import Error

__all__ = ["Error", "errors", "file", "prefetch", "stats"]


def stats():
    """Cache counters of the memarts this process uses (the fleet's slots, or the in-process engine),
    summed: ``hits``, ``misses``, ``bytes_from_cache``, ``bytes_from_origin``, ``origin_requests``,
    ``cached_chunks``, ``cache_bytes_used``, ``slots_down``; and what prefetching did:
    ``prefetch_hinted``, ``prefetched`` (objects fetched ahead), ``prefetched_chunks``,
    ``prefetch_skipped_cached``, ``prefetch_dropped``, ``prefetch_throttled``, ``prefetch_failed``,
    ``prefetch_queued``, ``prefetch_inflight``, ``prefetch_limit``, ``prefetch_unsupported``; and this
    process's local reads (warm chunks read straight from their files, with no request to a proxy;
    the slots count them in ``hits`` once reported, which this call does first): ``local_hits``,
    ``local_bytes``, ``local_fallbacks`` (looked for on disk, read through a proxy),
    ``local_corrupt`` (files that failed their checks: never served, refetched) and
    ``local_resident`` (of the hits, chunks their slot held resident: locked in memory and checked
    once, so not checked again)."""
    return file._fleet().stats()


def prefetch(urls):
    """Hints that ``urls`` will be read soon: the fleet fetches them ahead, each on the slot its read
    will go to, so that the read is a hit. Returns how many were queued (objects already cached are
    not). Best effort: local paths are skipped (they are read directly), and a slot that is down or
    too old to take hints only loses its hints. In embedded mode the in-process engine fetches them
    into the shared cache dir; in origin mode (nothing is cached) hints do nothing."""
    remote = [u for u in urls if file._local_path(u) is None]
    if not remote:
        return 0
    return file._fleet().prefetch(remote)


if file._settings["fsspec_route"]:
    # MEMARTS_FSSPEC_ROUTE: fsspec reads those URLs through memarts in any process that imports
    # memarts (fsspec itself imports only what a memarts:// URL needs). Needs fsspec installed.
    from . import fsspec  # noqa: F401  (routes when imported)
