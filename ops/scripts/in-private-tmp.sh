#!/usr/bin/env bash
# Runs a command with TMPDIR set to a new private directory under /tmp (or under $TMPDIR), removed
# when the command ends, whatever its outcome: `make test` runs each test command through it, so
# that what tests put in the temp dir (pytest's tmp_path dirs, the Python engine's private run dirs,
# tempfile dirs of a process that was killed) does not stay behind.
set -euo pipefail
dir=$(mktemp -d "${TMPDIR:-/tmp}/memarts-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
# As /tmp is: the tests run processes as other uids (65534), which make their own dirs in it.
chmod 1777 "$dir"
TMPDIR=$dir "$@"
