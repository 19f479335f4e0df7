#!/usr/bin/env bash
# Rehearses tools/gpu_check.sh on a machine without a GPU, in a bare Debian 12 root that
# looks like the GPU machine: a C/C++ compiler, CMake, ninja and Python 3 (installed in the
# root), the CUDA toolkit without cuDNN and NCCL (hard links to this machine's toolkit), and
# cuDNN and NCCL only as Python wheel folders (site-packages/nvidia/{cudnn,nccl}/ with
# versioned sonames and include/). No Open MPI, OpenBLAS, libyaml, cJSON, PCRE2 headers,
# OpenSSL headers, GoogleTest, pkg-config or ssh: those must come from gpu-bundle/.
#
# The source tree (git's files plus gpu-bundle/) is copied into the root, as it would be
# copied to the GPU machine, and gpu_check.sh runs there under chroot. Expected: it builds
# the GPU targets inside the plan's caps (the summary shows them), every `gpu` test skips
# cleanly, and the verdict is "RESULT: NO GPU" (exit status 3). GPU_CHECK_CAPS passes through
# (GPU_CHECK_CAPS=gpu_tests:2 rehearses a step that runs out of time: it must read
# INCOMPLETE, with how many tests it finished, and the verdict "RESULT: INCOMPLETE", exit 4).
#
# Needs root, debootstrap and a CUDA toolkit (CUDA_HOME, default /usr/local/cuda).
# Usage: tools/gpu_rehearse.sh BARE_ROOT LOGDIR   (BARE_ROOT is made when missing)
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BARE_ROOT LOGDIR" >&2
    exit 2
fi
BARE=$1
LOGDIR=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CUDA=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")

if [ ! -x "$BARE/usr/bin/apt-get" ]; then
    debootstrap --variant=minbase bookworm "$BARE" http://deb.debian.org/debian
fi
mountpoint -q "$BARE/proc" || mount -t proc proc "$BARE/proc"
mountpoint -q "$BARE/dev" || mount --bind /dev "$BARE/dev"
mountpoint -q "$BARE/dev/shm" || mount -t tmpfs tmpfs "$BARE/dev/shm"
mountpoint -q "$BARE/sys" || mount --bind /sys "$BARE/sys"

# The GPU machine's own tools.
if [ ! -x "$BARE/usr/bin/cmake" ]; then
    cp /etc/resolv.conf "$BARE/etc/resolv.conf"
    chroot "$BARE" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    chroot "$BARE" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends build-essential cmake ninja-build python3
fi

# The toolkit without cuDNN and NCCL, at the usual place.
T=$BARE/usr/local/$(basename "$CUDA")
ln -sfn "$(basename "$CUDA")" "$BARE/usr/local/cuda"
if [ ! -d "$T" ]; then
    cp -al "$CUDA" "$T.part"
    mv "$T.part" "$T"
    rm -rf "$T"/lib/libcudnn* "$T"/lib/libnccl* "$T"/include/cudnn* "$T"/include/nccl* \
        "$T"/lib/cmake/nccl* "$T"/lib/cmake/cudnn*
fi
# cuDNN and NCCL as Python's wheels lay them out: versioned sonames only.
py=$(chroot "$BARE" python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
SITE=$BARE/usr/local/lib/$py/dist-packages/nvidia
if [ ! -d "$SITE" ]; then
    for comp in cudnn:libcudnn:cudnn nccl:libnccl:nccl; do
        IFS=: read -r name lib hdr <<<"$comp"
        mkdir -p "$SITE/$name/lib" "$SITE/$name/include"
        touch "$SITE/__init__.py" "$SITE/$name/__init__.py"
        for f in "$CUDA"/lib/"$lib"*.so.[0-9]*; do ln "$(readlink -f "$f")" "$SITE/$name/lib/$(basename "$f")"; done
        cp -a "$CUDA"/include/"$hdr"* "$SITE/$name/include/"
    done
fi

# The source tree as the GPU machine receives it.
SRC=$BARE/src/tripod
mkdir -p "$SRC"
# (build-gpu/ stays, as ignored build outputs stay on the GPU machine between runs)
find "$SRC" -mindepth 1 -maxdepth 1 ! -name build-gpu -exec rm -rf {} +
(cd "$ROOT" && git ls-files --cached --others --exclude-standard -z | xargs -0 cp --parents -t "$SRC")
cp -a "$ROOT/gpu-bundle" "$SRC/"
du -sh --apparent-size --exclude=build-gpu "$SRC" "$SRC/gpu-bundle"

rm -rf "$BARE/tmp/gpu-check-logs"
rc=0
chroot "$BARE" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ${GPU_CHECK_BUDGET_S:+GPU_CHECK_BUDGET_S=$GPU_CHECK_BUDGET_S} ${JOBS:+JOBS=$JOBS} \
    ${GPU_CHECK_CAPS:+"GPU_CHECK_CAPS=$GPU_CHECK_CAPS"} \
    bash /src/tripod/tools/gpu_check.sh /tmp/gpu-check-logs || rc=$?
mkdir -p "$LOGDIR"
cp -a "$BARE/tmp/gpu-check-logs/." "$LOGDIR/"
echo "gpu_rehearse: gpu_check.sh exited $rc; $(ls "$LOGDIR" | wc -l) files in $LOGDIR"
exit "$rc"
