"""write_memarts: objects only the cache holds - durable when acknowledged, never at the origin,
surviving restarts and kill -9, refused (False) when there is no room or no memarts."""

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import memarts as mox
from conftest import MEMARTS, pattern


def test_round_trip_text_binary_small_and_large(s3, bucket):
    small, large = pattern(900, 1000), pattern(901, (3 << 20) + 5)
    assert mox.file.write_memarts(f"obs://{bucket}/mo/small", small) is True
    assert mox.file.write_memarts(f"obs://{bucket}/mo/large", large, retry=3) is True
    assert mox.file.write_memarts(f"obs://{bucket}/mo/text", "héllo".encode()) is True
    assert mox.file.read_meta_free(f"obs://{bucket}/mo/small", binary=True, memarts_only=True) == small
    assert mox.file.read_meta_free(f"obs://{bucket}/mo/large", binary=True, memarts_only=True) == large
    assert mox.file.read_meta_free(f"obs://{bucket}/mo/text", memarts_only=True) == "héllo"
    # The origin never sees them.
    with pytest.raises(Exception):
        s3.head_object(Bucket=bucket, Key="mo/small")
    # Overwrite: the new bytes replace the old, whole.
    assert mox.file.write_memarts(f"obs://{bucket}/mo/small", b"v2")
    assert mox.file.read_meta_free(f"obs://{bucket}/mo/small", binary=True, memarts_only=True) == b"v2"
    with pytest.raises(TypeError):
        mox.file.write_memarts(f"obs://{bucket}/mo/x", "not bytes")


@pytest.mark.proxy_only
def test_acknowledged_objects_survive_kill_9_of_the_fleet(bucket, fleet):
    """A writer loop while slots are kill -9'ed and the fleet recovered: every acknowledged object is
    present and byte-exact afterwards; none is partial."""
    n = 60
    ledger = os.path.join(fleet.directory, f"ledger-{bucket}")
    code = (
        "import memarts as mox, sys, random\n"
        f"for i in range({n}):\n"
        f"    data = random.Random(i).randbytes(1000 + 7919 * i)\n"
        f"    if mox.file.write_memarts('obs://{bucket}/d/' + str(i), data):\n"
        f"        open({ledger!r}, 'a').write(str(i) + '\\n')\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    kills = 0
    rng = random.Random(5)
    while writer.poll() is None and kills < 8:
        time.sleep(0.3)
        pid = int(open(os.path.join(fleet.run_dir, f"proxy-{rng.randrange(2)}.pid")).read())
        try:
            os.kill(pid, signal.SIGKILL)
            kills += 1
        except ProcessLookupError:
            pass
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
        subprocess.run([MEMARTS, "start_proxy", "2"], capture_output=True, check=True)
    assert writer.wait(timeout=300) == 0
    acked = [int(line) for line in open(ledger).read().split()]
    assert kills > 0 and len(acked) >= n // 2, (kills, len(acked))
    for i in range(n):
        want = random.Random(i).randbytes(1000 + 7919 * i)
        try:
            got = mox.file.read_meta_free(f"obs://{bucket}/d/{i}", binary=True, memarts_only=True)
        except FileNotFoundError:
            assert i not in acked, f"acknowledged object {i} was lost"
            continue
        assert got == want, f"object {i} is partial or wrong"


def _run(code, tmp_path, **env):
    full = dict(os.environ, MEMARTS_RUN_DIR=str(tmp_path / "none"), MEMARTS_CACHE_DIR=str(tmp_path / "cache"))
    full.pop("USE_MEMARTS", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_no_room_or_no_memarts_returns_false_with_a_reason(tmp_path):
    code = (
        "import memarts as mox, logging\n"
        "logging.basicConfig()\n"
        "print(mox.file.write_memarts('obs://b/big', b'x' * 200000))\n"
        "print(mox.file.write_memarts('obs://b/small', b'x' * 1000))\n"
        "print(mox.file.read_meta_free('obs://b/small', binary=True, memarts_only=True) == b'x' * 1000)\n"
    )
    out = _run(code, tmp_path, USE_MEMARTS="1", MEMARTS_ONLY_CAPACITY="64KiB")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"], out.stdout
    assert "quota" in out.stderr, out.stderr
    out = _run("import memarts as mox, logging\nlogging.basicConfig()\nprint(mox.file.write_memarts('obs://b/k', b'x'))\n", tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
    assert "disabled" in out.stderr, out.stderr
