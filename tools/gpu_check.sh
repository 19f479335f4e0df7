#!/usr/bin/env bash
# GPU check: builds tripod with CUDA into build-gpu and runs, in this order, a device probe,
# the `gpu` tests, the kernel microbenchmark and `tripod bench` on GPT-2 124M / 350M / 1.5B
# at sequence 1024, then the other tests with the time left. Without a GPU it builds and
# runs every other test, then stops at the GPU step with the verdict "NO GPU".
#
# Made for a machine with no package registry: the C/C++ compiler, CMake and the CUDA
# toolkit are the machine's; Open MPI, OpenBLAS, libyaml, cJSON, PCRE2, libcrypto,
# GoogleTest and pkg-config are the machine's when it has them all, and otherwise come from
# the .deb files of tools/gpu_bundle.sh, unpacked (dpkg -x) into a private prefix. cuDNN and
# NCCL may be system installs or only Python's nvidia.* wheels (cmake/TripodNvidiaPip.cmake).
#
# LOGDIR receives two files: summary.txt (per step: PASS/FAIL/SKIP, time, key figures, the
# first error of a failure) and logs.tar.gz (every full log). The summary is printed last.
# The run is budgeted to end within 8 minutes on 16 cores; every test's timeout is capped
# (TRIPOD_TEST_TIMEOUT) and each ctest step stops at its share of the budget.
#
# The verdict is "RESULT: PASS" only when every step passed on a GPU; "RESULT: NO GPU" when
# everything that can run without one passed; "RESULT: FAIL" otherwise. TRIPOD_REQUIRE_GPU=1
# is set, so a `gpu` test that finds no device fails instead of skipping.
# Exit status: 0 PASS, 1 FAIL, 3 NO GPU.
#
# Usage: tools/gpu_check.sh LOGDIR
# Environment: CMAKE_CUDA_ARCHITECTURES (default 90a), JOBS (default min(nproc, 16)),
#   GPU_CHECK_BUDGET_S (default 450), GPU_BUNDLE (default gpu-bundle/),
#   GPU_CHECK_PREFIX (where the bundle is unpacked; default build-gpu/deps),
#   TRIPOD_BENCH_ARGS (extra arguments for the `tripod bench` runs).
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 LOGDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
LOGDIR=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-gpu
BUNDLE=${GPU_BUNDLE:-$ROOT/gpu-bundle}
PREFIX=${GPU_CHECK_PREFIX:-$BUILD/deps}
ARCH=${CMAKE_CUDA_ARCHITECTURES:-90a}
NPROC=$(nproc 2>/dev/null || echo 4)
JOBS=${JOBS:-$((NPROC < 16 ? NPROC : 16))}
BUDGET_S=${GPU_CHECK_BUDGET_S:-450}
# The most any single test may take, in seconds: 120 in the default budget (16 cores), more
# when a longer budget is given for a smaller machine.
TEST_TIMEOUT=$((120 * BUDGET_S / 450))
START=$(date +%s)
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/tripod-gpu-check.XXXXXX")
export TRIPOD_REQUIRE_GPU=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

declare -a SUMMARY=()
FAILED=0
GPU=0

left() { echo $((BUDGET_S - ($(date +%s) - START))); }
say() { echo "[$(printf '%4d' $(($(date +%s) - START)))s] $*"; }
note() { SUMMARY+=("$*"); }

# first_error LOG: the first line of LOG that reads like an error, for the summary.
first_error() {
    { grep -m1 -E '\*\*\*(Failed|Exception|Timeout)|Not Run' "$1" ||
        grep -m1 -E '(^|[^[:alnum:]_])(error:|Error[ :])|ERROR' "$1" ||
        grep -m1 -E 'FAILED|FAIL |Failed|failed|cannot|No such' "$1" || tail -1 "$1"; } |
        cut -c1-200
}

# step NAME MAX_SECONDS CMD...: runs CMD under the smaller of MAX_SECONDS and the time left,
# its output in NAME.log. Returns CMD's status (124 on timeout, 125 when no time was left).
step() {
    local name=$1 max=$2
    shift 2
    local t log=$LOGS/$name.log
    max=$((max * BUDGET_S / 450)) # the caps are for the default budget; a longer one stretches them
    t=$(left)
    [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -le 5 ]; then
        note "SKIP  $name (out of time)"
        say "SKIP  $name (out of time)"
        return 125
    fi
    echo "==== $name (limit ${t}s): $*" >"$log"
    local s0 rc dt
    s0=$(date +%s)
    timeout --kill-after=10 "$t" "$@" >>"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - s0))
    if [ "$rc" -eq 0 ]; then
        note "PASS  $name (${dt}s)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        note "FAIL  $name (timed out after ${dt}s)"
    else
        note "FAIL  $name (exit $rc, ${dt}s): $(first_error "$log")"
    fi
    say "${SUMMARY[-1]}"
    return "$rc"
}

