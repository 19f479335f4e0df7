#!/usr/bin/env bash
# Folder names are paths, never commands: `tripod report` and `tripod sweep --out` on a
# folder named  x'; touch PWNED; echo '  (and one with a double quote and gnuplot's own
# shell escape) run no command, write their files inside that folder, and only say they
# drew pictures that are on disk.
#
# usage: hostile_path_flow.sh TRIPOD SOURCE_DIR
set -euo pipefail
tripod=$1
src=$2
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin hostile_path_flow
flow_corpus "$tripod" 100
cd "$work" # a command that escaped would create PWNED here

names=("x'; touch PWNED; echo '" 'y"; !touch PWNED
print "')
no_pwned() { # no_pwned WHAT
  if [[ -n $(find "$work" -name 'PWNED*' -print -quit) ]]; then
    fail "$1 ran a command hidden in a folder name: $(find "$work" -name 'PWNED*')"
  fi
}

i=0
for name in "${names[@]}"; do
  i=$((i + 1))
  run="$work/$name"
  mkdir -p "$run"
  for it in 1 2 3 4 5; do
    printf '{"iteration":%d,"lm_loss":%d,"lr":0.001,"grad_norm":1,"tokens_per_s":100,"tflops_per_gpu":0.5}\n' \
      "$it" $((10 - it))
  done >"$run/metrics.jsonl"
  "$tripod" report "$run" >"$work/report$i.out" 2>&1 || fail "report $i: $(cat "$work/report$i.out")"
  no_pwned "report"
  [[ -s $run/report/report.dat && -s $run/report/report.gp ]] ||
    fail "report $i did not write inside the folder: $(ls -R "$work")"
  if grep -qF -- "-> drew " "$work/report$i.out"; then
    for png in loss lr grad_norm throughput; do
      head -c 4 "$run/report/$png.png" | grep -q PNG || fail "report claims $png.png, not drawn"
    done
  elif command -v gnuplot >/dev/null; then
    fail "gnuplot is installed and report $i drew nothing: $(cat "$work/report$i.out")"
  fi

  out="$work/sweep $name"
  "$tripod" sweep "$src/configs/demo.yaml" data.data_path="$work/corpus" model.num_layers=1 \
    model.hidden_size=32 model.seq_length=32 training.global_batch_size=2 \
    training.micro_batch_size=1 training.num_threads=1 --steps 2 --warmup 0 --no-traces \
    --out "$out" >"$work/sweep$i.out" 2>&1 || fail "sweep $i: $(tail -5 "$work/sweep$i.out")"
  no_pwned "sweep"
  [[ -s $out/summary.csv ]] || fail "sweep $i wrote no summary.csv inside its folder"
  if command -v gnuplot >/dev/null; then
    head -c 4 "$out/sweep.png" | grep -q PNG || fail "sweep $i drew no plot: $(cat "$work/sweep$i.out")"
    grep -qF "plot written to $out/sweep.png" "$work/sweep$i.out" || fail "sweep $i: no plot line"
  fi
done

# A gnuplot that exits 0 and draws nothing: report fails, naming the missing picture, and
# never says it drew.
mkdir -p "$work/bin"
printf '#!/bin/sh\nexit 0\n' >"$work/bin/gnuplot"
chmod +x "$work/bin/gnuplot"
rm -rf "$run/report"
if PATH="$work/bin:$PATH" "$tripod" report "$run" >"$work/fake.out" 2>&1; then
  fail "report succeeded with a gnuplot that drew nothing: $(cat "$work/fake.out")"
fi
! grep -qF -- "-> drew " "$work/fake.out" || fail "report claimed pictures it did not draw"
grep -qF "did not write '$run/report/loss.png'" "$work/fake.out" ||
  fail "report does not name the missing picture: $(cat "$work/fake.out")"
echo "hostile_path_flow: PASS"
