#!/usr/bin/env bash
# Installs tripod's build and run dependencies from Debian 12 packages. Idempotent: only
# missing packages are installed, and apt's index is refreshed only when needed.
#
#   compilers and build:  build-essential cmake pkg-config
#   math:                 OpenBLAS built on OpenMP (shares the thread pool with our loops)
#   bf16 matmuls:         oneDNN (its OpenMP build, the same runtime)
#   launch / collectives: Open MPI
#   config, JSON, hashes: libyaml, cJSON, OpenSSL's libcrypto (SHA-256)
#   TensorBoard files:    protobuf-c (records), ISA-L (CRC32C of the record framing)
#   tests:                GoogleTest
#   demo corpus:          the English text of the fortunes packages
#   plots:                gnuplot (sweep plots)
#   scripts and tests:    procps (pgrep), openssh-client (Open MPI's launcher looks for it),
#                         clang-format (the layout check of the test suite), iproute2
#                         (`ip netns`: the multi-node test's namespaces)
#   sanitizers, fuzzing:  clang with its runtimes (ASan, UBSan, libFuzzer) and OpenMP
#                         (tools/test_sanitize.sh)
# The CUDA toolkit, cuDNN and NCCL are optional: when nvcc is on the PATH the cuda backend
# is built too.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-openmp-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  libyaml-dev libcjson-dev libssl-dev libpcre2-dev
  libprotobuf-c-dev protobuf-c-compiler libisal-dev
  libgtest-dev
  fortunes fortunes-min
  gnuplot-nox
  procps openssh-client iproute2
  clang-format
  clang libclang-rt-14-dev libomp-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies are installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
