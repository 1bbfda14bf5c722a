"""Merges one `make bench` run into `tests/bench/results/latest.json`, a markdown table
(`latest.md`) and a chart (`latest.svg`).

Inputs, all written by the same run: `fleet.json` (the Rust bench: warm reads through the Rust shim
against the page cache, cold reads against direct ranged GETs, restart time), `python.json` (the
Python package: small files, per-worker memory), `compare.json` (the peers over the emulated
remote link), `link.json` (cold reads over an emulated link against its capacity, origin s3s-fs with GET bodies read whole and LISTs of the prefix's directory, tests/bench/origin), `cluster.json` (a pool of 3 nodes against 3 independent fleets over one shared
emulated link: origin bytes, cold epoch time, warm reads from peers), `mount.json` (`memarts
mount` against local files in the page cache, s3fs and rclone) and `warm.json` (warm reads with
local hits against local files: `memarts cat` against `cat`, small files by 4 workers and by one). A missing input is an error: a
report never mixes runs silently.

`latest.json` keeps each input whole under its name and adds `ratios` (every ratio of the run, the
issue's keys first) and `goals` (each with the goal and whether this run met it).
"""

import json
import os
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# The ratios the benchmark issue asks for, their goals, and which input measures each.
GOALS = {
    "warm_vs_page_cache": (">=", 0.8, "fleet"),
    "warm_small_vs_page_cache": (">=", 0.7, "python"),
    "warm_vs_page_cache_1mib": (">=", 0.8, "fleet"),
    "warm_cat_vs_cat": (">=", 0.9, "warm"),
    "warm_small_4_workers_vs_download_then_read": (">=", 1.0, "warm"),
    "cold_vs_direct_origin": (">=", 0.9, "fleet"),
    "epoch2_hits_vs_best_sequential": (">=", 0.9, "fleet"),
    "epoch2_hits_vs_best_shuffled": (">=", 0.9, "fleet"),
    "changeover_pass3_hits_vs_best": (">=", 0.9, "fleet"),
    "proxy_vs_embedded_pss": ("<=", 0.35, "python"),
    "warm_vs_s3torchconnector": (">=", 5.0, "compare"),
    "warm_vs_fsspec_filecache": (">=", 1.0, "compare"),
    "warm_vs_download_then_read": (">=", 1.0, "compare"),
    "cluster_origin_bytes_per_dataset_byte": ("<=", 1.02, "cluster"),
    "cluster_cold_epoch_time_vs_independent": ("<=", 0.4, "cluster"),
    "cold_loader_vs_link": (">=", 0.8, "link"),
    "cold_large_stream_vs_link": (">=", 0.8, "link"),
    "warmup_vs_link": (">=", 0.9, "link"),
    "field_warm_vs_download_then_read": (">=", 0.9, "field"),
    "field_origin_requests_per_object": ("<=", 0.001, "field"),
    "field_pool_origin_requests_per_object": ("<=", 0.001, "field"),
    "small_fill_vs_cp_r": (">=", 1.0, "small_objects"),
    "small_space_amplification": ("<=", 1.1, "small_objects"),
    "small_proxy_memory_bytes_per_object": ("<=", 100, "small_objects"),
    "small_tables_bytes_per_object": ("<=", 64, "small_objects"),
    "small_restart_s_per_million": ("<=", 2.0, "small_objects"),
    "small_warm_vs_local_files": (">=", 0.9, "small_objects"),
}

# Ratios reported next to the goals, without one of their own.
REPORTED = {
    "lru_epoch2_hits_vs_best_sequential": "fleet",
    "lru_epoch2_hits_vs_best_shuffled": "fleet",
    "lru_changeover_pass3_hits_vs_best": "fleet",
    "cluster_warm_peers_vs_local": "cluster",
    "field_chunk_files_raw_vs_download_then_read": "field",
    "field_warm_vs_chunk_files_raw": "field",
    "mount_warm_large_vs_local_cat": "mount",
    "mount_warm_small_vs_local": "mount",
    "mount_warm_large_vs_s3fs": "mount",
    "mount_warm_small_vs_s3fs": "mount",
    "mount_warm_large_vs_rclone": "mount",
    "mount_warm_small_vs_rclone": "mount",
    "cold_loader_vs_measured_link": "link",
    "cold_loader_vs_s3torchconnector": "link",
    "cold_loader_vs_boto3": "link",
    "cold_loader_prefetch_vs_plain": "link",
    "warmup_vs_measured_link": "link",
    "warmup_manifest_vs_link": "link",
    "cold_large_stream_vs_boto3_download": "link",
    "warm_small_1_process_vs_local_files": "warm",
    "warm_file_read_loop_vs_local_file": "warm",
    "small_fill_vs_one_file_write": "small_objects",
    "small_files_fill_vs_cp_r": "small_objects",
    "small_files_fill_vs_one_file_write": "small_objects",
    "small_files_space_amplification": "small_objects",
    "small_files_proxy_memory_bytes_per_object": "small_objects",
    "small_files_tables_bytes_per_object": "small_objects",
    "small_files_restart_s_per_million": "small_objects",
    "small_files_warm_vs_local_files": "small_objects",
}

