"""``memarts.torch``: PyTorch datasets and checkpoints over memarts, shaped like Alibaba's OSS
connector (``OssMapDataset``, ``OssIterableDataset``, ``OssCheckpoint``).

``torch`` is imported only here, and only if it is installed: without it the datasets are plain
Python sequences / iterables (useful for tests and for other frameworks).

    from memarts.torch import MapDataset, IterableDataset, Checkpoint
    ds = MapDataset.from_prefix("obs://bucket/train/", transform=decode)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=8)

Each item is ``transform(obj)`` where ``obj`` is a :class:`DataObject` (``.url``, ``.read()``); the
default transform returns the object itself.

Prefetch: the datasets know which items come next, and the node's fleet fetches them ahead, so a
worker's read is a hit by the time it asks. For a map-style dataset the order is the sampler's,
drawn in the DataLoader's main process: pass the dataset's own sampler, nothing else changes::

    loader = DataLoader(ds, sampler=ds.sampler(shuffle=True, seed=0), batch_size=64, num_workers=8)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)   # a new order each epoch, as with DistributedSampler
        ...

``ds.sampler()`` has ``DistributedSampler``'s semantics (rank and world size from
``torch.distributed``, else ``RANK`` / ``WORLD_SIZE``; ``shuffle``, ``seed``, ``drop_last``,
``set_epoch``) and hints the next ``ahead`` items (default 256) to the fleet as the DataLoader draws
indices (the epoch's first ones already when it is made and at each ``set_epoch``). Any other sampler gets the same with ``PrefetchSampler(sampler, ds)`` (it forwards
``set_epoch``), e.g. ``PrefetchSampler(DistributedSampler(ds), ds)``. ``MapDataset.__getitems__``
reads a batch's items in parallel (torch >= 2 calls it for batched fetches). An
:class:`IterableDataset` worker hints its own shard ahead of its reads.

The fleet fetches each hinted object once, on the slot the read will go to, with an adaptive number
in flight (fewer when the object store answers 503 SlowDown); reads that arrive first join the
fetch; hints only reach a bounded window ahead, so prefetched data evicts only what those reads
would. ``memarts.stats()`` shows ``prefetched``, ``prefetch_skipped_cached``... In embedded mode the
process that draws the order (the main process) fetches into the shared cache dir; in origin mode
hints do nothing.
"""

import collections
import io
import itertools
import math
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from . import file as _file
from .errors import BadRequestError, Error

try:  # pragma: no cover - depends on the environment
    import torch as _torch

    _Dataset = _torch.utils.data.Dataset
    _IterableDataset = _torch.utils.data.IterableDataset
    _Sampler = _torch.utils.data.Sampler
except ImportError:  # torch is optional
    _torch = None
    _Dataset = object
    _IterableDataset = object
    _Sampler = object

#: Hints that could not be sent (a malformed URL, memarts unreachable): prefetch is best effort.
hint_errors = 0


def _hint(urls):
    """Sends prefetch hints for ``urls``; never raises."""
    global hint_errors
    if not urls:
        return 0
    from . import prefetch

    try:
        return prefetch(urls)
    except Error:
        hint_errors += 1
        return 0


_pool = None
_pool_pid = None
_pool_lock = threading.Lock()


def _batch_pool():
    """Threads of this process that read a batch's items in parallel (new after a fork: a child
    does not inherit the parent's threads)."""
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool_pid != os.getpid():
                _pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="memarts-batch")
                _pool_pid = os.getpid()
    return _pool


