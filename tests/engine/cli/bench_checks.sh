#!/usr/bin/env bash
# `tripod bench` and `tripod sweep` from the command line:
#  1. bad flags are configuration errors (exit 2) naming the flag and the rule: an unknown
#     --cluster for bench (every rank says so, before any step), --vp / --schedule /
#     --overlap lists for sweep;
#  2. a bench of an interleaved pipeline prints the measured idle fraction and exposed DP
#     time beside the planner's, each a number in its range;
#  3. results are kept: sweep --out and bench --calibrate --out refuse (exit 2, naming the
#     file) to write over an earlier result unless --force; a sweep where no layout runs
#     exits non-zero saying so;
#  4. `bench --calibrate` measures the kernels in the config's precision (a bf16 profile says
#     calibrated_bf16: 1), and the planner warns when a profile's precision is not the
#     config's.
# usage: bench_checks.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
fail=0
pass=0

for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $i."; done > "$work/text"
"$bin" data prepare --input "$work/text" --output "$work/corpus" >/dev/null || exit 1
common=(data.data_path="$work/corpus" model.num_layers=4 model.hidden_size=32
        model.seq_length=16 training.micro_batch_size=1 training.global_batch_size=8)

check() { # description, expected exit code, expected message (grep -F), command...
  local what=$1 want=$2 msg=$3
  shift 3
  local out rc
  out=$(timeout 120 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want" ] && printf '%s\n' "$out" | grep -qF -- "$msg"; then
    pass=$((pass + 1))
  else
    echo "FAIL: $what: exit $rc (want $want), '$msg' not found in:"
    printf '%s\n' "$out" | head -20
    fail=$((fail + 1))
  fi
  LAST_OUT=$out
}

# 1. bad flags
check "bench --cluster" 2 "no-such-profile" \
  "${mpirun[@]}" -np 2 "$bin" bench "$src/configs/demo.yaml" "${common[@]}" --cluster no-such-profile
n=$(printf '%s\n' "$LAST_OUT" | grep -c "no-such-profile")
if [ "$n" -ge 2 ]; then pass=$((pass + 1)); else echo "FAIL: bench --cluster: $n of 2 ranks said so"; fail=$((fail + 1)); fi
check "sweep --vp 0" 2 "--vp '0' must be a comma-separated list" \
  "$bin" sweep "$src/configs/demo.yaml" --vp 0
check "sweep --schedule" 2 "--schedule '1f1b,gpipe' must list 1f1b, interleaved and zb-h1" \
  "$bin" sweep "$src/configs/demo.yaml" --schedule 1f1b,gpipe
check "sweep --overlap" 2 "--overlap '2' must be 0, 1 or 0,1" \
  "$bin" sweep "$src/configs/demo.yaml" --overlap 2

# 2. an interleaved pipeline (two chunks of one layer on each of two stages)
check "bench interleaved" 0 "idle fraction" \
  "${mpirun[@]}" -np 2 "$bin" bench "$src/configs/demo.yaml" "${common[@]}" \
  parallel.pipeline_model_parallel_size=2 parallel.virtual_pipeline_model_parallel_size=2 \
  --steps 3 --warmup 1
line=$(printf '%s\n' "$LAST_OUT" | grep "idle fraction")
if printf '%s\n' "$line" | grep -qE "pipeline \(interleaved, v=2\) idle fraction 0\.[0-9]+ measured, 0\.[0-9]+ predicted"; then
  pass=$((pass + 1))
else
  echo "FAIL: bench idle line: $line"
  fail=$((fail + 1))
fi
line=$(printf '%s\n' "$LAST_OUT" | grep "DP reduction after the pipeline")
if printf '%s\n' "$line" | grep -qE "[0-9.]+ ms measured, [0-9.]+ ms predicted"; then
  pass=$((pass + 1))
else
  echo "FAIL: bench DP line: $line"
  fail=$((fail + 1))
fi

# 3. earlier results are kept unless --force; a sweep of no successful layout fails
tiny=("${common[@]}" model.num_layers=1 training.global_batch_size=2 training.num_threads=1)
mkdir -p "$work/old"
echo "keep me" >"$work/old/summary.csv"
check "sweep over a result" 2 "'$work/old/summary.csv' exists (an earlier result); pass --force" \
  "$bin" sweep "$src/configs/demo.yaml" "${tiny[@]}" --steps 1 --warmup 0 --no-plot --no-traces \
  --out "$work/old"
if grep -qx "keep me" "$work/old/summary.csv"; then pass=$((pass + 1)); else
  echo "FAIL: sweep wrote over $work/old/summary.csv without --force"; fail=$((fail + 1)); fi
check "sweep --force" 0 "Best layout:" \
  "$bin" sweep "$src/configs/demo.yaml" "${tiny[@]}" --steps 1 --warmup 0 --no-plot --no-traces \
  --out "$work/old" --force
check "sweep of no layout that runs" 2 "sweep: none of the 1 layouts ran successfully" \
  "$bin" sweep "$src/configs/demo.yaml" "${tiny[@]}" --tp 3 --steps 1 --warmup 0 --no-plot \
  --no-traces --out "$work/none"
echo "old profile" >"$work/profile.yaml"
check "calibrate over a profile" 2 "'$work/profile.yaml' exists (an earlier result); pass --force" \
  "$bin" bench --calibrate --out "$work/profile.yaml" "$src/configs/demo.yaml" "${tiny[@]}"
if grep -qx "old profile" "$work/profile.yaml"; then pass=$((pass + 1)); else
  echo "FAIL: calibrate wrote over $work/profile.yaml without --force"; fail=$((fail + 1)); fi

# 4. the calibration measures the config's precision, and the planner says when a profile's
# precision is not the config's
check "calibrate in bf16" 0 "calibrate: peak" \
  "$bin" bench --calibrate --out "$work/bf16.yaml" "$src/configs/demo.yaml" "${tiny[@]}" \
  training.precision=bf16
if grep -q "^calibrated_bf16: 1" "$work/bf16.yaml"; then pass=$((pass + 1)); else
  echo "FAIL: a bf16 calibration does not say calibrated_bf16: 1"; fail=$((fail + 1)); fi
check "an fp32 plan on a bf16 profile" 0 \
  "was calibrated with training.precision bf16, and this config trains in fp32" \
  "$bin" plan "$src/configs/demo.yaml" "${tiny[@]}" --cluster "$work/bf16.yaml" --gpus 1

echo "bench_checks: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
