"""The cluster pool against independent fleets, side by side in one run, over one shared emulated origin
link: `python3 tests/bench/cluster_bench.py` (`BENCH_SCALE=small` for the quick version; MEMARTS_BIN_DIR
names the directory of the binaries, target/release by default). Writes tests/bench/results/cluster.json
(the latest run) and cluster-<scale>.json (the latest of each scale) and prints a summary table. Asserts
nothing about timings; every reader computes the CRC32 of every object it read and each epoch is checked
against the uploaded bytes, so a wrong or missing byte fails the run.

The origin is moto (an S3 server) on loopback behind ONE `relay.py` relay: the link to the object store
that all the nodes share (+20 ms per request, 50 MB/s per connection, 50 MB/s in total by default here, so
that a cold epoch is bound by the link, not by the machine; BENCH_LINK_LATENCY_MS, BENCH_LINK_MBPS_PER_CONN
and BENCH_LINK_MBPS_TOTAL override). Each node is a fleet of P proxies with its own run dir and cache dir;
the nodes of the pool share a static cluster file and secret, each listening for peers on its own
loopback address (127.0.0.2, 127.0.0.3, 127.0.0.4; slot k on port + k): peers talk to each other
directly, not through the relay. On every node W reader processes (`mox.file.read`, spawned with the
node's MEMARTS_RUN_DIR) read the whole dataset, the node's own shuffled order split round-robin. The
dataset: many objects of a few MiB (random bytes, fixed seed), uploaded to moto directly.

Measurements, each against a reference measured in the same run:

1. cluster_origin_bytes_per_dataset_byte: the 3 nodes of the pool read the dataset cold at the same
   time; bytes of the origin's responses as counted by the relay (bodies and headers, any HEADs included) /
   dataset bytes (goal <= 1.02: a chunk leaves the store once per cluster). Reference: 3 independent
   fleets (no --cluster) doing the same (about 3). The proxies' own bytes_from_origin are recorded too.
2. cluster_cold_epoch_time_vs_independent: wall time of that cold epoch (every node starts at once; until
   the last node is done), pool / independent fleets (goal <= 0.4: the pool moves each byte over the
   shared link once, the independent fleets three times).
3. cluster_warm_peers_vs_local: warm epochs on node 0 of the pool (about 2/3 of its chunks are owned by
   the other nodes and come over loopback TCP) against warm epochs on independent fleet 0 (everything on
   its own SSD), alternated, best of R each; throughput ratio (no goal; the notes of the results say what
   bounds it, from the CPU seconds the proxies and readers used in those epochs).

Every epoch records bytes, seconds, MB/s, the relay's requests and bytes, the origin requests in the
proxies' request logs (`<run dir>/origin-<slot>.log`), every node's counters (`memarts status --json`;
for the pool also `memarts cluster status --json`, as node 0 sees every member) and the CPU seconds of
the proxies and readers, each as a delta over the epoch; and when the epoch's origin requests ran (first
start, last end, mean in flight, how busy the link was), from the request logs. `cold_notes` and
`warm_notes` in the results put these together: where a cold epoch's time went against the link alone,
and what bounds the warm pool epoch.

Scale: BENCH_SCALE=small: 72 objects of 1-6 MiB (about 270 MiB), W = 2, P = 2, R = 5 (under 2 minutes on a 2-core
VM); otherwise 448 objects (about 1.6 GiB), W = 4, P = 2, R = 3 (a few minutes: the independent cold epoch moves
4.5 GiB over the 50 MB/s link).
"""

import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (Phases, machine, WORKER_ENV)
import python_bench  # noqa: E402  (start_moto, MEMARTS, ROOT)
import relay  # noqa: E402

ROOT = python_bench.ROOT
MEMARTS = python_bench.MEMARTS
SMALL_SCALE = os.environ.get("BENCH_SCALE") == "small"
BUCKET = "cluster"
MIB = 1 << 20
NODES = 3

