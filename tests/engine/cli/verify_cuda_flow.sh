#!/usr/bin/env bash
# `tripod verify --device cuda` on a machine without a GPU:
#  1. it says so in one line and exits 6 (TPD_EXIT_NO_GPU, base/status.h), having run
#     nothing, alone and under mpirun (on a machine with a usable device this part is
#     skipped: the command then runs, which gpu_check.sh covers);
#  2. with the cpu standing in for the device (TRIPOD_TEST_VERIFY_DEVICE=cpu) the whole
#     comparison runs on the demo at TP 2 x PP 2 x DP 2 with ZeRO-1, and on the Llama demo:
#     every check PASS far inside the bf16 budget, which the report states with its inputs
#     (and --out writes into verify.json);
#  3. a fault planted in the device's run only fails the budgeted checks: a DP bucket left
#     unreduced (grad norm, then parameters), a dropped layer (structure);
#  4. --device other than cpu or cuda is a usage error (exit 2).
# usage: verify_cuda_flow.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$(dirname "$0")/flow_lib.sh"
flow_begin verify_cuda_flow
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
tp2pp2=(parallel.tensor_model_parallel_size=2 parallel.pipeline_model_parallel_size=2)
export OMP_NUM_THREADS=1

# 1. no GPU
out=$(timeout 120 "$bin" verify "$src/configs/demo.yaml" --device cuda 2>&1)
rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ]; then
  echo "verify_cuda_flow: a CUDA device is usable here: the no-GPU exit is not rehearsed"
else
  [ "$rc" -eq 6 ] || { printf '%s\n' "$out"; fail "no GPU: exit $rc, expected 6"; }
  grep -qE '^verify: NO GPU: no usable CUDA device \(.+\); --device cuda needs one, so nothing ran \(exit code 6\)$' <<<"$out" ||
    { printf '%s\n' "$out"; fail "no GPU: the line does not say so"; }
  grep -qE '^  (check|structure) ' <<<"$out" && fail "no GPU: checks ran anyway"
  echo "no GPU alone: exit 6: $(grep '^verify: NO GPU' <<<"$out")"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$bin" verify "$src/configs/demo.yaml" --device cuda 2>&1)
  rc=$?
  [ "$rc" -eq 6 ] || { printf '%s\n' "$out"; fail "no GPU under mpirun -np 2: exit $rc, expected 6"; }
  [ "$(grep -c '^verify: NO GPU' <<<"$out")" -eq 1 ] ||
    { printf '%s\n' "$out"; fail "no GPU under mpirun: not one line from rank 0"; }
  echo "no GPU under mpirun -np 2: exit 6"
fi

# 2. the comparison, the cpu standing in for the device
stand_in() { # NP CONFIG ARGS...: output in $out, status in $rc
  local np=$1 cfg=$2
  shift 2
  out=$(TRIPOD_TEST_VERIFY_DEVICE=cpu timeout 300 "${mpirun[@]}" -x TRIPOD_TEST_VERIFY_DEVICE \
        ${TRIPOD_TEST_FAULT:+-x TRIPOD_TEST_FAULT} -np "$np" "$bin" verify "$src/configs/$cfg" \
        --device cuda "$@" 2>&1)
  rc=$?
}
expect_pass() { # WHAT, then stand_in's arguments
  local what=$1
  shift
  stand_in "$@"
  local n
  n=$(grep -cE '^  (structure|cuda: initial weights|cuda: loss|cuda: grad norm|cuda: params) +PASS ' <<<"$out")
  if [ "$rc" -ne 0 ] || [ "$n" -ne 5 ] || ! grep -q '^verify: PASS (5 of 5' <<<"$out"; then
    printf '%s\n' "$out" | head -40
    fail "$what: exit $rc, $n of 5 checks PASS"
  fi
  grep -qE '^  shrunk: +the cpu in fp32 standing in for cuda' <<<"$out" || fail "$what: no stand-in said"
  # the same layout on the same backend: bit-identical, so worst 0 against a positive budget
  grep -E '^  cuda: (loss|grad norm|params) ' <<<"$out" | grep -vqE ' PASS +0\.00e\+00 +[1-9]\.[0-9]{2}e-0[1-3] ' &&
    { grep -E '^  cuda: ' <<<"$out"; fail "$what: not bit-identical, or no budget shown"; }
  echo "$what: PASS"
}
expect_pass "demo TP 2 PP 2 DP 2 ZeRO-1" 8 demo.yaml "${tp2pp2[@]}" \
  parallel.use_distributed_optimizer=true --out "$work/out"