class DataObject:
    """One object of a dataset: its URL, and its bytes on demand (read through memarts once)."""

    __slots__ = ("url", "_data")

    def __init__(self, url):
        self.url = url
        self._data = None

    def read(self):
        return self._load()

    def _load(self):
        """The bytes, read through memarts the first time (a batch read loads them ahead of the
        transform without moving a file-like subclass's position)."""
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

    def __getitems__(self, indices):
        """A batch's items (torch >= 2 asks for a batch at once): their objects are read in
        parallel, then transformed in order."""
        objs = [self.object_type(self.urls[i]) for i in indices]
        if len(objs) > 1:
            list(_batch_pool().map(lambda obj: obj._load(), objs))
        return [self.transform(obj) for obj in objs]

    def prefetch_urls(self, indices):
        """The URLs of items ``indices`` (what a :class:`PrefetchSampler` hints)."""
        return [self.urls[i] for i in indices]

    def sampler(self, shuffle=True, seed=0, drop_last=False, ahead=256, rank=None, world_size=None):
        """A sampler over this dataset with ``DistributedSampler``'s semantics (this rank's share of
        a per-epoch order; ``set_epoch``) that hints the next ``ahead`` items to the fleet as the
        DataLoader draws them, and the epoch's first ``ahead`` as soon as it is made and at each
        ``set_epoch`` (see :class:`PrefetchSampler`): ``DataLoader(ds, sampler=ds.sampler(shuffle=True), ...)``."""
        order = ShardedOrder(len(self), shuffle, seed, drop_last, rank, world_size)
        return PrefetchSampler(order, self, ahead)


def shard(items, rank, world_size, worker, num_workers):
    """The items one DataLoader worker of one distributed rank iterates over: every
    ``world_size * num_workers``-th item, so that together the shards cover each item exactly once."""
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise BadRequestError(f"shard {rank}/{world_size}, worker {worker}/{num_workers} is out of range")
    stride = world_size * num_workers
    return items[rank * num_workers + worker :: stride]


def _rank_world():
    """(rank, world_size) of this process: ``torch.distributed`` if initialised, else ``RANK`` and
    ``WORLD_SIZE``."""
    if _torch is not None and _torch.distributed.is_available() and _torch.distributed.is_initialized():
        return _torch.distributed.get_rank(), _torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _position():
    """(rank, world_size, worker, num_workers) of the calling DataLoader worker."""
    rank, world = _rank_world()
    worker, workers = 0, 1
    if _torch is not None:
        info = _torch.utils.data.get_worker_info()
        if info is not None:
            worker, workers = info.id, info.num_workers
    return rank, world, worker, workers


class ShardedOrder(_Sampler):
    """This rank's indices of a dataset of ``n`` items, as ``torch.utils.data.DistributedSampler``
    draws them (without needing torch): every epoch a permutation seeded by ``seed + epoch``
    (``shuffle``), padded by repeating its start so that every rank gets as many (or, with
    ``drop_last``, cut), then every ``world_size``-th index from ``rank``."""

    def __init__(self, n, shuffle=True, seed=0, drop_last=False, rank=None, world_size=None):
        found_rank, found_world = _rank_world()
        self.rank = found_rank if rank is None else int(rank)
        self.world_size = found_world if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise BadRequestError(f"rank {self.rank} is outside a world of {self.world_size}")
        self.n, self.shuffle, self.seed, self.drop_last = int(n), bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        if self.drop_last and self.n % self.world_size:
            self.num_samples = math.ceil((self.n - self.world_size) / self.world_size)
        else:
            self.num_samples = math.ceil(self.n / self.world_size)
        self.total_size = self.num_samples * self.world_size

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        indices = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        if not self.drop_last and indices:
            pad = self.total_size - len(indices)
            indices += (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.world_size])


def _flat(items):
    """Indices out of what a sampler yields: single indices, or lists of them (a batch sampler)."""
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from item
        else:
            yield item


def _seeded(sampler):
    """Whether ``sampler``'s order is a function of its seed and epoch alone (our
    :class:`ShardedOrder`, torch's ``DistributedSampler``): then drawing it ahead of the DataLoader
    gives the order the DataLoader would draw. Any other (``RandomSampler`` takes its seed from
    torch's generator when iterated) is drawn only when the DataLoader asks."""
    if isinstance(sampler, ShardedOrder):
        return True
    return _torch is not None and isinstance(sampler, _torch.utils.data.DistributedSampler)