SCALE = {
    "small": {"files": 72, "min_size": 1 * MIB, "max_size": 6 * MIB, "workers": 2, "proxies": 2, "reps": 5},
    "full": {"files": 448, "min_size": 1 * MIB, "max_size": 6 * MIB, "workers": 4, "proxies": 2, "reps": 3},
}["small" if SMALL_SCALE else "full"]

# The shared link's total bandwidth unless BENCH_LINK_MBPS_TOTAL says otherwise: low enough that the link,
# not the 2 cores running moto, the relay and three fleets, bounds a cold epoch.
MBPS_TOTAL = 50

CLK_TCK = os.sysconf("SC_CLK_TCK")

# The totals of `memarts status --json` kept per epoch (as differences).
STATUS_COUNTERS = ("hits", "misses", "bytes_from_cache", "bytes_from_origin", "cached_chunks", "cache_bytes_used")


# ---------------------------------------------------------------- dataset


class Dataset:
    """Objects under `s3://BUCKET/data/`: their sizes and CRC32 (the bytes themselves live in moto only)."""

    def __init__(self):
        self.keys, self.sizes, self.crcs = [], [], []

    @property
    def total(self):
        return sum(self.sizes)

    def url(self, i):
        return f"s3://{BUCKET}/{self.keys[i]}"

    def describe(self):
        return {"files": len(self.keys), "bytes": self.total, "min_size": min(self.sizes),
                "max_size": max(self.sizes), "prefix": f"s3://{BUCKET}/data/"}


def make_dataset(s3):
    """Uploads SCALE['files'] objects of random sizes in [min_size, max_size] (not chunk-aligned) and
    random bytes, fixed seed, straight to moto."""
    rng = random.Random(7)
    ds = Dataset()
    for i in range(SCALE["files"]):
        size = rng.randint(SCALE["min_size"], SCALE["max_size"])
        data = rng.randbytes(size)
        key = f"data/f{i:05d}.bin"
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        ds.keys.append(key)
        ds.sizes.append(size)
        ds.crcs.append(zlib.crc32(data))
    return ds


def check(ds, what, got):
    """`got`: [(index, length, crc32)] of one node's epoch; raises unless it is every object once, each
    with the uploaded bytes."""
    seen = {}
    for i, length, crc in got:
        if i in seen:
            raise AssertionError(f"{what}: {ds.keys[i]} read twice")
        seen[i] = (length, crc)
    for i, key in enumerate(ds.keys):
        if seen.get(i) != (ds.sizes[i], ds.crcs[i]):
            raise AssertionError(f"{what}: wrong bytes for {key}: got (length, crc32) {seen.get(i)}, "
                                 f"want {(ds.sizes[i], ds.crcs[i])}")


# ---------------------------------------------------------------- readers


def _worker_init(run_dir, ready):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as compare.py's workers: Pool.terminate() ends them
    os.environ.update(compare.WORKER_ENV, MEMARTS_RUN_DIR=run_dir)
    import memarts as mox

    mox.file.mode()  # creates this process's client before the first timed read
    ready.put(os.getpid())


def _read_share(share):
    """Reads [(index, url)] through the node's fleet; returns ([(index, length, crc32)], mode, unix times
    of the call and of the end of its first read)."""
    import memarts as mox

    called = time.time()
    first = None
    out = []
    for i, url in share:
        data = mox.file.read(url, binary=True)
        first = first or time.time()
        out.append((i, len(data), zlib.crc32(data)))
    return out, mox.file.mode(), (called, first)


def crc32_s_per_gb():
    """CPU seconds per GB of the readers' check (zlib.crc32) on this machine, best of 3 over 64 MiB."""
    data = os.urandom(64 * MIB)
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        zlib.crc32(data)
        best = min(best, time.process_time() - start)
    return best / (len(data) / 1e9)


