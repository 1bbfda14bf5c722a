"""memarts against what a user would pick instead, side by side in one run, through an emulated remote
link: `python3 tests/bench/compare.py` (`BENCH_SCALE=small` for the quick version; MEMARTS_BIN_DIR
names the directory of the binaries, target/release by default). Writes tests/bench/results/compare.json and prints a summary table. Asserts nothing
about timings; every scenario is checked for correct bytes, so a broken one cannot report a fast number.

The origin is moto (an S3 server) on loopback behind `relay.py`, a TCP relay that adds a latency to
every HTTP request and caps the bandwidth per connection and in total (defaults 20 ms, 50 MB/s,
200 MB/s; BENCH_LINK_LATENCY_MS, BENCH_LINK_MBPS_PER_CONN, BENCH_LINK_MBPS_TOTAL), so that cold reads
pay what a cloud object store costs. Every client, memarts included, reaches the origin through the
relay; the datasets are uploaded directly.

Two datasets, fixed seed: many small files (64-256 KiB, like images) and a few large ones. Scenarios,
each in MB/s (10^6 bytes) and files/s, for each dataset:

a. page cache: `open(path, 'rb').read()` of local copies of the same bytes, read once before (the
   ceiling of any local read);
b. memarts: `mox.file.read(url, binary=True)` in W forked worker processes (files round-robin) against
   a fleet of P proxies whose origin is the relay (with W above the number of large files, the
   extra workers have no large file to read). Worker sweep (W = 1, 4, 16 with P = 4): each with a
   fresh cache, a cold epoch (fills the cache), warm epochs, then `memarts stop_proxy` +
   `memarts start_proxy P` and one more epoch ("restart") with the same worker processes. Proxy sweep
   (W = 1, P = 1, 2, 8; P = 4 is in the worker sweep) over the cache the worker sweep filled: each fleet
   is started on a warm cache with another N, so its first epoch is a "restart" epoch (with a new worker
   process: a running client routes by the old N until it reaches a live slot, and waits out
   MEMARTS_TIMEOUT for a slot that no longer exists), then warm epochs (the cold epoch depends
   on the origin, not on P). Origin requests of each epoch are counted from the proxies' request logs
   (`<run dir>/origin-<slot>.log`, one line per attempt); a restart epoch must make 0 GETs;
c. boto3, download then read (the MoXing seed's workflow): cold = `download_file` of each object to a
   local directory and a read of the file; warm = reading the downloaded files again;
d. s3torchconnector: `S3MapDataset.from_prefix` over the relay (AWS CRT client, path-style), every item
   read fully, two epochs (no cache: both fetch from the origin);
e. fsspec + s3fs with a `filecache`: cold epoch (downloads into the file cache) and warm epoch (served
   from the file cache).

Scale: BENCH_SCALE=small: 200 small files, 2 x 64 MiB, W in {1, 4}, P in {1, 4} (about 2 minutes on
a 2-core VM); otherwise 1000 small files, 2 x 256 MiB, W in {1, 4, 16}, P in {1, 2, 4, 8} (about 12
minutes: with 20 ms per request, most cold and restart epochs cost one or two round trips per file).

Peers (c-e) run in one process; the ratios compare them with memarts with one worker process. Warm
figures are the best of 5 epochs (every side); a cold epoch is done once per fresh cache. memarts'
first warm epochs are not yet its steady state, and `runs_mbs` shows each: with the default metadata
TTL (60 s), the first one after a long cold fill asks the origin for each object's version again (a
HEAD each, counted), and the slots make resident the chunks read locally in the next one (one more read of
each from the disk and one CRC32C; see docs/ARCHITECTURE.md's resident chunks). Peers missing on the
machine are pip-installed quietly; one that cannot be installed or cannot run is reported with its
reason instead of a number.
"""

import json
import multiprocessing
import os
import platform
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

import python_bench  # noqa: E402  (start_moto, MEMARTS, ROOT)
import relay  # noqa: E402

ROOT = python_bench.ROOT
MEMARTS = python_bench.MEMARTS
SMALL_SCALE = os.environ.get("BENCH_SCALE") == "small"
BUCKET = "compare"
KIB, MIB = 1 << 10, 1 << 20

