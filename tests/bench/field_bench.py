"""A warm epoch as a training job meets it (issue 29): `python3 tests/bench/field_bench.py`
(`BENCH_SCALE=small` for the quick version; MEMARTS_BIN_DIR names the binaries, target/release by
default). Writes tests/bench/results/field.json and prints a table. Asserts nothing about timings;
every reader checks the CRC32 of every object it read against the uploaded bytes.

The scenario, with default settings everywhere (a fleet of 4 proxies, the default metadata TTL):
- the origin is moto behind `relay.py`'s emulated link (+20 ms per request, 50 MB/s per connection,
  200 MB/s in total), and every request through it is counted;
- the dataset is many objects of 64-192 KiB in 3 directories, as image datasets are;
- epoch 1 reads it cold through memarts (4 worker processes, `mox.file.read`), which fills the cache;
  the reference downloads the same objects to local files (boto3, untimed): "download, then read";
- the fleet is restarted before each timed epoch (what a job restart or a node's reboot does:
  nothing is pinned in memory any more) and each starts after the metadata TTL (every object's
  metadata expired);
- before each timed epoch the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`: the
  dataset comes from the SSD, as one larger than the machine's memory would);
- timed: 4 worker processes read every object once, whole, in a shuffled order, and compute its
  CRC32: through memarts (`mox.file.read(url)`) and from the local copies (`open(path).read()`).
  The memarts epoch counts the origin requests it made (through the relay) and the fleet's.

Ratios: `field_warm_vs_download_then_read` (memarts MB/s / local copies MB/s, goal >= 0.9) and
`field_origin_requests_per_object` (goal <= 0.001: one request per 1,000 objects). Needs root (to
drop the page cache).
"""

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (machine)
import python_bench  # noqa: E402  (MEMARTS, start_moto, write_results)
import relay  # noqa: E402

MEMARTS = python_bench.MEMARTS
SMALL_SCALE = os.environ.get("BENCH_SCALE") == "small"
BUCKET = "fieldbench"
KIB = 1 << 10
SCALE = {"small": {"per_dir": 400}, "full": {"per_dir": 1000}}["small" if SMALL_SCALE else "full"]
DIRS = 3
WORKERS = 4
PROXIES = 4
# The fleet's default metadata TTL (proxy/src/config.rs `meta_ttl_secs`), which the epoch must follow.
DEFAULT_TTL_SECS = 60


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _init():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import memarts as mox

    mox.file.mode()


def _read_memarts(items):
    import memarts as mox

    return [(i, zlib.crc32(mox.file.read(url, binary=True))) for i, url in items]


def _read_local(items):
    out = []
    for i, path in items:
        with open(path, "rb") as f:
            out.append((i, zlib.crc32(f.read())))
    return out


def epoch(pool, fn, items, crcs, what):
    """Every item read once by the pool's workers (a shuffled order, split round-robin); seconds."""
    order = list(items)
    random.Random(len(items)).shuffle(order)
    shares = [order[w::WORKERS] for w in range(WORKERS)]
    start = time.perf_counter()
    got = [x for part in pool.map(fn, shares) for x in part]
    seconds = time.perf_counter() - start
    if sorted(got) != sorted(enumerate(crcs)):
        raise AssertionError(f"{what}: wrong or missing bytes")
    return seconds