def cpu_seconds(pids):
    """User + system CPU seconds of the processes `pids` so far (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return total / CLK_TCK


# ---------------------------------------------------------------- nodes


class Node:
    """One node: a memarts fleet (run dir and cache dir under base/<name>) whose origin is the shared
    relay, in the pool if `cluster_file` is given, and its W reader processes."""

    def __init__(self, base, name, endpoint, cluster_file=None):
        self.name = name
        self.run_dir = os.path.join(base, name, "run")
        self.cache_dir = os.path.join(base, name, "cache")
        self.env = dict(os.environ, MEMARTS_RUN_DIR=self.run_dir, MEMARTS_CACHE_DIR=self.cache_dir,
                        AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                        AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        self.env.pop("MEMARTS_CLUSTER", None)
        self.env.pop("MEMARTS_NODE_ID", None)
        if cluster_file:
            self.env.update(MEMARTS_CLUSTER=cluster_file, MEMARTS_NODE_ID=name)
        self.cluster = bool(cluster_file)
        self.running = False
        self.pool = None

    def memarts(self, *args):
        return subprocess.run([MEMARTS, *args], env=self.env, capture_output=True, text=True, check=False)

    def json(self, *args):
        out = self.memarts(*args, "--json")
        if out.returncode != 0:
            raise RuntimeError(f"`memarts {' '.join(args)} --json` on {self.name} failed ({out.returncode}): "
                               f"{out.stderr.strip() or out.stdout.strip()}")
        return json.loads(out.stdout)

    def start(self, proxies, workers):
        out = self.memarts("start_proxy", str(proxies))
        if out.returncode != 0:
            raise SystemExit(f"cluster_bench: `memarts start_proxy {proxies}` of {self.name} failed "
                             f"({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        self.running = True
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Queue()
        self.pool = ctx.Pool(workers, initializer=_worker_init, initargs=(self.run_dir, ready))
        self.workers = workers
        for _ in range(workers):  # spawned and initialised: an epoch must not time interpreters starting
            ready.get(timeout=120)

    def proxy_pids(self):
        pids = []
        for name in os.listdir(self.run_dir):
            if name.startswith("proxy-") and name.endswith(".pid"):
                with open(os.path.join(self.run_dir, name)) as f:
                    pids.append(int(f.read().strip()))
        return pids

    def reader_pids(self):
        return [p.pid for p in self.pool._pool] if self.pool else []

    def origin_requests(self):
        """Origin requests by operation in the slots' request logs (one line per attempt), the rotated
        files too (a bench makes far fewer than a log file holds, so at most one rotation falls
        between two snapshots)."""
        ops = {}
        for op in compare.origin_log_ops(self.run_dir, 0):
            ops[op] = ops.get(op, 0) + 1
        return ops

    def origin_attempts(self, since):
        """(start, end) unix times of the origin request attempts in the slots' logs that ended after
        `since` (a line is written when its attempt ends, with its duration)."""
        out = []
        for name in os.listdir(self.run_dir):
            if name.startswith("origin-") and (name.endswith(".log") or name.endswith(".log.1")):
                with open(os.path.join(self.run_dir, name)) as f:
                    for line in f:
                        fields = line.split()
                        end, took = float(fields[0]), float(fields[-1].removesuffix("ms")) / 1000
                        if end >= since:
                            out.append((end - took, end))
        return out

    def wait_all_alive(self, timeout=30):
        """Waits until this node sees every member of the pool alive (a read must not route around a
        member that is merely still starting)."""
        deadline = time.time() + timeout
        while True:
            status = self.json("cluster", "status")
            if len(status["members"]) == NODES and all(m["state"] == "alive" for m in status["members"]):
                return
            if time.time() > deadline:
                raise SystemExit(f"cluster_bench: {self.name} never saw every member alive: {status}")
            time.sleep(0.2)

    def shares(self, ds, seed):
        """This node's order of the dataset (shuffled, `seed`), split round-robin over its readers."""
        order = list(range(len(ds.keys)))
        random.Random(seed).shuffle(order)
        return [[(i, ds.url(i)) for i in order[w::self.workers]] for w in range(self.workers)]

    def stop(self):
        if self.pool:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
        if self.running:
            self.memarts("stop_proxy")
            self.running = False


# ---------------------------------------------------------------- epochs


