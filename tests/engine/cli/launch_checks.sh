#!/usr/bin/env bash
# Launch-level checks of `tripod train` under mpirun:
#  1. invalid layouts: every rank prints the same one-line error naming the values, before
#     any collective, and the job exits non-zero (no rank hangs);
#  2. a dead rank: when one rank is killed mid-run the job ends with a non-zero status
#     instead of hanging;
#  3. a rank stopped (SIGSTOP) before start-up's config agreement: the other ends on
#     comm.timeout_s with the communication exit code (3), naming the collective.
# usage: launch_checks.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
fail=0
pass=0

# a small corpus
for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $i."; done > "$work/text"
"$bin" data prepare --input "$work/text" --output "$work/corpus" >/dev/null || exit 1
common=(data.data_path="$work/corpus" model.num_layers=4 model.hidden_size=32
        model.seq_length=16 training.micro_batch_size=1 logging.metrics_file= logging.eval_interval=0
        checkpoint.save=)

expect_error() { # np, expected message, overrides...
  local np=$1 msg=$2
  shift 2
  local out rc
  out=$(timeout 60 "${mpirun[@]}" -np "$np" "$bin" train "$src/configs/demo.yaml" "${common[@]}" "$@" 2>&1)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$out" | grep -cF -- "$msg")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$lines" -eq "$np" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL: np=$np $* -> exit $rc, '$msg' printed by $lines of $np ranks"
    printf '%s\n' "$out" | head -20
    fail=$((fail + 1))
  fi
}

expect_error 3 "world size (3) is not divisible by total_model_size (2)" \
  parallel.tensor_model_parallel_size=2
expect_error 2 "num_attention_heads (4) must be a multiple of tensor_model_parallel_size (8)" \
  parallel.tensor_model_parallel_size=8
expect_error 3 "Number of layers should be divisible by the pipeline-model-parallel size" \
  parallel.pipeline_model_parallel_size=3
expect_error 3 "global batch size (32) is not divisible by micro batch size (1) times data parallel size (3)" \
  training.global_batch_size=32
expect_error 2 "parallel.data_parallel_size (4) does not match world size (2)" \
  parallel.data_parallel_size=4

# A dead rank: kill one of two ranks after a few iterations.
"${mpirun[@]}" -np 2 "$bin" train "$src/configs/demo.yaml" "${common[@]}" \
  training.global_batch_size=8 training.train_iters=100000 comm.timeout_s=20 \
  >"$work/dead.log" 2>&1 &
launcher=$!
# wait until the job trains (its first log line), 60 s at most: start-up can be slow
for _ in $(seq 1 120); do
  grep -q 'iteration' "$work/dead.log" 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.5
done
# a rank of this job only: mpirun's own children (other tests may run tripod meanwhile)
victim=$(pgrep -P "$launcher" -f "$bin" | tail -1)
if [ -n "$victim" ]; then kill -9 "$victim"; fi
waited=0
while kill -0 "$launcher" 2>/dev/null && [ $waited -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: job still running ${waited}s after rank $victim was killed"
  kill -9 "$launcher"
  fail=$((fail + 1))
else
  wait "$launcher"
  rc=$?
  if [ -n "$victim" ] && [ "$rc" -ne 0 ]; then
    pass=$((pass + 1))
    echo "dead rank: job ended with status $rc after ${waited}s"
  else
    echo "FAIL: dead rank: victim '$victim', job status $rc"
    fail=$((fail + 1))
  fi
fi

# A rank stopped at start-up: the test-only fault stops rank 1 before the agreement.
t0=$(date +%s)
TRIPOD_TEST_FAULT=stop-rank:1 "${mpirun[@]}" -x TRIPOD_TEST_FAULT -np 2 "$bin" train \
  "$src/configs/demo.yaml" "${common[@]}" training.global_batch_size=8 comm.timeout_s=3 \
  >"$work/stuck.log" 2>&1 &
launcher=$!
sleep 1
ranks=$(pgrep -P "$launcher" -f "$bin" | tr '\n' ' ')
waited=0
while kill -0 "$launcher" 2>/dev/null && [ $waited -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: stuck start-up: job still running after ${waited}s"
  kill -9 "$launcher"
  rc=124
else
  wait "$launcher"
  rc=$?
fi
for r in $ranks; do kill -9 "$r" 2>/dev/null; done # the stopped rank, if mpirun left it
elapsed=$(($(date +%s) - t0))
if [ "$rc" -eq 3 ] && [ "$elapsed" -le 40 ] &&
  grep -q "all-reduce on communicator world did not complete within comm.timeout_s = 3 s; a peer rank is dead or stuck" "$work/stuck.log"; then
  pass=$((pass + 1))
  echo "stuck start-up: job ended with status $rc after ${elapsed}s"
else
  echo "FAIL: stuck start-up: status $rc after ${elapsed}s (expected 3 within 40 s)"
  head -20 "$work/stuck.log"
  fail=$((fail + 1))
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
