#!/usr/bin/env bash
# The data-parallel sharding strategies side by side on 4 and 8 cpu ranks: no_shard,
# optim (ZeRO-1), optim_grads (ZeRO-2) and optim_grads_params (ZeRO-3/FSDP), the same
# model and tokens under each. Per strategy and rank count it prints the model state per
# rank (parameters, gradients, optimizer state: measured from the engine's allocation and
# planned by `tripod plan` for the same layout), the peak bytes per rank (everything the
# rank allocates, the gathered working set included), the median step time, and each
# figure's ratio to no_shard's in the same run.
#
# The model is the demo widened so that model state is not lost beside the activations
# (hidden 512, 8 layers, 8 heads, ffn 2048: 25.5M parameters, micro-batch 1).
# usage: tools/bench_sharding.sh [BUILD_DIR] [ITERS] [OUT_DIR] [RANKS...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
iters=${2:-12}
out=${3:-bench_sharding}
shift $(($# < 3 ? $# : 3))
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(4 8)
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
cfg=configs/demo.yaml
model=(model.hidden_size=512 model.num_layers=8 model.num_attention_heads=8
  model.ffn_hidden_size=2048 training.micro_batch_size=1 training.global_batch_size=16)
strategies=(no_shard optim optim_grads optim_grads_params)
mkdir -p "$out"
MiB=1048576
# a key's values from a metrics file, one per line
values() { grep -o "\"$2\":[-+.eE0-9]*" "$1" | cut -d: -f2 || true; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
for n in "${ranks[@]}"; do
  mpirun=(mpirun --oversubscribe --bind-to none -np "$n")
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  printf '\n%s widened (25.5M parameters) at DP=%d, %d iterations\n' "$(basename $cfg .yaml)" \
    "$n" "$iters"
  printf '%-18s | %-24s | %-24s | %-24s | %-24s\n' strategy "model state MiB (ratio)" \
    "planned state MiB" "peak MiB (ratio)" "step ms (ratio) planned"
  base_state="" base_peak="" base_ms=""
  for s in "${strategies[@]}"; do
    tag=dp$n-$s
    m=$out/$tag.jsonl
    "${mpirun[@]}" "$bin" train "$cfg" "${model[@]}" training.train_iters="$iters" \
      parallel.data_parallel_sharding_strategy="$s" logging.log_interval=1 \
      logging.eval_interval=0 logging.metrics_file="$m" logging.overwrite=true \
      logging.tensorboard_dir= checkpoint.save= >"$out/$tag.log" 2>&1 ||
      { echo "$s: the run failed (see $out/$tag.log)"; exit 1; }
    # the engine's bytes: "memory T MiB = params P + grads G + gathered X + optimizer O +
    # master M + ..." of the logging rank (every DP rank of a stage allocates the same)
    line=$(grep -o 'memory [0-9.]* MiB = params [0-9.]* + grads [0-9.]* + gathered [0-9.]* + optimizer [0-9.]* + master [0-9.]*' \
      "$out/$tag.log" | head -n 1)
    read -r peak state < <(awk '{ print $2, $6 + $9 + $15 + $18 }' <<<"$line")
    ms=$(values "$m" elapsed_ms | tail -n +3 | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    plan=$("$bin" plan "$cfg" "${model[@]}" parallel.data_parallel_sharding_strategy="$s" \
      --cluster cpu --layout "1,1,$n" --json 2>/dev/null |
      python3 -c 'import json, sys
r = json.load(sys.stdin)[0]
m = r["memory_breakdown"][0] if r["memory_breakdown"] else {}
print(sum(m.get(k, 0) for k in ("params", "grads", "optimizer")) / 1048576, r["memory_bytes_per_rank"] / 1048576, 1e3 * r["step_time_s"])' ||
      echo "0 0 0")
    read -r pstate ppeak pms <<<"$plan"
    [ -n "$base_state" ] || { base_state=$state; base_peak=$peak; base_ms=$ms; }
    printf '%-18s | %10.2f (%s) | %8.2f (peak %7.2f) | %10.2f (%s) | %7.1f (%s) %7.1f\n' "$s" \
      "$state" "$(ratio "$state" "$base_state")" "$pstate" "$ppeak" "$peak" \
      "$(ratio "$peak" "$base_peak")" "$ms" "$(ratio "$ms" "$base_ms")" "$pms"
  done
done
echo "(MiB = $MiB bytes; ratios against no_shard in the same run)"