def snapshot(nodes, relay_stop):
    """Counters of the relay and of every node, to take differences of."""
    snap = {"relay": relay_stop.stats(), "nodes": {}}
    for node in nodes:
        totals = node.json("status")["totals"]
        snap["nodes"][node.name] = {"status": {k: totals[k] for k in STATUS_COUNTERS},
                                    "origin_requests": node.origin_requests(),
                                    "proxy_cpu_s": cpu_seconds(node.proxy_pids()),
                                    "reader_cpu_s": cpu_seconds(node.reader_pids())}
    if nodes[0].cluster:
        members = nodes[0].json("cluster", "status")["members"]
        for m in members:
            if "counters" not in m:
                raise RuntimeError(f"cluster status of {nodes[0].name}: no counters for {m['id']}: {m}")
            snap["nodes"].setdefault(m["id"], {})["cluster"] = m["counters"]
    return snap


def delta(after, before):
    """after - before for every number in nested dicts."""
    if isinstance(after, dict):
        return {k: delta(v, before.get(k, 0) if isinstance(before, dict) else 0) for k, v in after.items()}
    if isinstance(after, (int, float)) and not isinstance(after, bool):
        return round(after - before, 3) if isinstance(after, float) else after - before
    return after


def origin_timeline(counted, wall_start, seconds, origin_bytes, link):
    """When the epoch's origin requests ran (from the proxies' request logs), relative to its start:
    the first one's start, the last one's end, the time after it (reads from caches and peers only), the
    mean number of requests in flight while any ran (and over the last tenth of that time), and how busy
    the shared link was over the epoch and while requests ran."""
    attempts = [a for node in counted for a in node.origin_attempts(wall_start)]
    if not attempts:
        return None
    first, last = min(a for a, _ in attempts), max(b for _, b in attempts)

    def in_flight(lo, hi):
        return sum(max(0, min(b, hi) - max(a, lo)) for a, b in attempts) / (hi - lo) if hi > lo else None

    def busy(span):
        return origin_bytes / (link["mbps_total"] * 1e6 * span) if link["mbps_total"] > 0 and span > 0 else None

    return {"attempts": len(attempts), "first_request_s": round(first - wall_start, 3),
            "last_response_s": round(last - wall_start, 3),
            "after_last_response_s": round(seconds - (last - wall_start), 3),
            "mean_in_flight": in_flight(first, last),
            "mean_in_flight_last_tenth": in_flight(last - (last - first) / 10, last),
            "link_busy": busy(seconds), "link_busy_while_requests_ran": busy(last - first)}


def epoch(readers, counted, ds, relay_stop, seed, what):
    """Every node of `readers` reads the whole dataset at the same time (each its own order). Counters are
    taken over `counted` (every running node: a pool node serves its peers while others read). Returns
    the epoch's figures; raises if any node read a wrong byte or bypassed its fleet."""
    before = snapshot(counted, relay_stop)
    finished = {}
    jobs = []
    start, wall_start = time.perf_counter(), time.time()
    for k, node in enumerate(readers):
        jobs.append(node.pool.map_async(
            _read_share, node.shares(ds, seed + k), chunksize=1,
            callback=lambda _, name=node.name: finished.__setitem__(name, time.perf_counter())))
    results = [job.get(timeout=3600) for job in jobs]
    seconds = max(finished.values()) - start
    for node, result in zip(readers, results, strict=True):
        modes = {mode for _, mode, _ in result}
        if modes != {"proxy"}:
            raise AssertionError(f"{what}: the readers of {node.name} are in mode {modes}, not proxy")
        check(ds, f"{what}, {node.name}", [x for got, _, _ in result for x in got])
    counters = delta(snapshot(counted, relay_stop), before)
    read = ds.total * len(readers)
    times = [t for result in results for _, _, t in result]
    readers_timeline = {"last_called_s": round(max(c for c, _ in times) - wall_start, 3),
                        "first_read_done_s": round(min(f for _, f in times if f) - wall_start, 3)}
    return {"nodes_reading": len(readers), "bytes_read": read, "seconds": seconds,
            "mbs_per_node": ds.total / seconds / 1e6, "mbs_total": read / seconds / 1e6,
            "node_seconds": {name: t - start for name, t in sorted(finished.items())},
            "origin_bytes": counters["relay"]["bytes_down"], "origin_requests": counters["relay"]["requests"],
            "origin_bytes_per_dataset_byte": counters["relay"]["bytes_down"] / ds.total,
            "readers": readers_timeline,
            "origin_timeline": origin_timeline(counted, wall_start, seconds, counters["relay"]["bytes_down"],
                                               relay_stop.params),
            "relay": counters["relay"], "nodes": counters["nodes"]}


