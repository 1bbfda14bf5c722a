"""Warm reads against local files (issue 17's rows): `python3 tests/bench/warm_bench.py`
(`BENCH_SCALE=small` for the quick version; MEMARTS_BIN_DIR names the binaries, target/release by
default). Writes tests/bench/results/warm.json and prints a table. Asserts nothing about timings;
every scenario checks what it read, so a broken path cannot report a fast number.

Every row reads data that is in the page cache on both sides (memarts: the fleet's chunk files;
the reference: a local copy of the same bytes), each side the same way, best of REPS interleaved
runs:
- `memarts cat URL | cat > /dev/null` of a 256 MiB object (a stream: read-ahead, chunks handed to
  the output from their files' mappings) against `cat FILE | cat > /dev/null` of a local copy
  (coreutils: 128 KiB reads into one reused buffer): both write into a pipe whose reader copies
  every byte out;
- 4 worker processes reading small files (64-255 KiB) whole: `mox.file.read(url)` against
  `open(path, 'rb').read()` of the files a download left on local disk ("download, then read":
  what users do without a cache, timed after the download);
- the same with one process (python_bench.py has 128 KiB files, with 1 and 4 proxies);
- one process reading the 256 MiB object in 1 MiB reads: `mox.file.File(url, 'rb').read(n)` in a
  loop against `open(path, 'rb').read(n)` of the local copy (each read a new `bytes`).

The warm rows are the steady state of a warm epoch: before the timed passes, the small files are
read through memarts (untimed) until a whole pass comes from resident chunks (the slots pin what is
read directly: one more read from the disk and one CRC32C of each chunk, in the first warm epoch),
and each timed sample is EPOCHS passes over the files (a pass is ~50 ms here: one alone is noise).

The origin is moto (nothing here reads from it after the warm-up). The fleet has 4 proxies and a
metadata TTL of an hour (`--meta-ttl 3600`, as for any dataset that does not change).
"""

import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import python_bench  # noqa: E402  (MEMARTS, moto_workspace, write_results)

MEMARTS = python_bench.MEMARTS
SMALL_SCALE = os.environ.get("BENCH_SCALE") == "small"
BUCKET = "warmbench"
KIB, MIB = 1 << 10, 1 << 20
SCALE = {"small": {"files": 400, "large": 128 * MIB, "reps": 3},
         "full": {"files": 2000, "large": 256 * MIB, "reps": 5}}["small" if SMALL_SCALE else "full"]
WORKERS = 4
EPOCHS = 3  # passes over the small files per timed sample
WARMUP_PASSES = 20  # at most, until a whole pass comes from resident chunks


def best(fn, reps):
    """The fastest of `reps` runs of `fn` (seconds), and what the last one returned."""
    times, out = [], None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def crc_of_stdout(cmd):
    out = subprocess.run(cmd, capture_output=True, check=True)
    return zlib.crc32(out.stdout)


def large_cat(url, path, size, reps):
    """`memarts cat` against `cat`, each writing into a pipe that a consumer reads to its end
    (`| cat > /dev/null`: every byte is copied out of the pipe, as a program reading the output
    would), interleaved. The bytes of each side are checked (CRC32) in an untimed run."""
    want = crc_of_stdout(["cat", path])
    if crc_of_stdout([MEMARTS, "cat", url]) != want:
        raise AssertionError("memarts cat: wrong bytes")

    def run(cmd):
        with open(os.devnull, "wb") as sink:
            producer = subprocess.Popen(cmd, stdout=subprocess.PIPE)
            subprocess.run(["cat"], stdin=producer.stdout, stdout=sink, check=True)
            producer.stdout.close()
            if producer.wait() != 0:
                raise AssertionError(f"{cmd[0]} failed")

    cat, memarts = [], []
    for _ in range(reps):
        cat.append(best(lambda: run(["cat", path]), 1)[0])
        memarts.append(best(lambda: run([MEMARTS, "cat", url]), 1)[0])
    return {"bytes": size, "cat_mbs": size / min(cat) / 1e6, "memarts_cat_mbs": size / min(memarts) / 1e6,
            "ratio": min(cat) / min(memarts)}


def _read_loop(open_file, piece):
    """Reads a file opened by `open_file()` in `piece`-byte reads to its end; its length."""
    n = 0
    with open_file() as f:
        while data := f.read(piece):
            n += len(data)
    return n


