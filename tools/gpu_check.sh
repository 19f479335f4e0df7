#!/usr/bin/env bash
# GPU check: builds the GPU targets of tripod with CUDA into build-gpu and runs, in this
# order, a device probe, the `gpu` tests (four at a time, then the memory test alone),
# `tripod verify --device cuda` (the demo's TP 2 x PP 2 x DP 2 layout trained on the GPU in
# bf16 against the cpu's fp32 in one job, within the bf16 budget: whole-layout training,
# not only kernels), the kernel microbenchmark and `tripod bench` on GPT-2 124M / 350M /
# 1.5B at sequence 1024. No cpu-only test runs here (CI runs them). Without a GPU the `gpu`
# tests still run, and must skip cleanly, and verify exits with its own "no GPU" code (6);
# the verdict is then "NO GPU".
#
# Made for a machine with no package registry: the C/C++ compiler, CMake and the CUDA
# toolkit are the machine's; Open MPI, OpenBLAS, libyaml, cJSON, PCRE2, libcrypto,
# GoogleTest and pkg-config are the machine's when it has them all, and otherwise come from
# the .deb files of tools/gpu_bundle.sh, unpacked (dpkg -x) into a private prefix. cuDNN and
# NCCL may be system installs or only Python's nvidia.* wheels (cmake/TripodNvidiaPip.cmake).
#
# The plan (PLAN below): every step has a cap, and the caps add up to at most the budget,
# 450 s by default: 8 minutes on 16 cores less 30 s for the summary, the log archive and
# slack. A step that reaches its cap is INCOMPLETE (with what it reached: tests finished,
# the last line of its log), not FAIL: running out of time proves nothing wrong. A `gpu`
# test stopped by its own timeout counts the same way. A longer GPU_CHECK_BUDGET_S (a
# smaller machine) stretches every cap in proportion.
#
# LOGDIR receives two files: summary.txt (the plan; per step PASS/FAIL/INCOMPLETE/SKIP, its
# time against its cap, key figures, the first error of a failure) and logs.tar.gz (every
# full log). The summary is printed last.
#
# The verdict is "RESULT: PASS" only when every step passed on a GPU; "RESULT: NO GPU" when
# no device is usable and nothing else failed; "RESULT: INCOMPLETE" when a step ran out of
# time and none failed; "RESULT: FAIL" otherwise. TRIPOD_REQUIRE_GPU=1 is set once the probe
# found a device, so a `gpu` test that finds none fails instead of skipping.
# Exit status: 0 PASS, 1 FAIL, 3 NO GPU, 4 INCOMPLETE.
#
# Usage: tools/gpu_check.sh LOGDIR
#        tools/gpu_check.sh --plan            (the caps and their sum; exit 1 past the budget)
#        tools/gpu_check.sh --step NAME SECONDS CMD...   (one step through the step runner)
#        tools/gpu_check.sh --probe-verdict PROBE_EXIT GPUS_LISTED   (the probe's table)
#        tools/gpu_check.sh --targets         (the build targets of the GPU steps)
# Environment: CMAKE_CUDA_ARCHITECTURES (default 90a), JOBS (default min(nproc, 16)),
#   GPU_CHECK_BUDGET_S (default 450), GPU_CHECK_CAPS ("name:seconds ..." overriding the
#   plan's caps, as a rehearsal of a slow step does), GPU_BUNDLE (default gpu-bundle/),
#   GPU_CHECK_PREFIX (where the bundle is unpacked; default build-gpu/deps),
#   TRIPOD_BENCH_ARGS (extra arguments for the `tripod bench` runs).
set -u -o pipefail

# The plan, in the order the steps run: NAME:SECONDS at the default budget. The build is
# the GPU targets only; gpu_tests runs `ctest -j4 -L gpu` less the memory test, which runs
# alone afterwards in gpu_memory (as RUN_SERIAL would: it reads the device's free memory,
# which another test's allocations would move); gpu_verify, the first thing after the unit
# tests, trains a whole layout on the GPU: `tripod verify --device cuda` on the demo at
# TP 2 x PP 2 x DP 2 (8 ranks sharing the GPU), bf16 against the cpu's fp32 in one job,
# within the bf16 budget (exit 6 without a device: NO GPU).
PLAN="deps:15 configure:30 build:140 gpu_probe:10 gpu_tests:90 gpu_memory:25 gpu_verify:30
  bench_kernels:20 bench_data:5 bench_gpt2-124m:20 bench_gpt2-350m:25 bench_gpt2-1.5b:35"
