"""The node's Prometheus endpoint (``memarts start_proxy --metrics-address``), scraped from a running
fleet of its own and read with prometheus_client's OpenMetrics parser, as Prometheus would read it:
every slot's counters, gauges and histograms, each labelled with its slot, agree with what the reads
did; a slot that dies is reported down, and the endpoint moves to another slot when the one serving
it goes."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import MEMARTS, ROOT, _free_port, pattern

pytestmark = pytest.mark.proxy_only

SLOTS = 3
OBJECTS = 4
SIZE = 200 << 10  # four 64 KiB chunks (the session's MOX_FILE_CHUNK_SIZE), the last one short
CHUNKS = OBJECTS * 4


def scrape(url, deadline_s=15):
    """The parsed exposition, waiting for the endpoint to answer (a slot takes it within seconds)."""
    deadline = time.time() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                kind = r.headers["Content-Type"]
                text = r.read().decode()
            break
        except OSError:
            if time.time() > deadline:
                pytest.fail(f"nothing answered on {url}")
            time.sleep(0.1)
    assert kind.startswith("application/openmetrics-text"), kind
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(families, name, sample=None, **labels):
    """Per slot, the value of `sample` (default: the family's name) of the points with `labels`."""
    family = families[name]
    sample = sample or name
    got = {}
    for s in family.samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            slot = int(s.labels["slot"])
            got[slot] = got.get(slot, 0) + s.value
    return got


def total(families, name, sample=None, **labels):
    return sum(values(families, name, sample, **labels).values())


@pytest.fixture
def metrics_fleet(s3, fleet, bucket):
    """A fleet of SLOTS slots of its own, serving its metrics on a free port of loopback."""
    base = tempfile.mkdtemp(prefix="memarts-metrics-", dir=fleet.directory)
    env = dict(os.environ)
    env.update({"MEMARTS_RUN_DIR": os.path.join(base, "run"), "MEMARTS_CACHE_DIR": os.path.join(base, "cache")})
    fleet_env = env
    address = f"127.0.0.1:{_free_port()}"
    out = subprocess.run(
        [MEMARTS, "start_proxy", str(SLOTS), "--capacity", "64MiB", "--metrics-address", address],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        pytest.fail(f"start_proxy failed: {out.stdout}{out.stderr}")

    class Metrics:
        url = f"http://{address}/metrics"
        run_dir = env["MEMARTS_RUN_DIR"]

        @staticmethod
        def memarts(*args, check=True, env=None):
            out = subprocess.run([MEMARTS, *args], capture_output=True, env=dict(fleet_env, **(env or {})))
            if check and out.returncode != 0:
                pytest.fail(f"memarts {' '.join(args)}: {out.stderr.decode()}")
            return out

    yield Metrics
    subprocess.run([MEMARTS, "stop_proxy"], capture_output=True, env=env)
    shutil.rmtree(base, ignore_errors=True)


def test_the_endpoint_serves_every_slots_metrics_as_the_reads_made_them(s3, bucket, metrics_fleet):
    m = metrics_fleet
    families = scrape(m.url)
    assert values(families, "memarts_slot_up") == {s: 1 for s in range(SLOTS)}
    for i in range(OBJECTS):
        s3.put_object(Bucket=bucket, Key=f"m/{i}", Body=pattern(900 + i, SIZE))
    # Cold, then from the cache through the slots (local reads off: the slots time what they
    # serve; local hits are counted below).
    for direct in ("1", "0"):
        for i in range(OBJECTS):
            data = m.memarts("cat", f"s3://{bucket}/m/{i}", env={"MEMARTS_LOCAL_READS": direct}).stdout
            assert data == pattern(900 + i, SIZE)
    assert m.memarts("cat", f"s3://{bucket}/m/missing", check=False).returncode != 0

    status = json.loads(m.memarts("status", "--json").stdout)
    families = scrape(m.url)
    # Every slot is there, each point labelled with it.
    assert set(values(families, "memarts_hits", "memarts_hits_total")) == set(range(SLOTS))
    assert total(families, "memarts_misses", "memarts_misses_total") == CHUNKS
    assert total(families, "memarts_hits", "memarts_hits_total") == CHUNKS
    assert total(families, "memarts_read_bytes", "memarts_read_bytes_total", source="origin") == OBJECTS * SIZE
    assert total(families, "memarts_read_bytes", "memarts_read_bytes_total", source="cache") == OBJECTS * SIZE
    assert total(families, "memarts_read_bytes", "memarts_read_bytes_total", source="peer") == 0
    # The latency of each read, hit or miss, in the histogram (the parser checked its buckets).
    for result in ("hit", "miss"):
        count = total(families, "memarts_read_seconds", "memarts_read_seconds_count", result=result)
        assert count == CHUNKS, (result, count)
        inf = total(families, "memarts_read_seconds", "memarts_read_seconds_bucket", result=result, le="+Inf")
        assert inf == count
        assert total(families, "memarts_read_seconds", "memarts_read_seconds_sum", result=result) > 0
    # Origin requests by kind and outcome: as many as `memarts status` counts, each one timed.
    requests = total(families, "memarts_origin_requests", "memarts_origin_requests_total")
    assert requests == sum(s["origin_requests"] for s in status["slots"]), status
    assert total(families, "memarts_origin_requests", "memarts_origin_requests_total", op="get", outcome="ok") >= CHUNKS
    assert total(families, "memarts_origin_requests", "memarts_origin_requests_total", outcome="not_found") >= 1
    assert total(families, "memarts_origin_request_seconds", "memarts_origin_request_seconds_count") == requests
    # The cache and the memory budget.
    used = values(families, "memarts_cache_used_bytes")
    capacity = values(families, "memarts_cache_capacity_bytes")
    assert sum(used.values()) >= OBJECTS * SIZE
    assert all(0 < used[s] <= capacity[s] for s in range(SLOTS) if used[s]), (used, capacity)
    assert sum(capacity.values()) == pytest.approx(64 << 20, rel=0.01)
    assert total(families, "memarts_cached_chunks") == CHUNKS
    assert total(families, "memarts_memory_budget_bytes") > 0
    assert set(values(families, "memarts_memory_budget_used_bytes")) == set(range(SLOTS))
    for name in ("memarts_evicted_chunks", "memarts_corrupt_chunks", "memarts_connections"):
        assert set(values(families, name, name + ("_total" if families[name].type == "counter" else ""))) == set(
            range(SLOTS)
        ), name
    assert families["memarts_connections"].type == "gauge"
    # A third pass with local reads (the default): straight from the chunk files, no request to a
    # slot, reported when the process ends: hits, counted apart as local hits.
    assert total(families, "memarts_local_hits", "memarts_local_hits_total") == 0
    for i in range(OBJECTS):
        assert m.memarts("cat", f"s3://{bucket}/m/{i}").stdout == pattern(900 + i, SIZE)
    families = scrape(m.url)
    assert total(families, "memarts_local_hits", "memarts_local_hits_total") == CHUNKS
    assert total(families, "memarts_hits", "memarts_hits_total") == 2 * CHUNKS
    assert total(families, "memarts_read_seconds", "memarts_read_seconds_count", result="hit") == CHUNKS
    # The Grafana dashboard asks for nothing the endpoint does not serve.
    with open(os.path.join(ROOT, "ops", "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    served = {s.name for f in families.values() for s in f.samples}
    asked = {name for e in exprs for name in re.findall(r"memarts_[a-z_]+", e)}
    assert asked and asked <= served, sorted(asked - served)


def serving_slot(run_dir):
    """The slot whose log says it serves the metrics (the last to say so)."""
    said = []
    for slot in range(SLOTS):
        with open(os.path.join(run_dir, f"proxy-{slot}.log"), errors="replace") as log:
            if "serves the node's metrics" in log.read():
                said.append(slot)
    assert len(said) == 1, f"slots {said} say they serve the metrics"
    return said[0]


def test_a_dead_slot_is_reported_down_and_the_endpoint_moves_when_its_slot_goes(metrics_fleet):
    m = metrics_fleet
    scrape(m.url)
    serving = serving_slot(m.run_dir)
    with open(os.path.join(m.run_dir, f"proxy-{serving}.pid")) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGKILL)
    # Another slot takes the address within a few seconds and reports the dead one down.
    deadline = time.time() + 20
    while True:
        families = scrape(m.url)
        up = values(families, "memarts_slot_up")
        if up.get(serving) == 0:
            break
        if time.time() > deadline:
            pytest.fail(f"slot {serving} was killed but is still reported up: {up}")
        time.sleep(0.2)
    assert up == {s: (0 if s == serving else 1) for s in range(SLOTS)}, up
    assert set(values(families, "memarts_hits", "memarts_hits_total")) == set(range(SLOTS)) - {serving}


def test_a_bad_metrics_address_fails_the_start_naming_the_setting(fleet):
    base = tempfile.mkdtemp(prefix="memarts-metrics-", dir=fleet.directory)
    env = dict(os.environ, MEMARTS_RUN_DIR=os.path.join(base, "run"), MEMARTS_CACHE_DIR=os.path.join(base, "cache"))
    for args, extra in (
        (["--metrics-address", "nope"], {}),
        ([], {"MEMARTS_METRICS_ADDRESS": "127.0.0.1:port"}),
    ):
        out = subprocess.run([MEMARTS, "start_proxy", "1", *args], capture_output=True, text=True, env={**env, **extra})
        assert out.returncode != 0, out.stdout
        assert "metrics_address must be HOST:PORT" in out.stderr, out.stderr
        assert not os.path.exists(os.path.join(base, "run", "proxy-0.sock"))
    shutil.rmtree(base, ignore_errors=True)
