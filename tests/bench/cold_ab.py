"""A/B of a cold scenario between builds or settings, on this noisy 2-core VM:
`python3 tests/bench/cold_ab.py --variant old=/path/to/old/bin --variant new=target/release`.

Each variant is a directory holding `memarts` and `memarts-proxy`, optionally followed by
`,VAR=value,...` (environment for its fleet and its client, e.g. `new=target/release,MEMARTS_SPIN_US=0`).
The runs take turns (old, new, new, old, old, new, ...), each on a fresh fleet and a fresh cache,
over one origin (s3s-fs behind the emulated link, as `link_bench.py` sets them up): this machine's speed
wanders by 20% over minutes, and successive fresh caches slow down as the page cache grows (this VM
hands freed memory back to its host), which turns affect alike. Its caches are
deleted when it ends: on a journal-less ext4 (this VM's root) every file created in the next few
minutes pays a scan past the deleted inodes, so a run started right after another is slower all
through; wait or compare only within one invocation. Per run: throughput
against the link, and the CPU of the proxies, of the client process tree and of the origin, per
object (per MiB for `cat`), read from /proc; per variant, the medians.

Scenarios (`--scenario`): `warmup` (`memarts warmup` of the small files), `loader` (the prefetching
`memarts.torch` DataLoader of link_bench.py, 4 workers; it uses the installed Python package, the
same for every variant), `cat` (`memarts cat` of the large object), `curl` (the reference: `curl
--parallel` of the small files as link_bench.py runs it, beside an idle fleet; a variant's
`BENCH_CURL_RANGE=0-1048575` adds the Range header of a memarts first read). A variant's
`BENCH_ORIGIN=s3s-fs` runs it against the stock s3s-fs instead of memarts-bench-origin, and
`BENCH_ORIGIN=PATH` against that build of memarts-bench-origin (all serve one directory, each behind
its own relay), `BENCH_PROXIES=N` with a fleet of N, and
`BENCH_WARMUP_THREADS=N` runs `memarts warmup --threads N`. Asserts nothing
about timings; each scenario checks what it read as link_bench.py does. Also printed per run: the
origin requests and connections through the relay, and the proxies' context switches per object.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("BENCH_SCALE", "full")

import link_bench as lb  # noqa: E402
import relay  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU of a live process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def switches(pid):
    """Context switches (voluntary and not) of a live process's threads so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def proxy_pids(fleet):
    run = fleet.env["MEMARTS_RUN_DIR"]
    pids = []
    for name in os.listdir(run):
        if name.startswith("proxy-") and name.endswith(".pid"):
            with open(os.path.join(run, name)) as f:
                pids.append(int(f.read().split()[0]))
    return pids


def parse_variant(text):
    name, _, rest = text.partition("=")
    bin_dir, *settings = rest.split(",")
    env = dict(s.split("=", 1) for s in settings)
    if not os.path.exists(os.path.join(bin_dir, "memarts")):
        raise SystemExit(f"--variant {text}: no memarts binary in {bin_dir}")
    return name, os.path.abspath(bin_dir), env