SCALE = {
    "small": {"small_files": 200, "large_files": 2, "large_size": 64 * MIB, "workers": [1, 4],
              "proxies": [1, 4], "reps": 5},
    "full": {"small_files": 1000, "large_files": 2, "large_size": 256 * MIB, "workers": [1, 4, 16],
             "proxies": [1, 2, 4, 8], "reps": 5},
}["small" if SMALL_SCALE else "full"]

PEERS = {"s3torchconnector": "s3torchconnector", "fsspec": "fsspec", "s3fs": "s3fs"}  # module: pip name


# ---------------------------------------------------------------- datasets


class Dataset:
    """Objects under `s3://BUCKET/<name>/`, with local copies and their CRC32 for checks."""

    def __init__(self, name, local_dir):
        self.name = name
        self.local_dir = local_dir
        self.keys, self.sizes, self.paths, self.crcs = [], [], [], []

    @property
    def total(self):
        return sum(self.sizes)

    @property
    def urls(self):
        return [f"s3://{BUCKET}/{k}" for k in self.keys]

    def sample(self):
        """Indices checked byte for byte in every scenario: a spread of small files, every large one."""
        step = max(1, len(self.keys) // 8)
        return list(range(0, len(self.keys), step))

    def describe(self):
        return {"files": len(self.keys), "bytes": self.total, "min_size": min(self.sizes),
                "max_size": max(self.sizes), "prefix": f"s3://{BUCKET}/{self.name}/"}


def make_dataset(s3, name, sizes, base, seed):
    """Uploads objects of the given sizes (random bytes, fixed seed) straight to moto and writes the same
    bytes under base/local/<name>/."""
    rng = random.Random(seed)
    ds = Dataset(name, os.path.join(base, "local", name))
    os.makedirs(ds.local_dir)
    for i, size in enumerate(sizes):
        # randbytes takes at most 2^31 bits at a time
        data = b"".join(rng.randbytes(min(64 * MIB, size - at)) for at in range(0, size, 64 * MIB))
        key = f"{name}/f{i:05d}.bin"
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        path = os.path.join(ds.local_dir, f"f{i:05d}.bin")
        with open(path, "wb") as f:
            f.write(data)
        ds.keys.append(key)
        ds.sizes.append(size)
        ds.paths.append(path)
        ds.crcs.append(zlib.crc32(data))
    return ds


def make_datasets(s3, base):
    rng = random.Random(4)
    small_sizes = [rng.randint(64 * KIB, 256 * KIB) for _ in range(SCALE["small_files"])]
    large_sizes = [SCALE["large_size"]] * SCALE["large_files"]
    return [make_dataset(s3, "small", small_sizes, base, seed=5), make_dataset(s3, "large", large_sizes, base, seed=6)]


def check(ds, what, got):
    """`got`: {index: (length, crc32)} for ds.sample(); raises if any differs from the local copy."""
    for i in ds.sample():
        if got.get(i) != (ds.sizes[i], ds.crcs[i]):
            raise AssertionError(f"{what}: wrong bytes for {ds.keys[i]}: got {got.get(i)}, "
                                 f"want {(ds.sizes[i], ds.crcs[i])}")


def digest(data):
    return len(data), zlib.crc32(data)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- measuring


def rate(ds, seconds):
    return {"mbs": ds.total / seconds / 1e6, "files_per_s": len(ds.keys) / seconds, "seconds": seconds}


def timed_epoch(ds, epoch):
    """Runs `epoch()` (which returns the bytes it read) and returns its rate; the byte count must match."""
    start = time.perf_counter()
    n = epoch()
    seconds = time.perf_counter() - start
    if n != ds.total:
        raise AssertionError(f"{ds.name}: read {n} bytes, want {ds.total}")
    return rate(ds, seconds)


def best_of(ds, epoch, reps):
    runs = [timed_epoch(ds, epoch) for _ in range(reps)]
    best = max(runs, key=lambda r: r["mbs"])
    return dict(best, runs_mbs=[r["mbs"] for r in runs])


class OriginCounter:
    """Origin requests by kind, seen by the relay (all clients) and, for memarts, in the proxies' logs."""

    def __init__(self, relay_stop, run_dir=None):
        self.relay_stop = relay_stop
        self.run_dir = run_dir
        self.start = time.time()
        self.relay_before = self.relay_stop.stats()["requests"]

    def since(self):
        """Requests since the counter was made: the relay's, and the lines of the slots' logs written
        since then (a log file that filled is rotated to `<name>.1`, which is read too)."""
        out = {"relay_requests": self.relay_stop.stats()["requests"] - self.relay_before}
        for op in origin_log_ops(self.run_dir, self.start) if self.run_dir else []:
            out[op] = out.get(op, 0) + 1
        return dict(sorted(out.items()))


def origin_log_ops(run_dir, since):
    """The operation of each line of the slots' request logs (`origin-<slot>.log` and the rotated
    `origin-<slot>.log.1`) written at or after `since` (unix time; a line is written when its attempt
    ends: "<unix time> <OP> <url> ... attempt=<n> <outcome> <ms>ms")."""
    for name in os.listdir(run_dir):
        if name.startswith("origin-") and (name.endswith(".log") or name.endswith(".log.1")):
            with open(os.path.join(run_dir, name)) as f:
                for line in f:
                    when, op = line.split(" ", 2)[:2]
                    if float(when) >= since - 0.001:
                        yield op


def counted(ds, counter_factory, epoch):
    """timed_epoch, plus the origin requests it caused."""
    counter = counter_factory()
    result = timed_epoch(ds, epoch)
    result["origin_requests"] = counter.since()
    return result


# ---------------------------------------------------------------- a. page cache


def page_cache(ds, reps):
    def epoch():
        n = 0
        for p in ds.paths:
            with open(p, "rb") as f:
                n += len(f.read())
        return n

    epoch()  # into the page cache
    return best_of(ds, epoch, reps)


# ---------------------------------------------------------------- b. memarts


def _worker_init():
    import memarts as mox

    # Not main()'s handler (SystemExit, to run its finally blocks): Pool.terminate() sends workers
    # SIGTERM, and a worker whose handler did not run (one full make bench hung here, a worker left
    # waiting on the pool's task queue) kept Pool.join() waiting for good.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    mox.file.mode()  # creates this process's client before the first timed read


def _memarts_read(urls):
    import memarts as mox

    n = 0
    for u in urls:
        n += len(mox.file.read(u, binary=True))
    return n, mox.file.mode()


def _memarts_digests(urls):
    import memarts as mox

    return [digest(mox.file.read(u, binary=True)) for u in urls]


class Fleet:
    """A memarts fleet (run dir and cache dir under `base`) whose origin is the relay."""

    def __init__(self, base, cache_dir, endpoint):
        self.run_dir = os.path.join(base, "run")
        self.env = dict(os.environ, MEMARTS_RUN_DIR=self.run_dir, MEMARTS_CACHE_DIR=cache_dir,
                        AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                        AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        self.running = False

    def start(self, proxies):
        out = subprocess.run([MEMARTS, "start_proxy", str(proxies)], env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"compare: `memarts start_proxy {proxies}` failed ({out.returncode}): "
                             f"{out.stderr.strip() or out.stdout.strip()}")
        self.running = True

    def stop(self):
        if self.running:
            subprocess.run([MEMARTS, "stop_proxy"], env=self.env, capture_output=True)
            self.running = False


# The workers' environment besides MEMARTS_RUN_DIR. A shim call gives up after MEMARTS_TIMEOUT (30 s by
# default) even while the proxy is still fetching from the origin, and moto serves a 1 MiB range of a
# 256 MiB object in ~150 ms, one range at a time, so a cold read of one large object takes longer than
# that here (not against a cloud store at the emulated link's speed).
WORKER_ENV = {"MEMARTS_TIMEOUT": "900"}


class Workers:
    """W forked worker processes reading through the fleet of `fleet` (files split round-robin)."""

    def __init__(self, fleet, workers):
        # inherited by the forked workers
        os.environ.update(WORKER_ENV, MEMARTS_RUN_DIR=fleet.run_dir)
        self.n = workers
        self.pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)

    def epoch(self, ds):
        shares = [ds.urls[i::self.n] for i in range(self.n)]
        results = self.pool.map(_memarts_read, shares, chunksize=1)
        modes = {m for _, m in results}
        if modes != {"proxy"}:
            raise AssertionError(f"memarts workers are in mode {modes}, not proxy")
        return sum(n for n, _ in results)

    def check(self, ds, what):
        idx = ds.sample()
        digests = self.pool.apply(_memarts_digests, ([ds.urls[i] for i in idx],))
        check(ds, what, dict(zip(idx, digests)))

    def close(self):
        self.pool.terminate()
        self.pool.join()


def memarts_epochs(fleet, workers, datasets, relay_stop, reps, cold):
    """Epochs of one fleet and one set of workers: cold (if `cold`: the cache is fresh) then warm (best
    of `reps`; the origin requests of all of them are counted: a stale metadata entry is revalidated)."""
    counter = lambda: OriginCounter(relay_stop, fleet.run_dir)  # noqa: E731
    out = {ds.name: {} for ds in datasets}
    for ds in datasets:
        if cold:
            out[ds.name]["cold"] = counted(ds, counter, lambda: workers.epoch(ds))
            workers.check(ds, f"memarts cold {ds.name}")
    for ds in datasets:
        runs = [counted(ds, counter, lambda: workers.epoch(ds)) for _ in range(reps)]
        out[ds.name]["warm"] = _best_counted(runs)
    return out


def _best_counted(runs):
    best = dict(max(runs, key=lambda r: r["mbs"]))
    best["runs_mbs"] = [r["mbs"] for r in runs]
    kinds = sorted({k for r in runs for k in r["origin_requests"]})
    best["origin_requests"] = {k: sum(r["origin_requests"].get(k, 0) for r in runs) for k in kinds}
    best["first_mbs"] = runs[0]["mbs"]
    return best


def restart_epoch(fleet, proxies, workers_factory, datasets, relay_stop):
    """Stops the fleet, starts it with `proxies`, and reads every dataset once: the origin must see no
    GET. Returns (results, workers) — the workers are the ones that read (new ones if the factory
    makes them)."""
    fleet.stop()
    fleet.start(proxies)
    workers = workers_factory()
    counter = lambda: OriginCounter(relay_stop, fleet.run_dir)  # noqa: E731
    out = {}
    try:
        for ds in datasets:
            r = counted(ds, counter, lambda: workers.epoch(ds))
            gets = r["origin_requests"].get("GET", 0)
            r["origin_gets"] = gets
            if gets:
                print(f"  !! memarts restart epoch of {ds.name}: {gets} origin GETs (want 0)")
            workers.check(ds, f"memarts restart {ds.name}")
            out[ds.name] = r
    except BaseException:
        workers.close()
        raise
    return out, workers


def memarts_worker_sweep(base, endpoint, datasets, relay_stop, reps):
    """W = each of SCALE['workers'], P = 4: fresh cache, cold, warm, restart. Returns (results, cache dir
    of the last configuration, kept for the proxy sweep)."""
    results = []
    cache_dir = None
    for w in SCALE["workers"]:
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
        cache_dir = os.path.join(base, f"cache-w{w}")
        fleet = Fleet(os.path.join(base, f"fleet-w{w}"), cache_dir, endpoint)
        workers = None
        try:
            fleet.start(4)
            workers = Workers(fleet, w)
            print(f"memarts, {w} worker(s), 4 proxies ...", flush=True)
            r = memarts_epochs(fleet, workers, datasets, relay_stop, reps, cold=True)
            restart, workers = restart_epoch(fleet, 4, lambda: workers, datasets, relay_stop)
            for name, x in restart.items():
                r[name]["restart"] = x
            results.append({"workers": w, "proxies": 4, **r})
        finally:
            if workers:
                workers.close()
            fleet.stop()
    return results, cache_dir


def memarts_proxy_sweep(base, endpoint, datasets, relay_stop, reps, cache_dir):
    """W = 1, P = each of SCALE['proxies'] but 4 (measured by the worker sweep), over the warm cache:
    restart epoch (a fleet with another N, a new worker process), then warm epochs."""
    results = []
    fleet = Fleet(os.path.join(base, "fleet-p"), cache_dir, endpoint)
    try:
        for p in [p for p in SCALE["proxies"] if p != 4]:
            print(f"memarts, 1 worker, {p} proxies (warm cache) ...", flush=True)
            restart, workers = restart_epoch(fleet, p, lambda: Workers(fleet, 1), datasets, relay_stop)
            try:
                r = memarts_epochs(fleet, workers, datasets, relay_stop, reps, cold=False)
            finally:
                workers.close()
            for name, x in restart.items():
                r[name]["restart"] = x
            results.append({"workers": 1, "proxies": p, **r})
    finally:
        fleet.stop()
    return results


def warmup_epoch(fleet, ds, threads):
    """One epoch through the Rust shim: `memarts warmup PREFIX --threads T` reads every object of the
    set (bytes delivered to the client and checked, then dropped). Returns the bytes it read, after
    checking that it read every object and failed none."""
    out = subprocess.run([MEMARTS, "warmup", f"s3://{BUCKET}/{ds.name}/", "--threads", str(threads)],
                         env=dict(fleet.env, **WORKER_ENV), capture_output=True, text=True)
    objects = [line for line in out.stdout.splitlines() if line.strip().startswith("read ")]
    if out.returncode != 0 or not objects or f"read {len(ds.keys)} objects" not in objects[0]:
        raise AssertionError(f"memarts warmup of {ds.name} failed ({out.returncode}): {out.stdout}{out.stderr}")
    return ds.total


def rust_shim_sweep(base, endpoint, datasets, relay_stop, reps):
    """The Rust shim (through `memarts warmup`, T reader threads in one process), P = 4: fresh cache,
    cold epoch, warm epochs, warm epoch after stop_proxy/start_proxy (origin requests counted)."""
    results = []
    for t in SCALE["workers"]:
        cache_dir = os.path.join(base, f"cache-rust-t{t}")
        fleet = Fleet(os.path.join(base, f"fleet-rust-t{t}"), cache_dir, endpoint)
        try:
            fleet.start(4)
            print(f"memarts Rust shim, {t} thread(s), 4 proxies ...", flush=True)
            r = {}
            for ds in datasets:
                counter = lambda: OriginCounter(relay_stop, fleet.run_dir)  # noqa: E731
                cold = counted(ds, counter, lambda: warmup_epoch(fleet, ds, t))
                warm = best_of(ds, lambda: warmup_epoch(fleet, ds, t), reps)
                r[ds.name] = {"cold": cold, "warm": warm}
            fleet.stop()
            fleet.start(4)
            for ds in datasets:
                counter = lambda: OriginCounter(relay_stop, fleet.run_dir)  # noqa: E731
                restart = counted(ds, counter, lambda: warmup_epoch(fleet, ds, t))
                restart["origin_gets"] = restart["origin_requests"].get("GET", 0)
                r[ds.name]["restart"] = restart
            results.append({"threads": t, "proxies": 4, **r})
        finally:
            fleet.stop()
            shutil.rmtree(cache_dir, ignore_errors=True)
    return results


# ---------------------------------------------------------------- c. boto3 download then read


def boto3_download_then_read(endpoint, ds, base, relay_stop, reps):
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    dest = tempfile.mkdtemp(prefix=f"boto3-{ds.name}-", dir=base)
    paths = [os.path.join(dest, os.path.basename(k)) for k in ds.keys]
    try:
        def cold():
            n = 0
            for key, path in zip(ds.keys, paths):
                s3.download_file(BUCKET, key, path)
                with open(path, "rb") as f:
                    n += len(f.read())
            return n

        def warm():
            n = 0
            for path in paths:
                with open(path, "rb") as f:
                    n += len(f.read())
            return n

        out = {"cold": counted(ds, lambda: OriginCounter(relay_stop), cold)}
        out["warm"] = best_of(ds, warm, reps)
        check(ds, f"boto3 {ds.name}", {i: digest(read_file(paths[i])) for i in ds.sample()})
        return out
    finally:
        shutil.rmtree(dest, ignore_errors=True)


# ---------------------------------------------------------------- d. s3torchconnector


def s3torchconnector_epochs(endpoint, ds, relay_stop):
    from s3torchconnector import S3ClientConfig, S3MapDataset

    dataset = S3MapDataset.from_prefix(f"s3://{BUCKET}/{ds.name}/", region="us-east-1", endpoint=endpoint,
                                       s3client_config=S3ClientConfig(force_path_style=True))
    if len(dataset) != len(ds.keys):  # lists the prefix (not timed: memarts is given its URLs too)
        raise AssertionError(f"s3torchconnector lists {len(dataset)} objects under {ds.name}/, want {len(ds.keys)}")
    if [dataset[i].key for i in range(len(dataset))] != ds.keys:
        raise AssertionError(f"s3torchconnector lists other keys under {ds.name}/")

    def epoch():
        n = 0
        for i in range(len(dataset)):
            n += len(dataset[i].read())
        return n

    counter = lambda: OriginCounter(relay_stop)  # noqa: E731
    out = {"epoch1": counted(ds, counter, epoch), "epoch2": counted(ds, counter, epoch)}
    check(ds, f"s3torchconnector {ds.name}", {i: digest(dataset[i].read()) for i in ds.sample()})
    return out


# ---------------------------------------------------------------- e. fsspec filecache


def fsspec_filecache_epochs(endpoint, ds, base, relay_stop, reps):
    import fsspec

    cache = tempfile.mkdtemp(prefix=f"fsspec-{ds.name}-", dir=base)
    try:
        fs = fsspec.filesystem(
            "filecache", target_protocol="s3", cache_storage=cache, skip_instance_cache=True,
            target_options={"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
                            "key": "testing", "secret": "testing", "skip_instance_cache": True})
        paths = [f"{BUCKET}/{k}" for k in ds.keys]

        def epoch():
            n = 0
            for p in paths:
                with fs.open(p, "rb") as f:
                    n += len(f.read())
            return n

        counter = lambda: OriginCounter(relay_stop)  # noqa: E731
        out = {"cold": counted(ds, counter, epoch)}
        runs = [counted(ds, counter, epoch) for _ in range(reps)]
        out["warm"] = _best_counted(runs)

        def read(i):
            with fs.open(paths[i], "rb") as f:
                return digest(f.read())

        check(ds, f"fsspec filecache {ds.name}", {i: read(i) for i in ds.sample()})
        return out
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# ---------------------------------------------------------------- setup, report


def origin_range_cost(s3_direct, ds):
    """What one ranged GET of 1 MiB and of 8 MiB of a large object costs moto itself (no relay), in ms:
    moto reads the whole object for every range, so this grows with the object's size (a cloud store's
    does not), and clients reading many small ranges of a large object pay it more often."""
    out = {"object_bytes": ds.sizes[0]}
    for size in (MIB, 8 * MIB):
        best = float("inf")
        for i in range(3):
            start = time.perf_counter()
            body = s3_direct.get_object(Bucket=BUCKET, Key=ds.keys[0], Range=f"bytes={i * size}-{(i + 1) * size - 1}")
            body["Body"].read()
            best = min(best, time.perf_counter() - start)
        out[f"range_{size // MIB}mib_ms"] = best * 1000
    return out


class Phases:
    """Wall-clock seconds of each phase of the run, for the results."""

    def __init__(self):
        self.seconds = {}
        self.mark = time.perf_counter()

    def done(self, name):
        now = time.perf_counter()
        self.seconds[name] = round(now - self.mark, 1)
        self.mark = now


def ensure_peers():
    """Imports the peers, pip-installing the missing ones quietly. Returns {peer: reason} for those that
    still cannot be imported."""
    import importlib
    import importlib.util

    missing = [m for m in PEERS if importlib.util.find_spec(m) is None]
    if missing:
        print(f"installing {', '.join(PEERS[m] for m in missing)} ...", flush=True)
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              *[PEERS[m] for m in missing]], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"pip could not install the peers: {out.stderr.strip()[-500:]}")
        importlib.invalidate_caches()
    failed = {}
    for m in PEERS:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 — recorded in the results instead of a number
            failed[m] = f"cannot import {m}: {type(e).__name__}: {e}"
    return failed


