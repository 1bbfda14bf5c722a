#!/usr/bin/env bash
# The memarts demo: no cloud account needed. Generates a sample dataset (small "image" files and a
# few large "shards") in a local directory that plays the origin, starts a fleet of 4 proxies, reads
# the dataset cold (from the origin, filling the cache) and warm (from the cache), restarts the fleet
# and reads it warm again, shows the fleet status, and stops it.
# Usage: demo.sh [dir with the memarts binaries, default target/release]
set -euo pipefail
bin=${1:-target/release}
memarts="$bin/memarts"
[[ -x $memarts ]] || { echo "demo: $memarts not found; run 'make build' first" >&2; exit 1; }
demo=$(mktemp -d /tmp/memarts-demo.XXXXXX)
export MEMARTS_RUN_DIR=$demo/run MEMARTS_CACHE_DIR=$demo/cache
cleanup() { "$memarts" stop_proxy >/dev/null 2>&1 || true; rm -rf "$demo"; }
trap cleanup EXIT

echo "== generating a sample dataset in $demo/dataset (origin: local directory)"
python3 - "$demo/dataset" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(42)
os.makedirs(f"{root}/images", exist_ok=True)
os.makedirs(f"{root}/shards", exist_ok=True)
total = 0
for i in range(400):
    size = rng.randint(64 << 10, 256 << 10)
    with open(f"{root}/images/img-{i:05d}.jpg", "wb") as f:
        f.write(rng.randbytes(size))
    total += size
for i in range(4):
    with open(f"{root}/shards/shard-{i}.tar", "wb") as f:
        f.write(rng.randbytes(32 << 20))
    total += 32 << 20
print(f"   404 files, {total / 2**20:.1f} MiB")
PY

echo "== memarts start_proxy 4"
"$memarts" start_proxy 4
echo "== epoch 1 (cold: every chunk comes from the origin and is written to the cache)"
"$memarts" warmup "$demo/dataset"
echo "== epoch 2 (warm: every chunk comes from the SSD cache)"
"$memarts" warmup "$demo/dataset"
echo "== restart the fleet (stop_proxy, start_proxy 4): the cache survives"
"$memarts" stop_proxy
"$memarts" start_proxy 4
echo "== epoch 3 (warm after restart)"
"$memarts" warmup "$demo/dataset"
echo "== memarts status"
"$memarts" status
echo "== memarts stop_proxy"
"$memarts" stop_proxy
