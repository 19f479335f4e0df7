#!/usr/bin/env bash
# The test suite again under AddressSanitizer and UndefinedBehaviorSanitizer, with the
# fuzzers: builds BUILD_DIR (default build-sanitize) with clang, -DTRIPOD_FUZZ=ON and the
# cuda backend off, fuzzes every harness of tests/fuzz for FUZZ_SECONDS each (default 10),
# then runs the unit and mpi tests (and the fuzz corpus replays) through CTest, printed
# reports (label bench) left out. A sanitizer report fails the test that hit it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-sanitize}
jobs=${JOBS:-$(nproc)}
# the options hold at build time too: the build lists each test binary's tests by running it
# shellcheck source=../tests/sanitize/env.sh
source tests/sanitize/env.sh
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIPOD_CUDA=OFF \
    -DTRIPOD_FUZZ=ON >/dev/null
cmake --build "$build" -j "$jobs"
tests/fuzz/run.sh "$build" "${FUZZ_SECONDS:-10}"
cd "$build"
# The leave-one-source-out fits (PlanHeldout.LeaveOneSourceOut*) refit the planner seven times
# over: pure arithmetic that the plain run checks in under a minute, more than 20 minutes
# under the sanitizers; left to the plain run.
ctest --output-on-failure -j "$jobs" -LE bench -E 'PlanHeldout\.LeaveOneSourceOut'
