#!/usr/bin/env bash
# Builds tripod and runs the whole test suite through CTest (labels: unit, mpi, gpu; the
# gpu tests skip themselves without a device). Printed reports (label bench) are left
# out: `ctest -L bench` in the build directory runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tools/build.sh "$build"
cd "$build"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" -LE bench