def memarts(*args, env):
    out = subprocess.run([MEMARTS, *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"field_bench: memarts {' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def main():
    if os.geteuid() != 0:
        raise SystemExit("field_bench: run as root (the page cache is dropped before each timed epoch)")
    import boto3

    base = tempfile.mkdtemp(prefix="memarts-field-")
    moto = relay_stop = None
    env = None
    try:
        direct, moto = python_bench.start_moto()
        host, port = direct.rsplit("//", 1)[1].split(":")
        endpoint, relay_stop = relay.start_relay(host, int(port), mbps_total=200)
        s3 = boto3.client("s3", endpoint_url=direct, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        rng = random.Random(29)
        urls, paths, crcs, total = [], [], [], 0
        local = os.path.join(base, "local")
        for i in range(DIRS * SCALE["per_dir"]):
            data = rng.randbytes(rng.randint(64 * KIB, 192 * KIB))
            key = f"train/class{i % DIRS}/img{i:06d}.jpg"
            s3.put_object(Bucket=BUCKET, Key=key, Body=data)
            urls.append(f"s3://{BUCKET}/{key}")
            paths.append(os.path.join(local, key))
            crcs.append(zlib.crc32(data))
            total += len(data)
        print(f"dataset: {len(urls)} objects of 64-192 KiB in {DIRS} directories, {total / (1 << 20):,.0f} MiB",
              flush=True)
        env = dict(os.environ, MEMARTS_RUN_DIR=os.path.join(base, "run"), MEMARTS_CACHE_DIR=os.path.join(base, "cache"),
                   AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        for k in ("MEMARTS_CONFIG", "MEMARTS_CLUSTER"):
            env.pop(k, None)
        memarts("start_proxy", str(PROXIES), env=env)
        os.environ.update({k: env[k] for k in ("MEMARTS_RUN_DIR", "MEMARTS_CACHE_DIR", "AWS_ENDPOINT_URL",
                                               "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                               "AWS_REGION")})
        ctx = multiprocessing.get_context("spawn")
        res = {"scale": "small" if SMALL_SCALE else "full", "dataset": {"objects": len(urls), "bytes": total, "dirs": DIRS}}
        with ctx.Pool(WORKERS, initializer=_init) as pool:
            cold = epoch(pool, _read_memarts, list(enumerate(urls)), crcs, "memarts cold")
        filled = time.time()
        res["cold_epoch_s"] = cold
        print(f"cold epoch through memarts: {cold:.1f} s", flush=True)
        # The reference's download (untimed), over the same link.
        s3_link = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                               aws_secret_access_key="testing")
        for url, path in zip(urls, paths, strict=True):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3_link.download_file(BUCKET, url.split("/", 3)[3], path)
        # A restart (nothing pinned), then past the TTL of the last object read.
        memarts("stop_proxy", env=env)
        memarts("start_proxy", str(PROXIES), env=env)
        wait = DEFAULT_TTL_SECS + 2 - (time.time() - filled)
        if wait > 0:
            print(f"waiting {wait:.0f} s for the metadata TTL ({DEFAULT_TTL_SECS} s) to pass", flush=True)
            time.sleep(wait)
        runs = {"memarts": [], "local": []}
        for rep in range(2):
            if rep > 0:
                # Restarted again: the pages the first epoch locked in memory are gone with it.
                memarts("stop_proxy", env=env)
                memarts("start_proxy", str(PROXIES), env=env)
            drop_page_cache()
            before = relay_stop.stats()
            with ctx.Pool(WORKERS, initializer=_init) as pool:
                seconds = epoch(pool, _read_memarts, list(enumerate(urls)), crcs, "memarts warm")
            after = relay_stop.stats()
            requests = after["requests"] - before["requests"]
            runs["memarts"].append({"seconds": seconds, "mbs": total / seconds / 1e6, "origin_requests": requests})
            print(f"  memarts warm epoch {rep}: {total / seconds / 1e6:,.0f} MB/s, {requests} origin requests",
                  flush=True)
            drop_page_cache()
            with ctx.Pool(WORKERS, initializer=_init) as pool:
                seconds = epoch(pool, _read_local, list(enumerate(paths)), crcs, "local copies")
            runs["local"].append({"seconds": seconds, "mbs": total / seconds / 1e6})
            print(f"  local copies:           {total / seconds / 1e6:,.0f} MB/s", flush=True)
            if rep == 0:
                # The next memarts epoch also after the TTL (its revalidation is the point).
                time.sleep(DEFAULT_TTL_SECS + 2)
        first = runs["memarts"][0]
        res.update(
            machine=compare.machine(),
            setup={"proxies": PROXIES, "workers": WORKERS, "meta_ttl_secs": DEFAULT_TTL_SECS,
                   "link": relay_stop.params, "page_cache": "dropped before each timed epoch",
                   "fleet": "restarted before each timed epoch (nothing pinned), epochs after the TTL"},
            runs=runs,
            ratios={
                "field_warm_vs_download_then_read": max(r["mbs"] for r in runs["memarts"])
                / max(r["mbs"] for r in runs["local"]),
                "field_origin_requests_per_object": max(r["origin_requests"] for r in runs["memarts"]) / len(urls),
            },
            goals={"field_warm_vs_download_then_read": (">=", 0.9), "field_origin_requests_per_object": ("<=", 0.001)},
        )
        del first
        print(json.dumps(res["ratios"], indent=2))
        python_bench.write_results("field", res)
    finally:
        if env:
            subprocess.run([MEMARTS, "stop_proxy"], env=env, capture_output=True, check=False)
        if relay_stop:
            relay_stop()
        if moto:
            moto.kill()
            moto.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
