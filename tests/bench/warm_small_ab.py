"""A/B of warm small-file reads between builds, in microseconds per file:
`python3 tests/bench/warm_small_ab.py before=/path/to/worktree after=.` (`--epochs N`, `--turns T`).

Each variant is a worktree built with `cargo build --release` (its `memarts`, `memarts-proxy` and
`lib_memarts.so`, the Python extension, loaded with that worktree's `memarts` package). Per turn and
variant (the variants take turns): a fresh fleet of 4 proxies with default settings over one moto
origin on loopback, one forked worker process that reads 200 objects of 64-256 KiB with
`mox.file.read(url, binary=True)` once (cold) and then `--epochs` times, each epoch timed; the
bytes of every read are compared with the origin's (inside the timed loop, the same work for every
variant). Printed: each epoch's microseconds per file,
then per variant the median of the last half of every turn's epochs (the steady state: the first
warm epochs still make the chunks resident, see docs/ARCHITECTURE.md). compare.py times epochs of
about 4 ms at its small scale, where one preemption moves the figure by 20%; this times enough of
them to tell a change of a microsecond. With `--cold`, each epoch starts with the page cache
dropped (`echo 3 > /proc/sys/vm/drop_caches`, root) and no chunk is kept resident
(`MEMARTS_PIN_MEMORY=0`, the name every build reads): the chunk files come from the SSD, as in
field_bench.py's epochs. Asserts nothing about timings.
"""

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_bench  # noqa: E402  (start_moto)

BUCKET = "warm-small-ab"
FILES = 200


def python_package(worktree, into):
    """`into`/memarts: the worktree's Python package with its extension, built in its target dir."""
    shutil.copytree(os.path.join(worktree, "shim/python/python/memarts"), os.path.join(into, "memarts"))
    lib = os.path.join(worktree, "target/release/lib_memarts.so")
    if not os.path.exists(lib):
        raise SystemExit(f"{lib} is missing: run `cargo build --release` in {worktree}")
    shutil.copy(lib, os.path.join(into, "memarts/_memarts.abi3.so"))
    return into


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _epochs(package, urls, expected, epochs, cold):
    sys.path.insert(0, package)
    import memarts as mox

    assert mox.__file__.startswith(package), f"loaded {mox.__file__}, not the variant's package"
    for u in urls:
        if mox.file.read(u, binary=True) != expected[u]:
            raise AssertionError(f"wrong bytes for {u}")
    times = []
    for _ in range(epochs):
        wrong = 0
        if cold:
            drop_page_cache()
        start = time.perf_counter()
        for u in urls:
            wrong += mox.file.read(u, binary=True) != expected[u]
        times.append((time.perf_counter() - start) / len(urls) * 1e6)
        if wrong:
            raise AssertionError(f"{wrong} wrong reads in a warm epoch")
    return times


def run(worktree, package, base, endpoint, urls, expected, epochs, cold):
    """One turn of one variant: a fresh fleet, one forked worker's epoch times."""
    binary = os.path.join(worktree, "target/release/memarts")
    env = dict(os.environ, MEMARTS_RUN_DIR=os.path.join(base, "run"), MEMARTS_CACHE_DIR=os.path.join(base, "cache"))
    if cold:
        env["MEMARTS_PIN_MEMORY"] = "0"
    subprocess.run([binary, "start_proxy", "4"], env=env, check=True, capture_output=True)
    try:
        os.environ.update(MEMARTS_RUN_DIR=env["MEMARTS_RUN_DIR"])
        with multiprocessing.get_context("fork").Pool(1) as pool:
            return pool.apply(_epochs, (package, urls, expected, epochs, cold))
    finally:
        subprocess.run([binary, "stop_proxy"], env=env, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="label=worktree")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each epoch, nothing resident")
    args = ap.parse_args()
    variants = [v.split("=", 1) for v in args.variants]
    work = tempfile.mkdtemp(prefix="warm-small-ab-")
    endpoint, moto = python_bench.start_moto()
    try:
        import boto3

        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket=BUCKET)
        rng = random.Random(30)
        expected = {}
        for i in range(FILES):
            body = rng.randbytes(rng.randint(64 << 10, 256 << 10))
            s3.put_object(Bucket=BUCKET, Key=f"small/{i:05d}.bin", Body=body)
            expected[f"s3://{BUCKET}/small/{i:05d}.bin"] = body
        urls = list(expected)
        packages = {label: python_package(tree, os.path.join(work, f"py-{label}")) for label, tree in variants}
        steady = {label: [] for label, _ in variants}
        for turn in range(args.turns):
            for label, tree in variants:
                times = run(tree, packages[label], os.path.join(work, f"fleet-{label}"), endpoint, urls, expected,
                            args.epochs, args.cold)
                print(f"turn {turn + 1} {label}: us/file per epoch " + " ".join(f"{t:.1f}" for t in times), flush=True)
                steady[label] += times[len(times) // 2:]
        for label, times in steady.items():
            print(f"{label}: median of the last half of each turn's epochs {statistics.median(times):.2f} us/file "
                  f"({len(times)} epochs)")
    finally:
        moto.terminate()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
