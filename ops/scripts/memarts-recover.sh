#!/usr/bin/env bash
# Fast recovery of a node's memarts fleet: stop whatever is left (live, hung or crashed proxies, stale
# sockets and pid files), then start N proxies again with the same options. The cache on disk is kept,
# so the restarted fleet is warm at once.
#
# Usage: memarts-recover.sh N [extra start_proxy options...]
# Honours MEMARTS_RUN_DIR, MEMARTS_CACHE_DIR, MEMARTS_CACHE_CAPACITY, MEMARTS_CONFIG and AWS_* like
# the CLI; MEMARTS_BIN selects the memarts binary (default: memarts on PATH).
set -euo pipefail
if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 N [start_proxy options...]" >&2
  exit 2
fi
n=$1
shift
memarts=${MEMARTS_BIN:-memarts}
"$memarts" stop_proxy
exec "$memarts" start_proxy "$n" "$@"
