"""A real S3-protocol server (moto) on loopback and memarts, for the whole session.

``MEMARTS_TEST_MODE`` picks how the tests reach memarts: ``proxy`` (default: a real fleet of proxy
processes, started by ``memarts start_proxy 2``) or ``embedded`` (``USE_MEMARTS=1`` and no fleet: the
engine runs inside the test process). `make test` runs the suite both ways; tests marked
``proxy_only`` need proxy processes (or set up their own mode) and run in the proxy pass only.

The memarts binaries come from the workspace's target directory (``MEMARTS_BIN_DIR``, default
``target/debug``); `make test` builds them first. If anything is missing the session fails loudly.
"""

import os
import socket
import struct
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN_DIR = os.environ.get("MEMARTS_BIN_DIR", os.path.join(ROOT, "target", "debug"))
MEMARTS = os.path.join(BIN_DIR, "memarts")
MODE = os.environ.get("MEMARTS_TEST_MODE", "proxy")
if MODE not in ("proxy", "embedded"):
    raise SystemExit(f"MEMARTS_TEST_MODE={MODE!r} must be proxy or embedded")


def pytest_configure(config):
    config.addinivalue_line("markers", "proxy_only: needs proxy processes; skipped from the embedded pass")


def pytest_collection_modifyitems(config, items):
    if MODE == "embedded":
        kept = [item for item in items if item.get_closest_marker("proxy_only") is None]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


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
    """memarts for the session, as ``MEMARTS_TEST_MODE`` says: a fleet started by ``memarts
    start_proxy 2``, or the in-process engine; this process's environment points at it."""
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
    if MODE == "embedded":
        os.environ["USE_MEMARTS"] = "1"
    else:
        out = subprocess.run([MEMARTS, "start_proxy", "2"], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.fail(f"start_proxy failed: {out.stdout}{out.stderr}")
    import memarts

    if memarts.file.mode() != MODE:
        pytest.fail(f"the package runs in {memarts.file.mode()!r} mode, the session asked for {MODE!r}")

    class Fleet:
        run_dir = env["MEMARTS_RUN_DIR"]
        directory = base
        mode = MODE

        @staticmethod
        def total(field):
            """A cache counter summed over the slots (or the in-process engine)."""
            return memarts.stats()[field]

        @staticmethod
        def gets(bucket):
            """Origin GETs of the fleet for ``bucket`` so far (every attempt is a line of the proxies'
            origin logs)."""
            import glob

            n = 0
            for log in glob.glob(os.path.join(env["MEMARTS_RUN_DIR"], "origin-*.log")):
                with open(log) as f:
                    n += sum(1 for line in f if f" GET s3://{bucket}/" in line)
            return n

        @staticmethod
        def wait_cached(n):
            """Waits until at least ``n`` chunks are on disk: a fill is handed to its readers first
            and written after, so a read right after a cold one may still get a chunk from the fill
            (no second GET, but not a hit either). The index counts a chunk once room is reserved
            for it, before its file is renamed into place: both are waited for."""
            chunks = os.path.join(env["MEMARTS_CACHE_DIR"], "v1", "chunks")
            segments = os.path.join(env["MEMARTS_CACHE_DIR"], "v1", "segments")

            def packed():
                # Small chunks are records in segment files (`disk/src/segment.rs`): a 16-byte
                # header, then records of a 24-byte head (magic b"MRC1", identity and data
                # lengths, ...), the identity and the data, padded to 8 bytes.
                n = 0
                for root, _, files in os.walk(segments):
                    for name in (f for f in files if f.endswith(".seg")):
                        with open(os.path.join(root, name), "rb") as f:
                            b = f.read()
                        at = 16
                        while b[at : at + 4] == b"MRC1" and at + 24 <= len(b):
                            il, dl = struct.unpack_from("<II", b, at + 4)
                            end = at + (24 + il + dl + 7) // 8 * 8
                            if end > len(b):
                                break
                            n, at = n + 1, end
                return n

            def on_disk():
                return sum(len(files) for _, _, files in os.walk(chunks)) + packed()

            deadline = time.time() + 20
            while memarts.stats()["cached_chunks"] < n or on_disk() < n:
                if time.time() > deadline:
                    pytest.fail(f"the cache never held {n} chunks")
                time.sleep(0.02)

    yield Fleet
    if MODE == "proxy":
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


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


def assert_reads_ahead(fleet, f, want, chunk_size, before):
    """Chunks 0..3 of ``want`` read in order from the open file ``f`` grow the read-ahead window 1, 2,
    4, 8: chunks up to 11 are fetched (or on their way; ``before``: the fleet's misses before the
    open) although the reader asked for 4. Then the rest reads byte-exact."""
    for i in range(4):
        assert f.read(chunk_size) == want[i * chunk_size : (i + 1) * chunk_size]
    deadline = time.monotonic() + 20
    while fleet.total("misses") - before < 12:
        assert time.monotonic() < deadline, f"{fleet.total('misses') - before} misses: no read-ahead"
        time.sleep(0.02)
    assert f.read() == want[4 * chunk_size :]
