"""Worker processes (fork after use, spawn), the seed's usage examples, and the environment."""

import io
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile

import pytest

import memarts as mox
from conftest import pattern

CS = 64 << 10


def _read_in_child(url, expected_len):
    import memarts as mox_child

    data = mox_child.file.read(url, binary=True)
    return len(data) == expected_len and data == pattern(7, expected_len)


def test_forked_workers_after_the_parent_used_the_package(s3, bucket):
    data = pattern(7, 4 * CS + 3)
    s3.put_object(Bucket=bucket, Key="f.bin", Body=data)
    url = f"obs://{bucket}/f.bin"
    assert mox.file.read(url, binary=True) == data  # the parent holds pooled connections now
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            ok = all(mox.file.read(url, binary=True) == data for _ in range(10))
            os._exit(0 if ok else 1)
        pids.append(pid)
    for _ in range(10):
        assert mox.file.read(url, binary=True) == data
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "a forked worker failed"


def test_spawned_workers(s3, bucket):
    data = pattern(7, 2 * CS + 9)
    s3.put_object(Bucket=bucket, Key="s.bin", Body=data)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        assert pool.starmap(_read_in_child, [(f"obs://{bucket}/s.bin", len(data))] * 6) == [True] * 6


def test_the_seed_usage_examples_unchanged(s3, bucket):
    """The replacements listed in the MoXing document, with `import memarts as mox`."""
    import numpy as np
    from PIL import Image

    file_path = f"obs://{bucket}/examples"
    s3.put_object(Bucket=bucket, Key="examples/cfg.json", Body=json.dumps({"lr": 0.1}).encode())
    assert json.loads(mox.file.read(f"{file_path}/cfg.json", binary=False)) == {"lr": 0.1}

    arr = np.arange(1000, dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, arr)
    s3.put_object(Bucket=bucket, Key="examples/a.npy", Body=buf.getvalue())
    assert (np.load(io.BytesIO(mox.file.read_meta_free(f"{file_path}/a.npy", binary=True))) == arr).all()

    s3.put_object(Bucket=bucket, Key="examples/raw.bin", Body=arr.tobytes())
    assert (np.frombuffer(mox.file.read(f"{file_path}/raw.bin", binary=True), dtype=np.float32) == arr).all()

    s3.put_object(Bucket=bucket, Key="examples/obj.pkl", Body=pickle.dumps({"k": [1, 2, 3]}))
    with io.BytesIO(mox.file.read(f"{file_path}/obj.pkl", binary=True)) as f:
        assert pickle.load(f) == {"k": [1, 2, 3]}

    img = Image.new("RGB", (32, 16), (10, 200, 30))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    s3.put_object(Bucket=bucket, Key="examples/img.png", Body=buf.getvalue())
    got = Image.open(io.BytesIO(mox.file.read_meta_free(f"{file_path}/img.png", binary=True)))
    assert got.size == (32, 16) and got.getpixel((3, 3)) == (10, 200, 30)

    import torch

    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    buf = io.BytesIO()
    torch.save({"w": tensor}, buf)
    s3.put_object(Bucket=bucket, Key="examples/model.pth", Body=buf.getvalue())
    with io.BytesIO(mox.file.read(f"{file_path}/model.pth", binary=True)) as f:
        pth = torch.load(f)
    assert torch.equal(pth["w"], tensor)

    import scipy.sparse

    sparse = scipy.sparse.random(40, 30, density=0.1, format="csr", random_state=3)
    buf = io.BytesIO()
    scipy.sparse.save_npz(buf, sparse)
    s3.put_object(Bucket=bucket, Key="examples/m.npz", Body=buf.getvalue())
    with io.BytesIO(mox.file.read(f"{file_path}/m.npz", binary=True)) as f:
        ndarray = scipy.sparse.load_npz(f)
    assert (ndarray != sparse).nnz == 0

    import cv2

    bgr = np.zeros((16, 24, 3), np.uint8)
    bgr[:, :, 1] = 200
    ok, png = cv2.imencode(".png", bgr)
    assert ok
    s3.put_object(Bucket=bucket, Key="examples/cv.png", Body=png.tobytes())
    decoded = cv2.imdecode(np.frombuffer(mox.file.read_meta_free(f"{file_path}/cv.png", binary=True), np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (16, 24, 3) and (decoded == bgr).all()

    _, ext = os.path.splitext(f"{file_path}/a.npy")
    with tempfile.NamedTemporaryFile(suffix=ext, dir=tempfile.gettempdir(), delete=False) as fp:
        mox.file.copy(f"{file_path}/a.npy", fp.name)
        data = np.load(fp.name)
    os.unlink(fp.name)
    assert (data == arr).all()


def _python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_mount_path_mapping_reads_local_directories(s3, bucket, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("from the mount")
    code = (
        "import memarts as mox\n"
        f"assert mox.file.read('obs://{bucket}/mounted/x.txt') == 'from the mount'\n"
        f"assert mox.file.exists('obs://{bucket}/mounted/x.txt')\n"
        f"assert not mox.file.exists('obs://{bucket}/mounted/y.txt')\n"
        f"with mox.file.File('obs://{bucket}/mounted/x.txt', 'r') as f: assert f.read() == 'from the mount'\n"
    )
    out = _python(code, MOX_OBS_TO_MOUNT_PATH=f"obs://{bucket}/other=/nowhere;obs://{bucket}/mounted={tmp_path / 'a'}")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "name,value",
    [
        ("MOX_COPY_PARALLEL_THREADS", "many"),
        ("MOX_COPY_PARALLEL_THREADS", "0"),
        ("MOX_AUTO_READ_META_FREE", "yes"),
        ("MOX_OBS_TO_MOUNT_PATH", "obs://b/a:/cache/a"),
        ("MOX_MEMARTS_LARGE_FILE_ACC", "2"),
        ("MOX_FILE_PARTIAL_MAXIMUM_SIZE", "5GB"),
        ("MOX_FILE_LARGE_FILE_TASK_NUM", "-1"),
    ],
)
def test_malformed_environment_is_an_error_naming_the_variable(name, value):
    out = _python("import memarts", **{name: value})
    assert out.returncode != 0
    assert "ConfigError" in out.stderr and name in out.stderr, out.stderr


def test_malformed_chunk_size_is_an_error_naming_the_variable(s3, bucket):
    out = _python(f"import memarts as mox; mox.file.read('obs://{bucket}/x')", MOX_FILE_CHUNK_SIZE="1MB")
    assert out.returncode != 0
    assert "ConfigError" in out.stderr and "MOX_FILE_CHUNK_SIZE" in out.stderr, out.stderr


def test_large_file_acceleration_copies_in_ranges(s3, bucket, tmp_path):
    data = pattern(31, (5 << 20) + 77)
    s3.put_object(Bucket=bucket, Key="large.bin", Body=data)
    dst = tmp_path / "large.bin"
    code = f"import memarts as mox; mox.file.copy('obs://{bucket}/large.bin', {str(dst)!r})"
    out = _python(code, MOX_MEMARTS_LARGE_FILE_ACC="1", MOX_FILE_PARTIAL_MAXIMUM_SIZE="1000000",
                  MOX_FILE_LARGE_FILE_TASK_NUM="4")
    assert out.returncode == 0, out.stderr
    assert dst.read_bytes() == data
    assert [n for n in os.listdir(tmp_path)] == ["large.bin"], "temp files left behind"


def test_metadata_cache_skips_stats_and_recovers_from_changes(s3, bucket, tmp_path, fleet):
    url = f"obs://{bucket}/mc.bin"
    s3.put_object(Bucket=bucket, Key="mc.bin", Body=b"version 1")
    code = (
        "import memarts as mox, sys\n"
        f"print(mox.file.read({url!r}))\n"
        f"mox.file.copy({url!r}, {str(tmp_path / 'copy.bin')!r})\n"
        "print(open(" + repr(str(tmp_path / "copy.bin")) + ").read())\n"
    )
    env = {"USE_METADATA_CACHE": "1", "MEMARTS_CACHE_DIR": str(tmp_path / "mc")}
    out = _python(code, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["version 1", "version 1"]
    assert (tmp_path / "mc" / "metadata-cache.sqlite").exists()
    # The object changes at the origin. With the cached metadata the cached version is still served,
    # whole (that is what a persistent metadata cache means; remove its file to forget it).
    s3.put_object(Bucket=bucket, Key="mc.bin", Body=b"version 2, longer")
    out = _python(code, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["version 1", "version 1"], out.stdout
    # Once the old version's bytes are not in the cache (here: another chunk size), the origin
    # refuses the old ETag: the entry is dropped and the new version read - never a mix.
    out = _python(code, MOX_FILE_CHUNK_SIZE=str(128 << 10), **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["version 2, longer", "version 2, longer"], out.stdout
