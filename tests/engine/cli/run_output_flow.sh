#!/usr/bin/env bash
# What a run leaves for people, end to end: a run stopped and resumed writes TensorBoard
# files and one metrics file whose pictures `tripod report` draws as one curve; the
# training log says where; progress lines (checkpoint save and load, data prepare, export,
# import)
# show on a terminal (forced with TRIPOD_PROGRESS=1) and never in a log.
#
# usage: run_output_flow.sh TRIPOD SOURCE_DIR
set -euo pipefail
tripod=$1
src=$2
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin run_output_flow
flow_corpus "$tripod"
O=(data.data_path="$work/corpus" model.num_layers=2 model.hidden_size=32 model.seq_length=32
   training.global_batch_size=8 training.micro_batch_size=2 training.num_threads=1
   logging.eval_interval=4 logging.eval_iters=1 logging.log_interval=1
   logging.metrics_file="$work/run/metrics.jsonl" logging.tensorboard_dir="$work/run/tb"
   checkpoint.save="$work/run/ck" checkpoint.save_interval=4 data.split=90,5,5)

TRIPOD_PROGRESS=1 "$tripod" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=6 \
  >"$work/a.log" 2>&1 || fail "first segment: $(tail -3 "$work/a.log")"
grep -q "checkpoint save (rank 0's files): 100.0%" "$work/a.log" ||
  fail "no checkpoint save progress: $(grep -c . "$work/a.log") lines"
# resumed from its iteration-4 checkpoint: 5 and 6 are logged again, then 7 and 8
TRIPOD_PROGRESS=1 "$tripod" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=8 \
  checkpoint.load="$work/run/ck/iter_0000004" \
  >"$work/b.log" 2>&1 || fail "resumed segment: $(tail -3 "$work/b.log")"
grep -q "checkpoint load (rank 0's slice): 100.0%" "$work/b.log" || fail "no checkpoint load progress"
grep -q "pictures of this run: tripod report $work/run/metrics.jsonl" "$work/b.log" ||
  fail "the log does not say how to draw the run"
grep -q "ETA: " "$work/b.log" || fail "the log line has no ETA"
[[ $(ls "$work/run/tb" | grep -c '^events.out.tfevents\.') == 2 ]] ||
  fail "expected one event file per run segment in $work/run/tb"

"$tripod" report "$work/run" >"$work/report.out" || fail "report: $(cat "$work/report.out")"
grep -q "8 iterations (1 to 8) from 10 records in 2 segments" "$work/report.out" ||
  fail "report joined wrongly: $(cat "$work/report.out")"
[[ -s $work/run/report/report.gp ]] || fail "no gnuplot script beside the report's data"
if command -v gnuplot >/dev/null; then
  for png in loss lr grad_norm throughput; do
    head -c 4 "$work/run/report/$png.png" | grep -q PNG || fail "$png.png is not a PNG"
  done
else # a machine with the build tools only: the data and the script to draw them later
  grep -q "gnuplot is not on PATH .* gnuplot -c $work/run/report/report.gp" "$work/report.out" ||
    fail "no gnuplot, and the report does not say how to draw: $(cat "$work/report.out")"
fi

# progress: forced on, the bar and its ETA go to stderr; by default (not a terminal) nothing
TRIPOD_PROGRESS=1 "$tripod" data prepare --input "$work/text.txt" --output "$work/p1" \
  --records blank >/dev/null 2>"$work/p1.err"
grep -q "data prepare: 100.0% | .* MB/s | elapsed .* | ETA " "$work/p1.err" ||
  fail "no progress line: $(cat "$work/p1.err")"
"$tripod" data prepare --input "$work/text.txt" --output "$work/p2" --records blank \
  >/dev/null 2>"$work/p2.err"
! grep -q "ETA" "$work/p2.err" || fail "progress was drawn into a log"
cmp -s "$work/p1.bin" "$work/p2.bin" || fail "progress changed the prepared data"
TRIPOD_PROGRESS=1 "$tripod" export "$work/run/ck" --format hf --output "$work/hf" \
  >/dev/null 2>"$work/x.err" || fail "export: $(cat "$work/x.err")"
grep -q "export: 100.0%" "$work/x.err" || fail "no export progress: $(cat "$work/x.err")"
TRIPOD_PROGRESS=1 "$tripod" import "$work/hf" --format hf --output "$work/imp" \
  >/dev/null 2>"$work/i.err" || fail "import: $(cat "$work/i.err")"
grep -q "import: 100.0%" "$work/i.err" || fail "no import progress: $(cat "$work/i.err")"
# another run's metrics are kept: a run from iteration 0 on the resumed run's file stops
# (exit 2) naming the file and the ways on; logging.overwrite=true replaces them
cp "$work/run/metrics.jsonl" "$work/metrics.before"
F=("${O[@]}" training.train_iters=2 checkpoint.save= logging.tensorboard_dir=)
if "$tripod" train "$src/configs/demo.yaml" "${F[@]}" >"$work/c.log" 2>&1; then
  fail "a fresh run truncated another run's metrics"
else
  [[ $? == 2 ]] || fail "refusing the metrics file: exit $? (want 2): $(tail -3 "$work/c.log")"
fi
grep -qF "logging.metrics_file: '$work/run/metrics.jsonl' already holds" "$work/c.log" &&
  grep -qF "set logging.overwrite=true" "$work/c.log" ||
  fail "the refusal does not name the file and the way on: $(tail -3 "$work/c.log")"
cmp -s "$work/run/metrics.jsonl" "$work/metrics.before" || fail "the refused run changed the metrics"
"$tripod" train "$src/configs/demo.yaml" "${F[@]}" logging.overwrite=true >"$work/d.log" 2>&1 ||
  fail "logging.overwrite=true: $(tail -3 "$work/d.log")"
[[ $(grep -c . "$work/run/metrics.jsonl") == 2 ]] || fail "logging.overwrite=true did not replace"

# a metrics file that cannot take a write: exit 1, naming the file and the reason
if [[ -w /dev/full ]]; then
  if "$tripod" train "$src/configs/demo.yaml" "${F[@]}" logging.metrics_file=/dev/full \
    >"$work/e.log" 2>&1; then
    fail "a run whose metrics could not be written succeeded"
  fi
  grep -qF "writing iteration 1 to '/dev/full' failed: No space left on device" "$work/e.log" ||
    fail "the write error does not name the file and errno: $(tail -3 "$work/e.log")"
fi
echo "run_output_flow: PASS"