def large_read_loop(url, path, size, reps, piece=MIB):
    """One process reading the large object in `piece`-byte reads: `mox.file.File(url, 'rb')`
    against `open(path, 'rb')` of a local copy, each read returning a new `bytes` (both sides),
    interleaved; the bytes are checked (CRC32) in an untimed pass of each."""
    import memarts as mox

    def crc_of(open_file):
        crc = 0
        with open_file() as f:
            while data := f.read(piece):
                crc = zlib.crc32(data, crc)
        return crc

    local_file, memarts_file = (lambda: open(path, "rb")), (lambda: mox.file.File(url, "rb"))
    if crc_of(memarts_file) != crc_of(local_file):
        raise AssertionError("File(url, 'rb').read(n): wrong bytes")
    local, mem = [], []
    for _ in range(reps):
        t, n = best(lambda: _read_loop(local_file, piece), 1)
        local.append(t)
        t, m = best(lambda: _read_loop(memarts_file, piece), 1)
        mem.append(t)
        if n != size or m != size:
            raise AssertionError(f"read loops read {n} and {m} bytes of {size}")
    return {"bytes": size, "piece": piece, "local_mbs": size / min(local) / 1e6,
            "memarts_mbs": size / min(mem) / 1e6, "ratio": min(local) / min(mem)}


def _mark(data, full):
    """What a read returned: its CRC32 (`full`, untimed passes) or its length and edges (timed
    passes: a CRC32 in the loop would cost each side as much as the read it measures)."""
    return zlib.crc32(data) if full else (len(data), data[:8], data[-8:])


def _read_urls(urls, full=False):
    import memarts as mox

    return [_mark(mox.file.read(u, binary=True), full) for u in urls]


def _read_urls_checked(urls):
    return _read_urls(urls, True)


def _pinned_reads(urls):
    """Reads `urls`; how many of the chunks came from pins."""
    import memarts as mox

    before = mox.stats()["local_resident"]
    _read_urls(urls)
    return mox.stats()["local_resident"] - before


def _direct_counts(_):
    """This worker's local-read counters (cumulative), keyed by its pid."""
    import memarts as mox

    return os.getpid(), {k: v for k, v in mox.stats().items() if k.startswith("local")}


def _read_paths(paths, full=False):
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(_mark(f.read(), full))
    return out


def _parts(items, n):
    return [items[i::n] for i in range(n)]


def small_files(urls, paths, reps, workers):
    """`workers` processes reading every small file once: through memarts, and from local copies.
    Every byte is checked (CRC32) in an untimed pass before and after the timed ones; the timed
    passes check each file's length and edges."""
    want = _read_paths(paths, True)
    marks = _read_paths(paths)
    total = sum(os.path.getsize(p) for p in paths)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:

        def epoch(fn, items):
            parts = pool.map(fn, _parts(items, workers))
            got = [None] * len(items)
            for w, part in enumerate(parts):
                got[w::workers] = part
            return got

        if epoch(_read_urls_checked, urls) != want:  # also gives every worker its client
            raise AssertionError("memarts: wrong bytes")
        # Warm passes until one is served from pins whole (1 MiB chunks: a chunk per file).
        warmup = 0
        while warmup < WARMUP_PASSES:
            warmup += 1
            if sum(pool.map(_pinned_reads, _parts(urls, workers))) == len(urls):
                break

        def epochs(fn, items):
            got = None
            for _ in range(EPOCHS):
                got = epoch(fn, items)
            return got

        local, mem = [], []
        for _ in range(reps):
            t, got = best(lambda: epochs(_read_paths, paths), 1)
            local.append(t)
            if got != marks:
                raise AssertionError("local files: wrong lengths or bytes")
            t, got = best(lambda: epochs(_read_urls, urls), 1)
            mem.append(t)
            if got != marks:
                raise AssertionError("memarts: wrong lengths or bytes")
        if epoch(_read_urls_checked, urls) != want:
            raise AssertionError("memarts: wrong bytes")
        # Every worker's counters (a few calls per worker, so that each is asked at least once).
        direct = {}
        for pid, counts in pool.map(_direct_counts, range(workers * 8), chunksize=1):
            direct[pid] = counts
    direct = {k: sum(c[k] for c in direct.values()) for k in next(iter(direct.values()))}
    read = total * EPOCHS
    return {"workers": workers, "files": len(paths), "bytes": total, "passes_per_sample": EPOCHS,
            "warmup_passes": warmup, "local_mbs": read / min(local) / 1e6, "memarts_mbs": read / min(mem) / 1e6,
            "ratio": min(local) / min(mem), "local": direct}


