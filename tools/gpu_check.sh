#!/usr/bin/env bash
# GPU check: configure and build tripod with CUDA (Release) into build-gpu, run the gpu
# tests, the kernel microbenchmark, the unit tests if time allows, and `tripod bench`
# when the binary has it. Everything is tee'd into LOGDIR; a PASS/FAIL summary ends the
# output, and the exit status is non-zero when the build or a test failed.
#
# Sized for one H200 with 16 cores: the whole script stays under 8 minutes (each step is
# bounded by what is left of that budget).
#
# Usage: tools/gpu_check.sh LOGDIR
# Environment: CMAKE_CUDA_ARCHITECTURES (default 90a), JOBS (default min(nproc, 16)),
#              TRIPOD_BENCH_ARGS (extra arguments for the `tripod bench` runs).
set -u -o pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 LOGDIR" >&2
    exit 2
fi
LOGDIR=$1
mkdir -p "$LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-gpu
ARCH=${CMAKE_CUDA_ARCHITECTURES:-90a}
NPROC=$(nproc 2>/dev/null || echo 4)
JOBS=${JOBS:-$((NPROC < 16 ? NPROC : 16))}
BUDGET_S=470 # 8 minutes minus a margin for the summary
START=$(date +%s)

declare -a SUMMARY=()
FAILED=0

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME MAX_SECONDS REQUIRED(1|0) CMD...: runs CMD under the smaller of MAX_SECONDS and
# the time left, logging to LOGDIR/NAME.log. A failed required step fails the check.
step() {
    local name=$1 max=$2 required=$3
    shift 3
    local t
    t=$(left)
    [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -le 5 ]; then
        SUMMARY+=("SKIP  $name (out of time)")
        [ "$required" = 1 ] && FAILED=1
        return 1
    fi
    echo "==== $name (limit ${t}s): $*" | tee "$LOGDIR/$name.log"
    local s0 rc
    s0=$(date +%s)
    timeout --kill-after=10 "$t" "$@" 2>&1 | tee -a "$LOGDIR/$name.log"
    rc=${PIPESTATUS[0]}
    local dt=$(($(date +%s) - s0))
    if [ "$rc" -eq 0 ]; then
        SUMMARY+=("PASS  $name (${dt}s)")
        return 0
    fi
    [ "$rc" -eq 124 ] && SUMMARY+=("FAIL  $name (timed out after ${dt}s)") ||
        SUMMARY+=("FAIL  $name (exit $rc, ${dt}s)")
    [ "$required" = 1 ] && FAILED=1
    return "$rc"
}

{
    echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) root=$ROOT arch=$ARCH jobs=$JOBS"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    nvcc --version 2>&1 | tail -1 || true
} | tee "$LOGDIR/env.log"

BUILT=0
if step configure 150 1 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTRIPOD_CUDA=ON; then
    if step build 330 0 cmake --build "$BUILD" -j "$JOBS"; then
        BUILT=1
    else
        # Another part of the tree may not build yet: the GPU targets alone still tell.
        step build_gpu_targets 240 1 cmake --build "$BUILD" -j "$JOBS" --target \
            test_cuda_kernels test_cuda_nccl tripod_bench_cuda && BUILT=1
    fi
fi

if [ "$BUILT" = 1 ]; then
    step gpu_tests 240 1 ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 180
    step bench_kernels 120 0 "$BUILD/kernels/cuda/tripod_bench_cuda"
    # Model-level throughput and MFU on one GPU, GPT-2 124M / 350M / 1.5B at seq_length
    # 1024. The tokens come from the repository's own text (byte-level): the work per
    # token does not depend on the data.
    cat "$ROOT"/README.md "$ROOT"/configs/*.yaml > "$BUILD/bench_text.txt"
    if step bench_data 30 0 "$BUILD/tripod" data prepare --input "$BUILD/bench_text.txt" \
        --output "$BUILD/bench_data" --force; then
        for model in gpt2-124m:8 gpt2-350m:4 gpt2-1.5b:2; do
            name=${model%%:*}
            mbs=${model##*:}
            # shellcheck disable=SC2086
            step "bench_$name" 90 0 "$BUILD/tripod" bench "$ROOT/configs/$name.yaml" \
                data.data_path="$BUILD/bench_data" training.micro_batch_size="$mbs" \
                training.global_batch_size="$mbs" parallel.use_distributed_optimizer=false \
                --steps 10 --warmup 3 --peak-tflops 989 \
                ${TRIPOD_BENCH_ARGS:-}
        done
    fi
    if [ "$(left)" -gt 60 ]; then
        step unit_tests 180 1 ctest --test-dir "$BUILD" -L unit -j "$JOBS" --output-on-failure \
            --timeout 120
    else
        SUMMARY+=("SKIP  unit_tests (out of time)")
    fi
fi

{
    echo
    echo "==== summary ($(($(date +%s) - START))s, logs in $LOGDIR)"
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    if [ "$FAILED" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
} | tee "$LOGDIR/summary.log"
exit "$FAILED"