def warm_epochs(pool_node, local_node, counted, ds, relay_stop, reps):
    """Warm epochs on node 0 of the pool and on an independent fleet, alternated (so that a neighbour's
    load hits both alike); best of `reps` each, with every run's MB/s."""
    runs = {"pool": [], "local": []}
    for r in range(reps):
        runs["pool"].append(epoch([pool_node], counted, ds, relay_stop, 100 + r, f"warm pool {r}"))
        runs["local"].append(epoch([local_node], [local_node], ds, relay_stop, 100 + r, f"warm local {r}"))
    out = {}
    for kind, rs in runs.items():
        best = dict(max(rs, key=lambda x: x["mbs_per_node"]))
        best["runs_mbs"] = [x["mbs_per_node"] for x in rs]
        best["origin_requests_all_runs"] = sum(x["origin_requests"] for x in rs)
        out[kind] = best
    return out


# ---------------------------------------------------------------- setup


def link_self_check(direct, endpoint, params, tries=3):
    """relay.self_check, retried: on a shared machine one slow HEAD straight to moto can make the relay's
    added latency look too small."""
    for attempt in range(tries):
        try:
            return relay.self_check(direct, endpoint, params)
        except RuntimeError as e:
            if attempt == tries - 1:
                raise
            print(f"  {e}; again", flush=True)
            time.sleep(1)
    return None