# ctest_figures LOG: "N tests: P passed, F failed, S skipped" and the failed tests' names.
ctest_figures() {
    local line failed
    line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$1" | tail -1)
    [ -n "$line" ] && note "      $line, $(grep -c 'Not Run\|\*\*\*Skipped' "$1") skipped"
    failed=$(sed -n '/The following tests FAILED/,$p' "$1" | grep -E '^\s+[0-9]+ - ' | head -8 |
        sed -E 's/^\s+[0-9]+ - //' | paste -sd';' -)
    [ -n "$failed" ] && note "      failed: $failed"
}

# ---- the machine ----
{
    echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) root=$ROOT arch=$ARCH jobs=$JOBS"
    echo "budget ${BUDGET_S}s, $NPROC cores, $(uname -srm)"
    head -2 /etc/os-release 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    for tool in cc c++ cmake ninja python3 nvcc; do
        printf '%-8s %s\n' "$tool" "$(command -v "$tool" || echo '(none)')"
    done
} >"$LOGS/env.log" 2>&1

# The CUDA toolkit: nvcc on the PATH, or the usual install folders.
if ! command -v nvcc >/dev/null; then
    for d in /usr/local/cuda /usr/local/cuda-13* /opt/cuda /usr/lib/cuda; do
        [ -x "$d/bin/nvcc" ] && export PATH=$d/bin:$PATH && break
    done
fi
nvcc --version >>"$LOGS/env.log" 2>&1 || echo "no nvcc found" >>"$LOGS/env.log"

