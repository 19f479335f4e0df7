#!/usr/bin/env bash
# Pipeline schedules and DP overlap on 8 ranks at one global batch: PP=4 (DP=2) and
# TP=2 x PP=2 x DP=2, each as 1F1B, interleaved (v=2) and ZB-H1, with
# parallel.overlap_grad_reduce / overlap_param_gather off and on. Calibrates the planner on
# these 8 ranks first, then runs `tripod sweep` and prints, per run, the measured step
# time, pipeline idle fraction and exposed DP time beside the planner's predictions.
# usage: tools/bench_schedules.sh [BUILD_DIR] [STEPS] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
out=${3:-bench_schedules}
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -np 8)
# The demo at 8 layers (PP x v = 8 chunks), ZeRO-1 on so that the parameter gather counts,
# and buckets of 64 Ki elements (about 3 per layer): Megatron's 40 M would hold this whole
# 1.6 M-parameter model in one bucket, which cannot start before the backward ends.
O=(model.num_layers=8 training.global_batch_size=32 training.micro_batch_size=2
   parallel.use_distributed_optimizer=true parallel.ddp_bucket_size=65536)
mkdir -p "$out"
"${mpirun[@]}" "$bin" bench --calibrate --out "$out/cpu-8ranks.yaml" configs/demo.yaml "${O[@]}" \
  >"$out/calibrate.log" 2>&1
for layout in "1 4" "2 2"; do
  set -- $layout
  "${mpirun[@]}" "$bin" sweep configs/demo.yaml "${O[@]}" --tp "$1" --pp "$2" --vp 1,2 \
    --schedule 1f1b,zb-h1 --overlap 0,1 --steps "$steps" --warmup 2 \
    --cluster "$out/cpu-8ranks.yaml" --out "$out/tp$1pp$2" --no-plot --no-traces \
    >"$out/tp$1pp$2.log" 2>&1
done
printf '%-12s %-16s %-7s | %-19s | %-15s | %-19s\n' layout schedule overlap \
  "step ms meas/pred" "idle meas/pred" "DP exposed ms m/p"
for layout in tp1pp4 tp2pp2; do
  awk -F, -v L="$layout" '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { sch = $c["schedule"]; if ($c["vp"] > 1) sch = sch " v=" $c["vp"];
      printf "%-12s %-16s %-7s | %8.1f / %8.1f | %6.3f / %6.3f | %8.2f / %8.2f\n",
        L " dp" $c["dp"], sch, ($c["overlap"] ? "on" : "off"),
        1e3 * $c["time_per_step_s"], 1e3 * $c["predicted_time_s"],
        $c["idle_fraction"], $c["pred_idle_fraction"],
        1e3 * $c["dp_exposed_s"], 1e3 * $c["pred_dp_exposed_s"] }' "$out/$layout/summary.csv"
done
