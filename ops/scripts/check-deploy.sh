#!/usr/bin/env bash
# Checks the deployment files in ops/ with the tools that read them, as `make test` runs it:
# `systemd-analyze verify` for the systemd unit (its /usr/local/bin/ commands pointed at what
# `make install-bin` installs from BIN_DIR into a temporary prefix: each must be there and
# executable) and `kubernetes-validate --strict` (the
# Kubernetes API's schemas, unknown fields refused) for the manifests. Any warning fails too.
set -euo pipefail
bin_dir=${1:?usage: check-deploy.sh BIN_DIR}
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make --no-print-directory --quiet install-bin BIN_DIR="$bin_dir" PREFIX="$tmp/usr/local" >/dev/null
sed "s|/usr/local/bin/|$tmp/usr/local/bin/|g" ops/systemd/memarts.service >"$tmp/memarts.service"
if ! out=$(systemd-analyze verify "$tmp/memarts.service" 2>&1) || [ -n "$out" ]; then
    echo "systemd-analyze verify ops/systemd/memarts.service:" >&2
    echo "$out" >&2
    exit 1
fi
echo "ops/systemd/memarts.service: verified by systemd-analyze"
kubernetes-validate --strict --quiet ops/kubernetes/*.yaml
echo "ops/kubernetes/*.yaml: valid against the Kubernetes schemas (strict)"