PLAN_BUDGET_S=450
# The targets the GPU steps run: the binary, the kernel benchmark, every `gpu` test's
# executable (tests/arch/check_gpu_plan.sh fails when a `gpu` test is missing here).
GPU_TARGETS="tripod tripod_bench_cuda test_cuda_kernels test_cuda_kernels_recipe test_cuda_attention
  test_cuda_main_grads test_cuda_bias_grad test_comm_nccl test_gpu_train test_gpu_memory
  test_model_decode_cuda test_equivalence"
# The memory test's CTest name (gtest_discover_tests: Suite.Name).
MEMORY_TESTS='^GpuMemory\.'

BUDGET_S=${GPU_CHECK_BUDGET_S:-$PLAN_BUDGET_S}
START=$(date +%s)
declare -a SUMMARY=()
FAILED=0
INCOMPLETE=0
GPU=0

# cap NAME: the step's cap in seconds at this budget (GPU_CHECK_CAPS first); 0 if unplanned.
cap() {
    local e
    for e in ${GPU_CHECK_CAPS:-}; do
        [ "${e%%:*}" = "$1" ] && { echo "${e##*:}"; return; }
    done
    for e in $PLAN; do
        [ "${e%%:*}" = "$1" ] && { echo $((${e##*:} * BUDGET_S / PLAN_BUDGET_S)); return; }
    done
    echo 0
}

# plan_line: "plan: deps 15 + configure 30 + ... = 415 s of 450 s".
plan_line() {
    local e total=0 parts=""
    for e in $PLAN; do
        parts="$parts${parts:+ + }${e%%:*} $(cap "${e%%:*}")"
        total=$((total + $(cap "${e%%:*}")))
    done
    echo "plan: $parts = $total s of $BUDGET_S s"
    [ "$total" -le "$BUDGET_S" ]
}

left() { echo $((BUDGET_S - ($(date +%s) - START))); }
say() { echo "[$(printf '%4d' $(($(date +%s) - START)))s] $*"; }
note() { SUMMARY+=("$*"); }

# first_error LOG: the first line of LOG that reads like an error, for the summary.
# (Line 1 is the step's own header, the command line; Open MPI's notes on components it
# could not open and ignored are not errors.)
first_error() {
    local out
    out=$(sed 1d "$1" | grep -v '(ignored)$')
    { grep -m1 -E '\*\*\*(Failed|Exception)|Not Run' <<<"$out" ||
        grep -m1 -E '(^|[^[:alnum:]_])(error:|Error[ :])|ERROR' <<<"$out" ||
        grep -m1 -E 'FAILED|FAIL |Failed|failed|cannot|No such' <<<"$out" ||
        grep -v '^\s*$' <<<"$out" | tail -1; } | cut -c1-200
}

# ctest_reached LOG: how far a ctest run got, from its progress lines
# ("  3/40 Test  #3: Suite.Name ....   Passed    1.23 sec").
ctest_reached() {
    local done total p f t s
    done=$(grep -c -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+:' "$1")
    total=$(grep -m1 -o -E '^ *[0-9]+/[0-9]+ Test' "$1" | sed -E 's#.*/([0-9]+) Test#\1#')
    p=$(grep -c -E '^ *[0-9]+/[0-9]+ Test .* Passed ' "$1")
    f=$(grep -c -E '^ *[0-9]+/[0-9]+ Test .*\*\*\*(Failed|Exception)|^ *[0-9]+/[0-9]+ Test .*Not Run' "$1")
    t=$(grep -c -E '^ *[0-9]+/[0-9]+ Test .*\*\*\*Timeout' "$1")
    s=$(grep -c -E '^ *[0-9]+/[0-9]+ Test .*\*\*\*Skipped|^ *[0-9]+/[0-9]+ Test .* Skipped ' "$1")
    echo "$done of ${total:-?} tests finished: $p passed, $f failed, $t timed out, $s skipped"
}

# reached NAME LOG: what a step that ran out of time had reached.
reached() {
    if grep -q -E '^ *[0-9]+/[0-9]+ Test +#' "$2"; then
        ctest_reached "$2"
    else
        local last
        last=$(sed 1d "$2" | grep -v '^\s*$' | tail -1 | cut -c1-160)
        echo "last output: ${last:-(none)}"
    fi
}

# step NAME MAX_SECONDS CMD...: runs CMD under the smaller of MAX_SECONDS and the time left,
# its output in NAME.log, and notes PASS, FAIL or INCOMPLETE with its time against its cap
# (or NO GPU, when CMD exits STEP_NO_GPU_RC, its own "no device" code, and the probe found
# no device).
# Sets FAILED or INCOMPLETE; returns CMD's status (124 when stopped at the cap, 125 when no
# time was left to start it).
step() {
    local name=$1 max=$2
    shift 2
    local t log=$LOGS/$name.log
    t=$(left)
    [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -le 0 ] || { [ "$t" -lt "$max" ] && [ "$t" -le 5 ]; }; then
        note "SKIP  $name (out of time: ${t}s left of its ${max}s)"
        say "${SUMMARY[-1]}"
        INCOMPLETE=1
        return 125
    fi
    echo "==== $name (limit ${t}s): $*" >"$log"
    local s0 rc dt
    s0=$(date +%s)
    # timeout signals its whole process group: a test's children go with it.
    timeout --kill-after=5 "$t" "$@" >>"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - s0))
    if [ "$rc" -eq 0 ]; then
        note "PASS  $name (${dt}s of ${max}s)"
    elif [ "$rc" -eq "${STEP_NO_GPU_RC:--1}" ] && [ "$GPU" = 0 ]; then
        # the command's own "no device" exit where the probe found none: as a skip
        note "NO GPU $name (${dt}s of ${max}s): $(sed 1d "$log" | grep -m1 'NO GPU' | cut -c1-240)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        note "INCOMPLETE $name (stopped at ${t}s, cap ${max}s): $(reached "$name" "$log")"
        INCOMPLETE=1
        rc=124
    elif grep -q -E '^ *[0-9]+/[0-9]+ Test .*\*\*\*Timeout' "$log" &&
        ! grep -q -E '^ *[0-9]+/[0-9]+ Test .*(\*\*\*(Failed|Exception)|Not Run)' "$log"; then
        # ctest stopped tests at their (capped) timeout and nothing else failed: out of time
        note "INCOMPLETE $name (${dt}s of ${max}s, tests stopped at their limit): $(reached "$name" "$log")"
        INCOMPLETE=1
    else
        note "FAIL  $name (exit $rc, ${dt}s of ${max}s): $(first_error "$log")"
        FAILED=1
    fi
    say "${SUMMARY[-1]}"
    return "$rc"
}

# probe_verdict PROBE_EXIT GPUS_LISTED: the device probe's table. PROBE_EXIT is
# tripod_bench_cuda --probe's status (0 a device; 2 the CUDA runtime sees none; 3 it sees
# one but the cuda module did not load); GPUS_LISTED is how many GPUs `nvidia-smi -L`
# lists. Prints GPU, NO_GPU or FAIL. A GPU that nvidia-smi lists but the probe cannot use
# (an old driver, a missing cuDNN sub-library) is a broken setup, never "no GPU".
probe_verdict() {
    case "$1:$(($2 > 0))" in
    0:*) echo GPU ;;
    2:0) echo NO_GPU ;;
    *) echo FAIL ;;
    esac
}

usage() {
    sed -n 's/^# Usage: //p; s/^#        tools/tools/p' "$0" >&2
    exit 2
}
case "${1:-}" in
--plan)
    plan_line
    exit $?
    ;;
--targets)
    echo $GPU_TARGETS
    exit 0
    ;;
