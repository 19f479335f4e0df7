#!/usr/bin/env bash
# Single-rank CPU training throughput (tokens/s and GFLOP/s) for the demo model and for
# GPT-2 124M at seq_length 256, then the demo model under TP=2, PP=2 and DP=2 at the same
# global batch (two ranks each). Uses the fortune corpus (tools/prepare_demo.sh); GPT-2's
# vocabulary is larger than the corpus's, which does not change the work per token.
# usage: tools/bench_cpu.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-4}
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
cores=$(nproc)

echo "== demo model, one rank, $cores threads"
OMP_NUM_THREADS=$cores "$bin" bench configs/demo.yaml --steps "$steps" --warmup 1 | grep bench
for layout in "2 1" "1 2" "1 1"; do
  set -- $layout
  echo "== demo model, TP $1 PP $2 on 2 ranks, $((cores / 2)) thread(s) each"
  "${mpirun[@]}" -x OMP_NUM_THREADS=$((cores / 2 > 0 ? cores / 2 : 1)) -np 2 "$bin" bench \
    configs/demo.yaml parallel.tensor_model_parallel_size="$1" \
    parallel.pipeline_model_parallel_size="$2" --steps "$steps" --warmup 1 | grep bench
done
echo "== GPT-2 124M, seq_length 256, one rank, $cores threads"
OMP_NUM_THREADS=$cores "$bin" bench configs/gpt2-124m.yaml training.device=cpu \
  training.precision=fp32 model.seq_length=256 training.micro_batch_size=4 \
  training.global_batch_size=4 parallel.use_distributed_optimizer=false \
  data.data_path=data/fortunes --steps 2 --warmup 1 | grep bench
