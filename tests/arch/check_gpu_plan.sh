#!/usr/bin/env bash
# tools/gpu_check.sh's plan and step runner, without a GPU. Usage: check_gpu_plan.sh SOURCE_ROOT
#
# Fails when: the planned caps add up past the default budget or the budget past 8 minutes
# (480 s); the sum the script prints is not the sum of its caps; `tripod verify --device
# cuda` (gpu_verify) is not planned right after the gpu tests, or its own "no device" exit
# (6) is not read as NO GPU; a step that runs past its
# cap (sleep 30 under a 1 s cap) does not read INCOMPLETE with what it reached, or a
# failing step does not read FAIL; the probe's verdict table is not: a device -> GPU, no
# device and nvidia-smi lists none -> NO_GPU, a GPU listed but unusable -> FAIL, the cuda
# module not loading -> FAIL; a `gpu` test's executable is not among the GPU build targets.
set -uo pipefail

ROOT=$1
GC=$ROOT/tools/gpu_check.sh
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# ---- the plan fits ----
unset GPU_CHECK_BUDGET_S GPU_CHECK_CAPS
plan=$("$GC" --plan) || fail "--plan says the caps exceed the budget: $plan"
echo "$plan"
printed=$(sed -nE 's/.* = ([0-9]+) s of ([0-9]+) s$/\1/p' <<<"$plan")
budget=$(sed -nE 's/.* = ([0-9]+) s of ([0-9]+) s$/\2/p' <<<"$plan")
sum=0
for n in $(sed -E 's/^plan: //; s/ = .*//' <<<"$plan" | grep -oE '[0-9]+( \+|$)' | grep -oE '[0-9]+'); do
    sum=$((sum + n))
done
[ -n "$printed" ] && [ -n "$budget" ] || fail "no 'N s of B s' in the plan line"
[ "$sum" = "${printed:-x}" ] || fail "the caps add up to $sum, the plan line says ${printed:-nothing}"
[ "$sum" -le "${budget:-0}" ] || fail "the caps add up to $sum s, past the budget of ${budget:-?} s"
[ "${budget:-999}" -le 480 ] || fail "the default budget $budget s is past 8 minutes"
steps=$(sed -E 's/^plan: //; s/ = .*//' <<<"$plan" | tr '+' '\n' | wc -l)
[ "$steps" -ge 8 ] || fail "only $steps steps planned"
# Whole-layout training on the GPU (`tripod verify --device cuda`) is the first step after
# the gpu tests, inside the plan.
order=$(sed -E 's/^plan: //; s/ = .*//' <<<"$plan" | tr '+' '\n' | awk '{print $1}' | paste -sd' ' -)
[[ " $order " == *" gpu_tests gpu_memory gpu_verify "* ]] ||
    fail "gpu_verify is not planned right after the gpu tests: $order"
# (joined into a variable first: grep -q ending early would kill sed with SIGPIPE, which
# pipefail reads as a failure)
joined=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$GC")
grep -qE 'step gpu_verify .*/tripod" verify +"\$ROOT/configs/demo.yaml" .*--device cuda' \
    <<<"$joined" || fail "gpu_check.sh does not run tripod verify --device cuda on the demo"
# A step past its cap makes --plan fail (so it can).
GPU_CHECK_CAPS="build:9999" "$GC" --plan >/dev/null && fail "--plan passed with a 9999 s build"

# ---- the step runner ----
t0=$(date +%s)
out=$("$GC" --step slow 1 sh -c 'echo reached step 3 of 9; sleep 30')
rc=$?
dt=$(($(date +%s) - t0))
echo "$out" | head -1
[ "$rc" = 4 ] || fail "a step past its cap exited $rc, not 4 (INCOMPLETE)"
[[ $(head -1 <<<"$out") == "INCOMPLETE slow "*"reached step 3 of 9" ]] ||
    fail "a step past its cap reads: $(head -1 <<<"$out")"
[ "$dt" -lt 15 ] || fail "a 1 s cap let the step run ${dt}s"

# a ctest run cut short: how many tests it finished
out=$("$GC" --step tests 1 sh -c 'printf "1/3 Test  #1: A.b .....   Passed    0.10 sec\n"; sleep 30')
[[ $(head -1 <<<"$out") == "INCOMPLETE tests "*"1 of 3 tests finished: 1 passed"* ]] ||
    fail "a ctest step past its cap reads: $(head -1 <<<"$out")"