--probe-verdict)
    [ $# -eq 3 ] || usage
    probe_verdict "$2" "$3"
    exit 0
    ;;
--step) # one step, as the check runs it: its summary line, then its log
    [ $# -ge 4 ] || usage
    LOGS=$(mktemp -d "${TMPDIR:-/tmp}/tripod-gpu-step.XXXXXX")
    name=$2 max=$3
    shift 3
    step "$name" "$max" "$@" >/dev/null
    echo "${SUMMARY[-1]}"
    cat "$LOGS/$name.log"
    rm -rf "$LOGS"
    [ "$FAILED" = 1 ] && exit 1
    [ "$INCOMPLETE" = 1 ] && exit 4
    exit 0
    ;;
-*) usage ;;
esac
[ $# -eq 1 ] || usage

mkdir -p "$1" || exit 2
LOGDIR=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-gpu
BUNDLE=${GPU_BUNDLE:-$ROOT/gpu-bundle}
PREFIX=${GPU_CHECK_PREFIX:-$BUILD/deps}
ARCH=${CMAKE_CUDA_ARCHITECTURES:-90a}
NPROC=$(nproc 2>/dev/null || echo 4)
JOBS=${JOBS:-$((NPROC < 16 ? NPROC : 16))}
# The most any single test may take, in seconds: two thirds of the parallel gpu step.
TEST_TIMEOUT=$(($(cap gpu_tests) * 2 / 3))
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/tripod-gpu-check.XXXXXX")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PLAN_LINE=$(plan_line) || {
    note "FAIL  plan: the caps add up to more than the budget"
    FAILED=1
}
say "$PLAN_LINE"

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
DEPS_S0=$(date +%s)
MISSING=$(missing_deps)
if [ -z "$MISSING" ]; then
    note "PASS  deps ($(($(date +%s) - DEPS_S0))s of $(cap deps)s; the system's)"
    say "${SUMMARY[-1]}"
