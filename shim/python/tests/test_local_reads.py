"""Local reads from Python: a warm object is read straight from its chunk files (no request to a
proxy), byte-exact, and the reads are reported to the slots, also by a process that ends and by
DataLoader workers, which end without running atexit handlers (the extension's multiprocessing
finalizer reports them); nothing in ``memarts.file`` asks for it."""

import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

import memarts
from memarts import file as mox_file
from memarts.torch import MapDataset
from conftest import pattern

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

CHUNK = 64 << 10  # MOX_FILE_CHUNK_SIZE of the test session (conftest)


def _objects(s3, bucket, n, size=lambda i: 3 * CHUNK + 11 * i):
    data = {f"s3://{bucket}/d/{i:02d}": pattern(8100 + i, size(i)) for i in range(n)}
    for url, body in data.items():
        s3.put_object(Bucket=bucket, Key=url.split("/", 3)[3], Body=body)
    return data


def _chunks(data):
    return sum(-(-len(body) // CHUNK) for body in data.values())


def test_warm_reads_are_local_byte_exact_and_counted_by_the_slots(s3, bucket, fleet):
    data = _objects(s3, bucket, 6)
    for url, body in data.items():
        assert mox_file.read(url, binary=True) == body
    fleet.wait_cached(_chunks(data))
    before, gets = memarts.stats(), fleet.gets(bucket)
    for _ in range(3):
        for url, body in data.items():
            assert mox_file.read(url, binary=True) == body
    after = memarts.stats()
    assert after["local_hits"] - before["local_hits"] == 3 * _chunks(data), after
    assert after["local_corrupt"] == before["local_corrupt"]
    assert fleet.gets(bucket) == gets, "a warm read reached the origin"
    # stats() reported them first: the slots counted every one as a hit.
    assert after["hits"] - before["hits"] == 3 * _chunks(data), (before, after)


@pytest.mark.proxy_only
def test_dataloader_workers_report_their_local_reads_when_they_end(s3, bucket, fleet):
    data = _objects(s3, bucket, 16, size=lambda i: CHUNK + 100 * i)
    urls = sorted(data)
    for url in urls:
        mox_file.read(url, binary=True)
    fleet.wait_cached(_chunks(data))
    before = memarts.stats()
    ds = MapDataset.from_objects(urls, transform=lambda obj: (obj.url, obj.read()))
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b, multiprocessing_context="fork")
    seen = {url: body for batch in loader for url, body in batch}
    assert seen == data
    after = memarts.stats()
    # Read by the workers, not by this process, and reported by them as they ended.
    assert after["local_hits"] == before["local_hits"]
    assert after["hits"] - before["hits"] == _chunks(data), (before, after)


@pytest.mark.proxy_only
def test_a_process_that_ends_has_its_local_reads_counted(s3, bucket, fleet):
    data = _objects(s3, bucket, 6)
    for url, body in data.items():
        assert mox_file.read(url, binary=True) == body
    fleet.wait_cached(_chunks(data))
    before = memarts.stats()
    script = "import sys\nfrom memarts import file\nfor url in sys.argv[1:]:\n    file.read(url, binary=True)\n"
    subprocess.run([sys.executable, "-c", script, *data], check=True)
    after = memarts.stats()
    # Read by the child, not by this process, and reported as it ended.
    assert after["local_hits"] == before["local_hits"]
    assert after["hits"] - before["hits"] == _chunks(data), (before, after)
