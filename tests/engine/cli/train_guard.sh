#!/usr/bin/env bash
# Runs that must stop with an error instead of training a wrong model or running forever:
#  1. sizes past the keys' bounds (a padded vocabulary that wrapped in 32 bits, a batch
#     that overflowed the planner) are config errors naming the key and the bound, on
#     every rank, for train and plan;
#  2. a diverged run (optimizer.lr=1e30) stops after training.max_skipped_iterations
#     non-finite steps with exit 5 and a message on every rank, saving nothing; with the
#     limit off, skipped steps only skip, and non-finite weights are never saved;
#  3. training.num_threads past any machine is a config error; past the cores, a warning;
#  4. logging.eval_interval with an empty validation split fails before training;
#  5. settings the layout ignores (sequence_parallel at TP 1, a recompute_num_layers past a
#     model chunk's layers) are said once, by the logging rank, and the run trains.
# usage: train_guard.sh TRIPOD_BIN MPIEXEC SOURCE_DIR
set -u
bin=$1
mpiexec=$2
src=$3
. "$(dirname "$0")/flow_lib.sh"
flow_begin train_guard
flow_corpus "$bin" 200
cd "$work" || exit 1
# every check runs (a failure is counted, not fatal), so one run shows each that fails
nbad=0
mpirun=("$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
O=(data.data_path="$work/corpus" model.num_layers=2 model.hidden_size=64
   model.num_attention_heads=4 model.seq_length=32 training.micro_batch_size=2
   training.global_batch_size=16 checkpoint.save= logging.metrics_file= logging.eval_interval=0)

expect() { # CODE NP MESSAGE LOG: exit CODE and MESSAGE printed NP times
  local code=$1 np=$2 msg=$3 log=$4 rc=$5
  [ "$rc" -eq "$code" ] || bad "$log: exit $rc, expected $code: $(tail -4 "$log")"
  local n
  n=$(grep -cF -- "$msg" "$log")
  [ "$n" -eq "$np" ] || bad "$log: '$msg' printed $n times, expected $np: $(tail -4 "$log")"
  if grep -q "^ iteration" "$log" && [ "$code" -eq 2 ]; then bad "$log: trained before failing"; fi
  return 0
}

# 1. sizes
timeout 120 "${mpirun[@]}" -np 4 "$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=3 \
  model.make_vocab_size_divisible_by=1073741825 parallel.tensor_model_parallel_size=4 >v4.log 2>&1
expect 2 4 "model.make_vocab_size_divisible_by: 1073741825 is out of range (expected an integer in [1, 65536])" v4.log $?
timeout 120 "${mpirun[@]}" -np 2 "$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=3 \
  model.make_vocab_size_divisible_by=2147483647 parallel.tensor_model_parallel_size=2 >v2.log 2>&1
expect 2 2 "model.make_vocab_size_divisible_by: 2147483647 is out of range" v2.log $?
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=1 model.vocab_size=2147483647 >vs.log 2>&1
expect 2 1 "model.vocab_size: 2147483647 is out of range (expected an integer in [1, 16777216])" vs.log $?
"$bin" plan "$src/configs/demo.yaml" model.make_vocab_size_divisible_by=1073741824 --gpus 4 >p1.log 2>&1
expect 2 1 "model.make_vocab_size_divisible_by: 1073741824 is out of range" p1.log $?
"$bin" plan "$src/configs/demo.yaml" training.global_batch_size=1073741824 training.micro_batch_size=1 \
  --gpus 1 >p2.log 2>&1
expect 2 1 "training.global_batch_size: 1073741824 is out of range (expected an integer in [1, 1048576])" p2.log $?
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.micro_batch_size=65536 \
  training.global_batch_size=65536 model.seq_length=65536 model.max_position_embeddings=65536 >tok.log 2>&1
expect 2 1 "micro_batch_size * seq_length (65536 * 65536) must be at most" tok.log $?

# 2. divergence
timeout 120 "${mpirun[@]}" -np 2 "$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=40 \
  optimizer.lr=1e30 checkpoint.save=div >div.log 2>&1
expect 5 2 "in a row (training.max_skipped_iterations 10): the run diverged; stopping without saving" div.log $?
# (div/ itself exists from start-up on: it holds the run's lock, .tripod.lock)
ls div 2>/dev/null | grep -q . && bad "the diverged run saved: $(ls div)"
grep -q "^ iteration *40/" div.log && bad "the diverged run ran to the end"
grep -q "update skipped (1 in a row" div.log || bad "a skipped step was not said"
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=4 optimizer.lr=1e30 \
  training.max_skipped_iterations=0 >skip.log 2>&1
expect 0 0 "diverged" skip.log $?
grep -q "number of skipped iterations:   3" skip.log || bad "skipped steps only skip: $(tail -2 skip.log)"
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=2 model.init_method_std=1e38 \
  training.max_skipped_iterations=0 checkpoint.save=inf >inf.log 2>&1
expect 5 1 "the parameters are not finite" inf.log $?
[ -e inf/latest ] && bad "non-finite parameters were saved"

# 3. threads
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=1 training.num_threads=100000 >t1.log 2>&1
expect 2 1 "training.num_threads: 100000 is out of range (expected an integer in [0, 4096])" t1.log $?
timeout 60 "$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=2 training.num_threads=1000 \
  >t2.log 2>&1
expect 0 1 "training.num_threads 1000: this rank may run on" t2.log $?

# 4. an empty validation split asked for
"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=5 data.split=1,0,0 \
  logging.eval_interval=2 >split.log 2>&1
expect 2 1 "the valid split holds 0 tokens" split.log $?
grep -q "$work/corpus: split" split.log || bad "the split error does not name the data set: $(cat split.log)"
# 5. settings without effect at this layout: one warning each for the job (PP 2: 2 ranks)
timeout 120 "${mpirun[@]}" -np 2 "$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=1 \
  parallel.pipeline_model_parallel_size=2 parallel.sequence_parallel=true training.recompute=full \
  training.recompute_num_layers=5 >noeffect.log 2>&1
rc=$?
expect 0 1 "parallel.sequence_parallel: true has no effect at tensor_model_parallel_size 1" noeffect.log $rc
expect 0 1 "training.recompute_num_layers 5 is more than the 1 layer of a model chunk" noeffect.log $rc

[ $nbad -eq 0 ] || fail "$nbad checks failed"
echo "train_guard: PASS"