else
    echo "missing on this machine:$MISSING" >"$LOGS/deps.log"
    # The bundle holds Debian 12's packages, built against its glibc 2.36 and GCC 12's
    # libstdc++ (GLIBCXX_3.4.30): an older machine cannot load them, which would otherwise
    # show up as an unexplained link or load failure later.
    GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
    STDCXX=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')
    CXXABI_OK=1
    if [ -n "$STDCXX" ] && ! grep -q GLIBCXX_3.4.30 "$STDCXX" 2>/dev/null; then CXXABI_OK=0; fi
    echo "machine: glibc ${GLIBC:-unknown}, libstdc++ ${STDCXX:-not found}" >>"$LOGS/deps.log"
    if [ -n "$GLIBC" ] && [ "$(printf '%s\n2.36\n' "$GLIBC" | sort -V | head -1)" != 2.36 ]; then
        note "FAIL  deps: this machine's glibc $GLIBC is older than the bundle's Debian 12 (2.36): its packages cannot load here; install$MISSING from the machine's own packages"
        FAILED=1
    elif [ "$CXXABI_OK" = 0 ]; then
        note "FAIL  deps: this machine's libstdc++ ($STDCXX) lacks GLIBCXX_3.4.30 (GCC 12, Debian 12's): the bundle's C++ libraries (GoogleTest) cannot load; install$MISSING from the machine's own packages"
        FAILED=1
    elif ! ls "$BUNDLE"/*.deb >/dev/null 2>&1; then
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
            note "PASS  deps ($(($(date +%s) - DEPS_S0))s of $(cap deps)s; bundle: $n packages into $PREFIX; the machine lacked: ${MISSING# })"
        fi
    else
        note "FAIL  deps: unpacking $BUNDLE failed: $(tail -1 "$LOGS/deps.log")"
        FAILED=1
    fi
    say "${SUMMARY[-1]}"
fi

# ---- configure and build (the GPU targets only) ----
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
BUILT=0
if [ "$FAILED" = 0 ] && step configure "$(cap configure)" cmake -S "$ROOT" -B "$BUILD" \
    "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTRIPOD_CUDA=ON \
    -DTRIPOD_TEST_TIMEOUT="$TEST_TIMEOUT" "${CMAKE_DEPS[@]}"; then
    cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
    note "      cuDNN $(cache CUDNN_LIBRARY), NCCL $(cache NCCL_LIBRARY)"
    # cuDNN opens its sub-libraries (libcudnn_graph.so.9, ...) by soname at run time: the
    # folder of the library that was linked goes on the loader's path (and the toolkit's,
    # where no ld.so.conf entry names it).
    for lib in "$(cache CUDNN_LIBRARY)" "$(cache NCCL_LIBRARY)" "$(cache CUDA_cudart_LIBRARY)"; do
        [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    # Wheels: every nvidia/*/lib folder beside the linked cuDNN (cuBLAS, NVRTC, ... that
    # cuDNN's sub-libraries open), and the CUDA major the wheels were built for (their
    # nvidia_*_cuNN dist-info) against the toolkit's.
    WHEELS=$(dirname "$(dirname "$(dirname "$(cache CUDNN_LIBRARY)")")")
    if [ "$(basename "$WHEELS")" = nvidia ]; then
        for d in "$WHEELS"/*/lib; do
            [ -d "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
        done
        TK=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
        BUILT_FOR=$(ls -d "$(dirname "$WHEELS")"/nvidia_*_cu[0-9]*.dist-info 2>/dev/null |
            sed -n 's/.*_cu\([0-9]*\)-.*/\1/p' | sort -u | paste -sd, -)
        note "      wheels: $(ls -d "$WHEELS"/*/lib 2>/dev/null | wc -l) nvidia/*/lib folders on the path; built for CUDA ${BUILT_FOR:-?}, toolkit CUDA ${TK:-?}"
        if [ -n "$TK" ] && [ -n "$BUILT_FOR" ] && ! echo ",$BUILT_FOR," | grep -q ",$TK,"; then
            note "      WARNING: the cuDNN/NCCL wheels were built for CUDA $BUILT_FOR and the toolkit is CUDA $TK: a load failure below is that mix"
        fi
    fi
    # shellcheck disable=SC2086
    step build "$(cap build)" cmake --build "$BUILD" -j "$JOBS" --target $GPU_TARGETS && BUILT=1
fi

# run_tests NAME CTEST_ARGS...: one ctest step under its cap, then how far it got.
run_tests() {
    local name=$1
    shift
    step "$name" "$(cap "$name")" ctest --test-dir "$BUILD" --output-on-failure \
        --no-tests=error --timeout "$TEST_TIMEOUT" "$@"
    local rc=$?
    local failed
    [ -f "$LOGS/$name.log" ] || return $rc
    note "      $(ctest_reached "$LOGS/$name.log")"
    failed=$(grep -E '^ *[0-9]+/[0-9]+ Test .*(\*\*\*(Failed|Exception|Timeout)|Not Run)' \
        "$LOGS/$name.log" | sed -E 's/^.*Test +#[0-9]+: ([^ ]+).*(\*\*\*[A-Za-z]+|Not Run).*/\1 (\2)/' |
        head -8 | paste -sd';' -)
    [ -n "$failed" ] && note "      not passed: $failed"
    return $rc
}

# ---- the GPU ----
GPUS_LISTED=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$BUILT" = 1 ]; then
    was_failed=$FAILED
    step gpu_probe "$(cap gpu_probe)" "$BUILD/kernels/cuda/tripod_bench_cuda" --probe
    probe_rc=$?
    FAILED=$was_failed
    # The probe's own words (the loader's or the runtime's message), else the first error.
    why=$(grep -m1 '^tripod_bench_cuda: ' "$LOGS/gpu_probe.log" | sed 's/^tripod_bench_cuda: //')
    [ -n "$why" ] || why=$(first_error "$LOGS/gpu_probe.log")
    if [ "$probe_rc" = 124 ]; then
        : # INCOMPLETE, noted by step
    else
        case $(probe_verdict "$probe_rc" "$GPUS_LISTED") in
        GPU)
            GPU=1
            note "      $(grep -m1 '^device' "$LOGS/gpu_probe.log")"
            ;;
        NO_GPU) SUMMARY[-1]="NO GPU gpu_probe (nvidia-smi lists none): $why" ;;
        FAIL)
            SUMMARY[-1]="FAIL  gpu_probe (exit $probe_rc; nvidia-smi lists $GPUS_LISTED GPU(s)): $why"
            FAILED=1
            ;;
        esac
        say "${SUMMARY[-1]}"
    fi
