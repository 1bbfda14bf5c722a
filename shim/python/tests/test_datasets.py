"""memarts.torch datasets and checkpoints (without torch: they are plain sequences and iterables)."""

import io
import pickle

import pytest

from memarts import errors
from memarts.torch import Checkpoint, IterableDataset, MapDataset, shard
from conftest import pattern


def test_shards_cover_every_item_exactly_once():
    items = list(range(103))
    for world in (1, 2, 3):
        for workers in (1, 4):
            seen = []
            for rank in range(world):
                for worker in range(workers):
                    part = shard(items, rank, world, worker, workers)
                    assert abs(len(part) - len(items) / (world * workers)) <= 1
                    seen.extend(part)
            assert sorted(seen) == items
    with pytest.raises(errors.BadRequestError):
        shard(items, 2, 2, 0, 1)


def test_map_dataset_from_prefix_objects_and_manifest(s3, bucket):
    data = {f"train/{i:02d}.bin": pattern(200 + i, 100 + i) for i in range(12)}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    s3.put_object(Bucket=bucket, Key="lists/val.txt", Body=b"../train/03.bin extra\n# comment\n\n../train/07.bin\n")
    ds = MapDataset.from_prefix(f"obs://{bucket}/train/", transform=lambda o: (o.url, o.read()))
    assert len(ds) == 12
    assert ds[3] == (f"obs://{bucket}/train/03.bin", data["train/03.bin"])
    ds = MapDataset.from_objects([f"obs://{bucket}/train/05.bin"], transform=lambda o: o.read())
    assert ds[0] == data["train/05.bin"]
    ds = MapDataset.from_manifest(f"obs://{bucket}/lists/val.txt")
    assert [o.url for o in (ds[0], ds[1])] == [f"obs://{bucket}/lists/../train/03.bin", f"obs://{bucket}/lists/../train/07.bin"]


def test_iterable_dataset_shards_and_prefetches_in_order(s3, bucket):
    data = {f"it/{i:02d}": pattern(300 + i, 50) for i in range(20)}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    ds = IterableDataset.from_prefix(f"obs://{bucket}/it", transform=lambda o: o.read(), prefetch=4)
    assert list(ds) == [data[k] for k in sorted(data)]
    part = ds.shard_urls(rank=1, world_size=2, worker=0, num_workers=2)
    assert part == [f"obs://{bucket}/it/{i:02d}" for i in range(2, 20, 4)]


def test_checkpoint_round_trip(s3, bucket, tmp_path):
    state = {"w": list(range(1000)), "step": 7}
    path = str(tmp_path / "ckpt.pkl")
    ckpt = Checkpoint()
    with ckpt.writer(path) as w:
        pickle.dump(state, w)
    with ckpt.reader(path) as r:
        assert pickle.load(r) == state
    s3.put_object(Bucket=bucket, Key="ckpt/model.pkl", Body=pickle.dumps(state))
    with ckpt.reader(f"obs://{bucket}/ckpt/model.pkl") as r:
        assert isinstance(r, io.BufferedIOBase) or hasattr(r, "seek")
        assert pickle.load(r) == state
    with ckpt.writer(f"obs://{bucket}/ckpt/new.pkl") as w:
        pickle.dump(state, w)
    with ckpt.reader(f"obs://{bucket}/ckpt/new.pkl") as r:
        assert pickle.load(r) == state
