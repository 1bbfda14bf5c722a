"""Millions of small objects per node (issue 31): `python3 tests/bench/small_objects_bench.py`
(`BENCH_SCALE=small`: 100,000 objects; full: 1,000,000). MEMARTS_BIN_DIR names the binaries
(target/release by default). Writes tests/bench/results/small_objects.json and prints a table.
Asserts nothing about timings; every epoch checks the CRC32 of every object against its file.

The scenario, with default settings (a fleet of 2 slots: one per core here; small chunks packed
into segments), and again with a file per chunk (`MEMARTS_PACK_MAX=0`), on a local origin (a directory on the same disk as the cache, no network: the cache's own
cost per object is what shows):
- the dataset: objects of 4 KiB, 1,000 per directory;
- cold fill: `memarts warmup <dataset dir>` (listing and reading every object, filling the cache),
  then `sync`, against `cp -r` of the same tree to the same disk, then `sync` (the file-per-object
  limit), and against writing the same bytes into one file, then `sync` (the sequential-write
  limit); the page cache dropped before each;
- memory per cached object: the slots' anonymous memory (RssAnon) after the fill minus before it,
  and the shared tables the slots publish in the run dir (their files' allocated bytes), per object;
- disk: the cache directory's allocated bytes (du) / the objects' bytes;
- restart: `stop_proxy`, page cache dropped, `start_proxy`, and the time until every slot's index
  is rebuilt, less the same for an empty cache, per million objects;
- warm epoch: the page cache dropped, 4 worker processes read every object once (`mox.file.read`,
  shuffled) against the same workers reading the dataset's files (`open().read()`). Needs root.
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
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (machine)
import field_bench  # noqa: E402  (drop_page_cache, epoch helpers)
import python_bench  # noqa: E402  (MEMARTS, write_results)

MEMARTS = python_bench.MEMARTS
SMALL_SCALE = os.environ.get("BENCH_SCALE") == "small"
OBJECTS = int(os.environ.get("SMALL_OBJECTS", 100_000 if SMALL_SCALE else 1_000_000))
SIZE = 4096
PER_DIR = 1000
WORKERS = 4
PROXIES = 2


def make_dataset(root):
    """OBJECTS files of SIZE bytes, PER_DIR per directory; returns (paths, crcs)."""
    rng = random.Random(31)
    paths, crcs = [], []
    for i in range(OBJECTS):
        d = os.path.join(root, f"d{i // PER_DIR:05d}")
        if i % PER_DIR == 0:
            os.makedirs(d)
        data = rng.randbytes(SIZE)
        path = os.path.join(d, f"img-{i % PER_DIR:04d}.jpg")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
        crcs.append(zlib.crc32(data))
    return paths, crcs


def allocated(path):
    """Bytes the tree at `path` takes on disk (st_blocks), directories included."""
    total = os.lstat(path).st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def timed(fn):
    field_bench.drop_page_cache()
    start = time.perf_counter()
    fn()
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def write_one_file(paths, out):
    """The same bytes written into one file (read from the dataset first, untimed: only the write
    is the reference)."""
    blobs = []
    for p in paths:
        with open(p, "rb") as f:
            blobs.append(f.read())
    field_bench.drop_page_cache()
    start = time.perf_counter()
    with open(out, "wb") as f:
        for b in blobs:
            f.write(b)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def slot_pids(env):
    slots = json.loads(field_bench.memarts("status", "--json", env=env))["slots"]
    return [s["pid"] for s in slots]


def rss_anon(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon for {pid}")


def tables_bytes(run_dir):
    return sum(os.stat(os.path.join(run_dir, n)).st_blocks * 512 for n in os.listdir(run_dir)
               if n.endswith(".table"))


def wait_index_ready(env, deadline_s=600):
    start = time.perf_counter()
    while True:
        try:
            slots = json.loads(field_bench.memarts("status", "--json", env=env))["slots"]
        except SystemExit:
            slots = []
        if slots and all(s.get("index_ready") for s in slots):
            return time.perf_counter() - start
        if time.perf_counter() - start > deadline_s:
            raise SystemExit("small_objects_bench: the fleet never rebuilt its index")
        time.sleep(0.02)


def restart_until_ready(env):
    """`stop_proxy`, page cache dropped, `start_proxy`: seconds until every slot's index is ready."""
    field_bench.memarts("stop_proxy", env=env)
    field_bench.drop_page_cache()
    start = time.perf_counter()
    field_bench.memarts("start_proxy", str(PROXIES), env=env)
    wait_index_ready(env)
    return time.perf_counter() - start


