"""Prefetch in ``memarts.torch``: the dataset's sampler hints the items that come next and the fleet
fetches them ahead, so that the DataLoader workers' reads are hits, with one origin GET per chunk;
shuffled order, ``set_epoch``, several ranks and a wrapped ``DistributedSampler`` all work."""

import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import memarts
from memarts.torch import IterableDataset, MapDataset, PrefetchSampler, ShardedOrder
from conftest import pattern

# Four workers on a two-core machine is the point of the test, not a mistake.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

CHUNK = 64 << 10  # MOX_FILE_CHUNK_SIZE of the test session (conftest)


def _sample(obj):
    return obj.url, torch.frombuffer(bytearray(obj.read()), dtype=torch.uint8)


def _dataset(s3, bucket, prefix, n, size=lambda i: 1000 + 1201 * i):
    data = {f"obs://{bucket}/{prefix}/{i:03d}.bin": pattern(3100 + i, size(i)) for i in range(n)}
    for url, body in data.items():
        s3.put_object(Bucket=bucket, Key=url.split("/", 3)[3], Body=body)
    return data


def _check_epoch(batches, data):
    seen = []
    for batch in batches:
        for url, tensor in batch:
            assert bytes(tensor.numpy()) == data[url], url
            seen.append(url)
    assert len(seen) == len(set(seen)), "an item was delivered twice"
    return seen


def _chunk_files():
    """Chunk files in the session's cache dir (directories not counted)."""
    root = os.path.join(os.environ["MEMARTS_CACHE_DIR"], "v1", "chunks")
    return sum(len(files) for _, _, files in os.walk(root))


class _WaitForFiles:
    """worker_init_fn: a worker starts reading only once ``n`` chunk files are in the cache, as a
    worker busy with its first steps would while the fleet fetches ahead."""

    def __init__(self, n):
        self.n = n

    def __call__(self, _worker):
        deadline = time.time() + 30
        while _chunk_files() < self.n and time.time() < deadline:
            time.sleep(0.02)


def test_dataloader_four_workers_shuffled_over_a_cold_prefix_reads_prefetched_hits(s3, bucket, fleet):
    data = _dataset(s3, bucket, "cold", 48)  # all under one chunk: one GET each
    ds = MapDataset.from_prefix(f"obs://{bucket}/cold/", transform=_sample)
    before, files = memarts.stats(), _chunk_files()
    sampler = ds.sampler(shuffle=True, seed=7)
    loader = DataLoader(
        ds, sampler=sampler, batch_size=4, num_workers=4, collate_fn=list, worker_init_fn=_WaitForFiles(files + 48)
    )
    seen = _check_epoch(loader, data)
    assert sorted(seen) == sorted(data), "every item exactly once"
    assert seen != sorted(seen), "the order was shuffled"
    after = memarts.stats()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["prefetch_hinted"] == 48, delta
    assert delta["prefetched"] == 48 and delta["prefetch_failed"] == 0, delta
    if fleet.mode == "proxy":  # the fleet's counters see the workers' reads; an in-process engine, only ours
        assert delta["hits"] == 48, f"the workers' reads were not all hits: {delta}"
        assert fleet.gets(bucket) == 48, "one GET per chunk"


def test_multi_chunk_objects_cost_one_get_per_chunk(s3, bucket, fleet):
    data = _dataset(s3, bucket, "big", 12, size=lambda i: 2 * CHUNK + 1 + 333 * i)
    ds = MapDataset.from_prefix(f"obs://{bucket}/big/", transform=_sample)
    loader = DataLoader(ds, sampler=ds.sampler(shuffle=True, seed=1), batch_size=3, num_workers=4, collate_fn=list)
    assert sorted(_check_epoch(loader, data)) == sorted(data)
    if fleet.mode == "proxy":
        assert fleet.gets(bucket) == 12 * 3, "a chunk was fetched twice"


def test_the_first_items_are_hinted_when_the_sampler_is_made_and_at_each_set_epoch(s3, bucket, fleet):
    _dataset(s3, bucket, "early", 24)
    ds = MapDataset.from_prefix(f"obs://{bucket}/early/", transform=_sample)

    def hinted():
        return memarts.stats()["prefetch_hinted"]

    before = hinted()
    sampler = ds.sampler(shuffle=True, seed=2, ahead=8, rank=0, world_size=1)
    assert hinted() - before == 8, "the epoch's first items, before any DataLoader draws them"
    # The DataLoader's draw continues the early one: the order is the epoch's, each item hinted once.
    assert list(sampler) == list(ShardedOrder(24, shuffle=True, seed=2, rank=0, world_size=1))
    assert hinted() - before == 24
    sampler.set_epoch(1)
    assert hinted() - before == 32
    epoch1 = ShardedOrder(24, shuffle=True, seed=2, rank=0, world_size=1)
    epoch1.set_epoch(1)
    assert list(sampler) == list(epoch1)
    assert hinted() - before == 48
    # Iterated again without set_epoch: the same order, drawn (and hinted) anew.
    assert list(sampler) == list(epoch1)
    assert hinted() - before == 72
    # An order drawn from torch's generator at iteration is not drawn ahead of it.
    PrefetchSampler(torch.utils.data.RandomSampler(ds), ds, ahead=8)
    assert hinted() - before == 72


