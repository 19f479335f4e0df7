#!/usr/bin/env bash
# DiLoCo against every-step DP sync at DP=4, for the same tokens: the demo model (and with
# --llama the demo-llama model) trained with parallel.dp_sync every_step, DiLoCo at
# H = 5, 20 and 50 (one replica per DP rank), and Streaming DiLoCo at H = 20 with 4
# fragments. Prints, side by side, the final training loss (mean of the last 10
# iterations), the final validation loss, the DP bytes each rank moved per token (the
# payloads of the every-step gradient reductions and of the outer all-reduces, from the
# metrics file) and the mean step time, and draws the training-loss curves into one PNG.
#
# usage: tools/bench_diloco.sh [BUILD_DIR] [ITERS] [OUT_DIR] [--llama]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
iters=${2:-300}
out=${3:-bench_diloco}
llama=${4:-}
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none -np 4)
mkdir -p "$out"

# name | overrides
settings=(
  "every_step|parallel.dp_sync=every_step"
  "diloco_H5|parallel.dp_sync=diloco diloco.sync_interval=5"
  "diloco_H20|parallel.dp_sync=diloco diloco.sync_interval=20"
  "diloco_H50|parallel.dp_sync=diloco diloco.sync_interval=50"
  "streaming_H20_F4|parallel.dp_sync=diloco diloco.sync_interval=20 diloco.fragments=4"
)
models=(demo)
[[ "$llama" == --llama ]] && models+=(demo-llama)

for model in "${models[@]}"; do
  for s in "${settings[@]}"; do
    name=${s%%|*}
    read -r -a ov <<<"${s#*|}"
    run="$out/$model-$name"
    rm -rf "$run"
    mkdir -p "$run"
    "${mpirun[@]}" "$bin" train "configs/$model.yaml" training.train_iters="$iters" \
      logging.log_interval=1 logging.eval_interval="$iters" logging.eval_iters=8 \
      logging.metrics_file="$run/metrics.jsonl" checkpoint.save= "${ov[@]}" \
      >"$run/train.log" 2>&1 || { echo "bench_diloco: $model $name failed: $(tail -3 "$run/train.log")" >&2; exit 1; }
  done
done

# One number from a flat JSON object line: json_num LINE KEY
summary() { # metrics.jsonl tokens_per_iteration
  awk -v tpi="$2" '
    function num(k,   m) {
      if (match($0, "\"" k "\":[ ]*[-0-9.eE+]+")) { m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:[ ]*/, "", m); return m + 0 }
      return "";
    }
    /"lm_loss"/ { n++; loss[n] = num("lm_loss"); if (n > 1) { t += num("elapsed_ms"); nt++ }
                  b += num("dp_bytes") + num("dp_outer_bytes"); v = num("val_loss"); if (v != "") val = v }
    END { s = 0; k = 0; for (i = (n > 10 ? n - 9 : 1); i <= n; i++) { s += loss[i]; k++ }
          printf "%9.4f %9.4f %12.1f %9.1f", s / k, val, b / (n * tpi), t / nt }' "$1"
}

for model in "${models[@]}"; do
  seq=$(awk '/seq_length:/ { print $2; exit }' "configs/$model.yaml")
  gbs=$(awk '/global_batch_size:/ { print $2; exit }' "configs/$model.yaml")
  tpi=$((seq * gbs))
  echo "== $model, DP=4, $iters iterations of $tpi tokens"
  printf '%-18s %9s %9s %12s %9s %12s\n' setting train val "DP B/token" "step ms" "B/token vs every_step"
  base=""
  for s in "${settings[@]}"; do
    name=${s%%|*}
    read -r tl vl bpt ms < <(summary "$out/$model-$name/metrics.jsonl" "$tpi")
    [[ -z "$base" ]] && base=$bpt
    ratio=$(awk -v a="$bpt" -v b="$base" 'BEGIN { printf "%.4f", b > 0 ? a / b : 0 }')
    printf '%-18s %9s %9s %12s %9s %12s\n' "$name" "$tl" "$vl" "$bpt" "$ms" "$ratio"
  done
done

if command -v gnuplot >/dev/null; then
  for model in "${models[@]}"; do
    plot=""
    for s in "${settings[@]}"; do
      name=${s%%|*}
      awk '/"lm_loss"/ { match($0, /"iteration":[ ]*[0-9]+/); i = substr($0, RSTART, RLENGTH); sub(/.*:[ ]*/, "", i);
                         match($0, /"lm_loss":[ ]*[-0-9.eE+]+/); l = substr($0, RSTART, RLENGTH); sub(/.*:[ ]*/, "", l);
                         print i, l }' "$out/$model-$name/metrics.jsonl" >"$out/$model-$name/loss.dat"
      plot+="${plot:+, }'$out/$model-$name/loss.dat' using 1:2 with lines title '$name'"
    done
    gnuplot <<GP
set terminal pngcairo size 900,540
set output '$out/$model-loss.png'
set title '$model at DP=4: training loss, every-step sync against DiLoCo'
set xlabel 'iteration'
set ylabel 'lm loss'
set yrange [*:4]
set grid
plot $plot
GP
    echo "bench_diloco: $out/$model-loss.png"
  done
fi
