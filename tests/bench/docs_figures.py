"""Writes the figures of the README and docs/ from the committed results of one `make bench` run.

Each page holds its figures between `<!-- bench:NAME -->` and `<!-- /bench -->`; this replaces what
is between with text made from `tests/bench/results/latest.json`, so that no page states a figure the
run did not measure and no two pages disagree. `make bench` runs it after report.py.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from doc_blocks import fill_pages  # noqa: E402  (tests/doc_blocks.py)

from report import RESULTS, headline



def f0(v):
    return f"{v:,.0f}"


def blocks(latest):
    """The text of every marked block, by name."""
    r, fd, wm, py, fl, lk, cl, mt, cp = (latest[k] for k in (
        "ratios", "field", "warm", "python", "fleet", "link", "cluster", "mount", "compare"))
    m = cp["machine"]
    commit = latest.get("commit", "(unknown)")
    run_line = f"Latest run: `make bench` of commit {commit}, a {m['cores']}-core VM, scale `full`."
    runs = fd["runs"]
    mem = [x["mbs"] for x in runs["memarts"]]
    loc = [x["mbs"] for x in runs["local"]]
    raw = [x["mbs"] for x in runs["chunk_files"]]
    ahead = sorted({x["origin_requests_since_the_restart_before_the_epoch"] for x in runs["memarts"]})
    pool = fd["pool"]
    lc, s4, s1, rl = wm["large_cat"], wm["small_4_workers"], wm["small_1_process"], wm["large_read_loop"]
    warm = {x["object_mib"]: x for x in fl["rows"] if x["scenario"] == "warm"}
    restart = next(x for x in fl["rows"] if x["scenario"] == "restart")
    rows = lk["rows"]
    link = lk["link"]["mbps_total"]

    def runs_of(k):
        return ", ".join(f"{v / link:.2f}" for v in rows[k]["runs_mbs"])

    peers = cl.get("warm_notes", {}).get("peer_fraction", 0)
    mm, s3w, rcw, lp = (mt["tools"]["memarts"]["warm"], mt["tools"]["s3fs"]["warm"],
                        mt["tools"]["rclone"]["warm"], mt["local_page_cache"])
    mem_py = py["memory"]
    pc, ic, w = cl["pool"]["cold"], cl["independent"]["cold"], cl["warm"]
    run = (f"The latest run: `make bench` of commit {commit} on a {m['cores']}-core "
           f"{m['cpu'].replace('(R)', '')} VM with {m['ram_gib']} GiB of memory (kernel {m['kernel']}), scale `full`.")
    return {
        "readme": f"""`make bench` measures memarts against what its users would do instead, in one run on one machine;
every figure below and in [docs/BENCHMARKS.md](docs/BENCHMARKS.md) comes from that run's files in
`tests/bench/results/`. {run_line} The settings column says which rows ran with a setting other than the
defaults and which depend on resident chunks (chunks the fleet holds in memory, checked once: a dataset
that fits `MEMARTS_RESIDENT_MEMORY`, read more than once since the fleet started).

{headline(latest)}
The reference sides do the same work: the same number of processes, the same sink (a reader of every
byte), the same cache state, every byte checked on both sides. [docs/BENCHMARKS.md](docs/BENCHMARKS.md)
describes each script, its settings and what limits each figure; every table of the run is in
[`tests/bench/results/latest.md`](tests/bench/results/latest.md).

![throughput per scenario](tests/bench/results/latest.svg)

""",
        "run": run,
        "findings": f"""- **A warm epoch from the SSD** (`field.json`; as a job meets it: default settings, an epoch after
  the metadata TTL, the fleet restarted, the page cache dropped, 4 workers): memarts read the 3,000
  objects at {f0(max(mem))} MB/s against {f0(max(loc))} MB/s from the downloaded copies, best against best
  ({r['field_warm_vs_download_then_read']:.2f}×; epochs {', '.join(f0(x) for x in mem)} against
  {', '.join(f0(x) for x in loc)}). The cache's own chunk files read raw with `open().read()` ran at
  {f0(max(raw))} MB/s ({r['field_chunk_files_raw_vs_download_then_read']:.2f}× the copies): that much of the
  gap is the files' layout (256 fan-out directories, a 4 KiB header page per chunk, about 3% more bytes
  for objects of this size); the rest is memarts's read path (a CRC32C of every byte, the metadata
  lookup, the reads reported to the slots), which ran at {r['field_warm_vs_chunk_files_raw']:.2f}× its own
  files read raw. No epoch made an origin request: the restarted fleet listed the 3 directories
  ({', '.join(map(str, ahead))} requests) while it settled, before the epoch. On the pool of 3 nodes
  the cold epoch made {pool['cold']['origin_requests']:,} origin requests (one per object for the pool), the warm
  epochs after the TTL {' and '.join(str(w['origin_requests']) for w in pool['warm'])} (one listing per
  directory at most, for the pool).
