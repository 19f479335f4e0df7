#!/usr/bin/env bash
# DiLoCo against every-step data parallelism at DP=4 on the same tokens: the demo (and
# demo-llama) trained with parallel.dp_sync every_step, DiLoCo at H = 5, 20 and 50 (one
# replica per DP rank, AdamW inside, the outer Nesterov step at the paper's lr 0.7 and
# momentum 0.9), and Streaming DiLoCo at H = 20 with 4 fragments whose all-reduce overlaps
# one inner step. Prints, per setting, the final training loss (the mean of the last 10
# iterations), the validation loss at the end, the DP wire bytes per token (the job's,
# the ring's count, inner and outer), the peak bytes one rank sends in one outer
# all-reduce, and the median step time with its ratio to every-step's; draws the loss
# curves into OUT/diloco_loss.png.
# usage: tools/bench_diloco.sh [BUILD_DIR] [ITERS] [OUT_DIR] [CONFIGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
iters=${2:-300}
out=${3:-bench_diloco}
shift $(($# < 3 ? $# : 3))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/demo.yaml configs/demo-llama.yaml)
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
mpirun=(mpirun --oversubscribe --bind-to none -np 4)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
mkdir -p "$out"
settings=("every_step" "H=5" "H=20" "H=50" "H=20,F=4")
args_of() {
  case $1 in
  every_step) echo "parallel.dp_sync=every_step" ;;
  H=20,F=4) echo "parallel.dp_sync=diloco diloco.sync_interval=20 diloco.fragments=4 diloco.overlap_steps=1" ;;
  H=*) echo "parallel.dp_sync=diloco diloco.sync_interval=${1#H=}" ;;
  esac
}
# a key's values from a metrics file, one per line ("" where the record lacks it)
values() { grep -o "\"$2\":[-+.eE0-9]*" "$1" | cut -d: -f2 || true; }
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .yaml)
  seq=$(awk '/^ *seq_length:/ { print $2; exit }' "$cfg")
  gb=$(awk '/^ *global_batch_size:/ { print $2; exit }' "$cfg")
  tokens=$((iters * gb * seq))
  printf '\n%s at DP=4, %d iterations (%d tokens)\n' "$name" "$iters" "$tokens"
  printf '%-10s | %-10s | %-10s | %-14s | %-16s | %-18s\n' setting "train loss" "val loss" \
    "DP bytes/token" "peak outer MiB" "step ms (ratio)"
  base_ms=""
  for s in "${settings[@]}"; do
    tag=$name-${s//[=,]/_}
    m=$out/$tag.jsonl
    # shellcheck disable=SC2046
    "${mpirun[@]}" "$bin" train "$cfg" training.train_iters="$iters" logging.log_interval=1 \
      logging.eval_interval="$iters" logging.metrics_file="$m" logging.overwrite=true \
      checkpoint.save= $(args_of "$s") >"$out/$tag.log" 2>&1 ||
      { echo "$s: the run failed (see $out/$tag.log)"; exit 1; }
    train=$(values "$m" lm_loss | tail -n 10 | awk '{ s += $1 } END { printf "%.4f", s / NR }')
    val=$(values "$m" val_loss | tail -n 1)
    bpt=$(values "$m" dp_bytes | awk -v t="$tokens" '{ s += $1 } END { printf "%.1f", s / t }')
    peak=$(grep -o 'all-reduce of [0-9.]* MiB per rank per fragment' "$out/$tag.log" | head -n 1 |
      awk '{ print $3 }' || true)
    ms=$(values "$m" elapsed_ms | tail -n +3 | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    [ -n "$base_ms" ] || base_ms=$ms
    printf '%-10s | %-10s | %-10.4f | %-14s | %-16s | %7.1f (%.2f)\n' "$s" "$train" "$val" \
      "$bpt" "${peak:--}" "$ms" "$(awk -v a="$ms" -v b="$base_ms" 'BEGIN { print a / b }')"
  done
done
if command -v gnuplot >/dev/null; then
  # one panel per model: the loss curves of every setting
  gp="set terminal pngcairo size 1400,560 noenhanced; set output '$out/diloco_loss.png';"
  gp+=" set multiplot layout 1,${#configs[@]}; set xlabel 'iteration'; set ylabel 'lm loss';"
  gp+=" set yrange [1.6:4]; set key top right; set grid;"
  for cfg in "${configs[@]}"; do
    name=$(basename "$cfg" .yaml)
    plot=""
    for s in "${settings[@]}"; do
      tag=$name-${s//[=,]/_}
      paste <(values "$out/$tag.jsonl" iteration) <(values "$out/$tag.jsonl" lm_loss) \
        >"$out/$tag.dat"
      plot+="${plot:+, }'$out/$tag.dat' using 1:2 with lines title '$s'"
    done
    gp+=" set title '$name at DP=4, $iters iterations'; plot $plot;"
  done
  gnuplot -e "$gp unset multiplot" && echo "loss curves: $out/diloco_loss.png"
fi
