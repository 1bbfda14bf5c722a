"""``memarts.torch``: PyTorch datasets and checkpoints over memarts, shaped like Alibaba's OSS
connector (``OssMapDataset``, ``OssIterableDataset``, ``OssCheckpoint``).

``torch`` is imported only here, and only if it is installed: without it the datasets are plain
Python sequences / iterables (useful for tests and for other frameworks).

    from memarts.torch import MapDataset, IterableDataset, Checkpoint
    ds = MapDataset.from_prefix("obs://bucket/train/", transform=decode)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=8)

Each item is ``transform(obj)`` where ``obj`` is a :class:`DataObject` (``.url``, ``.read()``); the
default transform returns the object itself.
"""

import io
import os
from concurrent.futures import ThreadPoolExecutor

from . import file as _file
from .errors import BadRequestError

try:  # pragma: no cover - depends on the environment
    import torch as _torch

    _Dataset = _torch.utils.data.Dataset
    _IterableDataset = _torch.utils.data.IterableDataset
except ImportError:  # torch is optional
    _torch = None
    _Dataset = object
    _IterableDataset = object


class DataObject:
    """One object of a dataset: its URL, and its bytes on demand (read through memarts once)."""

    __slots__ = ("url", "_data")

    def __init__(self, url):
        self.url = url
        self._data = None

    def read(self):
        if self._data is None:
            self._data = _file.read(self.url, binary=True)
        return self._data

    @property
    def key(self):
        return self.url

    def __repr__(self):
        return f"DataObject({self.url!r})"


def _identity(obj):
    return obj


def _list_prefix(prefix):
    base = prefix.rstrip("/")
    return [f"{base}/{name}" for name in _file.list_directory(base, recursive=True)]


def _read_manifest(url):
    """URLs listed in a manifest: one object per line (its first field); keys without a scheme are
    relative to the manifest's directory. No LIST request is made."""
    base = url.rsplit("/", 1)[0]
    urls = []
    for line in _file.read(url).splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        key = fields[0]
        urls.append(key if "://" in key or key.startswith("/") else f"{base}/{key}")
    return urls


class MapDataset(_Dataset):
    """Random access over a fixed list of objects (the DataLoader's sampler shuffles and shards)."""

    #: Makes the object handed to ``transform`` from a URL (a subclass may give its own kind).
    object_type = DataObject

    def __init__(self, urls, transform=None):
        self.urls = list(urls)
        self.transform = transform or _identity

    @classmethod
    def from_prefix(cls, url, transform=None):
        """Every object below a prefix (one LIST of the prefix, up front)."""
        return cls(_list_prefix(url), transform)

    @classmethod
    def from_objects(cls, urls, transform=None):
        return cls(urls, transform)

    @classmethod
    def from_manifest(cls, url, transform=None):
        """Objects listed in a manifest file: no LIST request at all."""
        return cls(_read_manifest(url), transform)

    def __len__(self):
        return len(self.urls)

    def __getitem__(self, index):
        return self.transform(self.object_type(self.urls[index]))


def shard(items, rank, world_size, worker, num_workers):
    """The items one DataLoader worker of one distributed rank iterates over: every
    ``world_size * num_workers``-th item, so that together the shards cover each item exactly once."""
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise BadRequestError(f"shard {rank}/{world_size}, worker {worker}/{num_workers} is out of range")
    stride = world_size * num_workers
    return items[rank * num_workers + worker :: stride]


def _position():
    """(rank, world_size, worker, num_workers) of the calling DataLoader worker."""
    rank, world = 0, 1
    if _torch is not None and _torch.distributed.is_available() and _torch.distributed.is_initialized():
        rank, world = _torch.distributed.get_rank(), _torch.distributed.get_world_size()
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    worker, workers = 0, 1
    if _torch is not None:
        info = _torch.utils.data.get_worker_info()
        if info is not None:
            worker, workers = info.id, info.num_workers
    return rank, world, worker, workers


class IterableDataset(_IterableDataset):
    """Streams a list of objects, sharded across distributed ranks and DataLoader workers, fetching
    up to ``prefetch`` objects ahead in parallel (in order)."""

    #: Makes the object handed to ``transform`` from a URL (a subclass may give its own kind).
    object_type = DataObject

    def __init__(self, urls, transform=None, prefetch=16):
        self.urls = list(urls)
        self.transform = transform or _identity
        self.prefetch = max(1, int(prefetch))

    @classmethod
    def from_prefix(cls, url, transform=None, prefetch=16):
        return cls(_list_prefix(url), transform, prefetch)

    @classmethod
    def from_objects(cls, urls, transform=None, prefetch=16):
        return cls(urls, transform, prefetch)

    @classmethod
    def from_manifest(cls, url, transform=None, prefetch=16):
        return cls(_read_manifest(url), transform, prefetch)

    def shard_urls(self, rank=None, world_size=None, worker=None, num_workers=None):
        """The URLs this (or the given) worker iterates over."""
        pos = _position()
        rank = pos[0] if rank is None else rank
        world_size = pos[1] if world_size is None else world_size
        worker = pos[2] if worker is None else worker
        num_workers = pos[3] if num_workers is None else num_workers
        return shard(self.urls, rank, world_size, worker, num_workers)

    def __iter__(self):
        urls = self.shard_urls()

        def fetch(url):
            obj = self.object_type(url)
            obj.read()
            return obj

        with ThreadPoolExecutor(max_workers=self.prefetch) as pool:
            pending = []
            for url in urls:
                pending.append(pool.submit(fetch, url))
                if len(pending) >= self.prefetch:
                    yield self.transform(pending.pop(0).result())
            for fut in pending:
                yield self.transform(fut.result())


class Checkpoint:
    """Reads and writes checkpoints: ``with ckpt.reader(url) as r: torch.load(r)``;
    ``with ckpt.writer(path) as w: torch.save(state, w)``."""

    def reader(self, url):
        """A seekable binary file over the checkpoint (read through the cache)."""
        return io.BytesIO(_file.read(url, binary=True))

    def writer(self, url):
        """A binary file that becomes the checkpoint when closed (uploaded then, for object URLs)."""
        return _file.File(url, "wb")


# Alibaba's OSS connector names (``endpoint=``, ``cred_path=``, ``config_path=``), from memarts.oss;
# looked up when asked for, since memarts.oss builds on this module.
_OSS_NAMES = ("OssMapDataset", "OssIterableDataset", "OssCheckpoint", "imagenet_manifest_parser")


def __getattr__(name):
    if name in _OSS_NAMES:
        from . import oss

        return getattr(oss, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