fi

if [ "$BUILT" = 1 ]; then
    # With a device a `gpu` test that finds none fails; without one they must all skip.
    if [ "$GPU" = 1 ]; then export TRIPOD_REQUIRE_GPU=1; else export TRIPOD_REQUIRE_GPU=0; fi
    run_tests gpu_tests -L gpu -E "$MEMORY_TESTS" -j 4
    run_tests gpu_memory -L gpu -R "$MEMORY_TESTS"
fi

# ---- whole-layout training on the GPU: `tripod verify --device cuda` ----
if [ "$BUILT" = 1 ]; then
    MPIRUN=$(cache MPIEXEC_EXECUTABLE)
    # exit 6: no usable device, which is NO GPU only where the probe found none
    STEP_NO_GPU_RC=6 step gpu_verify "$(cap gpu_verify)" "${MPIRUN:-mpirun}" --oversubscribe \
        --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -np 8 "$BUILD/tripod" verify \
        "$ROOT/configs/demo.yaml" parallel.tensor_model_parallel_size=2 \
        parallel.pipeline_model_parallel_size=2 --device cuda --out "$LOGS/verify"
    verify_rc=$?
    if [ "$verify_rc" != 0 ] && [ "$verify_rc" != 124 ] && [ "$verify_rc" != 125 ] &&
        [ "${SUMMARY[-1]:0:6}" = "FAIL  " ]; then
        # the failed check (or the error) rather than the launcher's last words
        why=$(grep -m1 -E '^verify: NO GPU|^  [a-z:]+( [a-z]+)* +FAIL |error:' \
            "$LOGS/gpu_verify.log" | sed 's/^ *//; s/  */ /g' | cut -c1-240)
        [ "$verify_rc" = 6 ] && why="the probe found a device, verify none: $why"
        [ -n "$why" ] && SUMMARY[-1]="FAIL  gpu_verify (exit $verify_rc): $why" && say "${SUMMARY[-1]}"
    fi
    # its verdict and every check against its budget
    grep -h -E '^  (budget|structure|cuda: )|^verify: (PASS|FAIL)' "$LOGS/gpu_verify.log" \
        2>/dev/null | cut -c1-400 | sed 's/^ */      /' >"$LOGS/verify.txt"
    while IFS= read -r l; do note "$l"; done <"$LOGS/verify.txt"
