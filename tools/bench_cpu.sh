#!/usr/bin/env bash
# Single-rank CPU training throughput (tokens/s and GFLOP/s) for the demo model and for
# GPT-2 124M at seq_length 256, then the demo model under TP=2, PP=2 and DP=2 at the same
# global batch (two ranks each). Uses the fortune corpus (tools/prepare_demo.sh); GPT-2's
# vocabulary is larger than the corpus's, which does not change the work per token.
#
# Then "tripod vs PyTorch eager, fp32 and bf16": the demo model (seq 128, micro-batch 4) and
# GPT-2 124M (seq 256, micro-batch 4), one micro-batch per step, against the same model in
# PyTorch eager (tools/bench_torch_gpt2.py; bf16 there is torch.autocast with fp32 master
# weights, tripod's is training.precision=bf16). ROUNDS rounds, interleaved (tripod fp32,
# torch fp32, tripod bf16, torch bf16), then per configuration the minimum ms/step over the
# rounds of each, tokens/s and TFLOP/s at that minimum (FLOPs per step: tripod's
# tpd_model_flops for both), the ratios of step time tripod/torch (fp32 and bf16) and
# tripod bf16/tripod fp32, and each run's fraction of the machine's peak.
#
# Peak (TFLOP/s) = cores x GHz x FLOP/cycle/core, unless PEAK_FP32_TFLOPS / PEAK_BF16_TFLOPS
# are set. cores: distinct physical cores in /proc/cpuinfo, at most nproc. GHz: the largest
# "cpu MHz" in /proc/cpuinfo (the current clock, not a guaranteed one). FLOP/cycle/core,
# fp32: AVX-512 on AMD (Zen 4 runs a 512-bit FMA as two 256-bit halves): 2 FMA pipes x 8
# lanes x 2 = 32; AVX-512 on Intel (two 512-bit FMA units): 2 x 16 x 2 = 64; AVX2+FMA only:
# 2 x 8 x 2 = 32; otherwise 16. bf16: with AVX512_BF16 (vdpbf16ps: twice the lanes of an
# fp32 FMA) twice the fp32 figure; with AMX-BF16, 1024 (one TMUL tile op per cycle);
# otherwise the fp32 figure (bf16 computed in fp32). The assumption used is printed.
#
# usage: tools/bench_cpu.sh [BUILD_DIR] [STEPS]
#   env: ROUNDS (3), BENCH_SECTIONS (all | torch: only the comparison),
#        BENCH_TORCH_MODELS ("demo gpt2"), BENCH_TORCH_STEPS (measured steps per run,
#        default STEPS), PEAK_FP32_TFLOPS, PEAK_BF16_TFLOPS, PYTHON (python3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-4}
tools/prepare_demo.sh "$build" data/fortunes >/dev/null
bin=$build/tripod
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
cores=$(nproc)

sections=${BENCH_SECTIONS:-all}
if [[ $sections == all ]]; then
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
fi

if [[ $sections == all || $sections == torch ]]; then
rounds=${ROUNDS:-3}
tsteps=${BENCH_TORCH_STEPS:-$steps}
models=${BENCH_TORCH_MODELS:-demo gpt2}
py=${PYTHON:-python3}