def machine():
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    built = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(MEMARTS)))
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kib / (1 << 20), 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "git_head": head.stdout.strip() or None, "memarts_bin": MEMARTS, "memarts_bin_built": built}


def try_peer(results, name, unavailable, fn):
    """Runs one peer's scenario; records the reason instead of figures if it cannot run."""
    if name in unavailable:
        results[name] = {"unavailable": unavailable[name]}
        return
    try:
        results[name] = fn()
    except AssertionError:
        raise  # wrong bytes: a broken scenario must not go unnoticed
    except Exception as e:  # noqa: BLE001
        results[name] = {"unavailable": f"{type(e).__name__}: {e}"}
        print(f"  {name} could not run: {type(e).__name__}: {e}")


def ratio(a, b):
    return a / b if a and b else None


def ratios(res):
    mem = next(r for r in res["memarts"]["worker_sweep"] if r["workers"] == 1)

    def warm(name):
        return mem[name]["warm"]["mbs"]

    def peer(scenario, name, key):
        r = res[scenario].get(name, {})
        return r.get(key, {}).get("mbs") if "unavailable" not in r else None

    out = {"warm_small_vs_page_cache": ratio(warm("small"), res["page_cache"]["small"]["mbs"])}
    for name in ("small", "large"):
        suffix = "" if name == "small" else "_large"
        out[f"warm_vs_s3torchconnector{suffix}"] = ratio(warm(name), peer("s3torchconnector", name, "epoch2"))
        out[f"warm_vs_fsspec_filecache{suffix}"] = ratio(warm(name), peer("fsspec_filecache", name, "warm"))
        out[f"warm_vs_download_then_read{suffix}"] = ratio(warm(name), peer("boto3_download_then_read", name, "warm"))
    out["warm_large_vs_page_cache"] = ratio(warm("large"), res["page_cache"]["large"]["mbs"])
    return out