INPUTS = ("fleet", "python", "compare", "cluster", "mount", "link", "warm", "field", "small_objects")


def load(name):
    path = os.path.join(RESULTS, f"{name}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"report: {path} is missing; run `make bench` (it writes all {len(INPUTS)} inputs)") from None


def merged_ratios(inputs):
    ratios = {}
    for key, (_op, _goal, source) in GOALS.items():
        ratios[key] = inputs[source]["ratios"].get(key)
    for key, source in REPORTED.items():
        ratios[key] = inputs[source]["ratios"].get(key)
    for source, data in inputs.items():
        for key, value in data.get("ratios", {}).items():
            ratios.setdefault(key if key not in GOALS else f"{source}.{key}", value)
    return ratios


def goal_status(ratios):
    out = {}
    for key, (op, goal, _source) in GOALS.items():
        value = ratios.get(key)
        met = None if not isinstance(value, (int, float)) else (value >= goal if op == ">=" else value <= goal)
        out[key] = {"goal": f"{op} {goal}", "value": value, "met": met}
    return out


def mbs(entry):
    return entry.get("mbs") if isinstance(entry, dict) else None


def scenarios(fleet, python, compare):
    """(label, small-file MB/s, large-file MB/s) for every scenario measured over the same datasets in
    compare.json; None where a scenario does not apply or could not run."""
    rows = [("page cache: open().read() of local copies", mbs(compare["page_cache"]["small"]),
             mbs(compare["page_cache"]["large"]))]
    for run in compare["memarts"]["worker_sweep"] + compare["memarts"]["proxy_sweep"]:
        who = f"memarts (Python), {run['workers']} worker{'s' if run['workers'] > 1 else ''}, {run['proxies']} prox{'ies' if run['proxies'] > 1 else 'y'}"
        for phase, label in (("warm", "warm"), ("restart", "warm after restart"), ("cold", "cold")):
            small, large = run["small"].get(phase), run["large"].get(phase)
            if small or large:
                rows.append((f"{who}: {label}", mbs(small), mbs(large)))
    for run in compare["memarts"].get("rust_shim_sweep", []):
        who = f"memarts warmup (Rust shim, + a LIST), {run['threads']} thr., {run['proxies']} proxies"
        for phase, label in (("warm", "warm"), ("restart", "warm after restart"), ("cold", "cold")):
            rows.append((f"{who}: {label}", mbs(run["small"].get(phase)), mbs(run["large"].get(phase))))
    peers = [
        ("boto3 download, then read: warm (local re-read)", "boto3_download_then_read", "warm"),
        ("boto3 download, then read: cold", "boto3_download_then_read", "cold"),
        ("s3torchconnector S3MapDataset: epoch 2", "s3torchconnector", "epoch2"),
        ("s3torchconnector S3MapDataset: epoch 1", "s3torchconnector", "epoch1"),
        ("fsspec/s3fs filecache: warm", "fsspec_filecache", "warm"),
        ("fsspec/s3fs filecache: cold", "fsspec_filecache", "cold"),
    ]
    for label, name, phase in peers:
        peer = compare.get(name)
        if not isinstance(peer, dict) or "small" not in peer:
            rows.append((f"{label} (did not run: {peer.get('unavailable') if isinstance(peer, dict) else peer})", None, None))
            continue
        rows.append((label, mbs(peer["small"].get(phase)), mbs(peer["large"].get(phase))))
    return rows


def cluster_rows(cluster):
    """(label, pool, independent fleets, ratio) rows of cluster.json, as text."""
    pool, ind, warm = cluster["pool"]["cold"], cluster["independent"]["cold"], cluster["warm"]
    r = cluster["ratios"]
    peers = cluster.get("warm_notes", {}).get("peer_fraction")
    from_peers = f"{peers:.0%} from peers" if peers is not None else "most from peers"

    def times(v):
        return "" if v is None else f"{v:.2f}×"

    return [
        ("cold epoch, every node at once: origin bytes per dataset byte",
         f"{pool['origin_bytes_per_dataset_byte']:.3f}", f"{ind['origin_bytes_per_dataset_byte']:.3f}", ""),
        ("cold epoch: origin requests", f"{pool['origin_requests']:,}", f"{ind['origin_requests']:,}", ""),
        ("cold epoch: seconds until the last node is done", f"{pool['seconds']:.1f} s", f"{ind['seconds']:.1f} s",
         times(r.get("cluster_cold_epoch_time_vs_independent"))),
        ("cold epoch: MB/s per node", fmt(pool["mbs_per_node"]), fmt(ind["mbs_per_node"]), ""),
        (f"warm epoch of one node, MB/s (pool: {from_peers}; independent: all local)",
         fmt(warm["pool"]["mbs_per_node"]), fmt(warm["local"]["mbs_per_node"]),
         times(r.get("cluster_warm_peers_vs_local"))),
    ]


def cluster_bars(cluster):
    """(label, MB/s) bars of cluster.json for the chart."""
    pool, ind, warm = cluster["pool"]["cold"], cluster["independent"]["cold"], cluster["warm"]
    peers = cluster.get("warm_notes", {}).get("peer_fraction")
    return [
        ("memarts pool of 3 nodes: cold epoch, MB/s per node", pool["mbs_per_node"]),
        ("3 independent memarts fleets: cold epoch, MB/s per node", ind["mbs_per_node"]),
        (f"memarts pool, one node: warm ({'most' if peers is None else f'{peers:.0%}'} from peers)",
         warm["pool"]["mbs_per_node"]),
        ("memarts independent fleet: warm (all local)", warm["local"]["mbs_per_node"]),
    ]


def fmt(v, digits=0):
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def markdown(latest, rows):
    c, f, p, cl = latest["compare"], latest["fleet"], latest["python"], latest["cluster"]
    link = c["link"]
    m = c["machine"]
    lines = [
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['ram_gib']} GiB RAM, kernel {m['kernel']}; scale `{c['scale']}`.",
        f"Emulated link to the S3 server (moto on loopback): +{link['latency_ms']:g} ms per request, "
        f"{link['mbps_per_conn']:g} MB/s per connection, {link['mbps_total']:g} MB/s in total.",
        f"Datasets: {c['datasets']['small']['files']} small files ({c['datasets']['small']['min_size'] >> 10}–"
        f"{c['datasets']['small']['max_size'] >> 10} KiB), {c['datasets']['large']['files']} large files of "
        f"{c['datasets']['large']['max_size'] >> 20} MiB.",
        "",
        "| scenario | small files, MB/s | large files, MB/s |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {fmt(s)} | {fmt(l)} |" for label, s, l in rows]
    lines += ["", ("memarts's rows ran with default settings (metadata TTL 60 s, resident budget a sixteenth of the "
                   "machine's memory, which these datasets fit). `warm` is the best of 5 epochs: by then the chunks "
                   "read locally are made resident, so it depends on residency; `warm after restart` is the first epoch "
                   "after `stop_proxy` + `start_proxy`: nothing resident, the chunk files in the page cache.")]
    lines += ["", "Through the Rust shim (`fleet.json`, 4 proxies, one reader, no link emulation):", "",
              "| scenario | memarts | reference | ratio |", "|---|---:|---:|---:|"]
    for row in f["rows"]:
        if row["scenario"] == "warm":
            lines.append(f"| warm read, {row['object_mib']} MiB object | {fmt(row['memarts_mbs'])} MB/s | "
                         f"page cache {fmt(row['page_cache_mbs'])} MB/s | {row['ratio']:.2f}× |")
        elif row["scenario"] == "cold":
            lines.append(f"| cold read, {row['object_mib']} MiB object | {fmt(row['memarts_mbs'])} MB/s | "
                         f"direct ranged GETs {fmt(row['direct_origin_mbs'])} MB/s | {row['ratio']:.2f}× |")
        elif row["scenario"] == "restart":
            lines.append(f"| restart with {row['cached_chunks']:,} cached chunks | ready in {row['start_proxy_ready_s']:.2f} s "
                         f"| index rebuilt in {row['index_rebuilt_s']:.2f} s | |")
        elif row["scenario"] == "epochs" and row["policy"] != "lru":
            lru = next((r for r in f["rows"] if r["scenario"] == "epochs" and r["policy"] == "lru"
                        and r["order"] == row["order"]), None)
            per = lambda r: " / ".join(f"{x:.2f}" for x in r["hit_ratio_per_epoch"]) if r else "—"
            lines.append(f"| {len(row['hit_ratio_per_epoch'])} epochs {row['order']}, dataset {row['dataset_mib']} MiB = "
                         f"2× the cache: hit ratio per epoch | {per(row)} | plain LRU {per(lru)} | "
                         f"best {row['best_hit_ratio']:.2f} |")
        elif row["scenario"] == "changeover" and row["policy"] != "lru":
            lru = next((r for r in f["rows"] if r["scenario"] == "changeover" and r["policy"] == "lru"), None)
            per = lambda r: " / ".join(f"{x:.2f}" for x in r["hit_ratio_per_epoch"]) if r else "—"
            lines.append(f"| then a new dataset of {row['dataset_mib']} MiB = 2× the cache, shuffled, after "
                         f"{len(row['first_hit_ratio_per_epoch'])} epochs over {row['first_dataset_mib']} MiB: "
                         f"hit ratio per epoch | {per(row)} | plain LRU {per(lru)} | best {row['best_hit_ratio']:.2f} |")
        elif row["scenario"] == "round_trip":
            lines.append(f"| one request/response | stat {row['memarts_stat_us']:.0f} µs | "
                         f"socket ping-pong {row['socket_ping_pong_us']:.0f} µs | |")
    mem = p["memory"]
    lines += ["", f"Memory, {mem['workers']} worker processes reading one dataset (total PSS): proxy mode "
              f"{mem['proxy_mode_kib'] / 1024:.0f} MiB (workers {mem['proxy_mode_workers_kib'] / 1024:.0f} + proxies "
              f"{mem['proxies_kib'] / 1024:.0f}), embedded mode {mem['embedded_mode_kib'] / 1024:.0f} MiB, the same job "
              f"in plain Python {mem['plain_python_kib'] / 1024:.0f} MiB.", ""]
    setup, ds, cl_link = cl["setup"], cl["dataset"], cl["link"]
    lines += [(f"Cluster pool (`cluster.json`, scale `{cl['scale']}`): {setup['nodes']} nodes of "
               f"{setup['proxies_per_node']} proxies, {setup['readers_per_node']} reader processes each; "
               f"{ds['files']} objects of {ds['min_size'] / (1 << 20):.1f}–{ds['max_size'] / (1 << 20):.1f} MiB "
               f"({ds['bytes'] >> 20} MiB); all origin traffic over one shared link (+{cl_link['latency_ms']:g} ms "
               f"per request, {cl_link['mbps_per_conn']:g} MB/s per connection, {cl_link['mbps_total']:g} MB/s in "
               f"total), peers on loopback."), "",
              "| scenario | pool of 3 nodes | 3 independent fleets | ratio |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {a} | {b} | {ratio} |" for label, a, b, ratio in cluster_rows(cl)]
    mt = latest["mount"]
    lines += ["", (f"`memarts mount` (`mount.json`, fresh mounts of warm caches, best of 3; moto on loopback, no link "
                   f"emulation): one {mt['large_bytes'] >> 20} MiB file read by `cat`, {mt['small_files']} files of "
                   f"{mt['small_file_bytes'] >> 10} KiB read by `open().read()`."), "",
              "| mount | large file, MB/s | small files, MB/s |", "|---|---:|---:|",
              f"| local files in the page cache | {fmt(mt['local_page_cache']['large_mbs'])} | "
              f"{fmt(mt['local_page_cache']['small_mbs'])} |"]
    for key, t in mt["tools"].items():
        for phase, v in t.items():
            lines.append(f"| {key}: {phase} | {fmt(v['large_mbs'])} | {fmt(v['small_mbs'])} |")
    for key, why in mt.get("unavailable", {}).items():
        lines.append(f"| {key} ({why}) | — | — |")
    lines.append(f"| Mountpoint for S3 ({mt.get('mountpoint_s3', 'not measured')}) | — | — |")
    wm = latest["warm"]
    lc, s4, s1 = wm["large_cat"], wm["small_4_workers"], wm["small_1_process"]
    resident = [r["local"]["local_resident"] / max(r["local"]["local_hits"], 1) for r in (s4, s1) if "local" in r]
    lines += ["", (f"Warm reads with local hits (`warm.json`, scale `{wm['scale']}`, {wm['proxies']} proxies, "
                   "`--meta-ttl 3600`, `MOX_FILE_CHUNK_SIZE` 1 MiB, best of "
                   f"{wm['reps']} interleaved runs; both sides read bytes in the page cache, each the same way). These "
                   "rows depend on residency: the small-file rows are the steady state of a dataset that fits the resident "
                   "budget, reached by untimed passes"
                   + (f" ({', '.join(f'{x:.0%}' for x in resident)} of their local hits served from resident chunks)"
                      if resident else "")
                   + "; a dataset larger than the budget is read from its chunk files, as in the field epoch below."), "",
              "| scenario | memarts | local files | ratio |", "|---|---:|---:|---:|",
              f"| `memarts cat` vs `cat` of a local copy, {lc['bytes'] >> 20} MiB, through a pipe | "
              f"{fmt(lc['memarts_cat_mbs'])} MB/s | {fmt(lc['cat_mbs'])} MB/s | {lc['ratio']:.2f}× |"]
    for r in (s4, s1):
        lines.append(f"| {r['workers']} worker process(es), {r['files']} files of 64–255 KiB: `mox.file.read` vs "
                     f"`open(path, 'rb').read()` of the downloaded copies | {fmt(r['memarts_mbs'])} MB/s | "
                     f"{fmt(r['local_mbs'])} MB/s | {r['ratio']:.2f}× |")
    rl = wm.get("large_read_loop")
    if rl:
        lines.append(f"| 1 process, {rl['bytes'] >> 20} MiB in {rl['piece'] >> 10} KiB reads: "
                     f"`mox.file.File(url, 'rb').read(n)` vs `open(path, 'rb').read(n)` of a local copy | "
                     f"{fmt(rl['memarts_mbs'])} MB/s | {fmt(rl['local_mbs'])} MB/s | {rl['ratio']:.2f}× |")
    fd = latest["field"]
    ds, st = fd["dataset"], fd["setup"]
    lines += ["", (f"A warm epoch in the field (`field.json`, scale `{fd.get('scale', 'full')}`): {ds['objects']:,} objects "
                   f"of 64–192 KiB in {ds['dirs']} directories, default settings ({st['proxies']} proxies, metadata TTL "
                   f"{st['meta_ttl_secs']} s), {st['workers']} worker processes, the origin behind the emulated link; the "
                   f"fleet {st['fleet']}; the page cache {st['page_cache']}; every object's CRC32 checked on both sides."),
              "", "| run | memarts MB/s | origin requests | download-then-read MB/s | ratio | chunk files read raw MB/s |",
              "|---|---:|---:|---:|---:|---:|"]
    raw = fd["runs"].get("chunk_files", [])
    for i, (m, loc) in enumerate(zip(fd["runs"]["memarts"], fd["runs"]["local"])):
        lines.append(f"| {i} | {fmt(m['mbs'])} | {m['origin_requests']} | {fmt(loc['mbs'])} | {m['mbs'] / loc['mbs']:.2f}× | "
                     f"{fmt(raw[i]['mbs']) if i < len(raw) else '—'} |")
    pl = fd.get("pool")
    if pl:
        lines += ["", (f"The same dataset on a pool of {pl['nodes']} nodes ({pl['proxies_per_node']} proxies and "
                       f"{pl['readers_per_node']} readers each, one machine): every node reads every object, at once."),
                  "", "| epoch | MB/s, all nodes | origin requests | per object |", "|---|---:|---:|---:|",
                  f"| cold | {fmt(pl['cold']['mbs_all_nodes'])} | {pl['cold']['origin_requests']} | "
                  f"{pl['cold']['origin_requests'] / ds['objects']:.3f} |"]
        for i, w in enumerate(pl["warm"]):
            lines.append(f"| warm {i}, after the TTL | {fmt(w['mbs_all_nodes'])} | {w['origin_requests']} | "
                         f"{w['origin_requests'] / ds['objects']:.4f} |")
    lk = latest["link"]
    lk_link = lk["link"]
    lines += ["", (f"Cold reads against the link (`link.json`, scale `{lk['scale']}`): origin {lk['origin']} behind the "
                   f"emulated link (+{lk_link['latency_ms']:g} ms per request, {lk_link['mbps_per_conn']:g} MB/s per "
                   f"connection, {lk_link['mbps_total']:g} MB/s in total); {lk['datasets']['small_files']} small files "
                   f"of 64–255 KiB, one {lk['datasets']['large_bytes'] >> 20} MiB object; fresh caches."), "",
              "| scenario | MB/s (median run) | × link | × measured link | every run, × link |",
              "|---|---:|---:|---:|---|"]
    for key, row in lk["rows"].items():
        if "mbs" in row:
            runs = ", ".join(f"{m / lk_link['mbps_total']:.2f}" for m in row.get("runs_mbs", []))
            lines.append(f"| {key} | {fmt(row['mbs'])} | {row['vs_link']:.2f} | {row['vs_measured_link']:.2f} | "
                         f"{runs} |")
        else:
            lines.append(f"| {key} ({row.get('unavailable', 'not measured')}) | — | — | — | |")
    lines += ["", "| ratio (same run) | value | goal | met |", "|---|---:|---:|---|"]
    for key, g in latest["goals"].items():
        value = "—" if g["value"] is None else f"{g['value']:.2f}"
        lines.append(f"| `{key}` | {value} | {g['goal']} | {'yes' if g['met'] else 'no' if g['met'] is False else '—'} |")
    for key in REPORTED:
        value = latest["ratios"].get(key)
        lines.append(f"| `{key}` | {'—' if value is None else f'{value:.2f}'} | (reported) | — |")
    return "\n".join(lines) + "\n"