def test_set_epoch_changes_the_order_and_two_ranks_cover_the_dataset_once(s3, bucket, fleet):
    data = _dataset(s3, bucket, "ranks", 30)
    ds = MapDataset.from_prefix(f"obs://{bucket}/ranks/", transform=_sample)
    s = ds.sampler(shuffle=True, seed=3, rank=0, world_size=1)
    first = list(s)
    assert list(s) == first, "the same epoch, the same order"
    s.set_epoch(1)
    second = list(s)
    assert second != first and sorted(second) == sorted(first) == list(range(30))

    union = []
    for rank in range(2):
        sampler = ds.sampler(shuffle=True, seed=3, rank=rank, world_size=2)
        sampler.set_epoch(4)
        assert len(sampler) == 15
        loader = DataLoader(ds, sampler=sampler, batch_size=5, num_workers=2, collate_fn=list)
        union += _check_epoch(loader, data)
    assert sorted(union) == sorted(data), "two ranks cover the dataset exactly once"
    stats = memarts.stats()
    assert stats["prefetch_hinted"] >= 30 + 30 and stats["prefetch_failed"] == 0, stats


def test_sharded_order_matches_distributed_sampler_semantics_and_wraps_any_sampler(s3, bucket, fleet):
    # Padding as DistributedSampler pads: 10 items over 3 ranks is 4 each, the first two again.
    orders = [list(ShardedOrder(10, shuffle=False, rank=r, world_size=3)) for r in range(3)]
    assert orders == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert [len(ShardedOrder(10, drop_last=True, rank=r, world_size=3)) for r in range(3)] == [3, 3, 3]
    with pytest.raises(memarts.errors.BadRequestError):
        ShardedOrder(10, rank=2, world_size=2)
    os.environ.update(RANK="1", WORLD_SIZE="2")
    try:
        assert list(ShardedOrder(4, shuffle=False)) == [1, 3], "rank from RANK / WORLD_SIZE"
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]

    data = _dataset(s3, bucket, "wrapped", 16)
    ds = MapDataset.from_prefix(f"obs://{bucket}/wrapped/", transform=_sample)
    union = []
    for rank in range(2):
        sampler = PrefetchSampler(DistributedSampler(ds, num_replicas=2, rank=rank, seed=5), ds, ahead=4)
        sampler.set_epoch(2)
        assert sampler.sampler.epoch == 2, "set_epoch is forwarded"
        loader = DataLoader(ds, sampler=sampler, batch_size=4, num_workers=2, collate_fn=list)
        union += _check_epoch(loader, data)
    assert sorted(union) == sorted(data)


def test_getitems_reads_a_batch_in_parallel_in_order(s3, bucket, fleet):
    data = _dataset(s3, bucket, "batch", 8)
    ds = MapDataset.from_prefix(f"obs://{bucket}/batch/", transform=_sample)
    items = ds.__getitems__([5, 0, 3])
    assert [url for url, _ in items] == [ds.urls[5], ds.urls[0], ds.urls[3]]
    for url, tensor in items:
        assert bytes(tensor.numpy()) == data[url]


def test_iterable_dataset_workers_hint_their_shards(s3, bucket, fleet):
    data = _dataset(s3, bucket, "stream", 40)
    before = memarts.stats()
    ds = IterableDataset.from_prefix(f"obs://{bucket}/stream", transform=_sample, prefetch=2, ahead=8)
    loader = DataLoader(ds, batch_size=None, num_workers=4)
    seen = _check_epoch(([item] for item in loader), data)
    assert sorted(seen) == sorted(data)
    if fleet.mode == "proxy":
        after = memarts.stats()
        assert after["prefetch_hinted"] - before["prefetch_hinted"] == 40
        assert fleet.gets(bucket) == 40, "one GET per chunk"


def test_hints_for_local_paths_and_garbage_never_fail(tmp_path, fleet):
    local = tmp_path / "a.bin"
    local.write_bytes(b"x")
    assert memarts.prefetch([str(local)]) == 0, "local paths are read directly: nothing to hint"
    ds = MapDataset([str(local)])
    assert list(ds.sampler(shuffle=False)) == [0]


def test_copy_parallel_hints_what_it_copies_next_and_fetches_each_chunk_once(s3, bucket, fleet, tmp_path):
    data = _dataset(s3, bucket, "tree", 40, size=lambda i: 900 + 2003 * i)  # up to 2 chunks each
    chunks = sum(-(-len(body) // CHUNK) for body in data.values())
    before = memarts.stats()
    memarts.file.copy_parallel(f"obs://{bucket}/tree", str(tmp_path / "out"), threads=2)
    for url, body in data.items():
        assert (tmp_path / "out" / url.rsplit("/", 1)[1]).read_bytes() == body, url
    after = memarts.stats()
    assert after["prefetched"] - before["prefetched"] > 0, "copy_parallel hinted nothing"
    if memarts.file.mode() == "proxy":
        assert fleet.gets(bucket) == chunks, "a chunk was fetched twice"