# ---- the libraries: the system's, or the bundle's ----
PC_MODULES="openblas yaml-0.1 libcjson libcrypto libpcre2-8 libprotobuf-c libisal"
TRIPLET=x86_64-linux-gnu
export PKG_CONFIG_PATH=/usr/lib/$TRIPLET/openblas-openmp/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
missing_deps() {
    local m miss=""
    if ! command -v pkg-config >/dev/null; then
        miss="pkg-config"
    else
        for m in $PC_MODULES; do pkg-config --exists "$m" 2>/dev/null || miss="$miss $m"; done
    fi
    command -v mpicc >/dev/null || command -v mpicc.openmpi >/dev/null || miss="$miss mpicc"
    command -v mpiexec >/dev/null || command -v mpiexec.openmpi >/dev/null || miss="$miss mpiexec"
    command -v protoc-c >/dev/null || miss="$miss protoc-c"
    local d have_gtest=0
    for d in /usr /usr/local ${CMAKE_PREFIX_PATH:+${CMAKE_PREFIX_PATH//:/ }}; do
        [ -f "$d/include/gtest/gtest.h" ] && have_gtest=1
    done
    [ "$have_gtest" = 1 ] || miss="$miss googletest"
    echo "$miss"
}

# unpack_bundle: every .deb of BUNDLE into PREFIX, then what dpkg's maintainer scripts would
# have done: the alternatives' links (mpicc, mpiexec, pkg-config) and, since the files moved,
# the absolute /usr paths in the pkg-config files.
unpack_bundle() {
    local f
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for f in "$BUNDLE"/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$f" "$PREFIX" || return 1
        else # no dpkg: a .deb is an ar archive holding data.tar.*
            (cd "$PREFIX" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -xaf - 2>/dev/null ||
                ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -xJf -) || return 1
        fi
    done
    local bin=$PREFIX/usr/bin
    for f in mpicc mpicxx mpiexec mpirun; do ln -sf "$f.openmpi" "$bin/$f"; done
    [ -e "$bin/pkg-config" ] || ln -sf pkgconf "$bin/pkg-config"
    find "$PREFIX" -name '*.pc' -exec sed -i -e "s#\([= ]\)/usr/#\1$PREFIX/usr/#g" \
        -e "s#=/usr\$#=$PREFIX/usr#" -e "s#-I/usr/#-I$PREFIX/usr/#g" \
        -e "s#-L/usr/#-L$PREFIX/usr/#g" {} +
    ls "$BUNDLE"/*.deb | wc -l
}

CMAKE_DEPS=()
MISSING=$(missing_deps)
if [ -z "$MISSING" ]; then
    note "PASS  deps (the system's)"
    say "${SUMMARY[-1]}"
else
    echo "missing on this machine:$MISSING" >"$LOGS/deps.log"
    if ! ls "$BUNDLE"/*.deb >/dev/null 2>&1; then
        note "FAIL  deps: missing$MISSING and no bundle in $BUNDLE (run tools/gpu_bundle.sh)"
        FAILED=1
    elif n=$(unpack_bundle 2>>"$LOGS/deps.log"); then
        L=$PREFIX/usr/lib/$TRIPLET
        export PATH=$PREFIX/usr/bin:$PATH
        export LD_LIBRARY_PATH=$L:$L/openmpi/lib:$L/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LIBRARY_PATH=$L:$L/openblas-openmp${LIBRARY_PATH:+:$LIBRARY_PATH}
        # Debian's multiarch headers (openssl/opensslconf.h) are where the compiler looks only
        # under /usr: give it the prefix's as well.
        export CPATH=$PREFIX/usr/include/$TRIPLET:$PREFIX/usr/include${CPATH:+:$CPATH}
        export PKG_CONFIG_PATH=$L/openblas-openmp/pkgconfig:$L/pkgconfig:$PREFIX/usr/share/pkgconfig:$PKG_CONFIG_PATH
        export CMAKE_PREFIX_PATH=$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
        export OPAL_PREFIX=$PREFIX/usr # Open MPI finds its help files and plugins from it
        # Open MPI 4.1 as root, with no ssh: local ranks only.
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}
        CMAKE_DEPS=(-DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc.openmpi"
            -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpiexec.openmpi"
            -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf"
            -DGTest_DIR="$L/cmake/GTest")
        {
            echo "unpacked $n packages into $PREFIX"
            env | grep -E '^(PATH|LD_LIBRARY_PATH|LIBRARY_PATH|PKG_CONFIG_PATH|CMAKE_PREFIX_PATH|CPATH|OPAL_PREFIX|OMPI_)='
            echo "cmake: ${CMAKE_DEPS[*]}"
            pkg-config --modversion $PC_MODULES 2>&1 | paste -sd' ' -
        } >>"$LOGS/deps.log" 2>&1
        still=$(missing_deps)
        if [ -n "$still" ]; then
            note "FAIL  deps: still missing after unpacking the bundle:$still"
            FAILED=1
        else
            note "PASS  deps (bundle: $n packages into $PREFIX; the machine lacked: ${MISSING# })"
        fi
    else
        note "FAIL  deps: unpacking $BUNDLE failed: $(tail -1 "$LOGS/deps.log")"
        FAILED=1
    fi
    say "${SUMMARY[-1]}"
fi

# ---- configure and build ----
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
BUILT=0
if [ "$FAILED" = 0 ] && step configure 150 cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTRIPOD_CUDA=ON \
    -DTRIPOD_TEST_TIMEOUT="$TEST_TIMEOUT" "${CMAKE_DEPS[@]}"; then
    cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
    note "      cuDNN $(cache CUDNN_LIBRARY), NCCL $(cache NCCL_LIBRARY)"
    # cuDNN opens its sub-libraries (libcudnn_graph.so.9, ...) by soname at run time: the
    # folder of the library that was linked goes on the loader's path (and the toolkit's,
    # where no ld.so.conf entry names it).
    for lib in "$(cache CUDNN_LIBRARY)" "$(cache NCCL_LIBRARY)" "$(cache CUDA_cudart_LIBRARY)"; do
        [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    if step build 330 cmake --build "$BUILD" -j "$JOBS"; then
        BUILT=1
    else
        # Another part of the tree may not build: the GPU targets alone still tell.
        step build_gpu_targets 240 cmake --build "$BUILD" -j "$JOBS" --target tripod \
            tripod_bench_cuda test_cuda_kernels test_cuda_attention test_cuda_main_grads \
            test_cuda_bias_grad test_comm_nccl test_gpu_train test_gpu_memory && BUILT=2
        FAILED=1
    fi
else
    FAILED=1
fi

# run_tests NAME MAX_SECONDS CTEST_ARGS...: one ctest step, stopped at its share of the budget.
run_tests() {
    local name=$1 max=$2
    shift 2
    local t stop
    t=$(left)
    [ "$t" -gt $((max * BUDGET_S / 450)) ] && t=$((max * BUDGET_S / 450))
    stop=$(date -d "@$(($(date +%s) + t - 5))" +%H:%M:%S)
    step "$name" "$max" ctest --test-dir "$BUILD" --output-on-failure --stop-time "$stop" \
        --timeout "$TEST_TIMEOUT" "$@"
    local rc=$?
    ctest_figures "$LOGS/$name.log"
    return $rc
}

# ---- the GPU ----
if [ "$BUILT" != 0 ]; then
    step gpu_probe 30 "$BUILD/kernels/cuda/tripod_bench_cuda" --probe
    case $? in
    0)
        GPU=1
        note "      $(grep -m1 '^device' "$LOGS/gpu_probe.log")"
        ;;
    2) # no usable device: the probe names the reason (the loader's or the runtime's)
        SUMMARY[-1]="NO GPU gpu_probe: $(grep -m1 'no usable CUDA device' "$LOGS/gpu_probe.log" |
            sed 's/.*no usable CUDA device: //')"
        ;;
    *) FAILED=1 ;;
    esac
fi

if [ "$GPU" = 1 ]; then
    run_tests gpu_tests 240 -L gpu || FAILED=1
    # the figures: gradient errors (bf16 vs fp32, fp32 main gradients on and off), the 50-step
    # loss against the CPU, the attention path cuDNN took, planned against measured memory
    grep -h -E 'relative gradient error|all parameters: fp32 main grads|50 steps: worst|worst error after|cuDNN (fused )?attention|^  (measured|planned|engine) ' \
        "$LOGS/gpu_tests.log" | head -24 | cut -c1-200 | sed 's/^/      /' >"$LOGS/figures.txt"
    step bench_kernels 60 "$BUILD/kernels/cuda/tripod_bench_cuda" || FAILED=1
    # Model-level throughput and MFU on one GPU at seq_length 1024. The tokens come from the
    # repository's own text (byte-level): the work per token does not depend on the data.
    cat "$ROOT"/README.md "$ROOT"/configs/*.yaml >"$BUILD/bench_text.txt"
    if step bench_data 30 "$BUILD/tripod" data prepare --input "$BUILD/bench_text.txt" \
        --output "$BUILD/bench_data" --force; then
        for model in gpt2-124m:8 gpt2-350m:4 gpt2-1.5b:2; do
            name=${model%%:*}
            mbs=${model##*:}
            # shellcheck disable=SC2086
            step "bench_$name" 60 "$BUILD/tripod" bench "$ROOT/configs/$name.yaml" \
                data.data_path="$BUILD/bench_data" training.micro_batch_size="$mbs" \
                training.global_batch_size="$mbs" parallel.use_distributed_optimizer=false \
                --steps 10 --warmup 3 --peak-tflops 989 --cluster h200 ${TRIPOD_BENCH_ARGS:-} ||
                FAILED=1
            grep -h -i -m3 'tokens/s\|mfu\|predicted by the planner' "$LOGS/bench_$name.log" |
                sed 's/^/      /' |
                while IFS= read -r l; do echo "$l"; done >>"$LOGS/figures.txt"
        done
    else
        FAILED=1
    fi
    while IFS= read -r l; do note "$l"; done <"$LOGS/figures.txt"
fi

# ---- every other test ----
if [ "$BUILT" = 1 ]; then
    run_tests other_tests 300 -LE 'gpu|bench' -j "$JOBS" || FAILED=1
fi

# ---- the verdict ----
if [ "$FAILED" = 0 ] && [ "$GPU" = 1 ]; then
    VERDICT="RESULT: PASS"
    RC=0
elif [ "$FAILED" = 0 ]; then
    VERDICT="RESULT: NO GPU (built; every non-GPU test passed; no GPU step ran, so nothing on a GPU is proven)"
    RC=3
elif [ "$GPU" = 0 ]; then
    VERDICT="RESULT: FAIL (and NO GPU: the GPU steps did not run)"
    RC=1
else
    VERDICT="RESULT: FAIL"
    RC=1
fi
{
    echo "tripod gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - START))s of ${BUDGET_S}s," \
        "$NPROC cores, arch $ARCH"
    grep -m1 '^PRETTY_NAME' "$LOGS/env.log"
    grep -m1 -E 'MiB$' "$LOGS/env.log" || echo "nvidia-smi: no GPU listed"
    grep -m1 -E '^Cuda compilation|^no nvcc' "$LOGS/env.log"
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    echo "$VERDICT"
} >"$LOGS/summary.txt"
cp "$LOGS/summary.txt" "$LOGDIR/summary.txt"
tar -czf "$LOGDIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null
rm -rf "$LOGS"
echo
cat "$LOGDIR/summary.txt"
exit "$RC"