def free_base_port(ips, slots):
    """A base port whose `slots` ports are free on every one of `ips` (below the range the e2e tests pick
    from, 20000-50000, and below the ephemeral ports)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, 20_000 - slots)
        try:
            for ip in ips:
                for s in range(slots):
                    with socket.socket() as sock:
                        sock.bind((ip, base + s))
            return base
        except OSError:
            continue
    raise SystemExit(f"cluster_bench: no free peer ports on {ips}")


def write_cluster_file(base, ids, slots):
    """A secret (0600) and a static cluster file naming the nodes on 127.0.0.2, .3, ...; returns (path,
    addresses)."""
    secret = os.path.join(base, "cluster.secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    ips = [f"127.0.0.{k + 2}" for k in range(len(ids))]
    port = free_base_port(ips, slots)
    addresses = [f"{ip}:{port}" for ip in ips]
    lines = [f"secret_file = {json.dumps(secret)}"]
    for node_id, address in zip(ids, addresses, strict=True):
        lines += ["[[nodes]]", f'id = "{node_id}"', f'address = "{address}"']
    path = os.path.join(base, "cluster.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, addresses


def start_nodes(nodes, proxies, workers):
    for node in nodes:
        node.start(proxies, workers)
    if nodes[0].cluster:
        for node in nodes:
            node.wait_all_alive()


def tear_down(nodes, relay_stop, moto, base):
    """Stops `nodes`, the relay and moto (any of them may not have started), and removes `base`."""
    stop_nodes(nodes)
    if relay_stop:
        relay_stop()
    if moto:
        moto.kill()
        moto.wait()
    shutil.rmtree(base, ignore_errors=True)


def stop_nodes(nodes):
    for node in nodes:
        try:
            node.stop()
        except Exception as e:  # noqa: BLE001 — keep stopping the others
            print(f"  could not stop {node.name}: {type(e).__name__}: {e}")


# ---------------------------------------------------------------- report


def ratio(a, b):
    return a / b if a and b else None


def ratios(res):
    pool, ind = res["pool"], res["independent"]
    return {
        "cluster_origin_bytes_per_dataset_byte": pool["cold"]["origin_bytes_per_dataset_byte"],
        "cluster_cold_epoch_time_vs_independent": ratio(pool["cold"]["seconds"], ind["cold"]["seconds"]),
        "cluster_warm_peers_vs_local": ratio(res["warm"]["pool"]["mbs_per_node"], res["warm"]["local"]["mbs_per_node"]),
        "independent_origin_bytes_per_dataset_byte": ind["cold"]["origin_bytes_per_dataset_byte"],
    }


def warm_notes(res, ds, crc_cost):
    """What bounds the warm pool epoch against the local one, from the counters and the CPU seconds of
    the best runs."""
    pool, local = res["warm"]["pool"], res["warm"]["local"]
    node0 = pool["nodes"]["node-a"]
    from_peers, peer_reads = node0["cluster"]["bytes_from_peers"], node0["cluster"]["peer_reads"]
    gb = ds.total / 1e9

    def cpu(r, who):
        return sum(n.get(who, 0) for n in r["nodes"].values())

    figures = {}
    for kind, r in (("pool", pool), ("local", local)):
        proxies, readers = cpu(r, "proxy_cpu_s"), cpu(r, "reader_cpu_s")
        figures[kind] = {"proxies_cpu_s_per_gb": proxies / gb, "readers_cpu_s_per_gb": readers / gb,
                         "cores_busy": (proxies + readers) / r["seconds"]}
    owners_cpu = sum(n.get("proxy_cpu_s", 0) for name, n in pool["nodes"].items() if name != "node-a")
    figures["pool"]["owners_proxies_cpu_s_per_gb"] = owners_cpu / gb
    extra_ms = (pool["seconds"] - local["seconds"]) * 1000
    p, lo = figures["pool"], figures["local"]
    text = (
        f"Node 0 of the pool read {from_peers / ds.total:.0%} of the bytes from its peers ({peer_reads} chunk "
        f"reads, one TCP round trip each to the owner's slot). A local chunk reaches the reader as a file "
        f"descriptor (SCM_RIGHTS): its proxies used {lo['proxies_cpu_s_per_gb']:.2f} CPU s per GB read. A "
        f"peer's chunk is read and sealed by the owner (SSD to buffer, AES-256-GCM into the socket's "
        f"records), opened by node 0's slot (socket to buffer, AES-256-GCM, CRC32C, then inline over the Unix "
        f"socket) and copied by the reader: the pool's proxies used "
        f"{p['proxies_cpu_s_per_gb']:.2f} CPU s per GB ({p['owners_proxies_cpu_s_per_gb']:.2f} of it in the "
        f"owners); the readers {p['readers_cpu_s_per_gb']:.2f} (pool) and {lo['readers_cpu_s_per_gb']:.2f} "
        f"(local): the shim's read into a Python bytes object and the CRC32 of the check ({crc_cost:.2f} s "
        f"per GB here). Cores busy with this job: "
        f"pool {p['cores_busy']:.2f}, local {lo['cores_busy']:.2f} of {os.cpu_count()} (shared with whatever "
        f"else the machine runs). The pool epoch took {extra_ms:.0f} ms more: the per-byte CPU of the "
        f"copies and the round trip per chunk (W readers, a few chunks of a file in flight each) bound it, "
        f"not the bandwidth of loopback.")
    return {"peer_fraction": from_peers / ds.total, "peer_reads": peer_reads,
            "peer_read_bytes_avg": from_peers / peer_reads if peer_reads else None, **figures,
            "crc32_cpu_s_per_gb": crc_cost, "cores": os.cpu_count(), "text": text}


def cold_notes(res, link):
    """Where the cold epochs' time went, against what the shared link alone would take."""
    out = {}
    for kind in ("pool", "independent"):
        cold = res[kind]["cold"]
        line = cold["origin_timeline"] or {}
        out[kind] = {"seconds": cold["seconds"], "link_only_seconds": cold["origin_bytes"] / (link["mbps_total"] * 1e6),
                     "first_request_s": line.get("first_request_s"), "link_busy": line.get("link_busy"),
                     "link_busy_while_requests_ran": line.get("link_busy_while_requests_ran"),
                     "mean_in_flight": line.get("mean_in_flight"),
                     "mean_in_flight_last_tenth": line.get("mean_in_flight_last_tenth")}
    p, i = out["pool"], out["independent"]

    def pct(v):
        return "n/a" if v is None else f"{v:.0%}"

    out["text"] = (
        f"Over the shared link alone the pool's cold epoch would take {p['link_only_seconds']:.1f} s and the "
        f"independent fleets' {i['link_only_seconds']:.1f} s (a ratio of 1/3); measured {p['seconds']:.1f} s and "
        f"{i['seconds']:.1f} s (first origin request after {p['first_request_s']} s / {i['first_request_s']} s). "
        f"The link was busy {pct(p['link_busy'])} of the pool's epoch ({pct(p['link_busy_while_requests_ran'])} "
        f"while requests ran; {p['mean_in_flight']:.1f} requests in flight on average, "
        f"{p['mean_in_flight_last_tenth']:.1f} in the last tenth) against {pct(i['link_busy'])} "
        f"({pct(i['link_busy_while_requests_ran'])}; {i['mean_in_flight']:.1f}, {i['mean_in_flight_last_tenth']:.1f}) "
        f"for the independent fleets. Towards the end of the pool's epoch most chunks a node still has to read "
        f"were fetched by another node already, so fewer origin requests are in flight than the link could "
        f"carry, and the last node waits for the last chunks over the link and then reads them from their "
        f"owners.")
    return out