def summary(res):
    rows = []

    def row(label, name, r):
        if r is None:
            return
        if "unavailable" in r:
            rows.append((label, name, "n/a", "", r["unavailable"][:60]))
            return
        reqs = r.get("origin_requests")
        note = ""
        if reqs:
            logged = ", ".join(f"{k} {v}" for k, v in reqs.items() if v and k != "relay_requests")
            seen = reqs.get("relay_requests", 0)
            note = "origin: " + (logged or (f"{seen} requests" if seen else "none"))
            if logged and "first_mbs" in r:  # warm epochs that went to the origin (metadata TTL)
                note += f" (first epoch {r['first_mbs']:,.0f} MB/s)"
        rows.append((label, name, f"{r['mbs']:,.0f}", f"{r['files_per_s']:,.0f}", note))

    for name in ("small", "large"):
        row("page cache open().read()", name, res["page_cache"][name])
    for r in res["memarts"]["worker_sweep"]:
        for name in ("small", "large"):
            for phase in ("cold", "warm", "restart"):
                row(f"memarts W={r['workers']} P={r['proxies']} {phase}", name, r[name].get(phase))
    for r in res["memarts"]["proxy_sweep"]:
        for name in ("small", "large"):
            for phase in ("restart", "warm"):
                row(f"memarts W=1 P={r['proxies']} {phase} (sweep)", name, r[name].get(phase))
    for scenario, phases in (("boto3_download_then_read", ("cold", "warm")),
                             ("s3torchconnector", ("epoch1", "epoch2")),
                             ("fsspec_filecache", ("cold", "warm"))):
        for name in ("small", "large"):
            r = res[scenario].get(name, {})
            if "unavailable" in r:
                row(f"{scenario}", name, r)
                continue
            for phase in phases:
                row(f"{scenario} {phase}", name, r.get(phase))
    widths = [max(len(str(x[i])) for x in rows) for i in range(5)]
    head = ("scenario", "set", "MB/s", "files/s", "")
    print()
    print("  ".join(str(h).ljust(w) for h, w in zip(head, widths)))
    for x in rows:
        print("  ".join([x[0].ljust(widths[0]), x[1].ljust(widths[1]), x[2].rjust(widths[2]),
                         x[3].rjust(widths[3]), x[4]]))
    print()
    for k, v in res["ratios"].items():
        goal = res["goals"].get(k, "")
        print(f"  {k:36} {'n/a' if v is None else f'{v:.2f}x':>8}  {('goal ' + goal) if goal else ''}")


