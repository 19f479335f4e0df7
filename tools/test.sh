#!/usr/bin/env bash
# Builds tripod and runs the whole test suite through CTest (labels: unit, mpi, gpu; the
# gpu tests skip themselves without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tools/build.sh "$build"
cd "$build"
ctest --output-on-failure -j "${JOBS:-$(nproc)}"
