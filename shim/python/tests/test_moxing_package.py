"""``import moxing as mox`` and the ``moxing`` command, as MoXing scripts and the seed use them."""

import os
import subprocess
import sys

import pytest

import memarts
from conftest import BIN_DIR

HERE = os.path.dirname(os.path.abspath(__file__))


def test_moxing_file_is_memarts_file(s3, bucket):
    import moxing as mox
    import moxing.file
    from moxing.framework import file as framework_file

    assert mox.file is memarts.file and moxing.file is memarts.file and framework_file is memarts.file
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"via moxing")
    assert mox.file.read(f"obs://{bucket}/a.txt") == "via moxing"
    # Scripts poke MoXing's implementation module's flags; that must not fail.
    mox.file.file_io._USE_MEMARTS = True
    assert mox.file.file_io._USE_MEMARTS is True


def test_moxing_command_translates_the_seeds_subcommands():
    from moxing.command import translate

    assert translate(["start_memarts_proxy", "8"]) == ["start_proxy", "8"]
    assert translate(["stop_memarts_proxy"]) == ["stop_proxy"]
    assert translate(["status", "--json"]) == ["status", "--json"]
    assert translate([]) == []


def _moxing(args, **env):
    return subprocess.run(
        [sys.executable, "-m", "moxing", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


@pytest.mark.proxy_only
def test_moxing_start_and_stop_memarts_proxy_run_a_fleet(tmp_path, fleet):
    run_dir = str(tmp_path / "run")
    env = {"MEMARTS_RUN_DIR": run_dir, "MEMARTS_CACHE_DIR": str(tmp_path / "cache"), "MEMARTS_BIN_DIR": BIN_DIR}
    out = _moxing(["stop_memarts_proxy"], **env)  # the seed cleans up first: nothing to stop is fine
    assert out.returncode == 0, out.stdout + out.stderr
    out = _moxing(["start_memarts_proxy", "1"], **env)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        assert memarts._memarts.fleet_running(run_dir)
    finally:
        out = _moxing(["stop_memarts_proxy"], **env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not memarts._memarts.fleet_running(run_dir)


def test_moxing_command_without_the_binary_says_where_it_looked(tmp_path):
    out = _moxing(["start_memarts_proxy", "1"], MEMARTS_BIN_DIR=str(tmp_path))
    assert out.returncode == 2
    assert "memarts binary" in out.stderr and str(tmp_path) in out.stderr
