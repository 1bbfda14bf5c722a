"""memarts.torch under real PyTorch (``make deps-test`` installs it): DataLoaders with four worker
processes over both dataset kinds, and a checkpoint round trip through ``torch.save`` / ``torch.load``."""

import os

import pytest
import torch
from torch.utils.data import DataLoader

import memarts as mox
from memarts.torch import Checkpoint, IterableDataset, MapDataset
from conftest import pattern

# Four workers on a two-core machine is the point of the test, not a mistake.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _sample(obj):
    """A training sample: where it came from, which worker decoded it, and its bytes as a tensor."""
    return obj.url, os.getpid(), torch.frombuffer(bytearray(obj.read()), dtype=torch.uint8)


def _dataset(s3, bucket, prefix, n):
    data = {f"obs://{bucket}/{prefix}/{i:03d}.bin": pattern(900 + i, 3000 + 517 * i) for i in range(n)}
    for url, body in data.items():
        s3.put_object(Bucket=bucket, Key=url.split("/", 3)[3], Body=body)
    return data


def _check_epoch(batches, data):
    seen = {}
    for batch in batches:
        for url, pid, tensor in batch:
            assert url not in seen, f"{url} delivered twice"
            seen[url] = pid
            assert bytes(tensor.numpy()) == data[url], url
    assert sorted(seen) == sorted(data)
    return set(seen.values())


def test_dataloader_with_four_workers_over_a_map_dataset(s3, bucket, fleet):
    data = _dataset(s3, bucket, "train", 48)
    mox.file.read(next(iter(data)), binary=True)  # the parent uses the package before the fork
    ds = MapDataset.from_prefix(f"obs://{bucket}/train/", transform=_sample)
    assert len(ds) == len(data)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=4, collate_fn=list)
    pids = _check_epoch(loader, data)
    assert len(pids) == 4 and os.getpid() not in pids, pids
    if fleet.mode == "proxy":  # the fleet's counters see every worker; an in-process engine, only us
        misses = fleet.total("misses")
        _check_epoch(loader, data)
        assert fleet.total("misses") == misses, "the second epoch came from the cache"


def test_dataloader_with_four_workers_over_an_iterable_dataset(s3, bucket):
    data = _dataset(s3, bucket, "stream", 30)
    ds = IterableDataset.from_prefix(f"obs://{bucket}/stream", transform=_sample, prefetch=3)
    loader = DataLoader(ds, batch_size=None, num_workers=4)
    pids = _check_epoch(([item] for item in loader), data)
    assert len(pids) == 4 and os.getpid() not in pids, pids


def test_checkpoint_round_trip_through_torch_save_and_load(s3, bucket, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    ckpt = Checkpoint()
    for where in (f"obs://{bucket}/ckpt/epoch-3.pt", str(tmp_path / "epoch-3.pt")):
        with ckpt.writer(where) as w:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3}, w)
        with ckpt.reader(where) as r:
            state = torch.load(r)
        restored = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        restored.load_state_dict(state["model"])
        for a, b in zip(model.state_dict().values(), restored.state_dict().values()):
            assert torch.equal(a, b)
        assert state["epoch"] == 3 and state["opt"]["state"].keys() == opt.state_dict()["state"].keys()
    head = s3.head_object(Bucket=bucket, Key="ckpt/epoch-3.pt")
    assert head["ContentLength"] == os.path.getsize(tmp_path / "epoch-3.pt")
