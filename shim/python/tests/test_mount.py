"""``memarts mount`` from Python: the tools a training script uses on local files (``open``,
``np.load``, ``PIL.Image.open``, ``os.walk``, ``glob``, a PyTorch DataLoader with four workers over an
ImageFolder-shaped tree) on a real FUSE mount of a moto bucket. The mount process is started by the
real CLI with this session's environment, so in the proxy pass it reads through the fleet and in the
embedded pass (``USE_MEMARTS=1``, no fleet) it runs the engine itself: both passes mount for real."""

import glob
import io
import os
import subprocess
import time

import numpy as np
import pytest
from PIL import Image

from conftest import MEMARTS, pattern

# Four workers on a two-core machine is the point of the test, not a mistake.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


@pytest.fixture
def mount(fleet, bucket, tmp_path):
    """Mounts the test's bucket on a new directory; unmounts it (and fails loudly) at the end."""
    point = str(tmp_path / "mnt")
    os.mkdir(point)
    out = subprocess.run(
        [MEMARTS, "mount", f"s3://{bucket}", point, "--attr-timeout", "5", "--entry-timeout", "5"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        pytest.fail(f"memarts mount failed: {out.stdout}{out.stderr}")
    assert _mounted(point)
    # The mount process says how it reaches memarts: the fleet, or (embedded pass) its own engine.
    log = out.stdout.rsplit("log ", 1)[1].rstrip(")\n")
    with open(log) as f:
        said = f.read()
    assert f"({fleet.mode} mode," in said, said
    yield point
    out = subprocess.run([MEMARTS, "unmount", point], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    deadline = time.time() + 10
    while _mounted(point) and time.time() < deadline:
        time.sleep(0.05)
    assert not _mounted(point)


def _png(seed, size=(16, 12)):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return pixels, buf.getvalue()


def test_open_np_load_pil_walk_and_glob_through_the_mount(s3, bucket, mount):
    arr = np.arange(200_000, dtype=np.float32).reshape(400, 500)
    buf = io.BytesIO()
    np.save(buf, arr)
    s3.put_object(Bucket=bucket, Key="data/arrays/a.npy", Body=buf.getvalue())
    pixels, png = _png(1)
    s3.put_object(Bucket=bucket, Key="data/images/x.png", Body=png)
    texts = {f"data/text/{d}/t{i}.txt": f"line {d} {i}\n".encode() * (i + 1) for d in "ab" for i in range(3)}
    for key, body in texts.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    big = pattern(7, (3 << 20) + 11)
    s3.put_object(Bucket=bucket, Key="data/big.bin", Body=big)

    with open(os.path.join(mount, "data/big.bin"), "rb") as f:
        assert f.read() == big
        f.seek(1 << 20)
        assert f.read(4096) == big[1 << 20 : (1 << 20) + 4096]
    loaded = np.load(os.path.join(mount, "data/arrays/a.npy"))
    assert loaded.dtype == np.float32 and np.array_equal(loaded, arr)
    with Image.open(os.path.join(mount, "data/images/x.png")) as img:
        assert np.array_equal(np.asarray(img.convert("RGB")), pixels)
    walked = sorted(
        os.path.relpath(os.path.join(root, name), mount) for root, _, names in os.walk(mount) for name in names
    )
    assert walked == sorted(["data/arrays/a.npy", "data/images/x.png", "data/big.bin", *texts])
    found = sorted(os.path.relpath(p, mount) for p in glob.glob(os.path.join(mount, "data/text/**/*.txt"), recursive=True))
    assert found == sorted(texts)
    for key, body in texts.items():
        with open(os.path.join(mount, key), "r") as f:
            assert f.read() == body.decode()
    with pytest.raises(FileNotFoundError):
        open(os.path.join(mount, "data/missing.txt"), "rb")


def test_a_file_written_through_the_mount_is_at_the_origin_after_close(s3, bucket, mount):
    body = pattern(11, (2 << 20) + 5)
    os.makedirs(os.path.join(mount, "out/run1"))
    with open(os.path.join(mount, "out/run1/model.bin"), "wb") as f:
        f.write(body[:1000])
        f.write(body[1000:])
    assert s3.get_object(Bucket=bucket, Key="out/run1/model.bin")["Body"].read() == body
    with open(os.path.join(mount, "out/run1/model.bin"), "rb") as f:
        assert f.read() == body
    with open(os.path.join(mount, "out/x.bin"), "wb") as f:
        f.write(b"abc")
        f.seek(0)
        with pytest.raises(OSError) as e:
            f.write(b"z")
            f.flush()
        assert e.value.errno == 95  # EOPNOTSUPP: random writes are refused
        with pytest.raises(OSError):
            f.close()


class _ImageFolder:
    """A plain Dataset that opens paths, as an ImageFolder does: ``root/<class>/<image>``."""

    def __init__(self, root):
        self.classes = sorted(os.listdir(root))
        self.samples = [
            (os.path.join(root, c, name), label)
            for label, c in enumerate(self.classes)
            for name in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import torch

        path, label = self.samples[i]
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB"))
        return path, os.getpid(), int(pixels.astype(np.int64).sum()), torch.tensor(label)


def test_dataloader_with_four_workers_over_an_imagefolder_tree_on_the_mount(s3, bucket, mount):
    from torch.utils.data import DataLoader

    expected = {}
    for c in range(4):
        for k in range(10):
            pixels, png = _png(100 * c + k)
            key = f"train/class_{c}/img_{k:02d}.png"
            s3.put_object(Bucket=bucket, Key=key, Body=png)
            expected[os.path.join(mount, key)] = (int(pixels.astype(np.int64).sum()), c)
    ds = _ImageFolder(os.path.join(mount, "train"))
    assert ds.classes == [f"class_{c}" for c in range(4)] and len(ds) == 40
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=4, collate_fn=list)
    for _epoch in range(2):
        seen, pids = {}, set()
        for batch in loader:
            for path, pid, total, label in batch:
                assert path not in seen, f"{path} delivered twice"
                seen[path] = (total, int(label))
                pids.add(pid)
        assert seen == expected
        assert len(pids) == 4 and os.getpid() not in pids, pids
