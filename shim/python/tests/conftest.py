"""A real S3-protocol server (moto) on loopback and a real memarts fleet, for the whole session.

The memarts binaries come from the workspace's target directory (``MEMARTS_BIN_DIR``, default
``target/debug``); `make test` builds them first. If anything is missing the session fails loudly.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN_DIR = os.environ.get("MEMARTS_BIN_DIR", os.path.join(ROOT, "target", "debug"))
MEMARTS = os.path.join(BIN_DIR, "memarts")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    port = _free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail(f"moto did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def s3(moto_endpoint):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@pytest.fixture(scope="session")
def fleet(moto_endpoint):
    """Starts `memarts start_proxy 2` and points this process's environment at it."""
    if not os.path.exists(MEMARTS):
        pytest.fail(f"{MEMARTS} is missing: build the binaries first (cargo build --bins)")
    base = tempfile.mkdtemp(prefix="memarts-pytest-")
    env = {
        "MEMARTS_RUN_DIR": os.path.join(base, "run"),
        "MEMARTS_CACHE_DIR": os.path.join(base, "cache"),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "MOX_FILE_CHUNK_SIZE": str(64 << 10),
    }
    os.environ.update(env)
    out = subprocess.run([MEMARTS, "start_proxy", "2"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"start_proxy failed: {out.stdout}{out.stderr}")

    class Fleet:
        run_dir = env["MEMARTS_RUN_DIR"]
        directory = base

        @staticmethod
        def status():
            res = subprocess.run([MEMARTS, "status", "--json"], capture_output=True, text=True)
            return json.loads(res.stdout)

        @staticmethod
        def total(field):
            return sum(s.get(field) or 0 for s in Fleet.status()["slots"])

    yield Fleet
    subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)


_buckets = iter(range(10_000))


@pytest.fixture
def bucket(s3, fleet):
    name = f"pytest-{os.getpid()}-{next(_buckets)}"
    s3.create_bucket(Bucket=name)
    return name


def pattern(seed, n):
    """Deterministic bytes for (seed, n)."""
    import random

    return random.Random(seed).randbytes(n)
