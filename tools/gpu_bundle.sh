#!/usr/bin/env bash
# Downloads the Debian 12 packages that building and running tripod needs on a machine
# that has a C/C++ compiler, CMake and the CUDA toolkit but no package registry: Open MPI,
# OpenBLAS (OpenMP), oneDNN (bf16 cpu matmuls; brings the OpenCL ICD loader along),
# libyaml, cJSON, PCRE2, OpenSSL's libcrypto, GoogleTest, pkgconf, and protobuf-c (with
# protoc-c) and ISA-L for the TensorBoard writer.
# tools/gpu_check.sh unpacks them (dpkg -x) into a private prefix when the machine lacks
# them.
#
# Run it where Debian's archive is reachable (apt-get download needs no root). The .deb
# files land in gpu-bundle/ (ignored by git) with MANIFEST (package, version, bytes).
#
# Kept small: the -dev packages are taken alone (headers, .so links, .pc and CMake files;
# their own -dev dependencies such as gfortran or libibverbs-dev are not needed to build
# tripod), and the runtime libraries with their dependency closure, first alternative of
# each choice, less what every machine with a compiler has (the C and C++ runtimes, zlib,
# Priority: required packages).
#
# Usage: tools/gpu_bundle.sh [DIR]   (default: gpu-bundle at the repository root)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/gpu-bundle}

# Headers and link-time files only.
dev_pkgs=(libopenblas-openmp-dev libdnnl-dev libopenmpi-dev libyaml-dev libcjson-dev
  libpcre2-dev libssl-dev libgtest-dev libprotobuf-c-dev libisal-dev)
# Run-time libraries and programs, with their dependencies.
run_pkgs=(libopenblas0-openmp libdnnl2 libopenmpi3 openmpi-bin openmpi-common libyaml-0-2 libcjson1
  libpcre2-8-0 libssl3 pkgconf libprotobuf-c1 libisal2 protobuf-c-compiler)
# Present wherever gcc and g++ are, or pulled in only for what tripod does not use
# (ssh: mpirun starts local ranks without it; adduser and debconf: maintainer scripts;
# hwloc's plugins, which bring X11, OpenCL, libxml2 and ICU, 11 MB: hwloc runs without them).
skip_pkgs=" libc6 libgcc-s1 libstdc++6 libgomp1 libatomic1 libquadmath0 gcc-12-base zlib1g
  libcrypt1 libudev1 adduser debconf openssh-client ssh-client libc-dev libc6-dev
  libhwloc-plugins "
skip_pkgs=$(tr -s '[:space:]' ' ' <<<"$skip_pkgs")

declare -A seen=()
order=()

# visit PKG: adds PKG and, recursively, the first alternative of each of its Depends and
# Pre-Depends, unless skipped or Priority: required.
visit() {
    local p=$1
    [ -n "${seen[$p]:-}" ] && return 0
    seen[$p]=1
    case "$skip_pkgs" in *" $p "*) return 0 ;; esac
    local rec
    rec=$(apt-cache show --no-all-versions "$p" 2>/dev/null) || {
        echo "gpu_bundle: no package $p in the archive" >&2
        return 1
    }
    [ -z "$rec" ] && { echo "gpu_bundle: $p is virtual, skipped" >&2; return 0; }
    if grep -q '^Priority: required' <<<"$rec"; then return 0; fi
    order+=("$p")
    local deps d
    deps=$(awk '/^(Pre-)?Depends:/{sub(/^[^:]*: /, ""); print}' <<<"$rec" | tr ',' '\n')
    while IFS= read -r d; do
        d=${d%%|*}
        d=$(sed -e 's/([^)]*)//g' -e 's/:any//' -e 's/[[:space:]]//g' <<<"$d")
        [ -n "$d" ] && visit "$d"
    done <<<"$deps"
    return 0
}

for p in "${dev_pkgs[@]}"; do
    seen[$p]=1
    order+=("$p")
done
for p in "${run_pkgs[@]}"; do visit "$p"; done

rm -rf "$DIR"
mkdir -p "$DIR"
echo "gpu_bundle: downloading ${#order[@]} packages into $DIR"
(cd "$DIR" && apt-get download -q "${order[@]}" >/dev/null)
(
    cd "$DIR"
    for f in *.deb; do
        echo "$(dpkg-deb -W --showformat='${Package} ${Version}' "$f") $(stat -c %s "$f")"
    done >MANIFEST
)
total=$(du -cb "$DIR"/*.deb | tail -1 | cut -f1)
echo "gpu_bundle: $(ls "$DIR"/*.deb | wc -l) packages, $((total / 1024)) KiB ($DIR)"
