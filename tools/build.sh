#!/usr/bin/env bash
# Configures and builds tripod into BUILD_DIR (default: build). The cuda backend is built
# when nvcc is found (TRIPOD_CUDA=AUTO); pass -DTRIPOD_CUDA=OFF in CMAKE_ARGS to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=${JOBS:-$(nproc)}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