fi

if [ "$GPU" = 1 ]; then
    # the figures: gradient errors (bf16 vs fp32, fp32 main gradients on and off), the 50-step
    # loss against the CPU, the attention path cuDNN took, planned against measured memory
    cat "$LOGS/gpu_tests.log" "$LOGS/gpu_memory.log" 2>/dev/null |
        grep -h -E 'relative gradient error|all parameters: fp32 main grads|50 steps: worst|worst error after|cuDNN (fused )?attention|cuDNN [0-9.]+:|^  (measured|planned|engine) ' |
        head -24 | cut -c1-200 | sed 's/^/      /' >"$LOGS/figures.txt"
    step bench_kernels "$(cap bench_kernels)" "$BUILD/kernels/cuda/tripod_bench_cuda"
    # Model-level throughput and MFU on one GPU at seq_length 1024, on uniformly random tokens
    # over GPT-2's vocabulary: byte-level text has about 100 distinct tokens, which would
    # load the embedding backward's per-token sums unlike real data.
    if step bench_data "$(cap bench_data)" "$BUILD/tripod" data random \
        --output "$BUILD/bench_data" --vocab-size 50257 --tokens 4000000 --doc-length 1025 \
        --force; then
        for model in gpt2-124m:8 gpt2-350m:4 gpt2-1.5b:2; do
            name=${model%%:*}
            mbs=${model##*:}
            # shellcheck disable=SC2086
            # every core for the host side (the parallel fill of the initial parameters)
            step "bench_$name" "$(cap "bench_$name")" env OMP_NUM_THREADS="$JOBS" \
                "$BUILD/tripod" bench \
                "$ROOT/configs/$name.yaml" data.data_path="$BUILD/bench_data" \
                training.micro_batch_size="$mbs" training.global_batch_size="$mbs" \
                parallel.use_distributed_optimizer=false --steps 10 --warmup 3 \
                --peak-tflops 989 --cluster h200 ${TRIPOD_BENCH_ARGS:-}
            grep -h -i -m3 'tokens/s\|mfu\|predicted by the planner' "$LOGS/bench_$name.log" |
                sed 's/^/      /' >>"$LOGS/figures.txt"
        done
    fi
    while IFS= read -r l; do note "$l"; done <"$LOGS/figures.txt"
fi

# ---- the verdict ----
if [ "$FAILED" = 1 ]; then
    VERDICT="RESULT: FAIL"
    RC=1
elif [ "$INCOMPLETE" = 1 ]; then
    VERDICT="RESULT: INCOMPLETE (a step ran out of time; nothing failed in what ran)"
    RC=4
elif [ "$GPU" = 0 ]; then
    VERDICT="RESULT: NO GPU (built; the gpu tests skipped cleanly; nothing on a GPU is proven)"
    RC=3
else
    VERDICT="RESULT: PASS"
    RC=0
fi
[ "$GPU" = 0 ] && [ "$RC" != 3 ] && VERDICT="$VERDICT (and NO GPU: the GPU steps did not run)"
{
    echo "tripod gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - START))s of ${BUDGET_S}s," \
        "$NPROC cores, arch $ARCH"
    grep -m1 '^PRETTY_NAME' "$LOGS/env.log"
    grep -m1 -E 'MiB$' "$LOGS/env.log" || echo "nvidia-smi: no GPU listed"
    grep -m1 -E '^Cuda compilation|^no nvcc' "$LOGS/env.log"
    echo "$PLAN_LINE"
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    echo "$VERDICT"
} >"$LOGS/summary.txt"
cp "$LOGS/summary.txt" "$LOGDIR/summary.txt"
tar -czf "$LOGDIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null
rm -rf "$LOGS"
echo
cat "$LOGDIR/summary.txt"
exit "$RC"