def summary(out):
    pool, ind, warm = out["pool"], out["independent"], out["warm"]
    rows = [
        ("origin bytes / dataset byte, cold epoch of 3 nodes", f"{pool['cold']['origin_bytes_per_dataset_byte']:.3f}",
         f"{ind['cold']['origin_bytes_per_dataset_byte']:.3f}"),
        ("origin requests, cold epoch", f"{pool['cold']['origin_requests']:,}", f"{ind['cold']['origin_requests']:,}"),
        ("cold epoch of 3 nodes, s (until the last is done)", f"{pool['cold']['seconds']:.1f}",
         f"{ind['cold']['seconds']:.1f}"),
        ("cold epoch, MB/s per node", f"{pool['cold']['mbs_per_node']:,.0f}", f"{ind['cold']['mbs_per_node']:,.0f}"),
        ("cold epoch, shared link busy", f"{out['cold_notes']['pool']['link_busy'] or 0:.0%}",
         f"{out['cold_notes']['independent']['link_busy'] or 0:.0%}"),
        (f"warm epoch of one node, MB/s (pool: {out['warm_notes']['peer_fraction']:.0%} from peers)",
         f"{warm['pool']['mbs_per_node']:,.0f}",
         f"{warm['local']['mbs_per_node']:,.0f}"),
    ]
    widths = [max(len(r[i]) for r in rows + [("", "pool", "independent")]) for i in range(3)]
    print()
    print("  ".join([" ".ljust(widths[0]), "pool".rjust(widths[1]), "independent".rjust(widths[2])]))
    for r in rows:
        print("  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2])]))
    print()
    for k, v in out["ratios"].items():
        goal = out["goals"].get(k, "")
        print(f"  {k:42} {'n/a' if v is None else f'{v:.3f}':>7}  {('goal ' + goal) if goal else ''}")
    print(f"  cold: {out['cold_notes']['text']}")
    print(f"  warm: {out['warm_notes']['text']}")


GOALS = {
    "cluster_origin_bytes_per_dataset_byte": "<= 1.02",
    "cluster_cold_epoch_time_vs_independent": "<= 0.4",
}


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    if not os.access(MEMARTS, os.X_OK):
        raise SystemExit(f"cluster_bench: {MEMARTS} not found (build with `cargo build --release --bins` or "
                         f"set MEMARTS_BIN_DIR)")
    started = time.time()
    load_at_start = os.getloadavg()
    import boto3

    base = tempfile.mkdtemp(prefix="memarts-cluster-")
    moto = relay_stop = None
    nodes = []
    try:
        direct, moto = python_bench.start_moto()
        host, port = direct.rsplit("//", 1)[1].split(":")
        total = None if "BENCH_LINK_MBPS_TOTAL" in os.environ else MBPS_TOTAL
        endpoint, relay_stop = relay.start_relay(host, int(port), mbps_total=total)
        link = dict(relay_stop.params, self_check=link_self_check(direct, endpoint, relay_stop.params),
                    shared_by="every node's origin traffic (one relay); peers talk directly on loopback")
        s3 = boto3.client("s3", endpoint_url=direct, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        phases = compare.Phases()
        ds = make_dataset(s3)
        print(f"dataset: {len(ds.keys)} objects of {SCALE['min_size'] // MIB}-{SCALE['max_size'] // MIB} MiB, "
              f"{ds.total / MIB:,.0f} MiB", flush=True)
        phases.done("dataset")
        w, p, reps = SCALE["workers"], SCALE["proxies"], SCALE["reps"]
        ids = [f"node-{chr(ord('a') + k)}" for k in range(NODES)]

        print(f"{NODES} independent fleets, cold, {w} readers and {p} proxies each ...", flush=True)
        independent = [Node(base, f"solo-{k}", endpoint) for k in range(NODES)]
        nodes += independent
        start_nodes(independent, p, w)
        res = {"independent": {"cold": epoch(independent, independent, ds, relay_stop, 0, "independent cold")}}
        stop_nodes(independent[1:])  # independent fleet 0 stays: the warm local reference
        for node in independent[1:]:
            shutil.rmtree(os.path.join(base, node.name), ignore_errors=True)
        phases.done("independent_cold")

        print(f"pool of {NODES} nodes, cold ...", flush=True)
        cluster_file, addresses = write_cluster_file(base, ids, p)
        pool = [Node(base, node_id, endpoint, cluster_file) for node_id in ids]
        nodes += pool
        start_nodes(pool, p, w)
        res["pool"] = {"addresses": dict(zip(ids, addresses, strict=True)),
                       "cold": epoch(pool, pool, ds, relay_stop, 0, "pool cold")}
        phases.done("pool_cold")

        print(f"warm epochs, pool node {ids[0]} against independent fleet 0, best of {reps} ...", flush=True)
        res["warm"] = warm_epochs(pool[0], independent[0], pool, ds, relay_stop, reps)
        phases.done("warm")

        res["ratios"] = ratios(res)
        res["goals"] = GOALS
        res["cold_notes"] = cold_notes(res, relay_stop.params)
        res["warm_notes"] = warm_notes(res, ds, crc32_s_per_gb())
        out = {"scale": "small" if SMALL_SCALE else "full", "machine": compare.machine(),
               "load_avg": {"start": load_at_start, "end": os.getloadavg()}, "link": link, "dataset": ds.describe(),
               "setup": {"nodes": NODES, "proxies_per_node": p, "readers_per_node": w, "warm_reps": reps,
                         "worker_env": compare.WORKER_ENV,
                         "reader": "mox.file.read(url, binary=True) in spawned processes, then zlib.crc32"},
               **res, "seconds": round(time.time() - started, 1), "phase_seconds": phases.seconds}
        summary(out)
        results = os.path.join(ROOT, "tests", "bench", "results")
        for name in ("cluster.json", f"cluster-{out['scale']}.json"):
            with open(os.path.join(results, name), "w") as f:
                json.dump(out, f, indent=2)
        print(f"wrote {os.path.join(results, 'cluster.json')} ({out['seconds']:.0f} s)")
    finally:
        tear_down(nodes, relay_stop, moto, base)


if __name__ == "__main__":
    sys.exit(main())
