#!/usr/bin/env bash
# `tripod eval`: the loss of a saved checkpoint over the validation batches equals the
# validation loss that training printed at that iteration, on one rank and resharded to
# TP=2 x PP=2; the test split evaluates too; without checkpoint.load it is a config error.
# `tripod inspect` describes the checkpoint and refuses a damaged one.
#
# usage: eval_flow.sh TRIPOD MPIEXEC SOURCE_DIR
set -euo pipefail
tripod=$1
mpiexec=$2
src=$3
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin eval_flow
flow_corpus "$tripod"
O=(data.data_path="$work/corpus" model.num_layers=2 model.hidden_size=32 model.seq_length=32
   training.global_batch_size=8 training.micro_batch_size=1 training.train_iters=12
   training.num_threads=1 logging.eval_interval=12 logging.eval_iters=3 logging.log_interval=12
   logging.metrics_file= checkpoint.save="$work/ck" data.split=90,5,5)

want=$("$tripod" train "$src/configs/demo.yaml" "${O[@]}" 2>&1 | grep -o 'validation lm loss: [0-9.E+-]*' | tail -1 | cut -d' ' -f4)
[[ -n $want ]] || fail "training printed no validation loss"
one=$("$tripod" eval "$src/configs/demo.yaml" "${O[@]}" checkpoint.load=auto --iters 3 | grep -o 'lm loss: [0-9.E+-]*' | cut -d' ' -f3)
four=$("$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -np 4 \
  "$tripod" eval "$src/configs/demo.yaml" "${O[@]}" checkpoint.load=auto --iters 3 \
  parallel.tensor_model_parallel_size=2 parallel.pipeline_model_parallel_size=2 |
  grep -o 'lm loss: [0-9.E+-]*' | cut -d' ' -f3)
echo "eval_flow: training $want, eval $one, eval TP2 PP2 $four"
[[ $one == "$want" ]] || fail "one rank: $one, training printed $want"
awk -v a="$four" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' ||
  fail "TP2 PP2: $four against $want"
test_loss=$("$tripod" eval "$src/configs/demo.yaml" "${O[@]}" checkpoint.load=auto --split test --iters 1 |
  grep -o 'test split.*perplexity: [0-9.]*')
[[ -n $test_loss ]] || fail "no test-split line"
# `tripod inspect` describes the checkpoint, and refuses one with a damaged file
info=$("$tripod" inspect "$work/ck")
echo "$info"
[[ $info == *"iteration 12,"*"TP 1 x PP 1 x DP 1"*"2 layers, hidden 32"*"SHA-256 verified"* ]] ||
  fail "inspect: $info"
cp -r "$work/ck" "$work/ck2"
model=$(ls "$work"/ck2/iter_*/model_*.bin | head -1)
printf 'X' | dd of="$model" bs=1 seek=100 conv=notrunc status=none
set +e
err=$("$tripod" inspect "$work/ck2" 2>&1)
rc=$?
set -e
[[ $rc -ne 0 && $err == *"$(basename "$model")"*"SHA-256"* ]] || fail "inspect of a damaged file: rc $rc, $err"

set +e
err=$("$tripod" eval "$src/configs/demo.yaml" "${O[@]}" 2>&1)
rc=$?
set -e
[[ $rc -eq 2 && $err == *"eval needs checkpoint.load"* ]] || fail "without checkpoint.load: rc $rc, $err"
echo "eval_flow: OK"