# The machine's peak, as documented at the top.
vendor=$(awk -F': *' '/^vendor_id/ { print $2; exit }' /proc/cpuinfo)
flags=" $(awk -F': *' '/^flags/ { print $2; exit }' /proc/cpuinfo) "
mhz=$(awk -F': *' '/^cpu MHz/ { if ($2 + 0 > m) m = $2 + 0 } END { print m + 0 }' /proc/cpuinfo)
phys=$(awk -F': *' '/^physical id/ { p = $2 } /^core id/ { c[p ":" $2] = 1 }
                    END { n = 0; for (k in c) n++; print n }' /proc/cpuinfo)
pcores=$(( phys > 0 && phys < cores ? phys : cores ))
if [[ $flags == *" avx512f "* && $vendor == AuthenticAMD ]]; then
  fp32_fpc=32 why32="AVX-512 on AMD, 512-bit FMA as two 256-bit halves: 2 pipes x 8 lanes x 2"
elif [[ $flags == *" avx512f "* ]]; then
  fp32_fpc=64 why32="AVX-512 with two 512-bit FMA units: 2 x 16 lanes x 2"
elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then
  fp32_fpc=32 why32="AVX2 FMA: 2 pipes x 8 lanes x 2"
else
  fp32_fpc=16 why32="no AVX2/AVX-512 FMA detected: 16 assumed"
fi
if [[ $flags == *" amx_bf16 "* ]]; then
  bf16_fpc=1024 why16="AMX-BF16: 1024"
elif [[ $flags == *" avx512_bf16 "* ]]; then
  bf16_fpc=$((2 * fp32_fpc)) why16="AVX512_BF16 (vdpbf16ps): 2 x fp32 = $((2 * fp32_fpc))"
else
  bf16_fpc=$fp32_fpc why16="no bf16 dot product: as fp32"
fi
peak() { # PEAK_ENV_VALUE FLOP_PER_CYCLE
  if [[ -n $1 ]]; then echo "$1"; else
    awk -v c="$pcores" -v m="$mhz" -v f="$2" 'BEGIN { printf "%.4f", c * m / 1000 * f / 1000 }'
  fi
}
peak32=$(peak "${PEAK_FP32_TFLOPS:-}" "$fp32_fpc")
peak16=$(peak "${PEAK_BF16_TFLOPS:-}" "$bf16_fpc")
how() { # ENV_NAME PEAK FLOP_PER_CYCLE WHY
  if [[ -n ${!1:-} ]]; then echo "$2 TFLOP/s from $1"; else
    echo "$2 TFLOP/s = $pcores cores x $mhz MHz x $3 FLOP/cycle ($4)"; fi
}
echo "== tripod vs PyTorch eager, fp32 and bf16: $rounds round(s), $tsteps steps each," \
  "$cores threads, one micro-batch per step"
echo "   peak fp32: $(how PEAK_FP32_TFLOPS "$peak32" "$fp32_fpc" "$why32")"
echo "   peak bf16: $(how PEAK_BF16_TFLOPS "$peak16" "$bf16_fpc" "$why16")"

# Per model: tripod's config and overrides, the same model for tools/bench_torch_gpt2.py,
# and L h Vp s B for the FLOP count.
model_args() { # MODEL -> sets tripod_args, torch_args, dims
  case $1 in
    demo)
      tripod_args=(configs/demo.yaml training.global_batch_size=4)
      torch_args=(--layers 4 --hidden 128 --heads 4 --vocab 257 --divisible-by 64 --seq 128
                  --micro-batch 4)
      dims="4 128 320 128 4" ;;
    gpt2)
      tripod_args=(configs/gpt2-124m.yaml training.device=cpu model.seq_length=256
                   training.micro_batch_size=4 training.global_batch_size=4
                   parallel.use_distributed_optimizer=false data.data_path=data/fortunes)
      torch_args=(--layers 12 --hidden 768 --heads 12 --vocab 50257 --divisible-by 128
                  --seq 256 --micro-batch 4)
      dims="12 768 50304 256 4" ;;
    *) echo "bench_cpu: unknown model '$1' in BENCH_TORCH_MODELS (demo, gpt2)" >&2; exit 2 ;;
  esac
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
record() { # MODEL DTYPE TOOL OUTPUT KEY: the number before " ms/step" or after "ms/step="
  local ms
  ms=$(awk '{ for (i = 1; i <= NF; i++) {
                if ($i == "ms/step") { print $(i - 1); exit }
                if ($i ~ /^ms\/step=/) { sub(/^ms\/step=/, "", $i); print $i; exit } } }' <<<"$4")
  if [[ -n $ms ]]; then echo "$1 $2 $3 $ms" >>"$results"; fi
}
for ((r = 1; r <= rounds; r++)); do
  for m in $models; do
    model_args "$m"
    for dtype in fp32 bf16; do
      if out=$(OMP_NUM_THREADS=$cores "$bin" bench "${tripod_args[@]}" \
                 training.precision=$dtype --steps "$tsteps" --warmup 1 2>&1); then
        line=$(grep -m1 '^bench: layout' <<<"$out" || true)
        echo "   round $r $m tripod $dtype: ${line:-no bench line}"
        record "$m" "$dtype" tripod "$line"
      else
        echo "   round $r $m tripod $dtype FAILED: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
      fi
      if out=$(OMP_NUM_THREADS=$cores "$py" tools/bench_torch_gpt2.py "${torch_args[@]}" \
                 --name "$m" --dtype "$dtype" --threads "$cores" --steps "$tsteps" \
                 --warmup 1 2>&1); then
        line=$(grep -m1 '^torch ' <<<"$out" || true)
        echo "   round $r $m $line"
        record "$m" "$dtype" torch "$line"
      else
        echo "   round $r $m torch $dtype FAILED: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
      fi
    done
  done
done

echo "== summary: minimum ms/step over $rounds round(s); ratios are of ms/step (< 1: faster)"
for m in $models; do
  model_args "$m"
  awk -v model="$m" -v dims="$dims" -v p32="$peak32" -v p16="$peak16" '
    $1 == model { k = $2 " " $3; if (!(k in best) || $4 + 0 < best[k]) best[k] = $4 + 0 }
    END {
      split(dims, d, " "); L = d[1]; h = d[2]; vp = d[3]; s = d[4]; b = d[5]
      # tpd_model_flops: 3 * tokens * (L * (2 * (4h^2 + 2h * 4h) + 4sh) + 2h * Vp)
      tokens = b * s
      flops = 3 * tokens * (L * (2 * (4 * h * h + 2 * h * 4 * h) + 4 * s * h) + 2 * h * vp)
      printf "   %-5s %-5s %-7s %10s %10s %9s %7s\n", "model", "dtype", "tool", "ms/step",
             "tokens/s", "TFLOP/s", "%peak"
      for (i = 1; i <= 2; i++) {
        dt = i == 1 ? "fp32" : "bf16"; pk = i == 1 ? p32 : p16
        for (j = 1; j <= 2; j++) {
          tool = j == 1 ? "tripod" : "torch"; k = dt " " tool
          if (!(k in best)) { printf "   %-5s %-5s %-7s %10s\n", model, dt, tool, "failed"; continue }
          ms = best[k]; tf = flops / (ms / 1000) / 1e12
          printf "   %-5s %-5s %-7s %10.2f %10.0f %9.4f %6.1f%%\n", model, dt, tool, ms,
                 tokens / (ms / 1000), tf, (pk > 0 ? 100 * tf / pk : 0)
        }
      }
      r = "   " model " ratios:"
      r = r " tripod/torch fp32 " ratio(best["fp32 tripod"], best["fp32 torch"], "fp32 tripod" in best && "fp32 torch" in best)
      r = r ", tripod/torch bf16 " ratio(best["bf16 tripod"], best["bf16 torch"], "bf16 tripod" in best && "bf16 torch" in best)
      r = r ", tripod bf16/fp32 " ratio(best["bf16 tripod"], best["fp32 tripod"], "bf16 tripod" in best && "fp32 tripod" in best)
      print r
    }
    function ratio(a, b, ok) { return ok && b > 0 ? sprintf("%.3f", a / b) : "n/a" }
  ' "$results"
done
fi
