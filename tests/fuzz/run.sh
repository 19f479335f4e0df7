#!/usr/bin/env bash
# Fuzzes every harness of tests/fuzz for a bounded time under ASan+UBSan.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_EACH (default 10)] [NAME...]
# BUILD_DIR is a -DTRIPOD_FUZZ=ON build (clang). Each harness starts from its seed corpus
# corpus/NAME/ (never written to: new inputs go to a scratch copy) and runs on one core for
# SECONDS_EACH. Fails listing the harnesses that found a crash, a leak, a UBSan report, a
# timeout (10 s on one input) or an input needing more than 2 GB; the input that did it is
# kept as BUILD_DIR/fuzz/artifacts/NAME/crash-* (or leak-, timeout-, oom-), to be added to
# corpus/NAME/ once fixed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR [SECONDS_EACH] [NAME...]}
secs=${2:-10}
shift $(($# < 2 ? $# : 2))
# shellcheck source=../sanitize/env.sh
source "$here/../sanitize/env.sh"
# the harnesses start no MPI, whose leaks need the slow unwinder: the fast one is many
# times quicker on their malloc-heavy parsers
export ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=1
names=("$@")
if ((${#names[@]} == 0)); then
    for d in "$here"/corpus/*/; do
        names+=("$(basename "$d")")
    done
fi
failed=()
for name in "${names[@]}"; do
    exe=$build/fuzz/$name
    if [[ ! -x $exe ]]; then
        echo "fuzz: $exe is not built (cmake -DTRIPOD_FUZZ=ON, target fuzzers)" >&2
        failed+=("$name")
        continue
    fi
    work=$(mktemp -d)
    art=$build/fuzz/artifacts/$name
    mkdir -p "$art"
    # -close_fd_mask=3: the readers' error messages would slow the run; reports still print
    "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "$here/corpus/$name" \
        >"$art/log.txt" 2>&1
    rc=$?
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$art/log.txt" | grep -oE '[0-9]+$')
    echo "fuzz: $name: ${execs:-?} executions in ${secs} s, exit $rc"
    if ((rc != 0)); then
        failed+=("$name")
        grep -E 'ERROR|runtime error|SUMMARY|Test unit written' "$art/log.txt" | head -n 20
    fi
    rm -rf "$work"
done
if ((${#failed[@]} > 0)); then
    echo "fuzz: FAILED: ${failed[*]} (logs and inputs under $build/fuzz/artifacts/)"
    exit 1
fi
echo "fuzz: ${#names[@]} harnesses, no finding"
