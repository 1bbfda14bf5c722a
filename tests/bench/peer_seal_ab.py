"""What sealing the peer protocol costs: the warm-from-peers epoch of `cluster_bench.py` for two builds in
one run, taking turns: `python3 tests/bench/peer_seal_ab.py --old OLD_BIN_DIR [--new NEW_BIN_DIR]`.
OLD_BIN_DIR holds `memarts` and `memarts-proxy` of a build whose peer frames cross in clear (peer
protocol 2, before the Noise handshake and sealed records); NEW_BIN_DIR (target/release by default) this
build's. Writes tests/bench/results/peer_seal_ab.json and prints a summary. Asserts nothing about
timings; every reader checks the CRC32 of every object it read against the uploaded bytes.

Each build runs a pool of 3 nodes (P proxies, W reader processes each, as cluster_bench.py sets them up:
one moto origin behind the emulated link, peers on loopback), filled by one cold epoch of every node.
Then node 0 of each pool reads the whole dataset warm (about 2/3 of its chunks come from its peers),
the builds taking turns (old, new, new, old, ...: this machine's speed wanders over minutes), R runs
each. Per run: MB/s, and the CPU seconds per GB read of every node's proxies (the owners' sealing and
node 0's opening are in them) and of node 0's readers. Both builds' pools read through the same
installed Python package (the new build's shim: the Unix-socket protocol is the same).

Scale: as cluster_bench.py (BENCH_SCALE=small: 72 objects of 1-6 MiB, W = 2, P = 2; otherwise 448
objects, about 1.6 GiB, W = 4, P = 2); R = 6 per build (BENCH_REPS).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster_bench as cb  # noqa: E402
import compare  # noqa: E402
import python_bench  # noqa: E402
import relay  # noqa: E402


class BuildNode(cb.Node):
    """A node of cluster_bench.py run by the `memarts` of `bin_dir`."""

    def __init__(self, bin_dir, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bin = os.path.join(bin_dir, "memarts")

    def memarts(self, *args):
        return subprocess.run([self.bin, *args], env=self.env, capture_output=True, text=True, check=False)


def pool_of(label, bin_dir, base, endpoint, proxies, workers):
    root = os.path.join(base, label)
    os.makedirs(root)
    ids = [f"node-{chr(ord('a') + k)}" for k in range(cb.NODES)]
    cluster_file, _ = cb.write_cluster_file(root, ids, proxies)
    nodes = [BuildNode(bin_dir, root, node_id, endpoint, cluster_file) for node_id in ids]
    cb.start_nodes(nodes, proxies, workers)
    return nodes


def per_gb(run, ds):
    gb = ds.total / 1e9
    proxies = sum(n.get("proxy_cpu_s", 0) for n in run["nodes"].values())
    readers = run["nodes"]["node-a"].get("reader_cpu_s", 0)
    return {"mbs": run["mbs_per_node"], "proxies_cpu_s_per_gb": proxies / gb, "readers_cpu_s_per_gb": readers / gb,
            "bytes_from_peers": run["nodes"]["node-a"].get("cluster", {}).get("bytes_from_peers")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="bin dir of the build with peer frames in clear")
    ap.add_argument("--new", default=os.path.join(cb.ROOT, "target", "release"), help="bin dir of this build")
    args = ap.parse_args()
    for d in (args.old, args.new):
        if not os.access(os.path.join(d, "memarts"), os.X_OK):
            raise SystemExit(f"peer_seal_ab: no memarts in {d}")
    reps = int(os.environ.get("BENCH_REPS", "6"))
    w, p = cb.SCALE["workers"], cb.SCALE["proxies"]
    started = time.time()
    import boto3

    base = tempfile.mkdtemp(prefix="memarts-seal-ab-")
    moto = relay_stop = None
    pools = {}
    try:
        direct, moto = python_bench.start_moto()
        host, port = direct.rsplit("//", 1)[1].split(":")
        endpoint, relay_stop = relay.start_relay(host, int(port), mbps_total=cb.MBPS_TOTAL)
        s3 = boto3.client("s3", endpoint_url=direct, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=cb.BUCKET)
        ds = cb.make_dataset(s3)
        print(f"dataset: {len(ds.keys)} objects, {ds.total / cb.MIB:,.0f} MiB", flush=True)
        for label, bin_dir in (("old", args.old), ("new", args.new)):
            print(f"pool of the {label} build ({bin_dir}), cold ...", flush=True)
            pools[label] = pool_of(label, bin_dir, base, endpoint, p, w)
            cb.epoch(pools[label], pools[label], ds, relay_stop, 0, f"{label} cold")
        runs = {"old": [], "new": []}
        order = ["old", "new", "new", "old"] * ((reps + 1) // 2)
        for k, label in enumerate(order[: 2 * reps]):
            pool = pools[label]
            run = cb.epoch([pool[0]], pool, ds, relay_stop, 100 + k, f"warm {label} {k}")
            runs[label].append(per_gb(run, ds))
            print(f"  warm {label}: {run['mbs_per_node']:,.0f} MB/s", flush=True)
        out = {"machine": compare.machine(), "scale": "small" if cb.SMALL_SCALE else "full",
               "dataset": ds.describe(), "setup": {"nodes": cb.NODES, "proxies_per_node": p, "readers_per_node": w,
                                                   "reps": reps, "old": args.old, "new": args.new},
               "runs": runs}
        summary = {}
        for label, rs in runs.items():
            mbs = [r["mbs"] for r in rs]
            summary[label] = {"best_mbs": max(mbs), "median_mbs": statistics.median(mbs),
                              "median_proxies_cpu_s_per_gb": statistics.median(r["proxies_cpu_s_per_gb"] for r in rs),
                              "median_readers_cpu_s_per_gb": statistics.median(r["readers_cpu_s_per_gb"] for r in rs),
                              "peer_fraction": statistics.median(r["bytes_from_peers"] or 0 for r in rs) / ds.total}
        summary["sealed_vs_clear_best"] = summary["new"]["best_mbs"] / summary["old"]["best_mbs"]
        summary["sealed_vs_clear_median"] = summary["new"]["median_mbs"] / summary["old"]["median_mbs"]
        out["summary"] = summary
        out["seconds"] = round(time.time() - started, 1)
        for label in ("old", "new"):
            s = summary[label]
            print(f"{label}: best {s['best_mbs']:,.0f} MB/s, median {s['median_mbs']:,.0f}; proxies "
                  f"{s['median_proxies_cpu_s_per_gb']:.2f} CPU s/GB, readers {s['median_readers_cpu_s_per_gb']:.2f}; "
                  f"{s['peer_fraction']:.0%} from peers")
        print(f"sealed / clear: best {summary['sealed_vs_clear_best']:.3f}, median {summary['sealed_vs_clear_median']:.3f}")
        path = os.path.join(cb.ROOT, "tests", "bench", "results", "peer_seal_ab.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {path} ({out['seconds']:.0f} s)")
    finally:
        cb.tear_down([node for nodes in pools.values() for node in nodes], relay_stop, moto, base)


if __name__ == "__main__":
    sys.exit(main())
