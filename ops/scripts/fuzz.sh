#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder (cargo-fuzz / libFuzzer, crate fuzz/): runs each target of
# fuzz/fuzz_targets/ for SECONDS_PER_TARGET seconds on a copy of its committed seed corpus (the
# committed corpus never grows), then writes tests/reliability/results/fuzz.json and prints a table.
# Usage: [MEMARTS_FUZZ_TOOLCHAIN=auto|nightly|stable] fuzz.sh [SECONDS_PER_TARGET, default 60]
# Exit status: non-zero if any target crashed (the crash input's path is printed) or did not run.
#
# Toolchain: a nightly one if rustup has it; otherwise stable with RUSTC_BOOTSTRAP=1, which lets
# stable accept the nightly-only flags cargo-fuzz passes (-Zsanitizer=address and friends). That is
# the path of CI machines, which have only stable; it builds and runs with AddressSanitizer as it is.
# Should an ASan build ever fail on that path, the script builds again with `--sanitizer none` (the
# coverage guidance and the Rust checks, overflow checks included, stay) and records so in fuzz.json.
# A first build compiles the proxy and its dependencies with instrumentation: 8 to 18 minutes on 2
# cores (fuzz/target is reused after that).
set -euo pipefail

seconds=${1:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: SECONDS_PER_TARGET must be a positive integer, got '$seconds'" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fuzz_dir=$root/fuzz
results_dir=$root/tests/reliability/results
out_json=$results_dir/fuzz.json

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# Which toolchain: `cargo +TOOLCHAIN` needs rustup; without rustup, the one cargo on PATH is used.
# MEMARTS_FUZZ_TOOLCHAIN=stable takes the stable path even where nightly exists (to check CI's path).
choice=${MEMARTS_FUZZ_TOOLCHAIN:-auto}
[[ $choice =~ ^(auto|nightly|stable)$ ]] || { echo "fuzz: MEMARTS_FUZZ_TOOLCHAIN must be auto, nightly or stable" >&2; exit 2; }
plus=()
if [[ $choice == nightly ]] || { [[ $choice == auto ]] && command -v rustup >/dev/null 2>&1 &&
    rustup toolchain list | grep -q '^nightly'; }; then
    plus=(+nightly)
    toolchain="nightly ($(rustc +nightly --version))"
else
    command -v rustup >/dev/null 2>&1 && plus=(+stable)
    export RUSTC_BOOTSTRAP=1
    toolchain="stable with RUSTC_BOOTSTRAP=1 ($(rustc "${plus[@]}" --version))"
fi

mapfile -t targets < <(find "$fuzz_dir/fuzz_targets" -name '*.rs' -printf '%f\n' | sed 's/\.rs$//' | sort)
[[ ${#targets[@]} -gt 0 ]] || { echo "fuzz: no targets in $fuzz_dir/fuzz_targets" >&2; exit 1; }

cd "$fuzz_dir"
sanitizer=address
echo "== building ${targets[*]} with $toolchain, sanitizer $sanitizer"
if ! cargo "${plus[@]}" fuzz build --sanitizer address; then
    [[ ${plus[*]} == +nightly ]] && { echo "fuzz: the build failed" >&2; exit 1; }
    sanitizer=none
    echo "== the AddressSanitizer build failed on stable; building again with --sanitizer none"
    cargo "${plus[@]}" fuzz build --sanitizer none
fi

work=$(mktemp -d /tmp/memarts-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
logs=$fuzz_dir/artifacts/logs
mkdir -p "$logs" "$results_dir"

declare -A executions crashes artifact
failed=0
for target in "${targets[@]}"; do
    echo "== fuzzing $target for ${seconds}s"
    cp -r "$fuzz_dir/corpus/$target" "$work/$target"
    log=$logs/$target.log
    status=0
    cargo "${plus[@]}" fuzz run --sanitizer "$sanitizer" "$target" "$work/$target" -- \
        -max_total_time="$seconds" -timeout=60 -print_final_stats=1 >"$log" 2>&1 || status=$?
    # Executions: libFuzzer's final stats, else its `Done N runs` line, else the last `#N` status line.
    n=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
    [[ -n $n ]] || n=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
    [[ -n $n ]] || n=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -1)
    executions[$target]=${n:-0}
    # Each crash, leak, timeout or out-of-memory input is written as a "Test unit".
    found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log")
    crashes[$target]=$(grep -c . <<<"$found" || true)
    artifact[$target]=$found
    if [[ $status -ne 0 ]]; then
        failed=1
        if [[ ${crashes[$target]} -eq 0 ]]; then
            crashes[$target]=1
            artifact[$target]="(no input written; see $log)"
        fi
        echo "fuzz: $target failed (exit $status): ${artifact[$target]}" >&2
        grep -m1 -A3 'panicked at' "$log" >&2 || tail -5 "$log" >&2
    fi
done

{
    printf '{\n  "toolchain": "%s",\n  "sanitizer": "%s",\n  "targets": [\n' "$toolchain" "$sanitizer"
    for i in "${!targets[@]}"; do
        t=${targets[$i]}
        sep=$([[ $i -lt $((${#targets[@]} - 1)) ]] && echo , || true)
        printf '    {"target": "%s", "seconds": %d, "executions": %d, "crashes": %d}%s\n' \
            "$t" "$seconds" "${executions[$t]}" "${crashes[$t]}" "$sep"
    done
    printf '  ]\n}\n'
} >"$out_json"

echo
printf '%-14s %8s %14s %10s %8s\n' target seconds executions 'execs/s' crashes
for t in "${targets[@]}"; do
    printf '%-14s %8d %14d %10d %8d\n' "$t" "$seconds" "${executions[$t]}" $((executions[$t] / seconds)) "${crashes[$t]}"
done
echo "toolchain: $toolchain, sanitizer: $sanitizer; logs in $logs; results in $out_json"
if [[ $failed -ne 0 ]]; then
    for t in "${targets[@]}"; do
        [[ -z ${artifact[$t]} ]] || echo "crash in $t: ${artifact[$t]} (reproduce: cd fuzz && cargo fuzz run $t <that file>)" >&2
    done
    exit 1
fi