def chart(rows, bars, path):
    """Horizontal bars of MB/s per scenario, small and large files side by side, log scale; below them
    the cluster pool's bars (its own dataset of few-MiB files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r[1] is not None or r[2] is not None]
    labels = [r[0] for r in shown][::-1]
    fig = plt.figure(figsize=(13, 0.34 * (len(shown) + len(bars)) + 2.6))
    grid = fig.add_gridspec(2, 2, height_ratios=[len(shown), len(bars) + 1])
    axes = [fig.add_subplot(grid[0, 0])]
    axes.append(fig.add_subplot(grid[0, 1], sharey=axes[0]))
    axes[1].tick_params(labelleft=False)
    for ax, col, title in ((axes[0], 1, "small files (64–256 KiB)"), (axes[1], 2, "large files")):
        values = [r[col] or 0 for r in shown][::-1]
        colors = ["#1f77b4" if "memarts" in l else "#7f7f7f" if "page cache" in l else "#ff7f0e" for l in labels]
        ax.barh(range(len(values)), values, color=colors)
        ax.set_xscale("log")
        ax.set_title(f"{title}, MB/s (log scale)")
        ax.grid(axis="x", which="both", alpha=0.3)
        for i, v in enumerate(values):
            if v:
                ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    ax = fig.add_subplot(grid[1, :])
    values = [v or 0 for _, v in bars][::-1]
    ax.barh(range(len(values)), values, color="#1f77b4")
    ax.set_xscale("log")
    ax.set_title("cluster pool vs independent fleets, files of a few MiB over one shared link, MB/s (log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    for i, v in enumerate(values):
        if v:
            ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
    ax.set_yticks(range(len(values)), [label for label, _ in bars][::-1], fontsize=8)
    fig.suptitle("memarts vs page cache vs peers, one run (blue: memarts, orange: peers, grey: page cache)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def headline(latest):
    """The README's table: one row per question a user asks, each with its settings, from this run."""
    r, fd, wm, lk, cl, mt = (latest[k] for k in ("ratios", "field", "warm", "link", "cluster", "mount"))
    best = lambda side: max(x["mbs"] for x in fd["runs"][side])  # noqa: E731
    link = lk["link"]["mbps_total"]
    s4, lc = wm["small_4_workers"], wm["large_cat"]
    pool_cold = cl["pool"]["cold"]
    lines = [
        "| question | memarts | reference | ratio | settings |",
        "|---|---:|---:|---:|---|",
        (f"| warm epoch from the SSD, {fd['dataset']['objects']:,} objects of 64–192 KiB, "
         f"{fd['setup']['workers']} workers | {fmt(best('memarts'))} MB/s | download-then-read "
         f"{fmt(best('local'))} MB/s | {r['field_warm_vs_download_then_read']:.2f}× | defaults; after the TTL, "
         "fleet restarted, page cache dropped; nothing resident |"),
        (f"| origin requests in that epoch, per object | one node {r['field_origin_requests_per_object']:.3f}, "
         f"pool of 3 {r['field_pool_origin_requests_per_object']:.3f} | revalidating with a HEAD per object: 1.000 | | defaults |"),
        (f"| warm epoch from memory, {s4['files']:,} files of 64–255 KiB, {s4['workers']} workers | "
         f"{fmt(s4['memarts_mbs'])} MB/s | download-then-read {fmt(s4['local_mbs'])} MB/s | {s4['ratio']:.2f}× | "
         "`--meta-ttl 3600`; page cache; resident |"),
        (f"| `memarts cat` of a warm {lc['bytes'] >> 20} MiB object through a pipe | {fmt(lc['memarts_cat_mbs'])} MB/s | "
         f"`cat` of a local copy {fmt(lc['cat_mbs'])} MB/s | {lc['ratio']:.2f}× | `--meta-ttl 3600`; page cache; resident |"),
        (f"| cold `memarts warmup` of {lk['datasets']['small_files']:,} small files | "
         f"{fmt(lk['rows']['memarts_warmup']['mbs'])} MB/s | the link {fmt(link)} MB/s | "
         f"{lk['rows']['memarts_warmup']['vs_link']:.2f}× | defaults; median of 3 runs |"),
        (f"| cold DataLoader epoch (4 workers, prefetching sampler) | {fmt(lk['rows']['memarts_loader_prefetch']['mbs'])} "
         f"MB/s | the link {fmt(link)} MB/s | {lk['rows']['memarts_loader_prefetch']['vs_link']:.2f}× | defaults; "
         "median of 3 runs |"),
        (f"| cold epoch of a pool of 3 nodes, every node at once: origin bytes per dataset byte | "
         f"{pool_cold['origin_bytes_per_dataset_byte']:.3f} | 3 independent fleets "
         f"{cl['independent']['cold']['origin_bytes_per_dataset_byte']:.3f} | | defaults, one shared link |"),
        (f"| warm `memarts mount`: a {mt['large_bytes'] >> 20} MiB file by `cat`, {mt['small_files']:,} files of "
         f"{mt['small_file_bytes'] >> 10} KiB | {fmt(mt['tools']['memarts']['warm']['large_mbs'])} / "
         f"{fmt(mt['tools']['memarts']['warm']['small_mbs'])} MB/s | local files "
         f"{fmt(mt['local_page_cache']['large_mbs'])} / {fmt(mt['local_page_cache']['small_mbs'])} MB/s | "
         f"{r['mount_warm_large_vs_local_cat']:.2f}× / {r['mount_warm_small_vs_local']:.2f}× | defaults; page cache |"),
    ]
    return "\n".join(lines) + "\n"