grep -qE '^  budget: +bf16 u = 2\^-8, 4 layers x 15 rounding points \+ 5, deepest GEMM 64, weight gradients over 128 tokens: e_fwd = u sqrt\(65\) \+ 64 x 2\^-24 = 3\.15e-02, e_bwd = u sqrt\(130\) \+ 128 x 2\^-24 = 4\.45e-02; .* params <= 2 sqrt\(0\.798 e_bwd 3\) = 0\.653$' <<<"$out" ||
  { grep '^  budget' <<<"$out"; fail "the demo's budget line is not the hand computation"; }
grep -qE '^  cuda: loss +PASS +0\.00e\+00 +8\.35e-03 +per step, relative against its budget: 0\.0e\+00 of 2\.8e-03, 0\.0e\+00 of 5\.6e-03, 0\.0e\+00 of 8\.4e-03$' <<<"$out" ||
  { grep '^  cuda: loss' <<<"$out"; fail "the loss's per-step budgets"; }
grep -qP '"device":\s*"cuda"' "$work/out/verify.json" || fail "verify.json does not say cuda"
grep -qP '"eps_bwd":\s*0\.0445' "$work/out/verify.json" || fail "verify.json lacks the budget"
expect_pass "Llama demo TP 2 PP 2" 8 demo-llama.yaml "${tp2pp2[@]}"
grep -qE '^  budget: .* x 18 rounding points' <<<"$out" || fail "the Llama block's rounding points"

# 3. a fault in the device's run only
expect_fault() { # WHAT FAULT CHECK MESSAGE, then stand_in's arguments
  local what=$1 fault=$2 check=$3 msg=$4
  shift 4
  TRIPOD_TEST_FAULT=$fault stand_in "$@"
  if [ "$rc" -ne 1 ] || ! grep -qE "^  $check +FAIL .*$msg" <<<"$out" ||
     ! grep -q '^verify: FAIL' <<<"$out"; then
    printf '%s\n' "$out" | head -40
    fail "$what ($fault): exit $rc, expected '$check' to FAIL with '$msg'"
  fi
  echo "$what: caught: $(grep -E "^  $check +FAIL" <<<"$out" | head -1 | sed 's/  */ /g')"
}
expect_fault "skipped DP bucket" skip-dp-bucket:0 "cuda: grad norm" \
  "grad norm .* at step 1, the cpu's .* \(relative .*, budget 4\.5e-02 at step 1\)" 8 demo.yaml \
  "${tp2pp2[@]}"
grep -qE '^  cuda: params +FAIL .*param [a-z0-9.]+ differs by .* \(relative to how far the reference moved it\) after step 3; .*held by stage' <<<"$out" ||
  fail "the skipped bucket's parameters are not named"
grep -qE '^  cuda: initial weights +PASS' <<<"$out" || fail "the fault reached the initial weights"
expect_fault "dropped layer" drop-layer:1 "structure" "stage 1 of 2 holds 1 layers" 8 demo.yaml \
  "${tp2pp2[@]}"

# 4. usage
out=$("$bin" verify "$src/configs/demo.yaml" --device tpu 2>&1)
rc=$?
[ "$rc" -eq 2 ] && grep -q -- '--device tpu: expected cpu or cuda' <<<"$out" ||
  { printf '%s\n' "$out"; fail "--device tpu: exit $rc"; }
echo "verify_cuda_flow: PASS"
