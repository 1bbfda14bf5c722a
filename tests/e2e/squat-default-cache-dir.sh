#!/usr/bin/env bash
# The squatted default cache dir, for tests/e2e/cache_dir_trust.rs. Run as root.
#
# Inside a private mount namespace whose /tmp is a fresh tmpfs (the machine's /tmp is not touched),
# uid 65534 creates /tmp/memarts-cache-<caller's uid> -- the caller's default cache dir when HOME
# and XDG_CACHE_HOME are unset -- and plants what an attacker on a shared node would: files named
# like leftover temp files in v1/tmp (start-up removes those of dead writers), a chunk file, a
# metadata snapshot and a memarts-only object. Then the victim's command runs with the default run
# dir and cache dir (MEMARTS_RUN_DIR, MEMARTS_CACHE_DIR, MEMARTS_CONFIG, XDG_RUNTIME_DIR,
# XDG_CACHE_HOME and HOME unset).
#
# usage: squat-default-cache-dir.sh BIN_DIR -- VICTIM_COMMAND...
#   BIN_DIR holds memarts and memarts-proxy; they are copied into the namespace's /tmp/bin, which
#   the victim's command finds as $SQUAT_BIN.
# Prints `planted <path> <size> <access time> <modification time>` for every planted file before
# the victim runs, the victim's output, `victim-exit <code>`, then the same lines as `still` after.
set -euo pipefail
bin=$1
shift
[[ ${1:-} == -- ]] && shift
if [[ ${MEMARTS_SQUAT_NS:-} != 1 ]]; then
  exec env MEMARTS_SQUAT_NS=1 unshare --mount --propagation private -- "$0" "$bin" -- "$@"
fi
# The binaries may live under /tmp, which the tmpfs is about to hide: keep them open across it.
exec 3<"$bin/memarts" 4<"$bin/memarts-proxy"
# strictatime: any read of a planted file shows in its access time.
mount -t tmpfs -o mode=1777,strictatime memarts-squat /tmp
cd /
mkdir -m 0755 /tmp/bin
cp /proc/self/fd/3 /tmp/bin/memarts
cp /proc/self/fd/4 /tmp/bin/memarts-proxy
chmod 0755 /tmp/bin/memarts /tmp/bin/memarts-proxy
exec 3<&- 4<&-
export SQUAT_BIN=/tmp/bin

cache=/tmp/memarts-cache-$(id -u)
setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "
  set -e
  umask 022
  mkdir -p '$cache/v1/tmp' '$cache/v1/chunks/ab' '$cache/v1/meta' '$cache/v1/memarts'
  for f in tmp/chunk.999991.tmp tmp/x.40000001.y tmp/ab.999993.1.only.tmp \
      chunks/ab/ab000000000000000000000000000001 meta/slot-0-of-1.snap \
      memarts/0000000000000000000000000000abcd; do
    echo 'planted by uid 65534' >\"$cache/v1/\$f\"
  done
"
# A moment, so that a read after this would show in the access times.
sleep 0.05
planted() {
  find "$cache" -type f -printf "$1 %p %s %A@ %T@\n" | sort
}
planted planted
trap '/tmp/bin/memarts stop_proxy --grace 5 >/dev/null 2>&1 || true' EXIT

unset MEMARTS_RUN_DIR MEMARTS_CACHE_DIR MEMARTS_CONFIG XDG_RUNTIME_DIR XDG_CACHE_HOME HOME
set +e
"$@"
code=$?
set -e
echo "victim-exit $code"
planted still