# a test stopped by its own timeout, nothing failed: INCOMPLETE; with a failure: FAIL
out=$("$GC" --step tests 5 sh -c 'printf "1/2 Test  #1: A.b .....***Timeout  60.1 sec\n"; exit 8')
[ $? = 4 ] || fail "a test timeout alone is not INCOMPLETE: $(head -1 <<<"$out")"
out=$("$GC" --step tests 5 sh -c 'printf "1/2 Test  #1: A.b .....***Failed  0.1 sec\n2/2 Test  #2: A.c .....***Timeout  60.1 sec\n"; exit 8')
[ $? = 1 ] || fail "a failed test beside a timeout is not FAIL: $(head -1 <<<"$out")"

# a command's own "no device" exit (verify --device cuda's 6) where the probe found none:
# NO GPU, not a failure; any other exit of it still fails
out=$(STEP_NO_GPU_RC=6 "$GC" --step gpu_verify 5 sh -c 'echo "verify: NO GPU: no usable CUDA device (none)"; exit 6')
[ $? = 0 ] && [[ $(head -1 <<<"$out") == "NO GPU gpu_verify ("*"s of 5s): verify: NO GPU: no usable CUDA device (none)" ]] ||
    fail "verify's no-device exit reads: $(head -1 <<<"$out")"
out=$(STEP_NO_GPU_RC=6 "$GC" --step gpu_verify 5 sh -c 'exit 1')
[ $? = 1 ] || fail "verify's failure under STEP_NO_GPU_RC=6 did not FAIL: $(head -1 <<<"$out")"
out=$("$GC" --step gpu_verify 5 sh -c 'exit 6')
[ $? = 1 ] || fail "exit 6 without STEP_NO_GPU_RC did not FAIL: $(head -1 <<<"$out")"

out=$("$GC" --step good 5 true)
[ $? = 0 ] && [[ $out == "PASS  good ("*"s of 5s)"* ]] || fail "a passing step reads: $out"
out=$("$GC" --step bad 5 sh -c 'echo "error: the linker"; exit 3')
[ $? = 1 ] && [[ $(head -1 <<<"$out") == "FAIL  bad (exit 3, "*"): error: the linker" ]] ||
    fail "a failing step reads: $(head -1 <<<"$out")"

# ---- the probe's verdict table: PROBE_EXIT GPUS_LISTED -> verdict ----
while read -r probe listed want; do
    got=$("$GC" --probe-verdict "$probe" "$listed")
    [ "$got" = "$want" ] || fail "probe exit $probe, $listed GPU(s) listed: $got, not $want"
done <<'TABLE'
0 1 GPU
0 0 GPU
2 0 NO_GPU
2 1 FAIL
2 8 FAIL
3 0 FAIL
3 1 FAIL
1 0 FAIL
127 1 FAIL
TABLE

# ---- every gpu test is built ----
targets=" $("$GC" --targets) "
# the executables of the gpu-labelled tests: a gtest target's name and label share its first
# line; an add_test's executable is the first $<TARGET_FILE:...> after its NAME
gpu_exes=$(find "$ROOT/tests" -name CMakeLists.txt -exec cat {} + | sed 's/#.*//' | awk '
    /tpd_add_gtest\(/ && / LABEL gpu/ { sub(/.*tpd_add_gtest\( */, ""); print $1 }
    /gtest_discover_tests\(/ && /LABELS gpu/ { sub(/.*gtest_discover_tests\( */, ""); print $1 }
    /add_test\(NAME / { t = $0; sub(/.*add_test\(NAME */, "", t); split(t, w, " "); name = w[1] }
    name != "" && match($0, /TARGET_FILE:[A-Za-z0-9_]+/) {
        exe[name] = substr($0, RSTART + 12, RLENGTH - 12); name = "" }
    /tpd_test_properties\(/ && / LABEL gpu/ {
        t = $0; sub(/.*tpd_test_properties\( */, "", t); split(t, w, " "); if (w[1] in exe) print exe[w[1]] }' |
    sort -u)
[ -n "$gpu_exes" ] || fail "found no gpu-labelled tests under tests/"
for e in $gpu_exes; do
    [[ $targets == *" $e "* ]] || fail "gpu test executable $e is not in gpu_check.sh's GPU_TARGETS"
done
echo "gpu test executables: $(echo $gpu_exes)"
grep -rqE 'TEST\(GpuMemory,' "$ROOT/tests" || fail "no GpuMemory test for the serial memory step"

[ "$fails" = 0 ] && echo "gpu plan: all checks passed"
exit $((fails > 0))