def measured_commit():
    """The commit the run measured: `BENCH_COMMIT` (make bench takes it as it starts), else HEAD now."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    git = ["git", "-C", os.path.dirname(RESULTS), "describe", "--always", "--dirty", "--abbrev=7"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip() or "(unknown)"


def main():
    inputs = {name: load(name) for name in INPUTS}
    scales = {name: data.get("scale", "small" if name == "python" else None) for name, data in inputs.items()}
    ratios = merged_ratios(inputs)
    latest = dict(inputs, ratios=ratios, goals=goal_status(ratios), scales=scales, commit=measured_commit())
    with open(os.path.join(RESULTS, "latest.json"), "w") as f:
        json.dump(latest, f, indent=2)
    rows = scenarios(inputs["fleet"], inputs["python"], inputs["compare"])
    table = markdown(latest, rows)
    with open(os.path.join(RESULTS, "latest.md"), "w") as f:
        f.write(table)
    with open(os.path.join(RESULTS, "headline.md"), "w") as f:
        f.write(headline(latest))
    chart(rows, cluster_bars(inputs["cluster"]), os.path.join(RESULTS, "latest.svg"))
    print(table)
    print(f"wrote {RESULTS}/latest.json, latest.md, headline.md (the README's table), latest.svg")


if __name__ == "__main__":
    sys.exit(main())