def memarts_side(base, data, paths, crcs, extra_env):
    """The fill, memory, disk, restart and warm epoch of one fleet (its env on top of the defaults)."""
    name = "files" if extra_env else "default"
    env = dict(os.environ, MEMARTS_RUN_DIR=os.path.join(base, f"run-{name}"),
               MEMARTS_CACHE_DIR=os.path.join(base, f"cache-{name}"), **extra_env)
    out = {"env": extra_env}
    try:
        # An empty fleet's restart first: what a restart costs whatever the cache holds.
        field_bench.memarts("start_proxy", str(PROXIES), env=env)
        wait_index_ready(env)
        out["restart_empty_s"] = restart_until_ready(env)
        pids = slot_pids(env)
        before = sum(rss_anon(p) for p in pids)
        out["fill_s"] = timed(lambda: field_bench.memarts("warmup", data, env=env))
        after = sum(rss_anon(p) for p in pids)
        out["proxy_memory_bytes_per_object"] = (after - before) / OBJECTS
        out["tables_bytes_per_object"] = tables_bytes(env["MEMARTS_RUN_DIR"]) / OBJECTS
        out["cache_disk_bytes"] = allocated(env["MEMARTS_CACHE_DIR"])
        out["space_amplification"] = out["cache_disk_bytes"] / (OBJECTS * SIZE)
        out["restart_full_s"] = restart_until_ready(env)
        out["restart_s_per_million"] = (out["restart_full_s"] - out["restart_empty_s"]) * 1e6 / OBJECTS
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(WORKERS, initializer=field_bench._init) as pool:
            field_bench.drop_page_cache()
            out["warm_s"] = field_bench.epoch(pool, field_bench._read_memarts, list(enumerate(paths)), crcs, name)
    finally:
        subprocess.run([MEMARTS, "stop_proxy"], env=env, capture_output=True, check=False)
        shutil.rmtree(env["MEMARTS_CACHE_DIR"], ignore_errors=True)
    print(f"{name}: fill {OBJECTS / out['fill_s']:.0f} objects/s; memory {out['proxy_memory_bytes_per_object']:.0f} "
          f"B/object; tables {out['tables_bytes_per_object']:.0f} B/object; disk {out['space_amplification']:.2f}x; "
          f"restart {out['restart_full_s']:.2f} s (empty {out['restart_empty_s']:.2f} s); warm {out['warm_s']:.1f} s",
          flush=True)
    return out


def main():
    if os.geteuid() != 0:
        raise SystemExit("small_objects_bench needs root (it drops the page cache)")
    field_bench.require_memarts("small_objects_bench")
    base = tempfile.mkdtemp(prefix="memarts-small-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    res = {"machine": compare.machine(), "scale": "small" if SMALL_SCALE else "full", "objects": OBJECTS, "object_bytes": SIZE, "proxies": PROXIES,
           "settings": "defaults (start_proxy 2: one slot per core here), local origin on the cache's disk; "
                       "`files`: the same with MEMARTS_PACK_MAX=0 (a file per chunk)"}
    try:
        data = os.path.join(base, "dataset")
        os.makedirs(data)
        t = time.perf_counter()
        paths, crcs = make_dataset(data)
        print(f"dataset: {OBJECTS} objects of {SIZE} B in {time.perf_counter() - t:.0f} s", flush=True)
        copy = os.path.join(base, "copy")
        res["cp_r_s"] = timed(lambda: subprocess.run(["cp", "-r", data, copy], check=True))
        shutil.rmtree(copy)
        res["one_file_write_s"] = write_one_file(paths, os.path.join(base, "one-file"))
        os.unlink(os.path.join(base, "one-file"))
        print(f"cp -r {OBJECTS / res['cp_r_s']:.0f} files/s; one file {OBJECTS / res['one_file_write_s']:.0f} "
              "objects/s", flush=True)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(WORKERS, initializer=field_bench._init) as pool:
            field_bench.drop_page_cache()
            res["warm_local_s"] = field_bench.epoch(pool, field_bench._read_local, list(enumerate(paths)), crcs,
                                                    "local files")
        res["default"] = memarts_side(base, data, paths, crcs, {})
        res["files"] = memarts_side(base, data, paths, crcs, {"MEMARTS_PACK_MAX": "0"})
    finally:
        shutil.rmtree(base, ignore_errors=True)

    res["ratios"] = {}
    for side in ("default", "files"):
        r, p = res[side], "small_" if side == "default" else "small_files_"
        res["ratios"].update({
            p + "fill_vs_cp_r": res["cp_r_s"] / r["fill_s"],
            p + "fill_vs_one_file_write": res["one_file_write_s"] / r["fill_s"],
            p + "space_amplification": r["space_amplification"],
            p + "proxy_memory_bytes_per_object": r["proxy_memory_bytes_per_object"],
            p + "tables_bytes_per_object": r["tables_bytes_per_object"],
            p + "restart_s_per_million": r["restart_s_per_million"],
            p + "warm_vs_local_files": res["warm_local_s"] / r["warm_s"],
        })
    print(json.dumps(res["ratios"], indent=2))
    python_bench.write_results("small_objects", res)


if __name__ == "__main__":
    main()
