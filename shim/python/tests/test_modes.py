"""Mode resolution without a fleet: direct (no memarts) and embedded (USE_MEMARTS=1)."""

import os
import subprocess
import sys

import pytest

from conftest import pattern

# Each test sets up its own mode in a child process; running them once (in the proxy pass) suffices.
pytestmark = pytest.mark.proxy_only

CS = 64 << 10


def _run(code, tmp_path, **env):
    full = dict(os.environ)
    full.update(
        MEMARTS_RUN_DIR=str(tmp_path / "no-fleet-here"),
        MEMARTS_CACHE_DIR=str(tmp_path / "cache"),
        **env,
    )
    full.pop("USE_MEMARTS", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def _chunk_files(cache):
    return [f for _root, _dirs, files in os.walk(cache / "v1" / "chunks") for f in files]


def test_without_memarts_objects_are_read_from_the_origin_and_nothing_is_cached(s3, bucket, tmp_path):
    data = pattern(11, 3 * CS + 1)
    s3.put_object(Bucket=bucket, Key="d.bin", Body=data)
    code = (
        "import memarts as mox, sys\n"
        f"got = mox.file.read('obs://{bucket}/d.bin', binary=True)\n"
        "assert mox.file.mode() == 'origin', mox.file.mode()\n"
        f"sys.stdout.buffer.write(got)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env=dict(os.environ, MEMARTS_RUN_DIR=str(tmp_path / "none"), MEMARTS_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == data
    assert not (tmp_path / "cache").exists() or not _chunk_files(tmp_path / "cache")


def test_use_memarts_without_a_fleet_runs_the_engine_in_process(s3, bucket, tmp_path):
    data = pattern(12, 5 * CS + 3)
    s3.put_object(Bucket=bucket, Key="e.bin", Body=data)
    code = (
        "import memarts as mox, os\n"
        f"url = 'obs://{bucket}/e.bin'\n"
        "assert mox.file.read(url, binary=True) == open(os.environ['WANT'], 'rb').read()\n"
        "assert mox.file.mode() == 'embedded', mox.file.mode()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = mox.file.read(url, binary=True) == open(os.environ['WANT'], 'rb').read()\n"
        "    os._exit(0 if ok else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.WEXITSTATUS(status) == 0, 'forked child failed in embedded mode'\n"
    )
    (tmp_path / "want.bin").write_bytes(data)
    want = str(tmp_path / "want.bin")
    out = _run(code, tmp_path, USE_MEMARTS="1", WANT=want)
    assert out.returncode == 0, out.stderr
    assert len(_chunk_files(tmp_path / "cache")) == 6, "the embedded engine filled the shared cache dir"
    # The next process finds the chunks on disk (same cache dir and format as a fleet).
    out = _run(code, tmp_path, USE_MEMARTS="1", WANT=want)
    assert out.returncode == 0, out.stderr
    assert len(_chunk_files(tmp_path / "cache")) == 6


def test_bad_use_memarts_value_is_an_error_naming_it(tmp_path):
    out = _run("import memarts as mox; mox.file.read('obs://b/k')", tmp_path, USE_MEMARTS="yes")
    assert out.returncode != 0 and "USE_MEMARTS" in out.stderr and "ConfigError" in out.stderr, out.stderr
