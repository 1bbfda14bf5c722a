#!/usr/bin/env bash
# The squatted default run dir, for the trust tests of the Rust CLI (tests/e2e/trust.rs) and of the
# Python package (shim/python/tests/test_trust.py). Run as root.
#
# Inside a private mount namespace whose /tmp is a fresh tmpfs (the machine's /tmp is not touched),
# uid 65534 creates /tmp/memarts-<caller's uid> -- the caller's default run dir when XDG_RUNTIME_DIR
# is unset -- and starts a fleet in it that lets the caller in (allowed_uids), with the run dir and
# sockets opened to everyone, as an attacker on a shared node would. Then the victim's command runs
# with the default run dir (MEMARTS_RUN_DIR, MEMARTS_CONFIG and XDG_RUNTIME_DIR unset).
#
# usage: squat-default-run-dir.sh BIN_DIR -- VICTIM_COMMAND...
#   BIN_DIR holds memarts and memarts-proxy; they are copied into the namespace's /tmp/bin, which
#   the victim's command finds as $SQUAT_BIN. The squatter's fleet reaches the origin with the
#   caller's AWS_* environment.
# Prints `squatter-requests-before <n>`, the victim's output, `victim-exit <code>` and
# `squatter-requests-after <n>` (requests the squatter's slots served, its own status calls
# included: each counts one per slot).
set -euo pipefail
bin=$1
shift
[[ ${1:-} == -- ]] && shift
if [[ ${MEMARTS_SQUAT_NS:-} != 1 ]]; then
  exec env MEMARTS_SQUAT_NS=1 unshare --mount --propagation private -- "$0" "$bin" -- "$@"
fi
# The binaries may live under /tmp, which the tmpfs is about to hide: keep them open across it.
exec 3<"$bin/memarts" 4<"$bin/memarts-proxy"
mount -t tmpfs -o mode=1777 memarts-squat /tmp
# The working directory may have been under the old /tmp (a fresh clone is): out of everyone's way.
cd /
mkdir -m 0755 /tmp/bin
cp /proc/self/fd/3 /tmp/bin/memarts
cp /proc/self/fd/4 /tmp/bin/memarts-proxy
chmod 0755 /tmp/bin/memarts /tmp/bin/memarts-proxy
exec 3<&- 4<&-
export SQUAT_BIN=/tmp/bin

victim=$(id -u)
run=/tmp/memarts-$victim
home=/tmp/squatter
mkdir -m 0755 "$home"
chown 65534:65534 "$home"
printf 'allowed_uids = [%s]\n' "$victim" >"$home/fleet.toml"
as_squatter() {
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -u XDG_RUNTIME_DIR HOME="$home" MEMARTS_RUN_DIR="$run" MEMARTS_CACHE_DIR="$home/cache" \
    MEMARTS_CONFIG="$home/fleet.toml" "$@"
}
requests() {
  as_squatter /tmp/bin/memarts status --json | grep -o '"requests": *[0-9]*' | awk '{ n += $NF } END { print n + 0 }'
}
as_squatter /tmp/bin/memarts start_proxy 2 >&2
trap 'as_squatter /tmp/bin/memarts stop_proxy --grace 5 >&2 || true' EXIT
as_squatter chmod 0755 "$run"
as_squatter sh -c "chmod 0666 '$run'/proxy-*.sock"
echo "squatter-requests-before $(requests)"

unset MEMARTS_RUN_DIR MEMARTS_CONFIG XDG_RUNTIME_DIR
set +e
"$@"
code=$?
set -e
echo "victim-exit $code"
echo "squatter-requests-after $(requests)"