def run_once(scenario, fleet, data, relay_stop, link, base):
    """Runs the scenario; returns (seconds, units, unit name)."""
    if scenario == "curl":
        # BENCH_CURL_RANGE (a variant's setting, e.g. 0-1048575, the range of a memarts first read
        # with 1 MiB chunks): the same GETs with a Range header.
        ranged = ("--range", os.environ["BENCH_CURL_RANGE"]) if os.environ.get("BENCH_CURL_RANGE") else ()
        return lb.curl_parallel_gets(link, data, base, extra=ranged)["seconds"], len(data.small), "object"
    if scenario == "warmup":
        return lb.memarts_warmup(fleet, data, relay_stop)["seconds"], len(data.small), "object"
    if scenario == "loader":
        return lb.memarts_loader(fleet, data, relay_stop, True)["seconds"], len(data.small), "object"
    return lb.large_memarts_cat(fleet, data, relay_stop)["seconds"], data.large[0] / (1 << 20), "MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=BIN_DIR[,VAR=value...]")
    ap.add_argument("--scenario", choices=("warmup", "loader", "cat", "curl"), default="warmup")
    ap.add_argument("--runs", type=int, default=6, help="runs per variant (default 6)")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    base = tempfile.mkdtemp(prefix="memarts-cold-ab-")
    root = os.path.join(base, "origin")
    os.makedirs(root)
    # One origin server (and relay) per kind the variants ask for (BENCH_ORIGIN, as link_bench.py
    # reads it), all over one directory: the data is uploaded once, through the first.
    def origin_of(env):
        return env.get("BENCH_ORIGIN", lb.origin_kind())

    kinds = list(dict.fromkeys(origin_of(env) for _, _, env in variants))
    origins = {}
    results = {name: [] for name, _, _ in variants}
    try:
        for kind in kinds:
            endpoint, server = lb.start_origin(root, kind)
            host, port = endpoint.rsplit("/", 1)[1].split(":")
            origins[kind] = (endpoint, server, *relay.start_relay(host, int(port)))
        nominal = origins[kinds[0]][3].params["mbps_total"]
        print("uploading the datasets ...", flush=True)
        data = lb.Data(lb.s3_client(origins[kinds[0]][0]))
        total = data.small_bytes if args.scenario != "cat" else data.large[0]
        for rep in range(args.runs):
            # ABBA: the order turns each round, so that whatever favours a position (the page cache
            # the run before left, writeback) is shared out, not always given to one variant.
            for name, bin_dir, env in (variants if rep % 2 == 0 else variants[::-1]):
                saved = dict(os.environ)
                os.environ.update(env)
                lb.MEMARTS = os.path.join(bin_dir, "memarts")
                _, server, link, relay_stop = origins[origin_of(env)]
                try:
                    with lb.Fleet(base, f"{name}-{rep}", link) as fleet:
                        pids = proxy_pids(fleet)
                        link_before = relay_stop.stats()
                        before = ({p: cpu_seconds(p) for p in pids}, cpu_seconds(server.pid), os.times())
                        switched = sum(switches(p) for p in pids)
                        origin_switched = switches(server.pid)
                        secs, units, unit = run_once(args.scenario, fleet, data, relay_stop, link, base)
                        after = os.times()
                        link_after = relay_stop.stats()
                        proxies = sum(cpu_seconds(p) - before[0][p] for p in pids)
                        switched = sum(switches(p) for p in pids) - switched
                        origin_switched = switches(server.pid) - origin_switched
                        origin_cpu = cpu_seconds(server.pid) - before[1]
                        client = (after.children_user + after.children_system
                                  - before[2].children_user - before[2].children_system)
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                row = (total / secs / 1e6 / nominal, *(c / units * 1e3 for c in (proxies, client, origin_cpu)))
                results[name].append(row)
                print(f"{name} run {rep + 1}: {row[0]:.2f}x link; CPU ms per {unit}: proxies {row[1]:.2f}, "
                      f"client {row[2]:.2f}, origin {row[3]:.2f}; origin requests "
                      f"{link_after['requests'] - link_before['requests']}, connections "
                      f"{link_after['connections'] - link_before['connections']}; proxies' context switches per "
                      f"{unit} {switched / units:.1f}, the origin's {origin_switched / units:.1f}", flush=True)
    finally:
        for _, server, _, relay_stop in origins.values():
            relay_stop()
            server.kill()
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nmedians of {args.runs} runs ({args.scenario}; CPU in ms per {unit}):")
    for name, rows in results.items():
        cols = list(zip(*rows))
        print(f"  {name:<12} {statistics.median(cols[0]):.3f}x link (runs {min(cols[0]):.2f}-{max(cols[0]):.2f}); "
              f"proxies {statistics.median(cols[1]):.3f}, client {statistics.median(cols[2]):.3f}, "
              f"origin {statistics.median(cols[3]):.3f}")


if __name__ == "__main__":
    start = time.time()
    main()
    print(f"({time.time() - start:.0f} s)")
