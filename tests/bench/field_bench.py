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
  nothing is resident in memory any more), left to settle (index rebuilt, startup listings made),
  and each epoch starts after the metadata TTL (every object's metadata expired);
- before each timed epoch the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`: the
  dataset comes from the SSD, as one larger than the machine's memory would);
- timed, once the 4 worker processes are up (persistent workers): they read every object once, whole, in a shuffled order, and compute its
  CRC32: through memarts (`mox.file.read(url)`) and from the local copies (`open(path).read()`).
  The memarts epoch counts the origin requests it made (through the relay) and the fleet's. A third
  side reads the cache's own chunk files raw (`open(path).read()`, the object's bytes after the
  header page checked): what the files' layout costs, apart from memarts's code. The three sides
  take turns, the one that goes first rotating.

Then the same on a pool of 3 nodes (cluster_bench's nodes on 127.0.0.2-4, 2 proxies and 2 readers
each): all read the dataset cold at once, then twice, each time after the TTL, all read it again
at once, the pool's origin requests counted at the relay.

Ratios: `field_warm_vs_download_then_read` (memarts MB/s / local copies MB/s, goal >= 0.9),
`field_origin_requests_per_object` (goal <= 0.001: one request per 1,000 objects) and
`field_pool_origin_requests_per_object` (the pool's warm epochs, goal <= 0.001 per cluster); reported
beside them, `field_chunk_files_raw_vs_download_then_read` and `field_warm_vs_chunk_files_raw` (the
layout's share of the gap and memarts's). Needs root (to drop the page cache).
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
# Where a chunk file's data starts: its header padded to a page (memarts-disk's chunk_file ALIGN),
# for identities as short as this dataset's.
CHUNK_DATA_OFFSET = 4096
SCALE = {"small": {"per_dir": 400}, "full": {"per_dir": 1000}}["small" if SMALL_SCALE else "full"]
DIRS = 3
WORKERS = 4
# Timed epochs of each side, taking turns (which side goes first rotates): the disk's speed here
# wanders by 5-15% between runs, and the ratio is the best against the best.
REPS = 5
PROXIES = 4
# The pool of 3 nodes on this one machine: 3 fleets and their readers share its cores.
POOL_PROXIES = 2
POOL_WORKERS = 2
# The fleet's default metadata TTL (proxy/src/config.rs `meta_ttl_secs`), which the epoch must follow.
DEFAULT_TTL_SECS = 60


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def require_memarts(who):
    """Fails at once when the Python package is not installed: a worker pool whose initializer
    cannot import it starts new workers for ever."""
    try:
        import memarts  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"{who}: the memarts Python package is not installed ({e}): "
                         "pip install ./shim/python (make bench does)")


def _init():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import memarts as mox

    mox.file.mode()


def _pid_after_a_moment(_):
    time.sleep(0.05)
    return os.getpid()


def _read_memarts(items):
    import memarts as mox

    return [(i, zlib.crc32(mox.file.read(url, binary=True))) for i, url in items]


def _read_local(items):
    out = []
    for i, path in items:
        with open(path, "rb") as f:
            out.append((i, zlib.crc32(f.read())))
    return out


def _read_chunk_files(items):
    """The cache's own chunk files read whole, raw (no memarts code): what the files' layout costs,
    apart from memarts. The object's bytes start at the header's aligned end."""
    out = []
    for i, path in items:
        with open(path, "rb") as f:
            out.append((i, zlib.crc32(memoryview(f.read())[CHUNK_DATA_OFFSET:])))
    return out


def chunk_files(cache):
    """The chunk files of a fleet's cache (`v1/chunks/<aa>/<32 hex>`), in no particular order."""
    root = os.path.join(cache, "v1", "chunks")
    return [os.path.join(root, fan, name) for fan in sorted(os.listdir(root)) if len(fan) == 2
            for name in os.listdir(os.path.join(root, fan)) if len(name) == 32]


def epoch(pool, fn, items, crcs, what):
    """Every item read once by the pool's workers (a shuffled order, split round-robin); seconds.
    The workers are up before the clock starts (each ran its initializer and a first task), as a
    DataLoader's persistent workers are: the epoch times reading, not starting Python."""
    order = list(items)
    random.Random(len(items)).shuffle(order)
    shares = [order[w::WORKERS] for w in range(WORKERS)]
    while len(set(pool.map(_pid_after_a_moment, range(WORKERS), chunksize=1))) < WORKERS:
        pass
    start = time.perf_counter()
    got = [x for part in pool.map(fn, shares) for x in part]
    seconds = time.perf_counter() - start
    if fn is _read_chunk_files:
        # A chunk file does not name its object: the bytes are checked as a whole, every object once.
        if sorted(crc for _, crc in got) != sorted(crcs):
            raise AssertionError(f"{what}: wrong or missing bytes")
    elif sorted(got) != sorted(enumerate(crcs)):
        raise AssertionError(f"{what}: wrong or missing bytes")
    return seconds


def memarts(*args, env):
    out = subprocess.run([MEMARTS, *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"field_bench: memarts {' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def restart_settled(env, relay_stop):
    """The fleet stopped and started again (nothing pinned any more), then left to settle: every
    slot's index rebuilt and its startup listings made (no origin request for a second). A fleet
    runs for the whole job; what an epoch meets is a settled fleet, not one starting up."""
    memarts("stop_proxy", env=env)
    memarts("start_proxy", str(PROXIES), env=env)
    deadline = time.time() + 60
    while True:
        slots = json.loads(memarts("status", "--json", env=env))["slots"]
        if slots and all(s.get("index_ready") for s in slots):
            break
        if time.time() > deadline:
            raise SystemExit("field_bench: the restarted fleet never rebuilt its index")
        time.sleep(0.05)
    seen = relay_stop.stats()["requests"]
    while True:
        time.sleep(1)
        now = relay_stop.stats()["requests"]
        if now == seen:
            return
        seen = now


def pool_epochs(base, endpoint, relay_stop, urls, crcs, total):
    """The scenario on a pool of 3 nodes (cluster_bench's nodes: fleets on 127.0.0.2-4 sharing a
    cluster file and secret; POOL_PROXIES proxies and POOL_WORKERS readers each, this machine
    having 2 cores): all nodes read the dataset cold at once, then, each time after the TTL, every
    node reads it again at once; the origin requests of those warm epochs are the pool's."""
    import cluster_bench

    ids = [f"node-{chr(ord('a') + k)}" for k in range(cluster_bench.NODES)]
    cluster_file, _ = cluster_bench.write_cluster_file(base, ids, POOL_PROXIES)
    nodes = [cluster_bench.Node(base, node_id, endpoint, cluster_file) for node_id in ids]
    try:
        cluster_bench.start_nodes(nodes, POOL_PROXIES, POOL_WORKERS)

        def all_nodes_read(what, seed):
            shares = []
            for node in nodes:
                order = list(range(len(urls)))
                random.Random(seed + len(shares)).shuffle(order)
                shares.append([[(i, urls[i]) for i in order[w::POOL_WORKERS]] for w in range(POOL_WORKERS)])
            before = relay_stop.stats()["requests"]
            start = time.perf_counter()
            pending = [node.pool.map_async(cluster_bench._read_share, share) for node, share in zip(nodes, shares)]
            for node, job in zip(nodes, pending, strict=True):
                got = sorted((i, crc) for part in job.get(timeout=1800) for i, _, crc in part[0])
                if got != sorted(enumerate(crcs)):
                    raise AssertionError(f"pool {what}: wrong or missing bytes on {node.name}")
            seconds = time.perf_counter() - start
            requests = relay_stop.stats()["requests"] - before
            print(f"  pool {what}: {len(nodes) * total / seconds / 1e6:,.0f} MB/s over {len(nodes)} nodes, "
                  f"{requests} origin requests", flush=True)
            return {"seconds": seconds, "mbs_all_nodes": len(nodes) * total / seconds / 1e6,
                    "origin_requests": requests}

        out = {"nodes": len(nodes), "proxies_per_node": POOL_PROXIES, "readers_per_node": POOL_WORKERS,
               "cold": all_nodes_read("cold epoch", 0), "warm": []}
        filled = time.time()
        for rep in range(2):
            wait = DEFAULT_TTL_SECS + 2 - (time.time() - filled)
            if wait > 0:
                print(f"  waiting {wait:.0f} s for the metadata TTL to pass", flush=True)
                time.sleep(wait)
            out["warm"].append(all_nodes_read(f"warm epoch {rep} after the TTL", 10 + rep))
            filled = time.time()
        return out
    finally:
        cluster_bench.stop_nodes(nodes)


def main():
    if os.geteuid() != 0:
        raise SystemExit("field_bench: run as root (the page cache is dropped before each timed epoch)")
    require_memarts("field_bench")
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
        restarted_at = relay_stop.stats()["requests"]
        restart_settled(env, relay_stop)
        wait = DEFAULT_TTL_SECS + 2 - (time.time() - filled)
        if wait > 0:
            print(f"waiting {wait:.0f} s for the metadata TTL ({DEFAULT_TTL_SECS} s) to pass", flush=True)
            time.sleep(wait)
        cached = chunk_files(env["MEMARTS_CACHE_DIR"])
        if len(cached) != len(urls):
            raise SystemExit(f"field_bench: {len(cached)} chunk files in the cache for {len(urls)} objects")
        runs = {"memarts": [], "local": [], "chunk_files": []}
        for rep in range(REPS):
            if rep > 0:
                # Restarted again: the pages the first epoch locked in memory are gone with it.
                restarted_at = relay_stop.stats()["requests"]
                restart_settled(env, relay_stop)
            sides = ["memarts", "local", "chunk_files"]
            for side in sides[rep % 3:] + sides[:rep % 3]:
                drop_page_cache()
                if side == "memarts":
                    before = relay_stop.stats()
                    with ctx.Pool(WORKERS, initializer=_init) as pool:
                        seconds = epoch(pool, _read_memarts, list(enumerate(urls)), crcs, "memarts warm")
                    requests = relay_stop.stats()["requests"] - before["requests"]
                    # The listings the restarted fleet made ahead (settling, then keeping them fresh).
                    ahead = before["requests"] - restarted_at
                    runs["memarts"].append({"seconds": seconds, "mbs": total / seconds / 1e6,
                                            "origin_requests": requests,
                                            "origin_requests_since_the_restart_before_the_epoch": ahead})
                    print(f"  memarts warm epoch {rep}: {total / seconds / 1e6:,.0f} MB/s, {requests} origin requests",
                          flush=True)
                    continue
                fn, items = {"local": (_read_local, paths), "chunk_files": (_read_chunk_files, cached)}[side]
                with ctx.Pool(WORKERS) as pool:
                    seconds = epoch(pool, fn, list(enumerate(items)), crcs, side)
                runs[side].append({"seconds": seconds, "mbs": total / seconds / 1e6})
                print(f"  {side.replace('_', ' ') + ':':24}{total / seconds / 1e6:,.0f} MB/s", flush=True)
            if rep < REPS - 1:
                # The next memarts epoch also after the TTL (its revalidation is the point).
                time.sleep(DEFAULT_TTL_SECS + 2)
        memarts("stop_proxy", env=env)
        print(f"the same on a pool of 3 nodes ({POOL_PROXIES} proxies and {POOL_WORKERS} readers each) ...",
              flush=True)
        pool = pool_epochs(base, endpoint, relay_stop, urls, crcs, total)
        def best(side):
            return max(r["mbs"] for r in runs[side])

        res.update(
            machine=compare.machine(),
            setup={"proxies": PROXIES, "workers": WORKERS, "meta_ttl_secs": DEFAULT_TTL_SECS,
                   "link": relay_stop.params, "page_cache": "dropped before each timed epoch",
                   "fleet": "restarted and settled before each timed epoch (nothing pinned), epochs after the TTL",
                   "worker_start": "before the clock (persistent workers)"},
            runs=runs,
            ratios={
                "field_warm_vs_download_then_read": best("memarts") / best("local"),
                "field_origin_requests_per_object": max(r["origin_requests"] for r in runs["memarts"]) / len(urls),
                "field_pool_origin_requests_per_object": max(r["origin_requests"] for r in pool["warm"]) / len(urls),
                # Where the rest goes: the chunk files' layout (read raw, no memarts code) against the
                # local copies, and memarts against reading its own files raw.
                "field_chunk_files_raw_vs_download_then_read": best("chunk_files") / best("local"),
                "field_warm_vs_chunk_files_raw": best("memarts") / best("chunk_files"),
            },
            goals={"field_warm_vs_download_then_read": (">=", 0.9), "field_origin_requests_per_object": ("<=", 0.001),
                   "field_pool_origin_requests_per_object": ("<=", 0.001)},
            pool=pool,
        )
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