# The goals of the benchmark issue (#4) for the ratios this harness measures.
GOALS = {
    "warm_small_vs_page_cache": ">= 0.7",
    "warm_vs_s3torchconnector": ">= 5",
    "warm_vs_fsspec_filecache": ">= 1 (faster than every peer)",
    "warm_vs_download_then_read": ">= 1 (faster than every peer)",
}


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    if not os.access(MEMARTS, os.X_OK):
        raise SystemExit(f"compare: {MEMARTS} not found (build with `cargo build --release --bins` or set MEMARTS_BIN_DIR)")
    started = time.time()
    unavailable = ensure_peers()
    import boto3

    base = tempfile.mkdtemp(prefix="memarts-compare-")
    moto = relay_stop = None
    try:
        direct, moto = python_bench.start_moto()
        host, port = direct.rsplit("//", 1)[1].split(":")
        endpoint, relay_stop = relay.start_relay(host, int(port))
        link = dict(relay_stop.params, self_check=relay.self_check(direct, endpoint, relay_stop.params))
        s3 = boto3.client("s3", endpoint_url=direct, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        phases = Phases()
        datasets = make_datasets(s3, base)
        for ds in datasets:
            print(f"dataset {ds.name}: {len(ds.keys)} objects, {ds.total / MIB:,.1f} MiB")
        link["moto"] = origin_range_cost(s3, datasets[1])
        phases.done("datasets")
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        reps = SCALE["reps"]

        res = {"page_cache": {ds.name: page_cache(ds, reps) for ds in datasets}}
        phases.done("page_cache")
        sweep, cache_dir = memarts_worker_sweep(base, endpoint, datasets, relay_stop, reps)
        phases.done("memarts_worker_sweep")
        res["memarts"] = {"worker_env": WORKER_ENV, "worker_sweep": sweep,
                          "proxy_sweep": memarts_proxy_sweep(base, endpoint, datasets, relay_stop, reps, cache_dir)}
        shutil.rmtree(cache_dir, ignore_errors=True)
        phases.done("memarts_proxy_sweep")
        res["memarts"]["rust_shim_sweep"] = rust_shim_sweep(base, endpoint, datasets, relay_stop, reps)
        phases.done("rust_shim_sweep")
        for scenario in ("boto3_download_then_read", "s3torchconnector", "fsspec_filecache"):
            res[scenario] = {}
        for ds in datasets:
            print(f"peers, {ds.name} files ...", flush=True)
            try_peer(res["boto3_download_then_read"], ds.name, {},
                     lambda: boto3_download_then_read(endpoint, ds, base, relay_stop, reps))
            try_peer(res["s3torchconnector"], ds.name, unavailable,
                     lambda: s3torchconnector_epochs(endpoint, ds, relay_stop))
            fsspec_missing = {ds.name: unavailable[m] for m in ("fsspec", "s3fs") if m in unavailable}
            try_peer(res["fsspec_filecache"], ds.name, fsspec_missing,
                     lambda: fsspec_filecache_epochs(endpoint, ds, base, relay_stop, reps))
            phases.done(f"peers_{ds.name}")

        res["ratios"] = ratios(res)
        res["goals"] = GOALS
        out = {"scale": "small" if SMALL_SCALE else "full", "machine": machine(), "link": link,
               "datasets": {ds.name: ds.describe() for ds in datasets}, **res,
               "seconds": round(time.time() - started, 1), "phase_seconds": phases.seconds}
        summary(out)
        # compare.json is the latest run; compare-<scale>.json keeps the latest of each scale.
        results = os.path.join(ROOT, "tests", "bench", "results")
        for name in ("compare.json", f"compare-{out['scale']}.json"):
            with open(os.path.join(results, name), "w") as f:
                json.dump(out, f, indent=2)
        print(f"wrote {os.path.join(results, 'compare.json')} ({out['seconds']:.0f} s)")
    finally:
        if relay_stop:
            relay_stop()
        if moto:
            moto.kill()
            moto.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
