"""Python-side benchmarks (run by `make bench`), as ratios measured side by side in one run:

- warm_small_vs_page_cache: `mox.file.read` of 128 KiB files served from the cache, against
  `open(path, 'rb').read()` of the same files in the page cache, one process;
- proxy_vs_embedded_pss: total PSS (from /proc/<pid>/smaps_rollup) of 32 worker processes reading one
  dataset through a fleet, workers + proxies, against the same job with the engine embedded in every
  worker (USE_MEMARTS=1, no fleet).

Writes tests/bench/results/python.json. Asserts nothing about timings.
"""

import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("MEMARTS_BIN_DIR", os.path.join(ROOT, "target", "release"))
MEMARTS = os.path.join(BIN, "memarts")
SMALL = os.environ.get("BENCH_SCALE") == "small"


def pss_kib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def start_moto():
    """A moto S3 server on loopback; returns (endpoint, process)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                raise SystemExit("moto did not start")
            time.sleep(0.05)
    return f"http://127.0.0.1:{port}", proc


def moto_workspace(bucket, prefix):
    """A moto server holding `bucket`, the AWS variables pointed at it, and a fresh work dir (named
    `prefix`...) whose run/ and cache/ the fleet uses; returns (endpoint, process, s3 client, dir)."""
    import boto3

    endpoint, moto = start_moto()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    work = tempfile.mkdtemp(prefix=prefix)
    os.environ["MEMARTS_RUN_DIR"] = os.path.join(work, "run")
    os.environ["MEMARTS_CACHE_DIR"] = os.path.join(work, "cache")
    return endpoint, moto, s3, work


def make_dataset(s3, bucket, prefix, n, size, seed=1):
    """`n` objects of `size` random bytes; also written to local files for the page-cache reference,
    in the work dir of `moto_workspace` (which the caller removes)."""
    rng = random.Random(seed)
    work = os.path.dirname(os.environ["MEMARTS_CACHE_DIR"])
    local = tempfile.mkdtemp(prefix="memarts-pybench-data-", dir=work)
    urls, paths = [], []
    for i in range(n):
        data = rng.randbytes(size)
        key = f"{prefix}/f{i:05d}.bin"
        s3.put_object(Bucket=bucket, Key=key, Body=data)
        path = os.path.join(local, f"f{i:05d}.bin")
        with open(path, "wb") as f:
            f.write(data)
        urls.append(f"obs://{bucket}/{key}")
        paths.append(path)
    return urls, paths


def best_rate(fn, total_bytes, rounds=3):
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = max(best, total_bytes / (time.perf_counter() - start))
    return best


def write_results(name, res):
    """Writes `res` to tests/bench/results/<name>.json, for report.py, and says where."""
    path = os.path.join(ROOT, "tests", "bench", "results", f"{name}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {path}")


def small_files(s3, bucket, proxies_list=(1, 4)):
    """Warm 128 KiB reads, one process, against `open().read()` of the same files in the page cache;
    once per fleet size (a reader's files spread over every slot, so a slot sees a request every
    `proxies` reads and its polling catches fewer of them)."""
    urls, paths = make_dataset(s3, bucket, "small", 500 if SMALL else 2000, 128 << 10)
    total = sum(os.path.getsize(p) for p in paths)
    import memarts as mox

    def memarts_epoch():
        for u in urls:
            mox.file.read(u, binary=True)

    def page_cache_epoch():
        for p in paths:
            with open(p, "rb") as f:
                f.read()

    results = {}
    for proxies in proxies_list:
        subprocess.run([MEMARTS, "start_proxy", str(proxies)], check=True, capture_output=True)
        try:
            memarts_epoch()  # cold pass on the first fleet: fills the cache
            assert mox.file.mode() == "proxy", mox.file.mode()
            # Best of 5 passes each, the two sides taking turns: this VM's speed wanders over seconds.
            page = mem = 0.0
            for _ in range(5):
                page = max(page, best_rate(page_cache_epoch, total, rounds=1))
                mem = max(mem, best_rate(memarts_epoch, total, rounds=1))
        finally:
            subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
        results[proxies] = {"proxies": proxies, "files": len(paths), "file_kib": 128, "memarts_mbs": mem / 1e6,
                            "page_cache_mbs": page / 1e6, "memarts_files_per_s": mem / (128 << 10),
                            "ratio": mem / page}
    return results


def _worker(urls, barrier, done):
    import memarts as mox

    for u in urls:
        mox.file.read(u, binary=True)
    done.put((os.getpid(), mox.file.mode()))
    barrier.wait()  # stay alive until PSS has been measured


def _plain_worker(paths, barrier, done):
    """The same job without memarts: read local copies of the dataset with plain Python."""
    for p in paths:
        with open(p, "rb") as f:
            f.read()
    done.put((os.getpid(), "plain"))
    barrier.wait()


def workers_pss(paths, workers, env, target=_worker):
    os.environ.update(env)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    done = ctx.Queue()
    procs = [ctx.Process(target=target, args=(paths[i::workers], barrier, done)) for i in range(workers)]
    for p in procs:
        p.start()
    reports = [done.get(timeout=600) for _ in procs]
    modes = {m for _, m in reports}
    total = sum(pss_kib(pid) for pid, _ in reports)
    barrier.wait()
    for p in procs:
        p.join()
    return total, modes


def memory(base, s3, bucket):
    paths, local = make_dataset(s3, bucket, "mem", 256, 256 << 10, seed=2)
    workers = 32
    run_dir = os.path.join(base, "run")
    cache = os.path.join(base, "cache")
    env = {"MEMARTS_RUN_DIR": run_dir, "MEMARTS_CACHE_DIR": cache}
    os.environ.update(env)
    subprocess.run([MEMARTS, "start_proxy", "4"], check=True, capture_output=True)
    try:
        proxies = [int(open(os.path.join(run_dir, f"proxy-{i}.pid")).read()) for i in range(4)]
        worker_pss, modes = workers_pss(paths, workers, {"USE_MEMARTS": "1"})
        assert modes == {"proxy"}, modes
        proxy_pss = sum(pss_kib(p) for p in proxies)
    finally:
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
    embedded_pss, modes = workers_pss(paths, workers, {"USE_MEMARTS": "1", "MEMARTS_RUN_DIR": os.path.join(base, "none")})
    assert modes == {"embedded"}, modes
    plain_pss, _ = workers_pss(local, workers, {}, target=_plain_worker)
    proxy_total = worker_pss + proxy_pss
    # What memarts itself adds to the job, over the interpreters that run it either way.
    added_proxy, added_embedded = proxy_total - plain_pss, embedded_pss - plain_pss
    return {"workers": workers, "proxy_mode_kib": proxy_total, "proxy_mode_workers_kib": worker_pss,
            "proxies_kib": proxy_pss, "embedded_mode_kib": embedded_pss, "ratio": proxy_total / embedded_pss,
            "plain_python_kib": plain_pss, "added_by_memarts_proxy_mode_kib": added_proxy,
            "added_by_memarts_embedded_kib": added_embedded,
            "ratio_added": added_proxy / added_embedded if added_embedded > 0 else None}


def main():
    bucket = "pybench"
    _endpoint, moto, s3, base = moto_workspace(bucket, "memarts-pybench-")
    small_by_fleet = small_files(s3, bucket)
    for r in small_by_fleet.values():
        print(f"warm 128 KiB files, {r['proxies']} proxies: memarts {r['memarts_mbs']:.0f} MB/s "
              f"({r['memarts_files_per_s']:.0f} files/s) vs open().read() {r['page_cache_mbs']:.0f} MB/s "
              f"({r['ratio']:.2f}x)")
    small = small_by_fleet[4]
    try:
        mem = memory(base, s3, bucket)
    finally:
        moto.kill()
        shutil.rmtree(base, ignore_errors=True)
    print(f"PSS, {mem['workers']} workers: proxy mode {mem['proxy_mode_kib'] / 1024:.0f} MiB "
          f"(workers {mem['proxy_mode_workers_kib'] / 1024:.0f} + proxies {mem['proxies_kib'] / 1024:.0f}) "
          f"vs embedded {mem['embedded_mode_kib'] / 1024:.0f} MiB ({mem['ratio']:.2f}x); "
          f"the same job in plain Python {mem['plain_python_kib'] / 1024:.0f} MiB, so memarts adds "
          f"{mem['added_by_memarts_proxy_mode_kib'] / 1024:.0f} MiB in proxy mode vs "
          f"{mem['added_by_memarts_embedded_kib'] / 1024:.0f} MiB embedded")
    out = {"small_files": small, "small_files_by_fleet_size": list(small_by_fleet.values()), "memory": mem,
           "ratios": {"warm_small_vs_page_cache": small["ratio"], "proxy_vs_embedded_pss": mem["ratio"],
                      "warm_small_vs_page_cache_1_proxy": small_by_fleet[1]["ratio"],
                      "proxy_vs_embedded_added_pss": mem["ratio_added"]},
           "goals": {"warm_small_vs_page_cache": ">= 0.7", "proxy_vs_embedded_pss": "<= 0.35"}}
    write_results("python", out)


if __name__ == "__main__":
    sys.exit(main())