def main():
    endpoint, moto, s3, work = python_bench.moto_workspace(BUCKET, "memarts-warmbench-")
    os.environ["MOX_FILE_CHUNK_SIZE"] = str(MIB)
    local = os.path.join(work, "local")
    os.makedirs(local)
    rng = random.Random(17)
    urls, paths = [], []
    for i in range(SCALE["files"]):
        body = rng.randbytes(rng.randint(64 * KIB, 255 * KIB))
        key = f"small/{i:05d}.bin"
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        path = os.path.join(local, f"{i:05d}.bin")
        with open(path, "wb") as f:
            f.write(body)
        urls.append(f"s3://{BUCKET}/{key}")
        paths.append(path)
    large = b"".join(rng.randbytes(64 * MIB) for _ in range(SCALE["large"] // (64 * MIB)))
    s3.put_object(Bucket=BUCKET, Key="large.bin", Body=large)
    large_path = os.path.join(local, "large.bin")
    with open(large_path, "wb") as f:
        f.write(large)
    del large
    res = {"scale": "small" if SMALL_SCALE else "full", "proxies": 4, "reps": SCALE["reps"]}
    # A dataset that does not change, which may be given a long `--meta-ttl`: with the default
    # 60 s, the cold fill of the full scale (moto is slow) outlasts the TTL, and the first timed
    # epoch would measure one HEAD per object at the origin, not the hit path.
    out = subprocess.run([MEMARTS, "start_proxy", "4", "--meta-ttl", "3600"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"start_proxy failed: {out.stdout}{out.stderr}")
    try:
        import memarts as mox

        for u in urls:  # cold: fills the cache and the slots' metadata
            mox.file.read(u, binary=True)
        subprocess.run([MEMARTS, "cat", f"s3://{BUCKET}/large.bin"], stdout=subprocess.DEVNULL, check=True)
        print("memarts cat vs cat, File.read(n) loops, 4 workers and 1 process vs local files ...", flush=True)
        res["large_cat"] = large_cat(f"s3://{BUCKET}/large.bin", large_path, SCALE["large"], SCALE["reps"])
        res["large_read_loop"] = large_read_loop(f"s3://{BUCKET}/large.bin", large_path, SCALE["large"],
                                                 SCALE["reps"])
        res["small_4_workers"] = small_files(urls, paths, SCALE["reps"], WORKERS)
        res["small_1_process"] = small_files(urls, paths, SCALE["reps"], 1)
    finally:
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
        moto.kill()
        shutil.rmtree(work, ignore_errors=True)
    res["ratios"] = {
        "warm_cat_vs_cat": res["large_cat"]["ratio"],
        "warm_small_4_workers_vs_download_then_read": res["small_4_workers"]["ratio"],
        "warm_small_1_process_vs_local_files": res["small_1_process"]["ratio"],
        "warm_file_read_loop_vs_local_file": res["large_read_loop"]["ratio"],
    }
    lc, s4, s1 = res["large_cat"], res["small_4_workers"], res["small_1_process"]
    print(f"memarts cat, {lc['bytes'] >> 20} MiB: {lc['memarts_cat_mbs']:.0f} MB/s vs cat {lc['cat_mbs']:.0f} MB/s "
          f"({lc['ratio']:.2f}x)")
    rl = res["large_read_loop"]
    print(f"File(url, 'rb').read({rl['piece'] >> 10} KiB) loop, {rl['bytes'] >> 20} MiB: {rl['memarts_mbs']:.0f} MB/s "
          f"vs open(path, 'rb').read(n) {rl['local_mbs']:.0f} MB/s ({rl['ratio']:.2f}x)")
    for r in (s4, s1):
        print(f"{r['workers']} worker(s), {r['files']} small files: memarts {r['memarts_mbs']:.0f} MB/s vs local files "
              f"{r['local_mbs']:.0f} MB/s ({r['ratio']:.2f}x) after {r['warmup_passes']} warm pass(es) to pin; "
              f"local reads by the workers: {r['local']}")
    python_bench.write_results("warm", res)


if __name__ == "__main__":
    sys.exit(main())
