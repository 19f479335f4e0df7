#!/usr/bin/env bash
# `tripod verify` end to end under mpirun:
#  1. it passes on the README's layouts (the demo at TP 2 x PP 2 x DP 2, interleaved v 2,
#     ZB-H1 on 4 stages, and the Llama demo at TP 2 x PP 2, also with SP, ZeRO-1 and
#     recompute), every check PASS, exit 0, and --out writes the JSON report and the
#     shrunken config; on one rank the resharding check is not run and it still passes;
#  2. it fails loudly, naming the fault, on each fault planted through TRIPOD_TEST_FAULT
#     (base/fault.h): a dropped layer in one stage, a skipped DP bucket reduction, a resume
#     that loads the wrong shard;
#  3. it refuses up front a layout whose ranks do not fit, with the figure, and ranks that
#     do not hold whole copies of the model.
# usage: verify_flow.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$(dirname "$0")/flow_lib.sh"
flow_begin verify_flow
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
tp2pp2=(parallel.tensor_model_parallel_size=2 parallel.pipeline_model_parallel_size=2)

# verify NP CONFIG ARGS...: runs it, output in $out, exit status in $rc
verify() {
  local np=$1 cfg=$2
  shift 2
  out=$(timeout 300 "${mpirun[@]}" -np "$np" "$bin" verify "$src/configs/$cfg" "$@" 2>&1)
  rc=$?
}

expect_pass() { # what, then verify's arguments
  local what=$1
  shift
  verify "$@"
  local checks
  checks=$(printf '%s\n' "$out" | grep -cE '^  (structure|memory|train: |checkpoint: ).* PASS ')
  if [ "$rc" -ne 0 ] || [ "$checks" -ne 8 ] || ! grep -q '^verify: PASS (8 of 8' <<<"$out"; then
    printf '%s\n' "$out" | head -40
    fail "$what: exit $rc, $checks of 8 checks PASS"
  fi
  echo "$what: PASS ($(grep -o 'in [0-9.]* s' <<<"$out"))"
}

# expect_fault WHAT FAULT CHECK MESSAGE, then verify's arguments: exit 1, the check FAILs
# with the message, and the verdict is FAIL
expect_fault() {
  local what=$1 fault=$2 check=$3 msg=$4
  shift 4
  out=$(TRIPOD_TEST_FAULT=$fault timeout 300 "${mpirun[@]}" -x TRIPOD_TEST_FAULT -np "$1" \
        "$bin" verify "$src/configs/$2" "${@:3}" 2>&1)
  rc=$?
  if [ "$rc" -ne 1 ] || ! grep -qE "^  $check +FAIL .*$msg" <<<"$out" ||
     ! grep -q '^verify: FAIL' <<<"$out"; then
    printf '%s\n' "$out" | head -40
    fail "$what ($fault): exit $rc, expected '$check' to FAIL with '$msg'"
  fi
  echo "$what: caught: $(grep -E "^  $check +FAIL" <<<"$out" | head -1 | sed 's/  */ /g')"
}

# 1. the README's layouts
expect_pass "demo TP 2 PP 2 DP 2" 8 demo.yaml "${tp2pp2[@]}" --out "$work/out"
for f in verify.json verify-config.yaml; do
  [ -s "$work/out/$f" ] || fail "--out did not write $f"
done
grep -qP '"passed":\s*true' "$work/out/verify.json" || fail "verify.json does not say passed"
grep -qP '"name":\s*"checkpoint: one rank"' "$work/out/verify.json" || fail "verify.json lacks checks"
grep -q 'num_layers: 4' "$work/out/verify-config.yaml" || fail "the shrunken config lost its layers"
expect_pass "demo interleaved v 2" 8 demo.yaml "${tp2pp2[@]}" \
  parallel.virtual_pipeline_model_parallel_size=2
expect_pass "demo ZB-H1 PP 4" 8 demo.yaml parallel.pipeline_model_parallel_size=4 \
  parallel.pipeline_schedule=zb-h1
expect_pass "Llama demo TP 2 PP 2" 8 demo-llama.yaml "${tp2pp2[@]}"
# and the keys the README's layouts leave at their defaults: SP, ZeRO-1, recompute
expect_pass "Llama demo v 2, SP, ZeRO-1, selective recompute" 8 demo-llama.yaml "${tp2pp2[@]}" \
  parallel.virtual_pipeline_model_parallel_size=2 parallel.sequence_parallel=true \
  parallel.use_distributed_optimizer=true training.recompute=selective
# the sharded strategies: ZeRO-2 under TP 2 PP 2, ZeRO-3 (FSDP) with the Llama block under
# ZB-H1 on DP 2 and at DP 8
expect_pass "demo TP 2 PP 2 optim_grads" 8 demo.yaml "${tp2pp2[@]}" \
  parallel.data_parallel_sharding_strategy=optim_grads
expect_pass "Llama demo PP 4 ZB-H1 DP 2 optim_grads_params" 8 demo-llama.yaml \
  parallel.pipeline_model_parallel_size=4 parallel.pipeline_schedule=zb-h1 \
  parallel.data_parallel_sharding_strategy=optim_grads_params
