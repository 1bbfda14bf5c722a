"""Alibaba's OSS connector for AI/ML (``osstorchconnector``) over memarts: ``OssMapDataset``,
``OssIterableDataset`` and ``OssCheckpoint`` with the connector's arguments, so a script written
for it runs with one import changed::

    from memarts.torch import OssMapDataset, OssCheckpoint   # was: from osstorchconnector import ...
    dataset = OssMapDataset.from_prefix("oss://bucket/train/", endpoint=ENDPOINT,
                                        transform=decode, cred_path=CRED_PATH, config_path="config.json")

They are :class:`memarts.torch.MapDataset`, :class:`~memarts.torch.IterableDataset` and
:class:`~memarts.torch.Checkpoint` underneath: every read goes through the node's cache.

- ``endpoint`` (required, as in the connector) and ``cred_path`` (the credentials file, see
  :mod:`memarts._oss_config`) say where the objects are and how to sign for them. memarts holds one
  origin client per process (in proxy mode: per fleet), so they are **process-wide**: in embedded and
  origin modes the first dataset or checkpoint sets ``AWS_ENDPOINT_URL`` and
  ``MEMARTS_CREDENTIALS_FILE`` for the process (and for the DataLoader workers it starts) and
  restarts the in-process engine; another one asking for a different endpoint or credentials file
  in the same process is a :class:`~memarts.errors.ConfigError`. In proxy mode the fleet's
  processes hold the origin client: the endpoint and credentials file must be the ones the fleet
  was started with (read from its ``fleet.json``), else :class:`~memarts.errors.ConfigError` says
  how to start it. Either way the engine re-reads the credentials file when it changes or its
  credential nears ``Expiration``; a file already expired at construction is re-read until it is
  renewed, for up to ``MEMARTS_TIMEOUT`` seconds.
- ``config_path``: ``config.json`` (:mod:`memarts._oss_config`). ``logLevel`` / ``logPath``: the
  ``memarts`` logger writes there at that level. ``auditPath``: requests slower than 100 ms
  (:mod:`memarts._audit`). ``datasetConfig.prefetchConcurrency``: how many objects
  ``OssIterableDataset`` fetches ahead at once. ``checkpointConfig.prefetchConcurrency``: the read-ahead
  window of ``OssCheckpoint.reader``, in chunks (fetched by up to ``MOX_COPY_PARALLEL_THREADS``, 16,
  threads at once: that is process-wide). ``prefetchWorker`` and ``uploadConcurrency`` are
  checked and kept (``.prefetch_worker``, ``.upload_concurrency``) but change nothing: memarts' I/O
  threads release the GIL, so there is no separate pool of "vCPUs" to size, and the fleet uploads
  a checkpoint in 8 MiB parts, 4 at a time, whatever the client asks. Without ``config_path`` no
  log or audit file is written and the defaults apply.
- Errors: a malformed ``config.json`` is an :class:`OssConfigError`, a malformed credentials file a
  :class:`CredentialsFileError` (both :class:`~memarts.errors.ConfigError`, so ``ValueError``); a
  credential still expired when the wait ends is a :class:`CredentialsExpiredError` (a
  :class:`~memarts.errors.PermissionDeniedError`).
- ``transform`` receives an object with ``.read()``, ``.key`` (its ``oss://`` URI), ``.size``,
  ``.label`` (from a manifest), ``seek``/``tell``/``readinto``/``close`` and ``copy()``; the default
  returns it.
"""

import io
import logging

from . import file as _file
from . import torch as _mt
from ._audit import NoAudit
from ._oss_config import (  # noqa: F401  (the errors are part of this module's API)
    CredentialsExpiredError,
    CredentialsFileError,
    OssConfigError,
)
from ._oss_connector import Connector
from .errors import BadRequestError

_log = logging.getLogger("memarts")


def identity(obj):
    """The default transform: the object itself."""
    return obj