- **Warm reads from memory** (`warm.json`, `python.json`, `fleet.json`; resident chunks, `--meta-ttl 3600`
  in `warm.json`): `memarts cat` of a 256 MiB object through a pipe {f0(lc['memarts_cat_mbs'])} MB/s
  against `cat` {f0(lc['cat_mbs'])} MB/s ({lc['ratio']:.2f}×); 2,000 small files by 4 workers
  {s4['ratio']:.2f}× their downloaded copies, by one process {s1['ratio']:.2f}×; a `File.read(1 MiB)` loop
  {rl['ratio']:.2f}× the same loop over a local file; 128 KiB files from Python
  {r['warm_small_vs_page_cache']:.2f}× `open().read()`; through the Rust shim, 1 MiB objects
  {warm[1]['ratio']:.2f}× the page cache ({warm[1]['ratio_reused_buffer']:.2f}× with reused buffers),
  16 MiB {warm[16]['ratio']:.2f}×, 256 MiB {warm[256]['ratio']:.2f}×. `compare.py`'s one-process warm epoch:
  {r['warm_vs_download_then_read']:.2f}× boto3's downloaded copies, {r['warm_vs_fsspec_filecache']:.1f}×
  fsspec's filecache. A chunk that is not resident (the first epoch after a restart, a dataset larger
  than the resident budget) is checked at every read (a CRC32C of every byte), as in the field epoch.
- **Cold reads over the link** (`link.json`: +20 ms per request, 200 MB/s): `memarts warmup`
  {rows['memarts_warmup']['vs_link']:.2f}× the link (runs {runs_of('memarts_warmup')}), from a manifest
  {rows['memarts_warmup_manifest']['vs_link']:.2f}×; a cold DataLoader epoch (4 workers) with the
  prefetching sampler {rows['memarts_loader_prefetch']['vs_link']:.2f}× (runs {runs_of('memarts_loader_prefetch')}),
  without it {rows['memarts_loader_plain']['vs_link']:.2f}× (runs {runs_of('memarts_loader_plain')}); `memarts cat`
  of a cold 512 MiB object {rows['large_memarts_cat']['vs_link']:.2f}× (boto3's `download_file`
  {rows['large_boto3_download']['vs_link']:.2f}×). The DataLoader rows keep both cores busy (the proxies,
  the origin, the relay and the workers share them), so they move with the machine; the same epoch
  through s3torchconnector ran at {rows['s3torchconnector_loader']['vs_link']:.2f}× and through boto3 at
  {rows['boto3_loader']['vs_link']:.2f}×.
- **The pool** (`cluster.json`: 3 nodes of 2 proxies and 4 readers, one shared 50 MB/s origin link):
  the cold epoch moved {cl['pool']['cold']['origin_bytes_per_dataset_byte']:.3f} bytes over the origin link per
  dataset byte (3 independent fleets: {cl['independent']['cold']['origin_bytes_per_dataset_byte']:.3f}) and ended in
  {r['cluster_cold_epoch_time_vs_independent']:.2f}× their time. A warm epoch of one node, {peers:.0%} of it
  from peers, ran at {r['cluster_warm_peers_vs_local']:.2f}× an all-local one: each peer chunk is read and
  sealed (AES-256-GCM) by its owner, opened, checked and copied by the reading node, with three nodes and
  their readers on the same 2 cores; on real nodes each owner has its own.
- **Mount** (`mount.json`, fresh mounts of warm caches): a 1 GiB file by `cat` {f0(mm['large_mbs'])} MB/s
  ({r['mount_warm_large_vs_local_cat']:.2f}× a local file in the page cache; s3fs {f0(s3w['large_mbs'])}, rclone
  {f0(rcw['large_mbs'])}), 2,000 files of 128 KiB {f0(mm['small_mbs'])} MB/s ({r['mount_warm_small_vs_local']:.2f}×;
  s3fs {f0(s3w['small_mbs'])}, rclone {f0(rcw['small_mbs'])}): every `open`, `read` and `close` is a FUSE
  request to the daemon, which the Python and Rust APIs do not pay.
- **What a full cache keeps** (`epochs.rs`, a 64 MiB cache, a dataset twice as large): the second epoch
  hits {r['epoch2_hits_vs_best_sequential']:.2f}× the best possible share in order,
  {r['epoch2_hits_vs_best_shuffled']:.2f}× shuffled, {r['changeover_pass3_hits_vs_best']:.2f}× after a change of
  dataset; plain LRU {r['lru_epoch2_hits_vs_best_sequential']:.2f}×, {r['lru_epoch2_hits_vs_best_shuffled']:.2f}×,
  {r['lru_changeover_pass3_hits_vs_best']:.2f}×.