expect_pass "Llama demo DP 8 optim_grads_params" 8 demo-llama.yaml \
  parallel.data_parallel_sharding_strategy=optim_grads_params

# DiLoCo (2 replicas): the train checks against the one-rank DiLoCo reference, the same-layout
# resume bit-exact; another replica count is another algorithm, so those resumes are not run
# context parallelism: the same split of a shrunken sequence, the ring and the all-to-all
expect_pass "Llama demo CP 2 ring, TP 2, SP" 4 demo-llama.yaml parallel.context_parallel_size=2 \
  parallel.tensor_model_parallel_size=2 parallel.sequence_parallel=true
expect_pass "demo CP 4 a2a, DP 2, ZeRO-1" 8 demo.yaml parallel.context_parallel_size=4 \
  parallel.cp_comm_type=a2a parallel.use_distributed_optimizer=true
# the mixture of experts: the experts and their routing kept, their widths shrunk
expect_pass "MoE demo TP 2 PP 2" 4 demo-moe.yaml "${tp2pp2[@]}"

expect_diloco() { # what, what the train checks say, then verify's arguments
  local what=$1 train=$2
  shift 2
  verify "$@"
  if [ "$rc" -ne 0 ] || ! grep -qE '^  checkpoint: same layout +PASS' <<<"$out" ||
     ! grep -qE "^  train: params +$train" <<<"$out" ||
     ! grep -qE '^  checkpoint: one rank +SKIP .*continues at its replicas' <<<"$out"; then
    printf '%s\n' "$out" | head -40
    fail "$what: exit $rc"
  fi
  echo "$what: $(grep -E '^verify:' <<<"$out" | tail -1)"
}
expect_diloco "demo DiLoCo TP 2 PP 2, 2 replicas" "PASS .*DiLoCo reference" 8 demo.yaml \
  "${tp2pp2[@]}" parallel.dp_sync=diloco diloco.sync_interval=20
expect_diloco "demo streaming DiLoCo DP 4, 2 fragments, overlap 1" "PASS .*DiLoCo reference" 4 \
  demo.yaml parallel.dp_sync=diloco diloco.sync_interval=20 diloco.fragments=2 \
  diloco.overlap_steps=1
expect_diloco "Llama demo streaming DiLoCo, ZeRO-1 pairs" "SKIP .*spans of each rank" 4 \
  demo-llama.yaml parallel.dp_sync=diloco diloco.replicas=2 diloco.fragments=2 \
  parallel.use_distributed_optimizer=true

# 2. planted faults
expect_fault "dropped layer" drop-layer:1 structure \
  "stage 1 of 2 holds 1 layers, expected 2 .*layer 3 by none" 8 demo.yaml "${tp2pp2[@]}"
expect_fault "skipped DP bucket" skip-dp-bucket:0 "train: grad norm" \
  "grad norm .* at step 1, one rank" 8 demo.yaml "${tp2pp2[@]}"
grep -qE '^  train: params +FAIL .*param [a-z0-9.]+ differs .*held by stage' <<<"$out" ||
  fail "the skipped bucket's parameters are not named"
expect_fault "wrong shard on resume" wrong-shard "checkpoint: same layout" \
  "param .* differs .* after loading iteration 3; .*held by stage" 8 demo.yaml "${tp2pp2[@]}"

# 3. refused up front
verify 4 demo.yaml "${tp2pp2[@]}" parallel.data_parallel_size=100000
if [ "$rc" -eq 0 ] || ! grep -q "needs 400000 ranks, about .* GiB, and this machine has .* GiB available: pass --ranks N" <<<"$out"; then
  printf '%s\n' "$out" | head -20
  fail "a layout too large for the machine was not refused with its figure (exit $rc)"
fi
verify 4 demo.yaml "${tp2pp2[@]}" --ranks 6
if [ "$rc" -eq 0 ] || ! grep -q "6 ranks do not hold whole copies of the model" <<<"$out"; then
  printf '%s\n' "$out" | head -20
  fail "--ranks 6 at TP 2 x PP 2 was not refused (exit $rc)"
fi
# --ranks shrinks DP: DP 100000 of the config rehearsed at DP 1 on 4 ranks
expect_pass "DP 100000 shrunk by --ranks 4" 4 demo.yaml "${tp2pp2[@]}" \
  parallel.data_parallel_size=100000 --ranks 4
grep -q "DP 100000 of the config shrunk to 1" <<<"$out" || fail "the shrunk DP is not stated"
# one rank: no other layout to reshard into, so that check is not run, and it still passes
verify 1 demo.yaml
if [ "$rc" -ne 0 ] || ! grep -qE '^  checkpoint: other layout +SKIP +- .*not run: no other layout' <<<"$out" ||
   ! grep -q '^verify: PASS (7 of 8 checks passed, 1 not run)' <<<"$out"; then
  printf '%s\n' "$out" | head -30
  fail "one rank: exit $rc"
fi
echo "verify_flow: PASS"