def imagenet_manifest_parser(reader):
    """The connector's manifest format: one object a line, ``key<TAB>label`` (the label optional);
    yields ``(key, label)``. Blank lines are skipped."""
    for line in reader.read().decode("utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        key, _, label = line.partition("\t")
        yield key.strip(), label.strip()


class OssDataObject(_mt.DataObject):
    """One object, as the connector's ``DataObject``: ``key`` (the URI), ``size``, ``label``, and a
    binary file over its bytes (``read(n)``, ``readinto``, ``seek``, ``tell``). The bytes are read
    through memarts once, on the first read (timed for the audit log)."""

    __slots__ = ("label", "_size", "_pos", "_audit")

    def __init__(self, url, label="", size=None, audit=None):
        super().__init__(url)
        self.label = label
        self._size = size
        self._pos = 0
        self._audit = audit if audit is not None else NoAudit()

    def _load(self):
        if self._data is None:
            with self._audit.timed("read", self.url) as t:
                t.bytes = len(super()._load())
        return self._data

    def read(self, size=-1):
        """``size`` bytes from the current position (the rest if negative), as a file's ``read``."""
        data = self._load()
        start = self._pos
        end = len(data) if size is None or size < 0 else min(len(data), start + size)
        self._pos = max(start, end)
        return data if start == 0 and end == len(data) else data[start:end]

    def readinto(self, b):
        chunk = self.read(len(memoryview(b)))
        memoryview(b).cast("B")[: len(chunk)] = chunk
        return len(chunk)

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise BadRequestError(f"seek to a negative position in {self.url}")
        self._pos = base + offset
        return self._pos

    def tell(self):
        return self._pos

    @property
    def size(self):
        if self._data is not None:
            return len(self._data)
        if self._size is None:
            self._size = _file.get_size(self.url)
        return self._size

    def copy(self):
        """Another handle on the same bytes, at position 0."""
        other = OssDataObject(self.url, self.label, self._size, self._audit)
        other._data = self._data
        return other

    def close(self):
        self._data = None
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()
        return False

    def __repr__(self):
        return f"OssDataObject({self.url!r}, label={self.label!r})"


class _Objects:
    """A dataset's ``object_type``: the :class:`OssDataObject` of a URL (picklable for workers)."""

    def __init__(self, labels, audit):
        self.labels = labels
        self.audit = audit

    def __call__(self, url):
        return OssDataObject(url, self.labels.get(url, ""), audit=self.audit)


class _FromStart:
    """An iterable dataset's transform: prefetching has read each object; the user's transform
    sees it from its first byte."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, obj):
        obj.seek(0)
        return self.transform(obj)


def _uris(object_uris):
    return [object_uris] if isinstance(object_uris, str) else list(object_uris)


class _OssDataset:
    """The constructors both dataset kinds share (the connector's ``from_*``)."""

    @classmethod
    def from_objects(cls, object_uris, endpoint, *, cred_path="", config_path="", transform=identity):
        """The objects named by ``object_uris`` (one URI or several)."""
        if not object_uris:
            raise BadRequestError("object_uris must be non-empty")
        conn = Connector(endpoint, cred_path, config_path)
        return cls(endpoint, cred_path, config_path, _uris(object_uris), transform, _connector=conn, _how="from_objects")

    @classmethod
    def from_prefix(cls, oss_uri, endpoint, *, cred_path="", config_path="", transform=identity):
        """Every object below the prefix ``oss_uri`` (one listing, now)."""
        if not oss_uri:
            raise BadRequestError("oss_uri must be non-empty")
        conn = Connector(endpoint, cred_path, config_path)
        return cls(endpoint, cred_path, config_path, conn.list_prefix(oss_uri), transform, _connector=conn,
                   _how=f"from_prefix {oss_uri}")

    @classmethod
    def from_manifest_file(cls, manifest_file_path, manifest_parser, oss_base_uri, endpoint, *, cred_path="",
                           config_path="", transform=identity):
        """The objects a manifest lists: ``manifest_parser`` gets a binary file over the manifest
        (an object URI or a local path) and yields ``(key, label)``; each object is
        ``oss_base_uri + key`` and its ``.label`` is ``label``."""
        if not manifest_file_path:
            raise BadRequestError("manifest_file_path must be non-empty")
        if manifest_parser is None:
            raise BadRequestError("manifest_parser must be given (e.g. imagenet_manifest_parser)")
        conn = Connector(endpoint, cred_path, config_path)
        pairs = conn.read_manifest(manifest_file_path, manifest_parser, oss_base_uri or "")
        return cls(endpoint, cred_path, config_path, [u for u, _ in pairs], transform, labels=dict(pairs),
                   _connector=conn, _how=f"from_manifest_file {manifest_file_path}")

    def _connect(self, endpoint, cred_path, config_path, labels, connector, how):
        conn = connector or Connector(endpoint, cred_path, config_path)
        self.endpoint, self.cred_path, self.config_path = conn.endpoint, conn.cred_path, conn.config_path
        self.config = conn.settings
        self.object_type = _Objects(labels or {}, conn.audit)
        _log.info("%s %s: %d objects, endpoint %s, memarts %s mode", type(self).__name__, how, len(self.urls),
                  conn.endpoint, _file.mode())
        return conn


class OssMapDataset(_OssDataset, _mt.MapDataset):
    """The connector's map-style dataset: random access, order and shuffling decided by the
    DataLoader. Build it with ``from_prefix``, ``from_objects`` or ``from_manifest_file``. Items are
    read when the DataLoader asks (``datasetConfig`` applies to :class:`OssIterableDataset`)."""

    def __init__(self, endpoint, cred_path, config_path, object_uris, transform=identity, labels=None, *,
                 _connector=None, _how="from_objects"):
        _mt.MapDataset.__init__(self, _uris(object_uris), transform or identity)
        self._connect(endpoint, cred_path, config_path, labels, _connector, _how)

    def __getitem__(self, index):
        _log.debug("OssMapDataset item %d: %s", index, self.urls[index])
        return super().__getitem__(index)


class OssIterableDataset(_OssDataset, _mt.IterableDataset):
    """The connector's iterable dataset: streams the objects in order, sharded over ranks and
    DataLoader workers, ``datasetConfig.prefetchConcurrency`` (24) objects fetched ahead at once."""

    def __init__(self, endpoint, cred_path, config_path, object_uris, transform=identity, labels=None, *,
                 _connector=None, _how="from_objects"):
        conn = _connector or Connector(endpoint, cred_path, config_path)
        _mt.IterableDataset.__init__(self, _uris(object_uris), _FromStart(transform or identity),
                                     prefetch=conn.settings.dataset.prefetch_concurrency)
        self._connect(endpoint, cred_path, config_path, labels, conn, _how)
        self.prefetch_worker = self.config.dataset.prefetch_worker


class _CheckpointReader(io.BytesIO):
    """What ``OssCheckpoint.reader`` returns: a seekable binary file over the whole checkpoint."""

    def __init__(self, data, key):
        super().__init__(data)
        self.key = key
        self.size = len(data)


class _CheckpointWriter:
    """What ``OssCheckpoint.writer`` returns: memarts' upload-on-close file, its upload timed for the
    audit log."""

    def __init__(self, f, key, audit):
        self._f, self.key, self._audit, self._bytes = f, key, audit, 0

    def write(self, b):
        n = self._f.write(b)
        self._bytes += n if isinstance(n, int) else memoryview(b).nbytes
        return n

    def close(self):
        with self._audit.timed("checkpoint_write", self.key) as t:
            t.bytes = self._bytes
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            return self._f.__exit__(exc_type, exc, tb)  # nothing is uploaded
        with self._audit.timed("checkpoint_write", self.key) as t:
            t.bytes = self._bytes
            return self._f.__exit__(None, None, None)

    def __getattr__(self, name):
        return getattr(self._f, name)


class OssCheckpoint(_mt.Checkpoint):
    """The connector's checkpoint manager: ``with ckpt.reader(uri) as r: torch.load(r)``,
    ``with ckpt.writer(uri) as w: torch.save(state, w)``. A reader holds one version of the
    checkpoint, read with a window of ``checkpointConfig.prefetchConcurrency`` (24) chunks; a writer
    uploads on close (nothing is visible before, nothing if the ``with`` block fails)."""

    def __init__(self, endpoint, cred_path="", config_path=""):
        self._connector = Connector(endpoint, cred_path, config_path)
        self.endpoint = self._connector.endpoint
        self.cred_path, self.config_path = self._connector.cred_path, self._connector.config_path
        ck = self._connector.settings.checkpoint
        self.prefetch_concurrency = ck.prefetch_concurrency
        self.prefetch_worker = ck.prefetch_worker
        self.upload_concurrency = ck.upload_concurrency

    def reader(self, oss_uri):
        audit = self._connector.audit
        with audit.timed("checkpoint_read", oss_uri) as t:
            if _file._local_path(oss_uri) is not None:
                data = super().reader(oss_uri).getvalue()
            else:
                fleet = _file._fleet()
                stream = fleet.open_stream(oss_uri)  # pins one version
                try:
                    stream.set_readahead(self.prefetch_concurrency * fleet.chunk_size)
                    data = stream.read()
                finally:
                    stream.close()
            t.bytes = len(data)
        _log.info("OssCheckpoint read %s: %d bytes", oss_uri, len(data))
        return _CheckpointReader(data, oss_uri)

    def writer(self, oss_uri):
        _log.info("OssCheckpoint writing %s", oss_uri)
        return _CheckpointWriter(super().writer(oss_uri), oss_uri, self._connector.audit)


__all__ = ["OssMapDataset", "OssIterableDataset", "OssCheckpoint", "OssDataObject", "imagenet_manifest_parser",
           "identity", "OssConfigError", "CredentialsFileError", "CredentialsExpiredError"]