- **Restart and memory**: `start_proxy 4` over 100,000 cached chunks was ready in
  {restart['start_proxy_ready_s']:.2f} s, its index rebuilt in the background in {restart['index_rebuilt_s']:.2f} s.
  32 worker processes took {mem_py['proxy_mode_kib'] / 1024:.0f} MiB (PSS) with a fleet, {mem_py['embedded_mode_kib'] / 1024:.0f} MiB
  with an engine in every worker, {mem_py['plain_python_kib'] / 1024:.0f} MiB in plain Python: memarts adds
  {mem_py['added_by_memarts_proxy_mode_kib'] / 1024:.0f} MiB with a fleet. The total is {r['proxy_vs_embedded_pss']:.2f}× the embedded
  one; its goal (0.35×) cannot be met while the interpreters' own memory dominates both.""",
        "mount": f"""Measured (`tests/bench/mount_bench.py`, part of `make bench`, the run of [BENCHMARKS.md](BENCHMARKS.md); moto
on loopback, 4 proxies, each figure the best of 3 fresh mounts of a warm cache, `mount.json`): `cat`
of a 1 GiB file {f0(mm['large_mbs'])} MB/s, {r['mount_warm_large_vs_local_cat']:.2f}× `cat` of a local copy in the page cache
({f0(lp['large_mbs'])} MB/s); 2,000 files of 128 KiB by `open().read()` {f0(mm['small_mbs'])} MB/s, {r['mount_warm_small_vs_local']:.2f}× local
files ({f0(lp['small_mbs'])} MB/s): FUSE's round trips per file (lookup, open, read) cost more than the
bytes. Against the mounts users pick instead, warm from their own disk caches on the same server:
s3fs (`use_cache`) {f0(s3w['large_mbs'])} / {f0(s3w['small_mbs'])} MB/s (memarts {r['mount_warm_large_vs_s3fs']:.1f}× / {r['mount_warm_small_vs_s3fs']:.1f}×), rclone
(`--vfs-cache-mode full`) {f0(rcw['large_mbs'])} / {f0(rcw['small_mbs'])} MB/s ({r['mount_warm_large_vs_rclone']:.1f}× / {r['mount_warm_small_vs_rclone']:.1f}×). Mountpoint for Amazon
S3 cannot be installed from the registries here (crates.io holds only a placeholder crate of that
name; there is no Debian or PyPI package). For the fastest warm reads, read through the Python
package or the shim, which skip FUSE.
""",
        "cluster": f"""Measured by `tests/bench/cluster_bench.py` (part of `make bench`, the run of [BENCHMARKS.md](BENCHMARKS.md):
3 nodes of 2 proxies on one 2-core VM, {cl['dataset']['bytes'] / (1 << 30):.1f} GiB, all origin traffic over one shared
emulated 50 MB/s link, default settings; `tests/bench/results/cluster.json`):

| 3 nodes read the dataset cold at once | pool | 3 independent fleets |
|---|---:|---:|
| bytes over the origin link per dataset byte | {pc['origin_bytes_per_dataset_byte']:.3f} | {ic['origin_bytes_per_dataset_byte']:.3f} |
| origin requests | {pc['origin_requests']:,} | {ic['origin_requests']:,} |
| time until the last node is done | {pc['seconds']:.1f} s ({r['cluster_cold_epoch_time_vs_independent']:.2f}×) | {ic['seconds']:.1f} s |
| warm epoch of one node (pool: {peers:.0%} of it from peers) | {w['pool']['mbs_per_node'] / 1000:.2f} GB/s ({r['cluster_warm_peers_vs_local']:.2f}×) | {w['local']['mbs_per_node'] / 1000:.2f} GB/s (all local, local hits) |

""",
    }


PAGES = {"README.md": ("readme",), "docs/BENCHMARKS.md": ("run", "findings"),
         "docs/MOUNT.md": ("mount",), "docs/CLUSTER.md": ("cluster",)}



def main():
    with open(os.path.join(RESULTS, "latest.json")) as f:
        latest = json.load(f)
    # The docs state the figures of a full run (python_bench has one scale, its small one).
    partial = sorted(n for n, scale in latest["scales"].items() if n != "python" and scale != "full")
    if partial:
        print(f"docs_figures: {', '.join(partial)} ran at a smaller scale: the docs keep the last full run's figures")
        return 0
    made = blocks(latest)
    fill_pages("bench", PAGES, made)


if __name__ == "__main__":
    sys.exit(main())
