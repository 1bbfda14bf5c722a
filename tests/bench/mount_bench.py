"""`memarts mount` benchmarks (run by `make bench`), as ratios measured side by side in one run:

- mount_warm_large_vs_local_cat: `cat` of one large file through a fresh mount (every chunk in the
  fleet's SSD cache, none in the kernel's page cache: a new mount has none), against `cat` of a local
  copy in the page cache;
- mount_warm_small_vs_local: `open().read()` of many 128 KiB files through a fresh mount, against
  the same of local copies in the page cache (one process);
- the same reads through s3fs (its disk cache, `use_cache`) and rclone (`--vfs-cache-mode full`),
  both Debian packages, warm from their own caches, against the same moto server: the mounts users
  pick instead. Mountpoint for Amazon S3 is not in the registries this project can use (crates.io
  holds only a placeholder crate of that name; no Debian or PyPI package), so it is not compared.

Each "warm" figure is the best of three rounds, each on a fresh mount of a warm cache. The "cold"
figures (the first pass) are written down but say little: moto's cost of one ranged GET grows with
the object's size (a 1 MiB range takes 8 ms of a 1 MiB object, 61 ms of a 64 MiB one, 209 ms of a
256 MiB one, measured here), which punishes chunked readers (memarts reads 1 MiB ranges) against one
streaming GET (rclone); `compare.py` measures cold reads over an emulated link. Writes
tests/bench/results/mount.json. Asserts nothing about timings.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_bench import MEMARTS, SMALL, make_dataset, moto_workspace, write_results  # noqa: E402

LARGE = (256 if SMALL else 1024) << 20
SMALL_FILES = 500 if SMALL else 2000
ROUNDS = 3


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


def wait_mounted(path, proc=None, timeout=30):
    deadline = time.time() + timeout
    while not mounted(path):
        if time.time() > deadline or (proc is not None and proc.poll() is not None):
            raise SystemExit(f"{path} was not mounted within {timeout}s")
        time.sleep(0.05)


def unmount(path):
    for cmd in (["fusermount3", "-u", path], ["fusermount", "-u", path], ["umount", path]):
        if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
            break
    deadline = time.time() + 10
    while mounted(path) and time.time() < deadline:
        time.sleep(0.05)


def cat_seconds(path):
    start = time.perf_counter()
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def read_all_seconds(paths):
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            f.read()
    return time.perf_counter() - start


class Memarts:
    name = "memarts mount"

    def __init__(self, bucket):
        self.bucket = bucket

    def mount(self, point):
        subprocess.run([MEMARTS, "mount", f"s3://{self.bucket}", point, "--read-only",
                        "--attr-timeout", "7200", "--entry-timeout", "7200"], check=True, capture_output=True)

    def unmount(self, point):
        subprocess.run([MEMARTS, "unmount", point], check=True, capture_output=True)


class S3fs:
    name = "s3fs (use_cache)"

    def __init__(self, bucket, endpoint, work):
        self.bucket, self.endpoint = bucket, endpoint
        self.cache = os.path.join(work, "s3fs-cache")
        self.passwd = os.path.join(work, "s3fs-passwd")
        with open(self.passwd, "w") as f:
            f.write("testing:testing\n")
        os.chmod(self.passwd, 0o600)

    def mount(self, point):
        subprocess.run(["s3fs", self.bucket, point, "-o", f"url={self.endpoint}", "-o", "use_path_request_style",
                        "-o", f"passwd_file={self.passwd}", "-o", f"use_cache={self.cache}", "-o", "ro",
                        "-o", "stat_cache_expire=7200"], check=True, capture_output=True)
        wait_mounted(point)

    def unmount(self, point):
        unmount(point)


class Rclone:
    name = "rclone mount (vfs-cache-mode full)"

    def __init__(self, bucket, endpoint, work):
        self.bucket, self.endpoint = bucket, endpoint
        self.cache = os.path.join(work, "rclone-cache")

    def mount(self, point):
        self.proc = subprocess.Popen(
            ["rclone", "mount", f":s3:{self.bucket}", point, "--s3-provider", "Other", "--s3-endpoint", self.endpoint,
             "--s3-access-key-id", "testing", "--s3-secret-access-key", "testing", "--read-only",
             "--vfs-cache-mode", "full", "--cache-dir", self.cache, "--dir-cache-time", "2h",
             "--vfs-cache-max-age", "2h"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # rclone fails to start when AWS_CA_BUNDLE is set ("unsupported transport"); the server
            # is plain HTTP on loopback, so no CA is needed.
            env={k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"})
        wait_mounted(point, self.proc)

    def unmount(self, point):
        unmount(point)
        self.proc.wait(timeout=30)


def measure(tool, work, large_key, small_keys):
    """Cold pass (fills the tool's cache), then the best of ROUNDS warm passes on fresh mounts."""
    point = tempfile.mkdtemp(prefix="mnt-", dir=work)
    results = {}
    for phase in ["cold"] + ["warm"] * ROUNDS:
        tool.mount(point)
        try:
            large = cat_seconds(os.path.join(point, large_key))
            small = read_all_seconds([os.path.join(point, k) for k in small_keys])
        finally:
            tool.unmount(point)
        best = results.setdefault(phase, {"large_s": float("inf"), "small_s": float("inf")})
        best["large_s"] = min(best["large_s"], large)
        best["small_s"] = min(best["small_s"], small)
    return results


def main():
    import boto3

    bucket = "mountbench"
    endpoint, moto, s3, work = moto_workspace(bucket, "memarts-mountbench-")
    _, small_paths = make_dataset(s3, bucket, "small", SMALL_FILES, 128 << 10)
    small_keys = [f"small/{os.path.basename(p)}" for p in small_paths]
    large_local = os.path.join(work, "large.bin")
    with open(large_local, "wb") as f:
        f.write(os.urandom(LARGE))
    s3.upload_file(large_local, bucket, "large.bin", Config=boto3.s3.transfer.TransferConfig(multipart_chunksize=64 << 20))
    small_bytes = SMALL_FILES * (128 << 10)

    cat_seconds(large_local)
    read_all_seconds(small_paths)
    local = {"large_s": min(cat_seconds(large_local) for _ in range(ROUNDS)),
             "small_s": min(read_all_seconds(small_paths) for _ in range(ROUNDS))}

    subprocess.run([MEMARTS, "start_proxy", "4"], check=True, capture_output=True)
    tools = {"memarts": Memarts(bucket)}
    unavailable = {}
    for key, cls, binary in (("s3fs", S3fs, "s3fs"), ("rclone", Rclone, "rclone")):
        if shutil.which(binary):
            tools[key] = cls(bucket, endpoint, work)
        else:
            unavailable[key] = f"{binary} is not installed (apt-get install {binary})"
    runs = {}
    try:
        for key, tool in tools.items():
            try:
                runs[key] = measure(tool, work, "large.bin", small_keys)
            except (subprocess.CalledProcessError, SystemExit, OSError) as e:
                unavailable[key] = f"did not run: {e}"
    finally:
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
        moto.kill()
        # The datasets, caches and the peers' caches: gigabytes a later benchmark needs.
        shutil.rmtree(work, ignore_errors=True)

    def mbs(nbytes, seconds):
        return nbytes / seconds / 1e6

    out = {"scale": "small" if SMALL else "full", "large_bytes": LARGE, "small_files": SMALL_FILES, "small_file_bytes": 128 << 10,
           "local_page_cache": {"large_mbs": mbs(LARGE, local["large_s"]), "small_mbs": mbs(small_bytes, local["small_s"])},
           "tools": {}, "unavailable": unavailable,
           "mountpoint_s3": "not installable here: crates.io has only a placeholder crate named mountpoint-s3, "
                            "and there is no Debian or PyPI package"}
    for key, r in runs.items():
        out["tools"][key] = {phase: {"large_mbs": mbs(LARGE, v["large_s"]), "small_mbs": mbs(small_bytes, v["small_s"])}
                             for phase, v in r.items()}
    ratios = {}
    if "memarts" in runs:
        m = out["tools"]["memarts"]["warm"]
        ratios["mount_warm_large_vs_local_cat"] = m["large_mbs"] / out["local_page_cache"]["large_mbs"]
        ratios["mount_warm_small_vs_local"] = m["small_mbs"] / out["local_page_cache"]["small_mbs"]
        for peer in ("s3fs", "rclone"):
            if peer in out["tools"]:
                p = out["tools"][peer]["warm"]
                ratios[f"mount_warm_large_vs_{peer}"] = m["large_mbs"] / p["large_mbs"]
                ratios[f"mount_warm_small_vs_{peer}"] = m["small_mbs"] / p["small_mbs"]
    out["ratios"] = ratios
    for key, t in out["tools"].items():
        for phase, v in t.items():
            print(f"{tools[key].name} {phase}: large file {v['large_mbs']:.0f} MB/s, 128 KiB files {v['small_mbs']:.0f} MB/s")
    print(f"local page cache: large {out['local_page_cache']['large_mbs']:.0f} MB/s, "
          f"small {out['local_page_cache']['small_mbs']:.0f} MB/s")
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    for k, v in unavailable.items():
        print(f"{k}: {v}")
    write_results("mount", out)


if __name__ == "__main__":
    main()