class PrefetchSampler(_Sampler):
    """Wraps any sampler (or batch sampler) of ``dataset``: yields what it yields, in the same
    order, and hints the next ``ahead`` indices' objects to the fleet as they are drawn (hints go
    in groups, every ``ahead // 8`` items). ``set_epoch`` is forwarded. ``dataset`` needs
    ``prefetch_urls(indices)`` (a :class:`MapDataset` has it) or a ``urls`` list.

    For an order that depends on its seed and epoch alone (:class:`ShardedOrder`, what
    ``MapDataset.sampler`` makes, or ``DistributedSampler``), the first ``ahead`` items of the epoch
    are drawn and hinted as soon as the sampler is made and at every ``set_epoch``: they are on
    their way while the DataLoader starts its worker processes (tens of ms each) and while the
    training script does whatever it does before its first batch. The DataLoader's iteration
    then continues that same draw."""

    def __init__(self, sampler, dataset, ahead=256):
        self.sampler = sampler
        self.dataset = dataset
        self.ahead = max(1, int(ahead))
        #: (epoch, the items drawn and hinted, the rest of that draw) ahead of the DataLoader.
        self._early = None
        self._hint_early()

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self._hint_early()

    def _hint_early(self):
        self._early = None
        if not _seeded(self.sampler):
            return
        rest = iter(self.sampler)
        drawn = list(itertools.islice(rest, self.ahead))
        _hint(self._urls(drawn))
        self._early = (getattr(self.sampler, "epoch", None), drawn, rest)

    def _start(self):
        """The epoch's draw (its items, whether they were hinted already): the one started early
        if it is still this epoch's, else a new one."""
        early, self._early = self._early, None
        if early is not None and early[0] == getattr(self.sampler, "epoch", None):
            return itertools.chain(early[1], early[2]), len(early[1])
        return iter(self.sampler), 0

    def __len__(self):
        return len(self.sampler)

    def _urls(self, items):
        indices = list(_flat(items))
        if hasattr(self.dataset, "prefetch_urls"):
            return self.dataset.prefetch_urls(indices)
        return [self.dataset.urls[i] for i in indices]

    def __iter__(self):
        source, hinted = self._start()
        window = collections.deque()
        step = max(1, self.ahead // 8)
        done = False

        def refill():
            nonlocal done, hinted
            drawn = []
            while not done and len(window) < self.ahead:
                try:
                    item = next(source)
                except StopIteration:
                    done = True
                    break
                window.append(item)
                drawn.append(item)
            # The first items of an early draw were hinted when it was made.
            skip = min(hinted, len(drawn))
            hinted -= skip
            _hint(self._urls(drawn[skip:]))

        refill()
        while window:
            yield window.popleft()
            if not done and len(window) <= self.ahead - step:
                refill()


class IterableDataset(_IterableDataset):
    """Streams a list of objects, sharded across distributed ranks and DataLoader workers, reading
    up to ``prefetch`` objects ahead in parallel (in order), and hinting the next ``ahead`` objects
    of its shard to the fleet, which fetches them before they are read (0: no hints)."""

    #: Makes the object handed to ``transform`` from a URL (a subclass may give its own kind).
    object_type = DataObject

    def __init__(self, urls, transform=None, prefetch=16, ahead=256):
        self.urls = list(urls)
        self.transform = transform or _identity
        self.prefetch = max(1, int(prefetch))
        self.ahead = max(0, int(ahead))

    @classmethod
    def from_prefix(cls, url, transform=None, prefetch=16, ahead=256):
        return cls(_list_prefix(url), transform, prefetch, ahead)

    @classmethod
    def from_objects(cls, urls, transform=None, prefetch=16, ahead=256):
        return cls(urls, transform, prefetch, ahead)

    @classmethod
    def from_manifest(cls, url, transform=None, prefetch=16, ahead=256):
        return cls(_read_manifest(url), transform, prefetch, ahead)

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
            obj._load()
            return obj

        hinted = 0
        step = max(1, self.ahead // 8)
        with ThreadPoolExecutor(max_workers=self.prefetch) as pool:
            pending = []
            for i, url in enumerate(urls):
                if self.ahead and hinted < len(urls) and hinted - i <= self.ahead - step:
                    end = min(len(urls), i + self.ahead)
                    _hint(urls[hinted:end])
                    hinted = end
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
