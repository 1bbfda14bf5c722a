"""S5: the package uses a fleet only if its run dir and proxies belong to this user, or to a uid in
``MEMARTS_TRUSTED_UIDS``. The impostor is a real fleet started by ``memarts start_proxy`` as uid
65534 (``setpriv``) that lets root in, as an attacker on a shared node would; every ``mox.file``
call against it raises ``UntrustedFleetError`` before a request reaches it, including
``write_memarts`` (which must not quietly return False). Needs root, as CI runs."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pytest

from conftest import BIN_DIR, ROOT, pattern

# Each test sets up its own fleet and its own mode in child processes: once (the proxy pass) is enough.
pytestmark = pytest.mark.proxy_only

OTHER = 65534


def _as_other(*argv):
    return ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups", *argv]


def _binaries_for_everyone(base):
    """memarts and memarts-proxy where uid 65534 can run them (the checkout may be private)."""
    bin_dir = os.path.join(base, "bin")
    os.mkdir(bin_dir, 0o755)
    for name in ("memarts", "memarts-proxy"):
        src, dst = os.path.join(BIN_DIR, name), os.path.join(bin_dir, name)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    return bin_dir


@pytest.fixture
def impostor(moto_endpoint):
    if os.geteuid() != 0:
        pytest.fail("these tests start a fleet as uid 65534 with setpriv: run them as root (CI does)")
    base = tempfile.mkdtemp(prefix="memarts-impostor-")
    os.chmod(base, 0o755)
    bin_dir = _binaries_for_everyone(base)
    home = os.path.join(base, "home")
    os.mkdir(home, 0o755)
    os.chown(home, OTHER, OTHER)
    with open(os.path.join(home, "fleet.toml"), "w") as f:
        f.write("allowed_uids = [0]\n")
    run_dir = os.path.join(home, "run")
    env = dict(
        os.environ,
        HOME=home,
        MEMARTS_RUN_DIR=run_dir,
        MEMARTS_CACHE_DIR=os.path.join(home, "cache"),
        MEMARTS_CONFIG=os.path.join(home, "fleet.toml"),
    )
    env.pop("XDG_RUNTIME_DIR", None)
    memarts = os.path.join(bin_dir, "memarts")
    out = subprocess.run(_as_other(memarts, "start_proxy", "1"), capture_output=True, text=True, env=env)
    if out.returncode != 0:
        pytest.fail(f"start_proxy as uid {OTHER} failed: {out.stdout}{out.stderr}")
    os.chmod(run_dir, 0o755)
    os.chmod(os.path.join(run_dir, "proxy-0.sock"), 0o666)

    def requests():
        out = subprocess.run(_as_other(memarts, "status", "--json"), capture_output=True, text=True, env=env)
        return sum(s["requests"] for s in json.loads(out.stdout)["slots"])

    yield types.SimpleNamespace(run_dir=run_dir, requests=requests)
    subprocess.run(_as_other(memarts, "stop_proxy", "--grace", "5"), capture_output=True, env=env)
    shutil.rmtree(base, ignore_errors=True)


# Runs every kind of call in a fresh process and reports, per call, its result or its exception.
_CALLS = """
import json, sys
import memarts as mox
url = sys.argv[1]
calls = {
    "mode": lambda: mox.file.mode(),
    "read": lambda: len(mox.file.read(url, binary=True)),
    "exists": lambda: mox.file.exists(url),
    "list_directory": lambda: mox.file.list_directory(url.rsplit("/", 1)[0]),
    "write_memarts": lambda: mox.file.write_memarts(url + ".only", b"the job's features"),
    "copy_upload": lambda: mox.file.copy(sys.argv[2], url + ".ckpt"),
}
out = {}
for name, call in calls.items():
    try:
        out[name] = ["ok", call()]
    except Exception as e:
        out[name] = [type(e).__name__, isinstance(e, PermissionError), str(e)]
print(json.dumps(out))
"""


def _calls(run_dir, url, tmp_path, **env):
    local = tmp_path / "ckpt.bin"
    local.write_bytes(b"a checkpoint")
    full = dict(os.environ, MEMARTS_RUN_DIR=run_dir, **env)
    full.pop("USE_MEMARTS", None)
    if "MEMARTS_TRUSTED_UIDS" not in env:
        full.pop("MEMARTS_TRUSTED_UIDS", None)
    out = subprocess.run(
        [sys.executable, "-c", _CALLS, url, str(local)], capture_output=True, text=True, env=full
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_call_against_a_fleet_of_another_user_raises_untrusted_fleet_error(s3, bucket, impostor, tmp_path):
    import memarts._memarts
    from memarts.errors import PermissionDeniedError, UntrustedFleetError

    s3.put_object(Bucket=bucket, Key="d/x.bin", Body=pattern(1, 100_000))
    url = f"s3://{bucket}/d/x.bin"
    before = impostor.requests()

    with pytest.raises(UntrustedFleetError) as caught:
        memarts._memarts.Client(run_dir=impostor.run_dir)
    msg = str(caught.value)
    for part in (impostor.run_dir, "uid 65534", "MEMARTS_TRUSTED_UIDS=65534"):
        assert part in msg, msg
    assert isinstance(caught.value, PermissionDeniedError) and isinstance(caught.value, PermissionError)

    results = _calls(impostor.run_dir, url, tmp_path)
    for name, result in results.items():
        assert result[:2] == ["UntrustedFleetError", True], f"{name}: {result}"
    # The owner's own `status`: PrefetchStatus, AdmissionStatus and Status, nothing from the victim.
    assert impostor.requests() == before + 3, "the impostor served a request of the victim"


def test_a_fleet_of_a_trusted_uid_is_used(s3, bucket, impostor, tmp_path):
    data = pattern(2, 200_001)
    s3.put_object(Bucket=bucket, Key="d/y.bin", Body=data)
    results = _calls(impostor.run_dir, f"s3://{bucket}/d/y.bin", tmp_path, MEMARTS_TRUSTED_UIDS="nobody")
    assert results["mode"] == ["ok", "proxy"]
    assert results["read"] == ["ok", len(data)]
    assert results["write_memarts"] == ["ok", True]


def test_the_squatted_default_run_dir_raises_untrusted_fleet_error(s3, bucket):
    s3.put_object(Bucket=bucket, Key="z.bin", Body=b"genuine")
    script = os.path.join(ROOT, "tests", "e2e", "squat-default-run-dir.sh")
    victim = (
        "import memarts as mox\n"
        "try:\n"
        f"    mox.file.read('s3://{bucket}/z.bin')\n"
        "    print('victim-read-bytes')\n"
        "except Exception as e:\n"
        "    print('victim-error', type(e).__name__, e)\n"
    )
    env = dict(os.environ)
    for name in ("MEMARTS_RUN_DIR", "XDG_RUNTIME_DIR", "USE_MEMARTS", "MEMARTS_TRUSTED_UIDS"):
        env.pop(name, None)
    out = subprocess.run(
        ["bash", script, BIN_DIR, "--", sys.executable, "-c", victim],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines.get("victim-error", "").startswith("UntrustedFleetError"), out.stdout + out.stderr
    assert "/tmp/memarts-0" in lines["victim-error"] and "uid 65534" in lines["victim-error"]
    # Two status calls of the squatter's own, two slots each, three requests each (PrefetchStatus,
    # AdmissionStatus, Status): nothing from the victim.
    assert int(lines["squatter-requests-after"]) - int(lines["squatter-requests-before"]) == 6, out.stdout
